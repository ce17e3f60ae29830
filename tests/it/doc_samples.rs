//! Every output sample of README.md and docs/*.md is what the binary prints today, run against a
//! real throwaway PostgreSQL (issue 27 items 4 and 6): a sample that drifts fails `cargo test`.
//!
//! The convention, in the Markdown:
//! - An output sample is a ```` ```console ```` block right after a line `<!-- sample: GROUP -->`
//!   or `<!-- sample: GROUP STEP -->`. Its lines starting with `$ ` are commands (a line ending
//!   in `\` continues on the next), the lines after a command up to the next one are what it
//!   prints. A group is a setting this file prepares (a database in some state, a daemon, a
//!   webhook receiver, environment variables); its blocks run in document order, and a STEP names
//!   what this file does to the group's state before that block (e.g. `after-expiry`).
//! - One sample is not a command's output but a request the relay sends: the ```` ```http ````
//!   block after `<!-- sample: webhook -->` is compared with what a listener of this file
//!   receives from `tombstoned outbox deliver` (headers as sent, in their order).
//! - Compared: the command's stdout; when it exits non-zero, its stdout and then its stderr.
//!   Commands run with `bash -c` in the repository root (the HTTP walkthrough: in a scratch
//!   directory, where its files go), the `tombstoned` under test first on `PATH`, and only the
//!   group's environment — which, as in a reader's shell, keeps what a command `export`s for
//!   the group's later commands (the walkthrough's `ORDER_ID`). `/etc/tombstoned/tombstoned.toml`
//!   in a command stands for `config/tombstoned.toml`, the file the package installs there.
//! - Volatile parts: UUIDs, RFC 3339 times and `127.0.0.1` ports are matched as any UUID, time or
//!   port on both sides, so the samples keep real values; anything else volatile (durations,
//!   process ids, temporary paths) is written `[..]` (any text within a line), and `...` alone on
//!   a line stands for any number of lines (snapbox's wildcards).
//! - Every other fenced block carries a language that says it is not output (`sh`, `sql`, `toml`,
//!   `json`, ...); an untagged block, a `console` block without a known group, or a `$ ` line in
//!   an `sh` block fails [`every_output_block_is_a_sample_this_file_runs`].
//!
//! To see a sample fail: change a line of one (e.g. `rows due` to `rows overdue`) and run
//! `cargo test --test it doc_samples`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use regex::Regex;
use snapbox::{Assert, IntoData as _, Redactions};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::cleanup_support::{seed_live, seed_tombstones, NOT_DUE};
use crate::daemon_support::{Daemon, Spec};
use crate::examples::{self, Example};
use crate::harness::{binary, TestDb};
use crate::ops_support::repo_root;
use crate::outbox_support::{secret_file, Behaviour, Receiver};

/// The groups this file knows, with the steps each accepts.
const GROUPS: &[(&str, &[&str])] = &[
    ("demo", &[]),
    ("http", &["after-expiry"]),
    ("outbox", &["more-events"]),
    ("check-config", &[]),
    ("first-run", &[]),
    ("explain", &[]),
    ("error-line", &[]),
    ("webhook", &[]),
    ("conformance", &[]),
    ("operations", &[]),
    ("progress", &[]),
    ("keys-explain", &["held-open", "tombstoned"]),
    ("sql-api", &[]),
    ("examples", &[]),
];

/// Groups whose sample is not a console block: (group, language).
const NOT_CONSOLE: &[(&str, &str)] = &[("webhook", "http")];

/// Languages of fenced blocks that are not output (code, configuration, requests to copy). The
/// README's `js` blocks quote `clients/node/samples/`, which the Node client's suite runs.
const NOT_OUTPUT: &[&str] = &[
    "sh", "sql", "toml", "ini", "json", "python", "http", "text", "yaml", "rust", "js",
];

/// The walkthrough's `RUN` in the README's outputs (the test sets the same: its database is
/// fresh, so the values are fresh there too).
const DOC_RUN: &str = "1796275288-4121";
/// The dead letter the README's `outbox requeue --event` names.
const DOC_DEAD_LETTER: &str = "01a23a59-d631-7782-8794-18478aec6c70";

/// One fenced block.
#[derive(Debug, Clone)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    /// `GROUP` and `STEP` of the `<!-- sample: ... -->` line before it.
    marker: Option<(String, Option<String>)>,
    body: String,
}

