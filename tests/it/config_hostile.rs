//! Configuration a careless hand wrote, read by the real binary (issue 17 items 11 and 13): a
//! duration PostgreSQL cannot hold is refused by `check-config` naming the key, the longest one
//! accepted works end to end, and a syntax error on the password's line — in `check-config` and
//! in a SIGHUP reload, for the configuration and for the tokens file — says where, never what.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::api_support::order;
use crate::daemon_support::{Daemon, Spec, ALICE, PATIENCE};
use crate::harness::{binary, TestDb};

/// `tombstoned --config <file> check-config` with nothing else in the environment.
fn check_config(config: &str, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tombstoned.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(binary())
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .env_clear()
        // Read by check-config as by serve (the API is on by default).
        .env(
            "TOMBSTONED_API__TOKENS_FILE",
            crate::ops_support::repo_root().join("config/tokens.toml"),
        )
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_refuses_durations_postgresql_cannot_hold_naming_the_key() {
    for (config, key) in [
        (
            "[retention]\nreplay_window = \"300000years\"\n",
            "retention.replay_window",
        ),
        (
            "[retention]\npurge_tombstones_after = \"300000years\"\n",
            "retention.purge_tombstones_after",
        ),
        (
            "[cleanup]\nmax_run_time = \"300000years\"\n",
            "cleanup.max_run_time",
        ),
    ] {
        let (code, stdout, stderr) = check_config(config, &[]);
        assert_eq!(code, Some(64), "{config}: {stdout}{stderr}");
        assert!(stderr.contains(key), "{config}: {stderr}");
    }
    let (code, stdout, stderr) = check_config(
        "[retention]\nreplay_window = \"5000years\"\npurge_tombstones_after = \"5000years\"\n",
        &[],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}

#[tokio::test]
async fn the_longest_accepted_retention_claims_replays_reads_and_cleans_up() {
    let db = TestDb::new().await;
    let retention = "[retention]\nreplay_window = \"5000years\"\n\
                     purge_tombstones_after = \"5000years\"\n";
    let mut daemon = Daemon::start(Spec::new(&db.url).config(retention)).await;
    let body = order("long-1");
    daemon
        .create_order(ALICE, "long-1", &body)
        .await
        .expect(201);
    let replay = daemon.create_order(ALICE, "long-1", &body).await;
    replay.expect(201);
    assert!(replay.replayed());
    let status = daemon
        .http
        .get(format!("{}/v1/idempotency-keys/long-1", daemon.api))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 200, "{}", status.text().await.unwrap());
    daemon.stop().await;

    // A one-shot cleanup run computes its purge bound (now() - 5000 years) and finishes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tombstoned.toml");
    std::fs::write(&path, retention).unwrap();
    let out = tokio::process::Command::new(binary())
        .arg("--config")
        .arg(&path)
        .arg("cleanup")
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const PASSWORD: &str = "Pa55-w0rd-never-shown";
const RAW_TOKEN: &str = "raw-bearer-token-never-shown";

#[test]
fn a_syntax_error_on_the_url_line_is_located_without_quoting_the_password() {
    for (config, key) in [
        // An unterminated string.
        (
            format!("[database]\nurl = \"postgresql://app:{PASSWORD}@db/app\npool_size = 4\n"),
            "database.url",
        ),
        // No quotes.
        (
            format!("[database]\nurl = postgresql://app:{PASSWORD}@db/app\n"),
            "database.url",
        ),
        // A key=value string whose password has a backslash (an invalid escape in TOML).
        (
            format!("[database]\nurl = \"host=db password={PASSWORD}\\q\"\n"),
            "database.url",
        ),
        // The wrong type.
        (
            format!("[database]\nurl = [\"postgresql://app:{PASSWORD}@db/app\"]\n"),
            "database.url",
        ),
    ] {
        let (code, stdout, stderr) = check_config(&config, &[]);
        assert_eq!(code, Some(64), "{config}: {stdout}{stderr}");
        assert!(
            !stderr.contains(PASSWORD) && !stdout.contains(PASSWORD),
            "{stdout}{stderr}"
        );
        assert!(stderr.contains("line 2, column"), "{stderr}");
        assert!(stderr.contains(key), "{stderr}");
    }
    // A wrong value in the environment is named by its variable, not repeated.
    let (code, _, stderr) = check_config("", &[("TOMBSTONED_DATABASE__POOL_SIZE", PASSWORD)]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("TOMBSTONED_DATABASE__POOL_SIZE") && !stderr.contains(PASSWORD));
}

#[tokio::test]
async fn sighup_with_a_broken_config_or_tokens_file_logs_where_never_the_secret() {
    let db = TestDb::new().await;
    let mut daemon = Daemon::start(Spec::new(&db.url).env("RUST_LOG", "info")).await;
    daemon
        .create_order(ALICE, "hup-secret-1", &order("hup-secret-1"))
        .await
        .expect(201);

    // The configuration: the password's line broken.
    daemon.write_raw_config(&format!(
        "[database]\nurl = \"postgresql://app:{PASSWORD}@db/app\n"
    ));
    daemon.signal(Signal::SIGHUP);
    let line = daemon
        .wait_for_log(&["configuration reload rejected"])
        .await;
    assert!(line.contains("line 2, column"), "{line}");
    assert!(line.contains("database.url"), "{line}");

    // The tokens file: a raw token pasted where a digest entry belongs. The configuration is
    // valid again so the reload reaches the tokens file.
    daemon.rewrite_config("");
    std::fs::write(&daemon.tokens_path, format!("token = \"{RAW_TOKEN}\"\n")).unwrap();
    daemon.signal(Signal::SIGHUP);
    let line = daemon.wait_for_log(&["API reload failed", "tokens"]).await;
    assert!(line.contains("line 1, column"), "{line}");
    // And a digest given without quotes.
    std::fs::write(
        &daemon.tokens_path,
        format!("[[token]]\nsha256 = {RAW_TOKEN}\ntenant = \"a\"\nprincipal = \"b\"\n"),
    )
    .unwrap();
    daemon.signal(Signal::SIGHUP);
    let rejected = || {
        daemon
            .log()
            .lines()
            .filter(|l| l.contains("API reload failed"))
            .count()
    };
    let deadline = std::time::Instant::now() + PATIENCE;
    while rejected() < 2 {
        assert!(std::time::Instant::now() < deadline, "{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The old tokens stay in force.
    daemon
        .create_order(ALICE, "hup-secret-2", &order("hup-secret-2"))
        .await
        .expect(201);

    daemon.stop().await;
    let log = daemon.log();
    for secret in [PASSWORD, RAW_TOKEN] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}
