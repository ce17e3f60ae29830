//! The progress line of long runs (issue 43), seen from outside: the binary run with stderr on a
//! real pseudo-terminal — util-linux's `script` (in Debian's essential `bsdutils`), the command's
//! stdout redirected to a file so only stderr reaches the terminal — and, for comparison, the same
//! scenario without a terminal. The line appears, advances monotonically and ends at the count
//! due at the start; the report on stdout is what the same run prints without a terminal; and
//! without a terminal, with `--json`, with `--quiet` or under systemd there is no line at all.
//! `migrate`'s line, held at a lock by a real session (a `pg_stat_activity` barrier), says what
//! it waits for; an index build's phase and blocks are read as another session sees them.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::Value;

use crate::cleanup_support::{seed_live, seed_live_before_v5, DUE};
use crate::harness::{binary, wait_until_app_lock_wait, TestDb};
use crate::outbox_support::{secret_file, seed_events, Behaviour, Receiver};

const PATIENCE: Duration = Duration::from_secs(30);

/// What a run printed: its exit status, what its terminal received (stderr) and its stdout.
struct Printed {
    code: Option<i32>,
    terminal: String,
    stdout: String,
}

/// A shell word.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `tombstoned ARGS` with `env`, its stderr on a pseudo-terminal of 200 columns (`TERM=xterm`),
/// its stdout into `out`. Returns the `script` process, its terminal's bytes read as they come.
fn spawn_on_terminal(
    args: &[&str],
    env: &[(&str, &str)],
    out: &std::path::Path,
) -> (std::process::Child, Arc<Mutex<Vec<u8>>>) {
    let words: Vec<String> = args.iter().map(|a| quoted(a)).collect();
    let command = format!(
        "stty cols 200 rows 50; exec {} {} > {}",
        quoted(binary()),
        words.join(" "),
        quoted(&out.display().to_string())
    );
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TERM", "xterm")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("util-linux script");
    let received = Arc::new(Mutex::new(Vec::new()));
    let mut pty = child.stdout.take().unwrap();
    let sink = Arc::clone(&received);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pty.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (child, received)
}

/// [`spawn_on_terminal`], to the end.
async fn on_terminal(args: &[&str], env: &[(&str, &str)]) -> Printed {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("stdout");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (mut child, received) = spawn_on_terminal(&args, &env, &out);
        let status = child.wait().unwrap();
        // The reader ends at the terminal's end of file.
        let deadline = Instant::now() + PATIENCE;
        while Arc::strong_count(&received) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let terminal = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
        Printed {
            code: status.code(),
            terminal,
            stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        }
    })
    .await
    .unwrap()
}

