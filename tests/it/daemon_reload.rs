//! SIGHUP on the real `tombstoned serve`: a reload the daemon refuses says why, and a change that
//! needs a restart is named in the log.

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::daemon_support::{Daemon, Spec};
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

/// The reload's last line ("configuration reloaded", in full or in part; not the API's "API
/// configuration reloaded"), parsed.
async fn reloaded_entry(daemon: &Daemon) -> Value {
    let line = daemon
        .wait_for_log(&["configuration reloaded", r#""target":"tombstoned::daemon""#])
        .await;
    serde_json::from_str(&line).unwrap()
}

#[tokio::test]
async fn a_reload_refused_for_a_missing_file_logs_the_reason() {
    let db = TestDb::new().await;
    let mut daemon = json_daemon(&db).await;
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
    daemon.stop().await;
}

#[tokio::test]
async fn a_reload_names_the_changed_settings_that_need_a_restart() {
    let db = TestDb::new().await;
    let mut daemon = json_daemon(&db).await;
    daemon.rewrite_config("[database]\npool_size = 3\n[cleanup]\nbatch_size = 7");
    daemon.signal(Signal::SIGHUP);
    let entry = reloaded_entry(&daemon).await;
    assert_eq!(
        entry["not_applied"], "database.pool_size (at the next restart)",
        "{entry}"
    );
    let warnings: Vec<Value> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("after a restart"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0]["level"], "WARN");
    assert_eq!(warnings[0]["keys"], "database.pool_size", "{warnings:?}");
    daemon.stop().await;
}

/// A SIGHUP whose tokens file is broken: the ERROR, then a last line that says what was applied
/// and what was not — not a plain "configuration reloaded" (issue 27, friction).
#[tokio::test]
async fn a_reload_with_a_broken_tokens_file_says_what_was_and_was_not_applied() {
    let db = TestDb::new().await;
    let mut daemon = json_daemon(&db).await;
    daemon.rewrite_config("[cleanup]\nbatch_size = 7");
    std::fs::write(&daemon.tokens_path, "[[token]]\nsha256 = 3\n").unwrap();
    daemon.signal(Signal::SIGHUP);
    daemon.wait_for_log(&["API reload failed"]).await;
    let entry = reloaded_entry(&daemon).await;
    assert_eq!(entry["level"], "WARN", "{entry}");
    let text = |key: &str| entry[key].as_str().unwrap_or_default().to_owned();
    assert!(text("message").contains("in part"), "{entry}");
    assert!(text("applied").contains("cleanup"), "{entry}");
    assert!(text("not_applied").contains("api."), "{entry}");
    assert!(text("not_applied").contains("tokens"), "{entry}");
    assert_eq!(daemon.ops_get("/readyz").await.status, 200);
    daemon.stop().await;
}

/// A clean reload stays one INFO line, naming nothing left out.
#[tokio::test]
async fn a_clean_reload_is_one_info_line() {
    let db = TestDb::new().await;
    let mut daemon = json_daemon(&db).await;
    daemon.rewrite_config("[cleanup]\nbatch_size = 7");
    daemon.signal(Signal::SIGHUP);
    let entry = reloaded_entry(&daemon).await;
    assert_eq!(entry["level"], "INFO", "{entry}");
    assert!(entry.get("not_applied").is_none(), "{entry}");
    daemon.stop().await;
}
