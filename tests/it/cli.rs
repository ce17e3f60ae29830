//! The binary's edge, run for real: a printing command whose standard output is closed ends
//! quietly (exit 0, nothing on stderr, as `rg ... | head` does), a failure is reported once, and
//! `cleanup` takes SIGTERM/SIGINT as every command does (first: stop after the batch; second:
//! exit 130 at once).

use std::os::fd::OwnedFd;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::cleanup_support::{
    counts, nth_live, seed_live, wait_until_cleaner_waits, wait_until_gone, Reader, BARRIER, DUE,
};
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
        &["status"],
        &["status", "--json"],
        &["outbox", "list"],
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

/// `tombstoned cleanup` with batches of 10 over 30 due rows, its second batch blocked on a
/// replay reader's row lock; stderr goes to a file the test polls.
struct BlockedCleanup {
    _db: TestDb,
    observer: tokio_postgres::Client,
    reader: Reader,
    child: tokio::process::Child,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl BlockedCleanup {
    async fn start() -> Self {
        let db = TestDb::new().await;
        let observer = db.client().await;
        seed_live(&observer, "signal", 30, DUE).await;
        let held = nth_live(&observer, 15).await;
        let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr.log");
        let child = tokio::process::Command::new(binary())
            .args(["cleanup", "--batch-size", "10"])
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", &db.url)
            .env("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s")
            .env("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        wait_until_cleaner_waits(&observer).await;
        BlockedCleanup {
            _db: db,
            observer,
            reader,
            child,
            stderr,
            _dir: dir,
        }
    }

    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits until the command says it will stop after its batch: the signal was handled.
    async fn wait_stopping(&self) {
        let deadline = Instant::now() + BARRIER;
        while !std::fs::read_to_string(&self.stderr)
            .unwrap_or_default()
            .contains("stopping after the current batch")
        {
            assert!(
                Instant::now() < deadline,
                "the first signal was not handled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn cleanup_stops_after_its_batch_on_a_signal_and_exits_at_once_on_a_second() {
    // First signal: the blocked batch finishes when the reader lets go, then the run stops.
    let graceful = BlockedCleanup::start().await;
    graceful.signal(Signal::SIGTERM);
    graceful.wait_stopping().await;
    let BlockedCleanup {
        observer,
        reader,
        child,
        ..
    } = graceful;
    reader.commit().await;
    let output = tokio::time::timeout(BARRIER, child.wait_with_output())
        .await
        .expect("the run stops after its batch")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("cleanup stopped by a signal"), "{stdout}");
    assert!(stdout.contains("rows tombstoned   20"), "{stdout}");
    assert_eq!(counts(&observer).await.0, 20);

    // Second signal: exit 130 at once, without waiting for the blocked batch.
    let mut hurried = BlockedCleanup::start().await;
    hurried.signal(Signal::SIGINT);
    hurried.wait_stopping().await;
    let second = Instant::now();
    hurried.signal(Signal::SIGTERM);
    let status = tokio::time::timeout(BARRIER, hurried.child.wait())
        .await
        .expect("a second signal ends the command")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(
        second.elapsed() < Duration::from_secs(3),
        "{:?}",
        second.elapsed()
    );
    let stderr = std::fs::read_to_string(&hurried.stderr).unwrap();
    assert!(
        stderr.contains("second signal: exiting at once"),
        "{stderr}"
    );
    // The batch it left applies whole or not at all (its COMMIT was already sent).
    hurried.reader.commit().await;
    wait_until_gone(&hurried.observer, "tombstoned/cleanup").await;
    let tombstones = counts(&hurried.observer).await.0;
    assert!(tombstones == 10 || tombstones == 20, "{tombstones}");
}

#[tokio::test]
async fn serve_with_an_unusable_tokens_file_exits_64() {
    let db = TestDb::new().await;
    let url = db.url.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary())
            .arg("serve")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", url)
            .env("TOMBSTONED_API__TOKENS_FILE", "/nonexistent/tokens.toml")
            .env("TOMBSTONED_API__LISTEN", "127.0.0.1:0")
            .env("TOMBSTONED_METRICS__LISTEN", "127.0.0.2:0")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("tombstoned: error: cannot read tokens file /nonexistent/tokens.toml: "),
        "{stderr}"
    );
}

/// `tombstoned <command>` with only `env` set; no database is reached before the tokens file.
fn tokens_run(command: &str, env: &[(&str, &str)]) -> Output {
    Command::new(binary())
        .arg(command)
        .env_clear()
        .env(
            "TOMBSTONED_DATABASE_URL",
            "postgresql://nobody@127.0.0.1:1/none",
        )
        .env("TOMBSTONED_API__LISTEN", "127.0.0.1:0")
        .env("TOMBSTONED_METRICS__LISTEN", "127.0.0.2:0")
        .envs(env.iter().copied())
        .current_dir(repo_root())
        .output()
        .unwrap()
}

/// `check-config` reads the tokens file as `serve` does: a missing or broken one is the same
/// line and exit 64 from both, not "configuration OK" then a failed start (issue 27 item 1).
#[test]
fn check_config_refuses_an_unusable_tokens_file_as_serve_does() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[[token]]\nsha256 = 3\n").unwrap();
    let broken = broken.display().to_string();
    for (file, expected) in [
        (
            "/nonexistent/tokens.toml",
            "cannot read tokens file /nonexistent/tokens.toml: ",
        ),
        (broken.as_str(), "invalid tokens file "),
    ] {
        let env = [("TOMBSTONED_API__TOKENS_FILE", file)];
        let checked = tokens_run("check-config", &env);
        let served = tokens_run("serve", &env);
        let stderr = String::from_utf8_lossy(&checked.stderr);
        assert_eq!(checked.status.code(), Some(64), "{file}: {stderr}");
        assert!(checked.stdout.is_empty(), "{file}");
        assert!(
            stderr.starts_with(&format!("tombstoned: error: {expected}")),
            "{file}: {stderr}"
        );
        assert_eq!(served.status.code(), Some(64), "{file}");
        assert_eq!(
            stderr,
            String::from_utf8_lossy(&served.stderr),
            "{file}: the same line as serve's"
        );
    }

    // A good file: counted; with the API off neither command reads it.
    let good = tokens_run(
        "check-config",
        &[("TOMBSTONED_API__TOKENS_FILE", "config/tokens.toml")],
    );
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert_eq!(good.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("api: enabled on 127.0.0.1:0 (4 tokens in config/tokens.toml); "),
        "{stdout}"
    );
    let off = tokens_run(
        "check-config",
        &[
            ("TOMBSTONED_API__TOKENS_FILE", "/nonexistent/tokens.toml"),
            ("TOMBSTONED_API__ENABLED", "false"),
        ],
    );
    assert_eq!(off.status.code(), Some(0), "{off:?}");
    assert!(String::from_utf8_lossy(&off.stdout).contains("api: disabled on 127.0.0.1:0; "));
}

/// The database URL: any variable wins over the file (TOMBSTONED_DATABASE_URL, then
/// TOMBSTONED_DATABASE__URL, then DATABASE_URL), and `check-config` says where it came from;
/// README's check-config sample shows the line the shipped configuration gives (issue 27 item 3).
#[test]
fn check_config_says_where_the_database_url_came_from() {
    let run = |env: &[(&str, &str)]| {
        let out = Command::new(binary())
            .args(["--config", "config/tombstoned.toml", "check-config"])
            .env_clear()
            .envs(env.iter().copied())
            .current_dir(repo_root())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{env:?}: {out:?}");
        stdout
            .lines()
            .find(|l| l.starts_with("database: "))
            .unwrap_or_else(|| panic!("{env:?}: no database line in {stdout}"))
            .to_owned()
    };
    let rest = "; schema tombstoned, pool 16 connections)";
    let from_file = run(&[]);
    assert_eq!(
        from_file,
        format!(
            "database: postgresql://tombstoned@localhost/app (from the file's database.url{rest}"
        )
    );
    let generic = ("DATABASE_URL", "postgresql://generic@h/db");
    assert_eq!(
        run(&[generic]),
        format!("database: postgresql://generic@h/db (from DATABASE_URL{rest}"),
        "DATABASE_URL wins over the shipped file's database.url"
    );
    let sectioned = ("TOMBSTONED_DATABASE__URL", "postgresql://sectioned@h/db");
    assert_eq!(
        run(&[generic, sectioned]),
        format!("database: postgresql://sectioned@h/db (from TOMBSTONED_DATABASE__URL{rest}")
    );
    assert_eq!(
        run(&[
            generic,
            sectioned,
            ("TOMBSTONED_DATABASE_URL", "postgresql://specific@h/db")
        ]),
        format!("database: postgresql://specific@h/db (from TOMBSTONED_DATABASE_URL{rest}")
    );
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("\n{from_file}\n")),
        "README's check-config sample lacks {from_file:?}"
    );
}