/// `tombstoned ARGS` with `env`, no terminal anywhere: (exit status, stdout, stderr).
async fn off_terminal(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(binary())
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The frames of the progress lines starting with `prefix` that a terminal received, in order
/// (escape sequences removed, split at carriage returns and newlines).
fn frames(terminal: &str, prefix: &str) -> Vec<String> {
    let escapes = Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap();
    escapes
        .replace_all(terminal, "")
        .split(['\r', '\n'])
        .map(str::trim_end)
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// `(position, total)` of each frame matching `counted` (`cleanup (\d+)/(\d+) rows ...`).
fn counts(frames: &[String], counted: &Regex) -> Vec<(u64, u64)> {
    frames
        .iter()
        .filter_map(|f| {
            let c = counted.captures(f)?;
            Some((c[1].parse().unwrap(), c[2].parse().unwrap()))
        })
        .collect()
}

/// The line appeared, several times between start and end, never went back, and ended at
/// `due`, the total all along.
fn assert_advances_to(counts: &[(u64, u64)], due: u64, terminal: &str) {
    assert!(
        !counts.is_empty(),
        "no progress line on the terminal:\n{terminal:?}"
    );
    assert!(counts.iter().all(|(_, total)| *total == due), "{counts:?}");
    assert!(
        counts.windows(2).all(|w| w[0].0 <= w[1].0),
        "the line went back: {counts:?}"
    );
    let between: std::collections::BTreeSet<u64> = counts
        .iter()
        .map(|(pos, _)| *pos)
        .filter(|pos| *pos > 0 && *pos < due)
        .collect();
    assert!(
        between.len() >= 2,
        "fewer than two updates during the run: {counts:?}"
    );
    assert_eq!(counts.last().map(|c| c.0), Some(due), "{counts:?}");
}

/// A cleanup report with its timings (which differ from run to run) masked: cutoff, duration,
/// rates, slowest batch, throttled time.
fn without_timings(report: &str) -> String {
    let number = Regex::new(r"\d+(\.\d+)?").unwrap();
    report
        .lines()
        .map(|line| {
            let label = line.trim_start();
            if [
                "cleanup finished (cutoff",
                "duration",
                "rows/s",
                "slowest batch",
                "throttled",
            ]
            .iter()
            .any(|volatile| label.starts_with(volatile))
            {
                number.replace_all(line, "N").into_owned()
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The JSON report without the fields that differ from run to run.
fn json_without_timings(text: &str) -> Value {
    let mut value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    for key in [
        "cutoff",
        "duration_seconds",
        "rows_per_second",
        "slowest_batch_seconds",
        "batch_p99_seconds",
        "throttled_rate_seconds",
        "throttled_replica_lag_seconds",
    ] {
        value.as_object_mut().unwrap().remove(key);
    }
    value
}

const ROWS: u64 = 3000;

/// A database with `ROWS` records due.
async fn seeded() -> TestDb {
    let db = TestDb::new().await;
    seed_live(&db.client().await, "due", ROWS as i64, DUE).await;
    db
}

/// The environment of a paced run on `db`: 100 rows per batch, `ROWS` rows per second.
fn paced(db: &TestDb) -> Vec<(String, String)> {
    vec![
        ("TOMBSTONED_DATABASE_URL".to_owned(), db.url.clone()),
        (
            "TOMBSTONED_CLEANUP__BATCH_SIZE".to_owned(),
            "100".to_owned(),
        ),
        (
            "TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND".to_owned(),
            ROWS.to_string(),
        ),
    ]
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// `cleanup` on a terminal: 3000 rows due, 100 per batch at 3000 rows/s (a second of work,
/// several redraws); the same scenario without a terminal, and with `--json` on a terminal and
/// off; `--quiet` and systemd's variables on a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_shows_its_progress_on_a_terminal_only() {
    let (a, b, c, d, e) = tokio::join!(seeded(), seeded(), seeded(), seeded(), seeded());
    let (env_a, env_b, env_c, env_d) = (paced(&a), paced(&b), paced(&c), paced(&d));
    let (env_a, env_b, env_c, env_d) = (
        borrowed(&env_a),
        borrowed(&env_b),
        borrowed(&env_c),
        borrowed(&env_d),
    );
    let (terminal, plain, terminal_json, plain_json) = tokio::join!(
        on_terminal(&["cleanup"], &env_a),
        off_terminal(&["cleanup"], &env_b),
        on_terminal(&["cleanup", "--json"], &env_c),
        off_terminal(&["cleanup", "--json"], &env_d),
    );

    assert_eq!(terminal.code, Some(0), "{}", terminal.terminal);
    let lines = frames(&terminal.terminal, "cleanup ");
    let counted = Regex::new(r"^cleanup (\d+)/(\d+) rows tombstoned").unwrap();
    assert_advances_to(&counts(&lines, &counted), ROWS, &terminal.terminal);
    let last = lines.last().unwrap();
    assert!(
        last.contains(" 30 batches, 0 lock timeouts, 0 rows skipped"),
        "{last}"
    );
    // The report is the one the same run prints without a terminal (timings aside), and the
    // line never reached stdout.
    assert_eq!(plain.0, Some(0), "{}", plain.2);
    assert!(
        plain.1.starts_with("cleanup finished (cutoff "),
        "{}",
        plain.1
    );
    assert_eq!(without_timings(&terminal.stdout), without_timings(&plain.1));
    // Without a terminal: not a trace of a line on stderr either.
    for stderr in [&plain.2, &plain_json.2] {
        assert!(
            !stderr.contains("rows tombstoned") && !stderr.contains('\r'),
            "{stderr}"
        );
        assert!(!stderr.contains('\x1b'), "{stderr}");
    }
    // --json on a terminal: no line; the JSON is the one printed without a terminal.
    assert_eq!(terminal_json.code, Some(0));
    assert!(
        frames(&terminal_json.terminal, "cleanup ").is_empty(),
        "{}",
        terminal_json.terminal
    );
    assert_eq!(plain_json.0, Some(0));
    assert_eq!(
        json_without_timings(&terminal_json.stdout),
        json_without_timings(&plain_json.1)
    );
    assert_eq!(json_without_timings(&plain_json.1)["rows_tombstoned"], ROWS);

    // --quiet, and a terminal under systemd (a unit's INVOCATION_ID, a journal stream): no line.
    for (extra, db_env) in [
        (vec!["--quiet"], vec![]),
        (
            vec![],
            vec![("INVOCATION_ID", "4f6e0f3c2b1a4d5e8f9a0b1c2d3e4f50")],
        ),
        (vec![], vec![("JOURNAL_STREAM", "8:12345")]),
    ] {
        let mut env = vec![("TOMBSTONED_DATABASE_URL", e.url.as_str())];
        env.extend(db_env);
        let mut args = vec!["cleanup"];
        args.extend(extra);
        let run = on_terminal(&args, &env).await;
        assert_eq!(run.code, Some(0), "{args:?} {env:?}: {}", run.terminal);
        assert!(
            frames(&run.terminal, "cleanup ").is_empty(),
            "{args:?} {env:?}: {}",
            run.terminal
        );
        assert!(run.stdout.starts_with("cleanup finished"), "{}", run.stdout);
    }
}

/// `outbox deliver` on a terminal: 12 events, one at a time, each answered after 60 ms; the
/// report is the one the same delivery prints without a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_deliver_shows_its_progress_on_a_terminal() {
    const EVENTS: u64 = 12;
    let (dir, secret) = secret_file();
    let secret = secret.display().to_string();
    let counted = Regex::new(r"^outbox deliver (\d+)/(\d+) events").unwrap();
    let mut runs = Vec::new();
    for on_a_terminal in [true, false] {
        let db = TestDb::new().await;
        seed_events(&db.client().await, EVENTS as usize, 1).await;
        let receiver = Receiver::start(&db).await;
        receiver.set_default(Behaviour::Slow(Duration::from_millis(60)));
        let env = [
            ("TOMBSTONED_DATABASE_URL", db.url.as_str()),
            ("TOMBSTONED_OUTBOX__ENDPOINT", receiver.url.as_str()),
            ("TOMBSTONED_OUTBOX__SECRET_FILE", secret.as_str()),
            ("TOMBSTONED_OUTBOX__CONCURRENCY", "1"),
        ];
        let printed = if on_a_terminal {
            on_terminal(&["outbox", "deliver"], &env).await
        } else {
            let (code, stdout, stderr) = off_terminal(&["outbox", "deliver"], &env).await;
            assert!(
                !stderr.contains("outbox deliver ") && !stderr.contains('\r'),
                "{stderr}"
            );
            Printed {
                code,
                terminal: stderr,
                stdout,
            }
        };
        assert_eq!(
            printed.code,
            Some(0),
            "{}{}",
            printed.stdout,
            printed.terminal
        );
        let stats = receiver.stats();
        assert_eq!((stats.requests, stats.bad_signatures), (EVENTS, 0));
        runs.push(printed.stdout.replace(&receiver.url, "ENDPOINT"));
        if on_a_terminal {
            let lines = frames(&printed.terminal, "outbox deliver ");
            assert_advances_to(&counts(&lines, &counted), EVENTS, &printed.terminal);
            assert!(lines
                .last()
                .unwrap()
                .contains(&format!(" {EVENTS} delivered, 0 retry scheduled")));
        }
    }
    drop(dir);
    assert_eq!(runs[0], runs[1]);
    assert!(runs[0].starts_with("outbox delivery to ENDPOINT: 12 events attempted\n"));
}

/// `migrate` on a terminal, from V4 (the last schema before V5's rewrite of the records table),
/// while a session reads the table: V5's first statement waits for it, and the line says which
/// migration, for how long, and the lock it waits for and who holds it. Then the reader ends and
/// the migrations apply; stdout is exactly what the same migration prints without a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_shows_the_lock_its_migration_waits_for() {
    let mut outputs = Vec::new();
    for on_a_terminal in [true, false] {
        let db = TestDb::empty().await;
        crate::schema_support::migrate_to(&db, 4).await;
        let client = db.client().await;
        seed_live_before_v5(&client, "old", 20, DUE).await;
        let env = [("TOMBSTONED_DATABASE_URL", db.url.as_str())];
        if !on_a_terminal {
            let (code, stdout, stderr) = off_terminal(&["migrate"], &env).await;
            assert_eq!(code, Some(0), "{stderr}");
            assert!(
                !stderr.contains("V5__compact_records (") && !stderr.contains('\r'),
                "{stderr}"
            );
            outputs.push(stdout);
            continue;
        }
        let reader = db.client().await;
        let reader_pid = crate::api_support::backend_pid(&reader).await;
        reader
            .batch_execute("BEGIN; SELECT count(*) FROM idempotency_records")
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("stdout");
        let (mut child, received) = spawn_on_terminal(&["migrate"], &env, &out);
        // The barrier: the migrate session waits for the reader's lock...
        let observer = db.client().await;
        wait_until_app_lock_wait(&observer, "tombstoned/migrate", PATIENCE).await;
        // ...and the terminal says so.
        let wanted = format!(
            "V5__compact_records (1 of {}), ",
            crate::schema_support::versions_after(4).len()
        );
        let waiting = format!(
            ": waiting for AccessExclusiveLock on tombstoned.idempotency_records held by pid {reader_pid}"
        );
        let deadline = Instant::now() + PATIENCE;
        let seen = loop {
            let terminal = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
            if let Some(frame) = frames(&terminal, "migrate ")
                .into_iter()
                .find(|f| f.contains(&wanted) && f.contains(&waiting))
            {
                break frame;
            }
            assert!(
                Instant::now() < deadline,
                "no such line on the terminal:\n{terminal:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(seen.starts_with("migrate V5__compact_records"), "{seen}");
        reader.batch_execute("COMMIT").await.unwrap();
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        assert_eq!(status.code(), Some(0));
        outputs.push(std::fs::read_to_string(&out).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
    assert!(
        outputs[0].starts_with("applied V5__compact_records\n"),
        "{}",
        outputs[0]
    );
}

/// An index build as the migration's watcher reads it (`pg_stat_progress_create_index`): a
/// `CREATE INDEX` whose expression waits on an advisory lock the test holds, so the build is
/// caught in its table scan, with its blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_build_is_read_with_its_phase_and_blocks() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "CREATE TABLE build_me AS SELECT i FROM generate_series(1, 20000) AS i;
             CREATE FUNCTION gated(i integer) RETURNS integer LANGUAGE plpgsql IMMUTABLE AS
               $$ BEGIN PERFORM pg_advisory_xact_lock_shared(4343); RETURN i; END $$;",
        )
        .await
        .unwrap();
    admin
        .query_one("SELECT pg_advisory_lock(4343)", &[])
        .await
        .unwrap();
    let builder = db.client().await;
    let builder_pid = crate::api_support::backend_pid(&builder).await;
    let build = tokio::spawn(async move {
        builder
            .batch_execute("CREATE INDEX build_me_gated ON build_me (gated(i))")
            .await
    });
    let observer = db.client().await;
    crate::harness::wait_until_lock_wait(&observer, builder_pid, PATIENCE).await;
    let session = tombstoned::db::connect(&db.config().database, "test-watch")
        .await
        .unwrap();
    let seen = tombstoned::schema::migrations::session_activity(&session.conn(), builder_pid)
        .await
        .unwrap();
    let build_seen = seen.index_build.expect("an index build");
    assert_eq!(build_seen.phase, "building index: scanning table");
    assert_eq!(build_seen.table.as_deref(), Some("tombstoned.build_me"));
    assert!(build_seen.blocks.0 > 0, "{build_seen:?}");
    assert!(
        seen.holds
            .iter()
            .any(|h| h == "ShareLock on tombstoned.build_me"),
        "{:?}",
        seen.holds
    );
    let waits = seen.waits.expect("a lock wait");
    assert_eq!(waits.what, "advisory");
    assert_eq!(
        waits.blocked_by,
        [crate::api_support::backend_pid(&admin).await]
    );
    admin
        .query_one("SELECT pg_advisory_unlock(4343)", &[])
        .await
        .unwrap();
    build.await.unwrap().unwrap();
}
