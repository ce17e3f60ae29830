//! `api.listen` and `metrics.listen` may both be `127.0.0.1:0`: two ports the OS picks, not one
//! address twice (issue 27, friction). Two equal non-zero addresses stay refused. `serve` reports
//! the ports it was given, in its "tombstoned ready" line and systemd's STATUS.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::daemon_support::NotifySocket;
use crate::harness::{binary, TestDb};
use crate::ops_support::repo_root;

fn check_config(api: &str, metrics: &str) -> std::process::Output {
    Command::new(binary())
        .arg("check-config")
        .env_clear()
        .env(
            "TOMBSTONED_DATABASE_URL",
            "postgresql://nobody@127.0.0.1:1/none",
        )
        .env("TOMBSTONED_API__TOKENS_FILE", "config/tokens.toml")
        .env("TOMBSTONED_API__LISTEN", api)
        .env("TOMBSTONED_METRICS__LISTEN", metrics)
        .current_dir(repo_root())
        .output()
        .unwrap()
}

#[test]
fn port_zero_twice_is_valid_and_an_equal_address_twice_is_not() {
    let both_zero = check_config("127.0.0.1:0", "127.0.0.1:0");
    assert_eq!(
        both_zero.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&both_zero.stderr)
    );
    let twice = check_config("127.0.0.1:9999", "127.0.0.1:9999");
    let stderr = String::from_utf8_lossy(&twice.stderr);
    assert_eq!(twice.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("`metrics.listen`") && stderr.contains("127.0.0.1:9999 is also api.listen"),
        "{stderr}"
    );
}

/// The `key=127.0.0.1:PORT` value of a log line.
fn port_of(line: &str, key: &str) -> u16 {
    let value = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line}"));
    let port = value.rsplit_once(':').map(|(_, p)| p).unwrap_or_default();
    port.parse()
        .unwrap_or_else(|_| panic!("{key}={value} is no address"))
}

#[tokio::test]
async fn serve_binds_both_listeners_on_ports_the_os_picks_and_says_which() {
    let db = TestDb::new().await;
    let notify = NotifySocket::bind();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (notify_var, notify_path) = notify.env();
    let mut child = tokio::process::Command::new(binary())
        .arg("serve")
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .env(
            "TOMBSTONED_API__TOKENS_FILE",
            repo_root().join("config/tokens.toml"),
        )
        .env("TOMBSTONED_API__LISTEN", "127.0.0.1:0")
        .env("TOMBSTONED_METRICS__LISTEN", "127.0.0.1:0")
        .env(notify_var, notify_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let ready = notify
        .until(Duration::from_secs(30), |m| m.has("READY=1"))
        .await;
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let status = ready
        .iter()
        .rev()
        .find_map(|m| m.value("STATUS"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no READY=1 with STATUS: {ready:?}\n{}", read_log()));
    // The log line is written right after READY=1.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        if let Some(line) = read_log().lines().find(|l| l.contains("tombstoned ready")) {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no ready line:\n{}", read_log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (api, metrics) = (port_of(&line, "api"), port_of(&line, "metrics"));
    assert!(api != 0 && metrics != 0 && api != metrics, "{line}");
    assert!(
        status.contains(&format!("api on 127.0.0.1:{api}")),
        "{status}"
    );

    let http = reqwest::Client::new();
    let readyz = http
        .get(format!("http://127.0.0.1:{metrics}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status(), 200);
    let unauthenticated = http
        .get(format!("http://127.0.0.1:{api}/v1/idempotency-keys/k"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), 401);

    kill(
        Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit.code(), Some(0), "{}", read_log());
}
