//! The binary's edge, run for real: a printing command whose standard output is closed ends
//! quietly (exit 0, nothing on stderr, as `rg ... | head` does), and a failure is reported once.

use std::os::fd::OwnedFd;
use std::process::{Command, Output, Stdio};

use crate::cleanup_support::{seed_live, DUE};
use crate::harness::{binary, TestDb};
use crate::ops_support::repo_root;

/// The write end of a pipe whose read end is already closed: the first write fails with EPIPE,
/// as when `head -1` has read its line and gone.
fn closed_pipe() -> OwnedFd {
    let (read, write) = nix::unistd::pipe().expect("pipe(2)");
    drop(read);
    write
}

/// Runs the binary with `args`, stdout a closed pipe; logs at warn so stderr holds only what the
/// edge itself prints.
async fn with_closed_stdout(args: &[&str], database_url: Option<&str>) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let database_url = database_url.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(binary());
        command
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUST_LOG", "warn")
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped());
        if let Some(url) = database_url {
            command.env("TOMBSTONED_DATABASE_URL", url);
        }
        command.output().expect("run tombstoned")
    })
    .await
    .unwrap()
}

fn assert_quiet_success(args: &[&str], output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
    assert!(stderr.is_empty(), "{args:?} wrote to stderr: {stderr}");
}

#[tokio::test]
async fn printing_commands_end_quietly_when_stdout_is_closed() {
    let args = ["--config", "config/tombstoned.toml", "check-config"];
    assert_quiet_success(&args, &with_closed_stdout(&args, None).await);

    let db = TestDb::new().await;
    seed_live(&db.client().await, "pipe", 3, DUE).await;
    for args in [
        &["cleanup", "--dry-run", "--json"][..],
        &["cleanup", "--dry-run"],
        &["migrate", "--status"],
        &["migrate"],
        &["cleanup", "--json"],
        &["cleanup"],
    ] {
        let output = with_closed_stdout(args, Some(&db.url)).await;
        assert_quiet_success(args, &output);
    }

    // The demo's story starts with its title: nothing is started when nobody reads it.
    let args = ["demo"];
    assert_quiet_success(&args, &with_closed_stdout(&args, None).await);
}

#[tokio::test]
async fn a_failed_cleanup_run_is_reported_once_without_the_server_detail() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "refused", 5, DUE).await;
    // A real server error with a DETAIL and a HINT on every tombstoning UPDATE.
    client
        .batch_execute(
            "CREATE FUNCTION refuse_tombstoning() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 RAISE EXCEPTION 'tombstoning refused by a test trigger'
                     USING DETAIL = 'Key (idempotency_key)=(secret-detail-key)',
                           HINT = 'secret-hint';
             END $$;
             CREATE TRIGGER refuse_tombstoning BEFORE UPDATE ON idempotency_records
                 FOR EACH ROW EXECUTE FUNCTION refuse_tombstoning();",
        )
        .await
        .unwrap();
    let url = db.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary())
            .arg("cleanup")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(70), "{stderr}");
    assert_eq!(
        stderr
            .matches("tombstoning refused by a test trigger")
            .count(),
        1,
        "the failure is reported exactly once:\n{stderr}"
    );
    assert!(
        stderr.contains("tombstoned: error: cleanup run failed: ") && stderr.contains("P0001"),
        "{stderr}"
    );
    assert!(!stderr.contains("secret"), "{stderr}");
}