/// `outbox requeue` without a target names both ways to give one, `--event` and
/// `--all-dead-letters`, and still refuses both at once (exit 64, a usage error; issue 27).
#[test]
fn outbox_requeue_without_a_target_names_both_options() {
    let run = |args: &[&str]| {
        Command::new(binary())
            .args(["outbox", "requeue"])
            .args(args)
            .env_clear()
            .output()
            .unwrap()
    };
    let none = run(&[]);
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("--event <EVENT_ID>"), "{stderr}");
    assert!(stderr.contains("--all-dead-letters"), "{stderr}");
    let id = "00000000-0000-0000-0000-000000000007";
    let both = run(&["--event", id, "--all-dead-letters"]);
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert_eq!(both.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// `tombstoned --help` ends with every exit status and its meaning, rendered from `exit::Exit`
/// like the man page's EXIT STATUS and the README's table (issue 42, friction); `demo --help`
/// no longer lists the `--config` the demo refuses, which still exits 64.
#[test]
fn help_names_the_exit_statuses_and_demo_help_hides_config() {
    let help = |args: &[&str]| {
        let out = Command::new(binary())
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = help(&["--help"]);
    let statuses = text
        .split("\nExit status:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no exit statuses after the options:\n{text}"));
    let flowing = statuses.split_whitespace().collect::<Vec<_>>().join(" ");
    for exit in tombstoned::exit::Exit::ALL {
        let meaning = exit.meaning().replace('`', "");
        let meaning = meaning.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flowing.contains(&format!("{} {meaning}", exit.code())),
            "{} missing or different:\n{statuses}",
            exit.code()
        );
    }
    assert!(statuses.lines().all(|l| l.len() <= 100), "{statuses}");
    #[cfg(feature = "demo")]
    assert!(!help(&["demo", "--help"]).contains("--config"));
}

