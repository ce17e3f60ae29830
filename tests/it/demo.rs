//! `tombstoned demo` end to end (the debug binary): the story's real status codes, exit 0, and
//! nothing left behind — no cluster or configuration directory, no process, no listener.

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::harness::binary;

/// The text after `prefix` up to the next character in `stop` (or the end of the line).
fn field<'a>(stdout: &'a str, prefix: &str, stop: &[char]) -> &'a str {
    let start = stdout
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{stdout}"))
        + prefix.len();
    let rest = &stdout[start..];
    let end = rest
        .find(|c: char| c == '\n' || stop.contains(&c))
        .unwrap_or(rest.len());
    &rest[..end]
}

fn demo_command() -> Command {
    let mut command = Command::new(binary());
    command
        .arg("demo")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    // The PostgreSQL 18 run points the harness (and so the demo) at other binaries.
    if let Some(bin) = std::env::var_os("TOMBSTONED_PG_BIN") {
        command.env("TOMBSTONED_PG_BIN", bin);
    }
    command
}

/// Runs `command` to its end off the async runtime.
async fn output_of(mut command: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(needle))
        .collect()
}

#[tokio::test]
async fn the_demo_tells_the_story_with_real_status_codes_and_leaves_nothing_behind() {
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(|| demo_command().output().unwrap())
        .await
        .unwrap();
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(took < Duration::from_secs(60), "the demo took {took:?}");
    eprintln!("tombstoned demo took {took:?}");

    let request_id = field(&stdout, "orders for ", &[':']);
    for expected in [
        "[1/10] A throwaway PostgreSQL cluster",
        "schema tombstoned migrated: V1__initial_schema",
        "-> 201 Created  Location: /v1/orders/",
        "-> 201 Created  Idempotent-Replayed: true  (body identical to the first answer's",
        "-> 422 Unprocessable Entity  idempotency-key-reused",
        "| dry run at cutoff",
        "|   rows due          0 (0 batches of 1000)",
        "|   live records      1",
        "completed: a retry replays",
        "expired and tombstoned at",
        "-> 410 Gone  replay-window-expired  order_url: /v1/orders/",
        &format!("-> 200; orders for {request_id}: 1"),
        "|   \"state\": \"expired\",",
        "| tombstoned_claims_total{outcome=\"created\"} 1",
        "| tombstoned_claims_total{outcome=\"replayed\"} 1",
        "| tombstoned_claims_total{outcome=\"key_reused\"} 1",
        "| tombstoned_claims_total{outcome=\"expired\"} 1",
        "| tombstoned_cleanup_rows_tombstoned_total 1",
        "| tombstoned_cleanup_runs_total{outcome=\"success\"}",
        "Done in ",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing:\n{stdout}");
    }
    // The key status never shows a body, and the order's URL is the one the 201 gave.
    let location = field(&stdout, "201 Created  Location: ", &[' ']);
    assert_eq!(field(&stdout, "order_url: ", &[' ']), location);
    assert!(!stdout.contains("\"response_body\""));

    assert_nothing_left(&stdout).await;
}

/// Nothing of the demo that printed `stdout` is left: directories, processes, listeners.
async fn assert_nothing_left(stdout: &str) {
    let cluster_dir = field(stdout, "data in ", &[' ']);
    let workdir = field(stdout, "config ", &[':']);
    let workdir = Path::new(workdir).parent().unwrap();
    assert!(
        cluster_dir.starts_with("/tmp/tombstoned-pg."),
        "{cluster_dir}"
    );
    assert!(
        !Path::new(cluster_dir).exists(),
        "{cluster_dir} left behind"
    );
    assert!(!workdir.exists(), "{} left behind", workdir.display());
    let daemon_pid = field(stdout, "pid ", &[';']);
    assert!(
        !Path::new("/proc").join(daemon_pid).exists(),
        "the daemon ({daemon_pid}) is still running"
    );
    for needle in [cluster_dir, workdir.to_str().unwrap()] {
        assert_eq!(processes_mentioning(needle), Vec::<String>::new());
    }
    let ports = [
        field(stdout, "PostgreSQL on 127.0.0.1:", &[' ']),
        field(stdout, "API on http://127.0.0.1:", &[',']),
        field(stdout, "metrics on http://127.0.0.1:", &[' ']),
    ];
    for port in ports {
        let port: u16 = port.parse().unwrap();
        assert!(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err(),
            "something still listens on port {port}"
        );
    }
}

