//! SIGHUP on the real `tombstoned serve`: a reload the daemon refuses says why, and a change that
//! needs a restart is named in the log.

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::daemon_support::{Daemon, Spec, PATIENCE};
use crate::harness::TestDb;

async fn json_daemon(db: &TestDb) -> Daemon {
    Daemon::start(
        Spec::new(&db.url)
            .flag("--log-format")
            .flag("json")
            .env("RUST_LOG", "info"),
    )
    .await
}

async fn stop(mut daemon: Daemon) {
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(PATIENCE).await.code(), Some(0));
}

#[tokio::test]
async fn a_reload_refused_for_a_missing_file_logs_the_reason() {
    let db = TestDb::new().await;
    let daemon = json_daemon(&db).await;
    std::fs::remove_file(&daemon.config_path).unwrap();
    daemon.signal(Signal::SIGHUP);
    let line = daemon
        .wait_for_log(&["configuration reload rejected"])
        .await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    let error = entry["error"].as_str().unwrap();
    assert!(
        error.contains("cannot read configuration file") && error.contains("No such file"),
        "the I/O reason is missing: {line}"
    );
    assert_eq!(daemon.ops_get("/readyz").await.status, 200);
    stop(daemon).await;
}