/// `migrate` on a current schema: PostgreSQL's NOTICEs ("schema ... already exists, skipping")
/// are logged at DEBUG, not INFO, and a JSON line carries no source path of the build machine
/// (the driver's own `log` record did, through the log bridge) (issue 27, friction).
#[tokio::test]
async fn migrate_logs_server_notices_at_debug_without_a_source_path() {
    use crate::conn_support::run_binary;
    let db = TestDb::new().await;
    let json = ["--log-format", "json", "migrate"];
    let first = run_binary(&json, &db.url, &[]).await;
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let at_info = run_binary(&json, &db.url, &[]).await;
    assert_eq!(at_info.code, Some(0), "{}", at_info.stderr);
    assert!(
        !at_info.stderr.contains("already exists"),
        "a notice at INFO: {}",
        at_info.stderr
    );
    let at_debug = run_binary(&json, &db.url, &[("RUST_LOG", "debug")]).await;
    assert_eq!(at_debug.code, Some(0), "{}", at_debug.stderr);
    let notices: Vec<serde_json::Value> = at_debug
        .stderr
        .lines()
        .filter(|l| l.contains("already exists"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        !notices.is_empty(),
        "no notice at DEBUG: {}",
        at_debug.stderr
    );
    for notice in &notices {
        assert_eq!(notice["level"], "DEBUG", "{notice}");
        assert_eq!(notice["severity"], "NOTICE", "{notice}");
        assert!(notice.get("log.file").is_none(), "{notice}");
        assert!(!notice.to_string().contains(".cargo/registry"), "{notice}");
    }
}