/// The Markdown files checked: README.md, docs/*.md and examples/README.md.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![repo_root().join("README.md")];
    files.extend(docs_pages());
    files.push(repo_root().join("examples/README.md"));
    files
}

/// docs/*.md, by name.
pub(crate) fn docs_pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs
}

fn blocks_of(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let file = path
        .strip_prefix(repo_root())
        .unwrap()
        .display()
        .to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(lang) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let marker = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| {
                l.trim()
                    .strip_prefix("<!-- sample:")?
                    .strip_suffix("-->")
                    .map(str::trim)
            })
            .map(|m| {
                let mut words = m.split_whitespace();
                let group = words.next().unwrap_or_default().to_owned();
                (group, words.next().map(str::to_owned))
            });
        let start = i;
        let mut body = String::new();
        i += 1;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            let line = lines[i];
            body.push_str(line.get(indent.min(line.len())..).unwrap_or(line));
            body.push('\n');
            i += 1;
        }
        blocks.push(Block {
            file: file.clone(),
            line: start + 1,
            lang: lang.trim().to_owned(),
            marker,
            body,
        });
        i += 1;
    }
    blocks
}

fn all_blocks() -> Vec<Block> {
    documents().iter().flat_map(|p| blocks_of(p)).collect()
}

/// The samples of `group`, in document order (README first, then docs/ by name).
fn samples(group: &str) -> Vec<Block> {
    let found: Vec<Block> = all_blocks()
        .into_iter()
        .filter(|b| b.marker.as_ref().is_some_and(|(g, _)| g == group))
        .collect();
    assert!(!found.is_empty(), "no sample of group {group} in the docs");
    found
}

/// The commands of a sample with what each prints.
fn commands(body: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut continuing = false;
    for line in body.lines() {
        if continuing {
            let last = out.last_mut().unwrap();
            last.0.push('\n');
            last.0.push_str(line);
            continuing = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            out.push((command.to_owned(), String::new()));
            continuing = command.ends_with('\\');
        } else if let Some(last) = out.last_mut() {
            last.1.push_str(line);
            last.1.push('\n');
        } else {
            panic!("output before the first `$ ` command:\n{body}");
        }
    }
    out
}

/// UUIDs, RFC 3339 times and loopback ports, on both sides.
fn redactions() -> &'static Redactions {
    static R: OnceLock<Redactions> = OnceLock::new();
    R.get_or_init(|| {
        let mut r = Redactions::new();
        r.insert(
            "[UUID]",
            Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap(),
        )
        .unwrap();
        r.insert(
            "[TIME]",
            Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)").unwrap(),
        )
        .unwrap();
        r.insert(
            "[PORT]",
            Regex::new(r"127\.0\.0\.1:(?<redacted>\d{2,5})").unwrap(),
        )
        .unwrap();
        r
    })
}

/// Where a group's commands run.
struct Shell {
    env: BTreeMap<String, String>,
    /// The working directory of every command.
    dir: PathBuf,
    /// Holds the file each command writes its exported environment to.
    scratch: tempfile::TempDir,
    /// Text of a command replaced before it runs.
    substitutions: Vec<(String, String)>,
    failures: Vec<String>,
}

impl Shell {
    fn new(env: &[(&str, &str)]) -> Self {
        let bin = Path::new(binary()).parent().unwrap().display().to_string();
        let path = std::env::var("PATH").unwrap_or_default();
        let mut vars: BTreeMap<String, String> =
            [("PATH".to_owned(), format!("{bin}:{path}"))].into();
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Shell {
            env: vars,
            dir: repo_root().to_owned(),
            scratch: tempfile::tempdir().unwrap(),
            substitutions: vec![(
                "/etc/tombstoned/tombstoned.toml".to_owned(),
                "config/tombstoned.toml".to_owned(),
            )],
            failures: Vec::new(),
        }
    }

