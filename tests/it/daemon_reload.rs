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

#[tokio::test]
async fn a_reload_names_the_changed_settings_that_need_a_restart() {
    let db = TestDb::new().await;
    let daemon = json_daemon(&db).await;
    daemon.rewrite_config("[database]\npool_size = 3\n[cleanup]\nbatch_size = 7");
    daemon.signal(Signal::SIGHUP);
    daemon.wait_for_log(&["configuration reloaded"]).await;
    let warnings: Vec<Value> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("after a restart"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["level"], "WARN");
    assert_eq!(warnings[0]["keys"], "database.pool_size", "{warnings:?}");
    stop(daemon).await;
}
