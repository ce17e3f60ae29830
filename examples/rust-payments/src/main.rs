//! The Rust payments example as a program. Environment (as the other two examples):
//! `DATABASE_URL` (the service role), `PAYMENTS_TOKENS` (JSON: bearer token →
//! `{"tenant", "principal"}`), `PORT` (default 8083; 0 picks a free port, and the first line
//! printed names it), `CLAIM_LOCK_TIMEOUT` (default "2 seconds"), `REPLAY_WINDOW` (default
//! "24 hours").
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let settings = rust_payments::Settings::new(
        &env_or("PAYMENTS_TOKENS", "{}"),
        &env_or("CLAIM_LOCK_TIMEOUT", "2 seconds"),
        &env_or("REPLAY_WINDOW", "24 hours"),
    );
    let started = async {
        let settings = settings?;
        let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
        let pool = rust_payments::pool(&url)?;
        let port = env_or("PORT", "8083");
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
            .await
            .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on http://{address}");
        rust_payments::run(listener, pool, settings)
            .await
            .map_err(|e| e.to_string())
    };
    match started.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("{why}");
            ExitCode::FAILURE
        }
    }
}