#[tokio::test]
async fn the_demo_without_postgresql_exits_69_saying_how_to_install_it() {
    let mut command = demo_command();
    command.env("TOMBSTONED_PG_BIN", "/nonexistent");
    let output = output_of(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.starts_with(
            "tombstoned: error: cannot start a throwaway PostgreSQL cluster: PostgreSQL server \
             binaries not found"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("apt-get install postgresql"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // It says exactly what was searched: with TOMBSTONED_PG_BIN set, that directory alone, not
    // $PATH (issue 27 item 7).
    assert!(
        stderr.contains(
            "(looked in TOMBSTONED_PG_BIN=/nonexistent only: no initdb, pg_ctl, postgres there;"
        ),
        "{stderr}"
    );
    assert!(
        !stderr.contains("looked in $TOMBSTONED_PG_BIN, $PATH"),
        "{stderr}"
    );
}

/// `demo --config PATH` is refused (exit 64), not accepted and ignored: the demo writes its own
/// configuration around its throwaway cluster (issue 27 item 7). TOMBSTONED_CONFIG in the
/// environment is not a request of this command line: the demo runs.
#[tokio::test]
async fn the_demo_refuses_a_config_flag() {
    let mut flag_after = demo_command();
    flag_after.args(["--config", "/etc/tombstoned/tombstoned.toml"]);
    let output = output_of(flag_after).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.starts_with("tombstoned: demo takes no --config: it writes its own configuration"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "{output:?}");
    // Before the subcommand, the same.
    let mut flag_before = Command::new(binary());
    flag_before.args(["--config", "x.toml", "demo"]).env_clear();
    let output = output_of(flag_before).await;
    assert_eq!(output.status.code(), Some(64), "{output:?}");
}

/// `demo ARGS` started with its stdout and stderr piped, its stdout read up to the first line
/// starting with `until`: the child, what it printed so far, and the rest of its stdout.
pub(crate) async fn demo_until(
    args: &[&str],
    until: &'static str,
) -> (Child, String, BufReader<ChildStdout>) {
    let mut command = demo_command();
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (printed, reader) = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut printed = String::new();
        loop {
            let mut line = String::new();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "the demo ended before a line {until:?}:\n{printed}"
            );
            printed.push_str(&line);
            if line.starts_with(until) {
                return (printed, reader);
            }
        }
    })
    .await
    .unwrap();
    (child, printed, reader)
}

/// The demo, read up to step 3: the daemon is up, the story under way.
async fn demo_in_its_story() -> (Child, String, BufReader<ChildStdout>) {
    demo_until(&[], "[3/10]").await
}

/// Sends `signals` to the demo, one after the other, then waits for it: its exit code, the rest
/// of its stdout and its stderr.
pub(crate) async fn signal_and_wait(
    mut child: Child,
    mut reader: BufReader<ChildStdout>,
    signals: &[Signal],
) -> (Option<i32>, String, String) {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
    for signal in signals {
        kill(pid, *signal).unwrap();
    }
    tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (child.wait().unwrap().code(), rest, stderr)
    })
    .await
    .unwrap()
}

/// One Ctrl-C during the story: the story stops, everything is torn down, and the demo exits 0
/// — a clean teardown, which a script tells from a cut-short one (130, below) by the status
/// alone (issue 42 item 7).
#[tokio::test]
async fn one_signal_during_the_story_tears_everything_down_and_exits_0() {
    let (child, printed, reader) = demo_in_its_story().await;
    let (code, rest, stderr) = signal_and_wait(child, reader, &[Signal::SIGINT]).await;
    let stdout = format!("{printed}{rest}");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.trim_end().ends_with(
            "Interrupted: the daemon is stopped, the cluster and the files are removed."
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("Done"), "{stdout}");
    assert!(stderr.is_empty(), "{stderr}");
    assert_nothing_left(&stdout).await;
}

/// A second signal during the teardown the first one started ends the demo at once with 130,
/// leaving what was not yet removed (which this test then removes).
#[tokio::test]
async fn a_second_signal_during_the_teardown_exits_130_at_once() {
    let (child, printed, reader) = demo_in_its_story().await;
    // Two kinds, so the second cannot merge with the first into one delivery: the first starts
    // the teardown (a SIGTERM to the daemon and its drain, then the cluster's stop, hundreds of
    // milliseconds of other processes' work), the second arrives inside it.
    let (code, rest, stderr) =
        signal_and_wait(child, reader, &[Signal::SIGINT, Signal::SIGTERM]).await;
    let stdout = format!("{printed}{rest}");
    assert_eq!(code, Some(130), "{stdout}\n{stderr}");
    assert!(!stdout.contains("Interrupted:"), "{stdout}");
    assert!(
        stderr.contains("second signal: exiting at once"),
        "{stderr}"
    );

    // What the cut-short teardown may have left: the daemon (when its SIGTERM was not sent yet)
    // and the demo's directory. The cluster goes by itself: its supervisor stops and deletes it
    // when the demo's end closes the pipe it waits on (`pg_cluster`).
    let daemon_pid: i32 = field(&stdout, "pid ", &[';']).parse().unwrap();
    let _ = kill(Pid::from_raw(daemon_pid), Signal::SIGKILL);
    let workdir = Path::new(field(&stdout, "config ", &[':']))
        .parent()
        .unwrap();
    let _ = std::fs::remove_dir_all(workdir);
}