    /// Runs `command`; what it exported (a variable set or changed) stays for the next ones.
    fn output(&mut self, command: &str) -> Output {
        let mut command = command.to_owned();
        for (from, to) in &self.substitutions {
            command = command.replace(from, to);
        }
        let exported = self.scratch.path().join("exported");
        let output = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{command}\nstatus=$?\nenv -0 >\"$0\"\nexit $status"
            ))
            .arg(&exported)
            .env_clear()
            .envs(&self.env)
            .current_dir(&self.dir)
            .output()
            .unwrap();
        let environment = std::fs::read(&exported).unwrap_or_default();
        for entry in String::from_utf8_lossy(&environment).split('\0') {
            // bash's own variables, which every command gets afresh.
            if let Some((name, value)) = entry.split_once('=') {
                if !["_", "PWD", "OLDPWD", "SHLVL"].contains(&name) {
                    self.env.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        let _ = std::fs::remove_file(&exported);
        output
    }

    /// `command` with stdout and stderr on a pseudo-terminal of 200 columns (util-linux's
    /// `script`, `TERM=xterm`): its exit status in `status`, and in `stdout` the terminal's
    /// screen as a person reads it at the end ([`screen`]).
    fn on_terminal(&mut self, command: &str) -> Output {
        let mut command = command.to_owned();
        for (from, to) in &self.substitutions {
            command = command.replace(from, to);
        }
        let output = Command::new("script")
            .args([
                "-q",
                "-e",
                "-c",
                &format!("stty cols 200 rows 50; {command}"),
                "/dev/null",
            ])
            .env_clear()
            .envs(&self.env)
            .env("TERM", "xterm")
            .current_dir(&self.dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        Output {
            stdout: screen(&String::from_utf8_lossy(&output.stdout)).into_bytes(),
            ..output
        }
    }

    /// Runs every command of `block` and compares; returns what each printed.
    async fn run(&mut self, block: &Block) -> Vec<String> {
        self.run_with(block, Shell::output).await
    }

    /// [`Shell::run`], each command run by `run`.
    async fn run_with(
        &mut self,
        block: &Block,
        run: impl Fn(&mut Shell, &str) -> Output,
    ) -> Vec<String> {
        let mut printed = Vec::new();
        for (command, expected) in commands(&block.body) {
            let output = tokio::task::block_in_place(|| run(self, &command));
            let mut actual = String::from_utf8_lossy(&output.stdout).into_owned();
            if !output.status.success() {
                actual.push_str(&String::from_utf8_lossy(&output.stderr));
            }
            let label = format!("{}:{}: $ {command}", block.file, block.line);
            if let Err(e) = compare(&label, &actual, &expected) {
                self.failures.push(format!(
                    "{label}\n(exit {:?}; stderr: {})\n{e}\n--- printed in full:\n{actual}",
                    output.status.code(),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            printed.push(actual);
        }
        printed
    }

    fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{} sample(s) differ from what the binary prints:\n\n{}",
            self.failures.len(),
            self.failures.join("\n\n")
        );
    }
}

/// `actual` against the sample's `expected`, both redacted; HTTP's CRLF line ends (curl -i) read
/// as LF, and trailing blank lines (a body without a final newline, the blank line before the
/// sample's next command) do not count.
fn compare(label: &str, actual: &str, expected: &str) -> Result<(), snapbox::assert::Error> {
    let actual = format!("{}\n", actual.replace("\r\n", "\n").trim_end());
    let expected = format!("{}\n", expected.trim_end());
    let r = redactions();
    Assert::new()
        .palette(snapbox::report::Palette::plain())
        .try_eq(
            Some(&label),
            r.redact(&actual).into_data(),
            r.redact(&expected).into_data(),
        )
}

/// What a terminal shows at the end of `raw` (what it received): line by line, only what the
/// last carriage return left of each (a progress line redraws itself in place), escape
/// sequences (colours, line clearing) removed, trailing blanks trimmed.
fn screen(raw: &str) -> String {
    let escapes = Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap();
    let raw = raw.replace("\r\n", "\n");
    let mut out = String::new();
    for line in raw.split('\n') {
        let shown = line.rsplit('\r').next().unwrap_or_default();
        out.push_str(escapes.replace_all(shown, "").trim_end());
        out.push('\n');
    }
    out
}

/// A real `tombstoned cleanup` run on `url` (a step of a sample group: the record's window is
/// over, the cleaner tombstones it).
fn run_cleanup(url: &str) {
    let cleanup = tokio::task::block_in_place(|| {
        Command::new(binary())
            .arg("cleanup")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", url)
            .output()
            .unwrap()
    });
    assert!(cleanup.status.success(), "{cleanup:?}");
}

fn step(block: &Block) -> Option<&str> {
    block.marker.as_ref().and_then(|(_, s)| s.as_deref())
}

#[test]
fn every_output_block_is_a_sample_this_file_runs() {
    let known: BTreeMap<&str, &[&str]> = GROUPS.iter().copied().collect();
    let mut problems = Vec::new();
    let mut groups_seen = BTreeSet::new();
    for block in all_blocks() {
        let at = format!("{}:{}", block.file, block.line);
        match (block.lang.as_str(), &block.marker) {
            ("console", Some((group, step))) => match known.get(group.as_str()) {
                None => problems.push(format!("{at}: unknown sample group {group:?}")),
                Some(steps) => {
                    groups_seen.insert(group.clone());
                    if let Some(step) = step {
                        if !steps.contains(&step.as_str()) {
                            problems.push(format!("{at}: group {group} has no step {step:?}"));
                        }
                    }
                    if commands(&block.body).is_empty() {
                        problems.push(format!("{at}: a sample without a `$ ` command"));
                    }
                }
            },
            (lang, Some((group, None))) if NOT_CONSOLE.contains(&(group.as_str(), lang)) => {
                groups_seen.insert(group.clone());
            }
            ("console", None) => problems.push(format!(
                "{at}: a console block without a `<!-- sample: GROUP -->` line: no test runs it"
            )),
            ("", _) => problems.push(format!(
                "{at}: an untagged block: `console` with a sample marker if it shows output, \
                 otherwise the language of its text"
            )),
            (lang, _) if !NOT_OUTPUT.contains(&lang) => {
                problems.push(format!("{at}: unexpected block language {lang:?}"));
            }
            (_, Some(_)) => {
                problems.push(format!("{at}: a sample marker before a non-console block"))
            }
            ("sh", None) if block.body.lines().any(|l| l.starts_with("$ ")) => problems.push(
                format!("{at}: an sh block with `$ ` commands: output samples are console blocks"),
            ),
            _ => {}
        }
    }
    for (group, _) in GROUPS {
        if !groups_seen.contains(*group) {
            problems.push(format!("group {group} has no sample in the docs"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_sample_is_what_the_demo_prints() {
    let mut env = vec![];
    let pg_bin = std::env::var("TOMBSTONED_PG_BIN").ok();
    if let Some(bin) = &pg_bin {
        env.push(("TOMBSTONED_PG_BIN", bin.as_str()));
    }
    let mut shell = Shell::new(&env);
    for block in samples("demo") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// The HTTP walkthrough against `tombstoned serve`: `API` and `RUN` as the README sets them,
/// in a scratch directory (the first answer's headers file goes there); `ORDER_ID` is what the
/// README's own `export` line takes from that file (issue 42 item 5). `after-expiry`: the
/// record's window ends and a `tombstoned cleanup` run tombstones it (instead of waiting the
/// window out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_walkthrough_is_what_the_daemon_answers() {
    let db = TestDb::new().await;
    let daemon =
        Daemon::start(Spec::new(&db.url).config("[retention]\nreplay_window = \"60s\"")).await;
    let mut shell = Shell::new(&[("API", &daemon.api), ("RUN", DOC_RUN)]);
    let scratch = tempfile::tempdir().unwrap();
    shell.dir = scratch.path().to_owned();
    let client = db.client().await;
    for block in samples("http") {
        if block.body.contains("$ORDER_ID") && !block.body.contains("export ORDER_ID=") {
            assert!(
                shell.env.contains_key("ORDER_ID"),
                "{}:{}: uses $ORDER_ID, which no earlier sample exported",
                block.file,
                block.line
            );
        }
        if step(&block) == Some("after-expiry") {
            client
                .execute(
                    "UPDATE idempotency_records SET replay_deadline = now() \
                     WHERE idempotency_key = $1",
                    &[&format!("checkout-{DOC_RUN}")],
                )
                .await
                .unwrap();
            run_cleanup(&db.url);
        }
        shell.run(&block).await;
    }
    shell.finish();
}

/// "Check your own service": `tombstoned conformance` against an example service with a replay
/// window of 3 seconds, at `PAYMENTS` — the Rust one, served in this process (the Python and
/// Node ones answer alike: tests/it/conformance.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_samples_are_what_the_command_prints() {
    let db = TestDb::new().await;
    let url = examples::service_role(&db).await;
    let service = examples::start_with_window(Example::Rust, &db, &url, "3 seconds").await;
    let mut shell = Shell::new(&[("PAYMENTS", &service.base)]);
    for block in samples("conformance") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// docs/api.md's psql sessions: `psql` as a service role with the documented GRANTs and its
/// operation, `create-payment` (granted through the command's library, as the page says), on a
/// throwaway database — `PGHOST`, `PGPORT`, `PGDATABASE` and `PGUSER` set as the page says. The
/// psycopg sample runs the Python example's venv (`examples/setup python`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_api_sessions_are_what_postgresql_answers() {
    let db = TestDb::new().await;
    let role = format!("svc_{}", db.name);
    crate::operations_support::service_role(&db.client().await, &role).await;
    crate::operations_support::grant(&db, "create-payment", &role).await;
    examples::setup(Example::Python);
    let server = crate::harness::server();
    let host = match server.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("the sql-api samples need a TCP server, not {other:?}"),
    };
    let port = server
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let mut shell = Shell::new(&[
        ("PGHOST", &host),
        ("PGPORT", &port),
        ("PGDATABASE", &db.name),
        ("PGUSER", &role),
    ]);
    for block in samples("sql-api") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// examples/README.md's requests, against the Rust example served in this process (the others
/// answer the same: tests/it/examples.rs), at `PAYMENTS`, in a scratch directory where
/// `payment.headers` goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_requests_are_what_the_example_answers() {
    let db = TestDb::new().await;
    let url = examples::service_role(&db).await;
    let service = examples::start_with_window(Example::Rust, &db, &url, "1 hour").await;
    let mut shell = Shell::new(&[("PAYMENTS", &service.base)]);
    let scratch = tempfile::tempdir().unwrap();
    shell.dir = scratch.path().to_owned();
    for block in samples("examples") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// One order and its `order.created` event, as the API would commit them.
async fn order_with_event(client: &Client, event: Uuid) {
    let order = Uuid::now_v7();
    client
        .execute(
            "INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor, \
                                 currency, item, quantity, recipient) \
             VALUES ($1, 'acme', 'alice', $2, 10000, 'CNY', 'SKU-42', 1, 'Li Wei')",
            &[&order, &format!("PR-{order}")],
        )
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO outbox_events \
                 (event_id, tenant_id, order_id, event_type, sequence, payload, created_at) \
             VALUES ($1, 'acme', $2, 'order.created', 1, '{}', clock_timestamp())",
            &[&event, &order],
        )
        .await
        .unwrap();
}

/// The outbox commands against a webhook receiver: first an event the receiver answers 410 (a
/// dead letter, with the README's id), `requeue` before the requeue sample, `more-events` (one
/// more pending event, the receiver accepting) before the delivery samples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_samples_are_what_the_relay_commands_print() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_secret_dir, secret) = secret_file();
    let secret = secret.display().to_string();
    let mut shell = Shell::new(&[
        ("TOMBSTONED_DATABASE_URL", &db.url),
        ("TOMBSTONED_OUTBOX__ENDPOINT", &receiver.url),
        ("TOMBSTONED_OUTBOX__SECRET_FILE", &secret),
    ]);
    let dead_letter: Uuid = DOC_DEAD_LETTER.parse().unwrap();
    order_with_event(&client, dead_letter).await;
    receiver.script(&[Behaviour::Status(410)]);
    let deliver = tokio::task::block_in_place(|| shell.output("tombstoned outbox deliver"));
    assert_eq!(deliver.status.code(), Some(75), "{deliver:?}");
    for block in samples("outbox") {
        if step(&block) == Some("more-events") {
            order_with_event(&client, Uuid::now_v7()).await;
        }
        shell.run(&block).await;
    }
    assert_eq!(receiver.stats().bad_signatures, 0);
    shell.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_config_sample_is_what_check_config_prints() {
    // The service user's home: where libpq (and so tombstoned) looks for the password file.
    let mut shell = Shell::new(&[("HOME", "/var/lib/tombstoned")]);
    for block in samples("check-config") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// docs/api.md's `operations` sample: a service role's grant, `create-order` refused, the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_sample_is_what_the_command_prints() {
    let db = TestDb::new().await;
    sample_role(
        &db,
        "payments_service",
        &crate::clients_support::documented_grants("tombstoned", "payments_service"),
    )
    .await;
    let mut shell = Shell::new(&[("TOMBSTONED_DATABASE_URL", &db.url)]);
    for block in samples("operations") {
        shell.run(&block).await;
    }
    shell.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_error_line_sample_is_what_a_failed_command_prints() {
    let mut shell = Shell::new(&[]);
    for block in samples("error-line") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// 2500 records due (overdue by ~41 minutes), one not due, one tombstone; analysed.
async fn seeded(db: &TestDb) -> Client {
    let client = db.client().await;
    seed_live(&client, "due", 2500, "2000-01-01T00:00:00Z").await;
    client
        .execute(
            "UPDATE idempotency_records \
             SET replay_deadline = now() - interval '41 minutes' + (replay_deadline - '2000-01-01'), \
                 created_at = now() - interval '1 day 41 minutes' \
             WHERE idempotency_key LIKE '%-due-%'",
            &[],
        )
        .await
        .unwrap();
    seed_live(&client, "later", 1, NOT_DUE).await;
    seed_tombstones(&client, "old", 1, "2026-01-01T00:00:00Z").await;
    client
        .batch_execute("ANALYZE idempotency_records")
        .await
        .unwrap();
    client
}

/// "First run": the dry run, the real run right after it, then `status`, whose record counts
/// are exact on a table this small (the statistics are the ones taken before the run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_run_samples_are_what_cleanup_and_status_print() {
    let db = TestDb::new().await;
    let _client = seeded(&db).await;
    let mut shell = Shell::new(&[("TOMBSTONED_DATABASE_URL", &db.url)]);
    for block in samples("first-run") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// docs/cleanup.md's plan of the batch statement, on the same data as the first run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explain_sample_is_the_plan_cleanup_prints() {
    let db = TestDb::new().await;
    let _client = seeded(&db).await;
    let mut shell = Shell::new(&[("TOMBSTONED_DATABASE_URL", &db.url)]);
    for block in samples("explain") {
        shell.run(&block).await;
    }
    shell.finish();
}

/// One HTTP/1.1 request read off `stream` (headers, then `content-length` bytes of body), answered
/// 204; returns its text as received.
async fn receive_one(listener: tokio::net::TcpListener) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "the relay closed before its request was complete");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if raw.len() >= end + 4 + length {
                break;
            }
        }
    }
    stream
        .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    String::from_utf8_lossy(&raw).into_owned()
}

/// A role of the cluster the samples name, made once by whichever test gets there first (roles
/// are cluster-wide), with `grants` on this test's database.
async fn sample_role(db: &TestDb, role: &str, grants: &str) {
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE {role} LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$; {grants}"
        ))
        .await
        .unwrap_or_else(|e| panic!("the sample's role {role}: {e}"));
}

/// The README's webhook: an order created through the API (with the walkthrough's body) by a
/// daemon running as the role `tombstoned` (with the grants of "Installing without the package"),
/// then `tombstoned outbox deliver` to a listener of this test at `/hooks/orders`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_sample_is_what_the_relay_sends() {
    let db = TestDb::new().await;
    sample_role(
        &db,
        "tombstoned",
        "GRANT USAGE ON SCHEMA tombstoned TO tombstoned;
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tombstoned TO tombstoned;
         GRANT EXECUTE ON FUNCTION tombstoned.cleanup_lease_required(timestamptz) TO tombstoned;",
    )
    .await;
    let daemon = Daemon::start(Spec::new(&crate::operations_support::url_as(
        &db,
        "tombstoned",
    )))
    .await;
    let created = daemon
        .create_order(
            "example-acme-alice-token",
            &format!("checkout-{DOC_RUN}"),
            &serde_json::json!({
                "request_id": format!("PR-{DOC_RUN}"), "amount": "100.00", "item": "SKU-42",
                "recipient": "Li Wei", "metadata": {"trace_id": "abc"}
            }),
        )
        .await;
    assert_eq!(created.status, 201);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!(
        "http://127.0.0.1:{}/hooks/orders",
        listener.local_addr().unwrap().port()
    );
    let received = tokio::spawn(receive_one(listener));
    let (_secret_dir, secret) = secret_file();
    let secret = secret.display().to_string();
    let mut shell = Shell::new(&[
        ("TOMBSTONED_DATABASE_URL", &db.url),
        ("TOMBSTONED_OUTBOX__ENDPOINT", &endpoint),
        ("TOMBSTONED_OUTBOX__SECRET_FILE", &secret),
    ]);
    let deliver = tokio::task::block_in_place(|| shell.output("tombstoned outbox deliver"));
    assert!(deliver.status.success(), "{deliver:?}");
    let request = received.await.unwrap();
    let mut failures = Vec::new();
    for block in samples("webhook") {
        let label = format!("{}:{}: the webhook request", block.file, block.line);
        if let Err(e) = compare(&label, &request, &block.body) {
            failures.push(format!("{e}\n--- received in full:\n{request}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// "Progress of long runs": `tombstoned cleanup` on a terminal, on the first run's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_progress_sample_is_what_a_terminal_shows() {
    let db = TestDb::new().await;
    let _client = seeded(&db).await;
    let mut shell = Shell::new(&[("TOMBSTONED_DATABASE_URL", &db.url)]);
    for block in samples("progress") {
        shell.run_with(&block, Shell::on_terminal).await;
    }
    shell.finish();
}

/// The order of `keys explain`'s samples: created through the endpoint (acme/alice,
/// `checkout-42`); `held-open`: an SQL API claim of `create-payment`/`pay-7` left open in a
/// session named `payments` (a `pg_stat_activity` barrier: idle in transaction); `tombstoned`:
/// that claim rolled back, the order's window over and the real cleaner run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_explain_samples_are_what_it_prints() {
    let api = crate::api_support::TestApi::start().await;
    api.post(
        crate::api_support::ALICE,
        "checkout-42",
        &serde_json::json!({"request_id": "PR-42", "amount": "100.00", "item": "SKU-42",
                            "recipient": "Li Wei", "metadata": {"trace_id": "abc"}}),
    )
    .await
    .expect(201);
    let client = api.db.client().await;
    let mut shell = Shell::new(&[("TOMBSTONED_DATABASE_URL", &api.db.url)]);
    let mut held: Option<Client> = None;
    for block in samples("keys-explain") {
        match step(&block) {
            Some("held-open") => {
                let mut config = crate::harness::server().clone();
                config.dbname(&api.db.name);
                config.application_name("payments");
                let (session, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(connection);
                let pid = crate::api_support::backend_pid(&session).await;
                session
                    .batch_execute(
                        "BEGIN; SELECT * FROM tombstoned.claim('acme', 'alice', 'create-payment', \
                         'pay-7', tombstoned.fingerprint('{\"amount_minor\": 2500, \
                         \"currency\": \"EUR\"}'), interval '1 day')",
                    )
                    .await
                    .unwrap();
                crate::harness::wait_until_idle_in_transaction(
                    &client,
                    pid,
                    std::time::Duration::from_secs(30),
                )
                .await;
                held = Some(session);
            }
            Some("tombstoned") => {
                if let Some(session) = held.take() {
                    session.batch_execute("ROLLBACK").await.unwrap();
                }
                client
                    .execute(
                        "UPDATE idempotency_records SET replay_deadline = now() \
                         WHERE idempotency_key = 'checkout-42'",
                        &[],
                    )
                    .await
                    .unwrap();
                run_cleanup(&api.db.url);
            }
            _ => {}
        }
        shell.run(&block).await;
    }
    shell.finish();
}

/// The man page of `keys explain` shows, as its examples, commands the samples above run.
#[test]
fn the_keys_explain_man_page_examples_are_samples() {
    let page =
        std::fs::read_to_string(repo_root().join("dist/man/tombstoned-keys-explain.8")).unwrap();
    let examples = page
        .split_once(".SH EXAMPLES\n")
        .expect("an EXAMPLES section")
        .1;
    let examples: Vec<String> = examples
        .lines()
        .take_while(|l| !l.starts_with(".SH"))
        .filter(|l| l.starts_with("tombstoned "))
        .map(|l| l.replace("\\-", "-").replace("\\*(Aq", "'"))
        .collect();
    assert!(!examples.is_empty(), "no example command in:\n{page}");
    let sampled: Vec<String> = samples("keys-explain")
        .iter()
        .flat_map(|b| commands(&b.body))
        .map(|(command, _)| {
            command
                .replace("\\\n", " ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    for example in examples {
        let example = example.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            sampled.iter().any(|s| s.starts_with(&example)),
            "the man page's example is no sample: {example}\nsamples: {sampled:#?}"
        );
    }
}
