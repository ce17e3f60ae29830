//! `tombstoned demo`: a throwaway PostgreSQL cluster, the real daemon (`tombstoned serve`, a child
//! process of this binary), and a scripted client that walks through the protocol step by step,
//! printing the real answers and why the protocol gives them. Everything it creates is removed at
//! the end (after Ctrl-C with `--keep`).
//!
//! The daemon runs with a 5-second replay window and a cleanup every 2 seconds, so the whole life
//! of an idempotency record — created, replayed, refused for another purchase, expired,
//! tombstoned — fits in a quarter of a minute.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db;
use crate::pg_cluster::{ClusterOptions, ThrowawayCluster};
use crate::schema;
use crate::signals::GracefulStop;

/// `retention.replay_window` of the demo daemon unless `--replay-window` says otherwise.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(5);
/// `cleanup.schedule` of the demo daemon: every 2 seconds (the 6-field form, seconds first).
const CLEANUP_SCHEDULE: &str = "*/2 * * * * *";
/// The example tokens file; the demo's client is acme/alice.
const TOKENS: &str = include_str!("../config/tokens.toml");
const TOKEN: &str = "example-acme-alice-token";
/// Steps of the story.
const STEPS: usize = 10;
/// Bounds on the waits, so a broken installation fails instead of hanging.
const START_PATIENCE: Duration = Duration::from_secs(30);
/// How long after the replay window the story waits for the cleaner's tombstone.
const CLEANER_PATIENCE: Duration = Duration::from_secs(60);
const STOP_PATIENCE: Duration = Duration::from_secs(20);
/// Environment the daemon and the `cleanup` child must not inherit: the demo's configuration
/// file is the whole truth (a `TOMBSTONED_DATABASE_URL` of the caller's would point the demo at a
/// real database), and a `NOTIFY_SOCKET` belongs to whatever started the demo.
const ENV_PREFIX_DROPPED: &str = "TOMBSTONED_";
const ENV_DROPPED: &[&str] = &[
    "DATABASE_URL",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
];

/// What `tombstoned demo` was asked for.
#[derive(Debug, Clone, Copy)]
pub struct DemoOptions {
    /// Leave the cluster and the daemon running at the end, until a signal.
    pub keep: bool,
    /// The daemon's `retention.replay_window` (the story waits that long for the expiry).
    pub replay_window: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            keep: false,
            replay_window: DEFAULT_REPLAY_WINDOW,
        }
    }
}

/// A window as the configuration and the story spell it ("5s", "1m").
fn window_text(window: Duration) -> String {
    humantime::format_duration(window).to_string()
}

/// How the demo ended (a failure is an error: no PostgreSQL server binaries, a step that did not
/// answer as the protocol says, ...). Both end in a clean teardown; a second signal during it
/// ends the process instead ([`GracefulStop`], status 130).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The story ran through (with `keep`: and a signal ended the wait).
    Completed,
    /// A signal stopped the story; everything was torn down.
    Interrupted,
}

/// Where the story goes: the edge's writer to standard output, given by `tombstoned demo` (the
/// demo names no output of its own). Its error is returned as it is, so the edge still tells a
/// reader that went away from any other failure.
pub type Print = fn(&str) -> anyhow::Result<()>;

/// Runs the demo, its story written through `print`. SIGINT/SIGTERM stop the story and tear
/// everything down ([`Finished::Interrupted`]); a second signal exits at once (130), leaving
/// whatever was not yet removed.
pub async fn run(options: DemoOptions, print: Print) -> anyhow::Result<Finished> {
    let started = Instant::now();
    let mut out = Printer::new(print);
    let interrupted = CancellationToken::new();
    GracefulStop::install()?.spawn(
        interrupted.clone(),
        None,
        "second signal: exiting at once; the demo's daemon and cluster may be left running \
         (their paths are printed above)",
    );
    let window = options.replay_window;
    out.title(&format!(
        "tombstoned demo: an idempotency record's life, live ({} replay window, cleanup every \
         2 s)",
        window_text(window)
    ))?;

    out.step("A throwaway PostgreSQL cluster")?;
    let starting =
        tokio::task::spawn_blocking(|| ThrowawayCluster::start(&ClusterOptions::default()));
    let cluster = tokio::select! {
        biased;
        // The start-up task runs on; the cluster it returns is dropped (removed) unused.
        () = interrupted.cancelled() => return Ok(Finished::Interrupted),
        started = starting => started
            .context("the cluster start-up task failed")?
            .context("cannot start a throwaway PostgreSQL cluster")?,
    };
    let workdir = tempfile::Builder::new()
        .prefix("tombstoned-demo.")
        .tempdir()
        .context("cannot create the demo's temporary directory")?;

    // From here on, everything is torn down whatever happens in the story.
    let mut daemon = None;
    let mut story = tokio::select! {
        biased;
        () = interrupted.cancelled() => Err(Interrupted.into()),
        result = story(&mut out, &cluster, workdir.path(), &mut daemon, options) => result,
    };
    let story_took = started.elapsed();
    let mut kept_for = None;
    if let (Ok(()), true, Some(d)) = (&story, options.keep, &daemon) {
        story = out.keep_notice(d, &cluster, workdir.path(), window);
        if story.is_ok() {
            let kept_since = Instant::now();
            interrupted.cancelled().await;
            kept_for = Some(kept_since.elapsed());
            story = out.print("\n");
        }
    }
    if let Some(d) = daemon.take() {
        d.stop().await;
    }
    let cluster_dir = cluster.dir().to_owned();
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .context("the cluster clean-up task failed")?;
    let workdir_path = workdir.path().to_owned();
    drop(workdir);
    match story {
        Err(e) if e.is::<Interrupted>() => {
            // Interrupted is the outcome, whether or not anyone still reads this line.
            let _ = out
                .done("Interrupted: the daemon is stopped, the cluster and the files are removed.");
            return Ok(Finished::Interrupted);
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    // What was timed: the story; with --keep, the time the daemon then stayed up is its own.
    let timed = match kept_for {
        None => format!("Done in {:.1} s.", story_took.as_secs_f64()),
        Some(kept) => format!(
            "Done: the story took {:.1} s, then the daemon stayed up {:.0} s until the signal.",
            story_took.as_secs_f64(),
            kept.as_secs_f64()
        ),
    };
    out.done(&format!(
        "{timed} The daemon was stopped with SIGTERM; the cluster ({}) and {} are removed.",
        cluster_dir.display(),
        workdir_path.display()
    ))?;
    Ok(Finished::Completed)
}

/// The demo was interrupted by Ctrl-C or SIGTERM.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
struct Interrupted;

async fn story(
    out: &mut Printer,
    cluster: &ThrowawayCluster,
    workdir: &Path,
    daemon: &mut Option<Daemon>,
    options: DemoOptions,
) -> anyhow::Result<()> {
    let window = options.replay_window;
    let database_url = cluster.url("postgres");
    out.line(&format!(
        "PostgreSQL on 127.0.0.1:{} (binaries in {}), data in {}",
        cluster.port(),
        cluster.bin_dir().display(),
        cluster.dir().display()
    ))?;
    // The in-process configuration for migrating and for counting orders; the daemon reads the
    // same settings from the file written below.
    let db_config = Config::load_from(
        None,
        [("TOMBSTONED_DATABASE_URL".to_owned(), database_url.clone())],
        &[],
    )
    .context("the demo's database configuration")?;
    let applied = schema::migrate(&db_config.database)
        .await
        .context("cannot migrate the demo database")?;
    let names: Vec<String> = applied
        .iter()
        .map(|m| format!("V{}__{}", m.version, m.name))
        .collect();
    out.line(&format!(
        "schema {} migrated: {}",
        db_config.database.schema,
        names.join(", ")
    ))?;

    out.step("The daemon: tombstoned serve")?;
    std::fs::write(workdir.join("tokens.toml"), TOKENS).context("cannot write tokens.toml")?;
    let d = daemon.insert(Daemon::start(workdir, &database_url, window).await?);
    out.line(&format!(
        "pid {}; API on {}, metrics on {}",
        d.pid, d.api, d.metrics
    ))?;
    if options.keep {
        // As soon as the API is up: the walkthrough can start beside the story.
        out.line(&export_api_line(&d.api, window))?;
    }
    out.line(&format!(
        "config {}: replay_window = \"{}\", cleanup.schedule = \"{CLEANUP_SCHEDULE}\"",
        d.config.display(),
        window_text(window)
    ))?;
    out.why(
        "it answered /readyz with 200: database reachable, schema current, both listeners bound",
    )?;
    let d = &*d;
    let client = Client::new(&d.api)?;

    let key = uuid::Uuid::new_v4().to_string();
    let request_id = format!("req-{}", &key[..8]);
    let purchase = json!({
        "request_id": request_id,
        "amount": "129.00",
        "currency": "CNY",
        "item": "espresso machine",
        "recipient": "alice@example.com",
    });

    out.step("Create an order")?;
    out.line(&format!(
        "POST /v1/orders  Idempotency-Key: {key}  (alice, 129.00 CNY)"
    ))?;
    let created = client.create(&key, &purchase).await?;
    created.require(201)?;
    let order_url = created.header("location").unwrap_or_default().to_owned();
    out.answer(&created, &format!("Location: {order_url}"))?;
    out.line(&format!("body: {}", excerpt(&created.text, 96)))?;
    out.why("a new key: claimed, the order created and this answer stored in ONE transaction")?;

    out.step("The response is lost; the client retries with the same key and body")?;
    let replayed = client.create(&key, &purchase).await?;
    replayed.require(201)?;
    let same = replayed.text == created.text;
    out.answer(
        &replayed,
        &format!(
            "Idempotent-Replayed: {}  (body {} the first answer's {} bytes)",
            replayed.header("idempotent-replayed").unwrap_or("absent"),
            if same { "identical to" } else { "DIFFERS from" },
            created.text.len()
        ),
    )?;
    out.why("same key, same intent, inside the replay window: the stored answer, byte for byte; no second order")?;

    out.step("A bug reuses the key for a different amount")?;
    let other = {
        let mut p = purchase.clone();
        p["amount"] = json!("149.00");
        p
    };
    let reused = client.create(&key, &other).await?;
    reused.require(422)?;
    out.answer(&reused, &reused.problem())?;
    out.why(
        "same key, different fingerprint: refused, and nothing of the stored order is revealed",
    )?;

    out.step("What would the cleaner do now? tombstoned cleanup --dry-run")?;
    let dry_run = d.dry_run().await?;
    for line in dry_run.lines() {
        out.quote(line)?;
    }
    out.why(&format!(
        "nothing is due yet: the record replays for {} after its claim (a dry run only reads, in \
         a READ ONLY transaction)",
        window_text(window)
    ))?;

    out.step("Wait for the cleaner (GET /v1/idempotency-keys/{key})")?;
    let claimed_at = created.at;
    let mut last_seen = None;
    let deadline = Instant::now() + window + CLEANER_PATIENCE;
    loop {
        let status = client.key_status(&key).await?;
        status.require(200)?;
        let body = status.json()?;
        let state = body["state"].as_str().unwrap_or("?").to_owned();
        let expired_at = body["expired_at"].as_str().map(str::to_owned);
        let seen = (state.clone(), expired_at.is_some());
        if last_seen.as_ref() != Some(&seen) {
            let at = format!("+{:.1}s", (status.at - claimed_at).as_secs_f64());
            let what = match (state.as_str(), &expired_at) {
                ("completed", _) => format!(
                    "completed: a retry replays (until {})",
                    body["replay_deadline"].as_str().unwrap_or("?")
                ),
                ("expired", None) => {
                    "expired: the window has passed, a retry gets 410 even before the cleaner \
                     comes"
                        .to_owned()
                }
                ("expired", Some(when)) => {
                    format!("expired and tombstoned at {when}: body cleared, key kept")
                }
                (other, _) => other.to_owned(),
            };
            out.line(&format!("{at:>6}  {what}"))?;
            last_seen = Some(seen);
        }
        if expired_at.is_some() {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the cleaner did not tombstone the record within {CLEANER_PATIENCE:?} of the window; daemon \
                 log:\n{}",
                d.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    out.why("the scheduled cleaner turned the expired record into a tombstone, in a short batch transaction")?;

    out.step("The client retries once more")?;
    let late = client.create(&key, &purchase).await?;
    late.require(410)?;
    let problem = late.json()?;
    out.answer(
        &late,
        &format!(
            "{}  order_url: {}",
            late.problem(),
            problem["order_url"].as_str().unwrap_or("?")
        ),
    )?;
    let order = client.get(&order_url).await?;
    order.require(200)?;
    let orders = count_orders(&db_config, &request_id).await?;
    out.line(&format!(
        "GET {order_url} -> {}; orders for {request_id}: {orders}",
        order.status
    ))?;
    out.why(
        "past the window a request is never executed again: the answer says where the order is",
    )?;

    out.step("The key's status")?;
    let status = client.key_status(&key).await?;
    status.require(200)?;
    out.answer(&status, "")?;
    let pretty = serde_json::to_string_pretty(&status.json()?).unwrap_or(status.text.clone());
    for line in pretty.lines() {
        out.quote(line)?;
    }
    out.why("a tombstone keeps scope, key and fingerprint forever (the key cannot buy anything else), never the body")?;

    out.step("Metrics excerpt (GET /metrics on the metrics listener)")?;
    let metrics = client.get(&format!("{}/metrics", d.metrics)).await?;
    metrics.require(200)?;
    for line in metrics_excerpt(&metrics.text) {
        out.quote(&line)?;
    }
    Ok(())
}

async fn count_orders(config: &Config, request_id: &str) -> anyhow::Result<i64> {
    let session = db::connect(&config.database, "demo").await?;
    let row = session
        .conn()
        .query_one(
            "SELECT count(*) FROM {schema}.orders WHERE tenant_id = $1 AND request_id = $2",
            &[&"acme", &request_id],
        )
        .await
        .context("cannot count the orders")?;
    Ok(row.try_get(0)?)
}

/// The claim outcomes, rows tombstoned and runs, without the zero-valued label sets.
fn metrics_excerpt(text: &str) -> Vec<String> {
    let wanted = [
        "tombstoned_claims_total{",
        "tombstoned_cleanup_rows_tombstoned_total ",
        "tombstoned_cleanup_runs_total{",
    ];
    wanted
        .iter()
        .flat_map(|prefix| {
            text.lines()
                .filter(move |l| l.starts_with(prefix))
                .filter(|l| !l.ends_with(" 0") || !l.contains('{'))
                .map(str::to_owned)
        })
        .collect()
}

/// At most `max` characters of `text`, with an ellipsis when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The daemon child process.
struct Daemon {
    child: Child,
    pid: u32,
    api: String,
    metrics: String,
    config: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Writes the configuration into `workdir`, starts `tombstoned serve` and waits for
    /// `/readyz` 200. Two ports picked free can be taken before the daemon binds them; then it
    /// exits 64 ("cannot listen") and is started again on others.
    async fn start(workdir: &Path, database_url: &str, window: Duration) -> anyhow::Result<Daemon> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let config = workdir.join("tombstoned.toml");
        let log = workdir.join("daemon.log");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (api_port, metrics_port) = (free_port()?, free_port()?);
            std::fs::write(
                &config,
                config_file(database_url, api_port, metrics_port, window),
            )
            .context("cannot write the demo configuration")?;
            let log_file = std::fs::File::create(&log).context("cannot create the daemon log")?;
            let mut command = Command::new(&exe);
            command
                .arg("--config")
                .arg(&config)
                .arg("serve")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log_file))
                // Its own process group: Ctrl-C at the terminal reaches the demo, which then
                // stops the daemon with one SIGTERM (a second signal would cut its drain short).
                .process_group(0)
                .kill_on_drop(true); // a failed demo never leaves the daemon behind
            scrub_env(&mut command);
            let child = command.spawn().context("cannot start tombstoned serve")?;
            let pid = child.id().context("the daemon exited at once")?;
            let mut daemon = Daemon {
                child,
                pid,
                api: format!("http://127.0.0.1:{api_port}"),
                metrics: format!("http://127.0.0.1:{metrics_port}"),
                config: config.clone(),
                log: log.clone(),
            };
            match daemon.wait_ready().await? {
                None => return Ok(daemon),
                Some(status) if status.code() == Some(64) && attempt < 3 => {
                    if daemon.log_tail().contains("cannot listen") {
                        continue;
                    }
                    bail!(
                        "tombstoned serve exited with {status}:\n{}",
                        daemon.log_tail()
                    );
                }
                Some(status) => {
                    bail!(
                        "tombstoned serve exited with {status}:\n{}",
                        daemon.log_tail()
                    )
                }
            }
        }
    }

    /// `None` once `/readyz` answers 200; the exit status if the daemon exits first.
    async fn wait_ready(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .context("cannot build the HTTP client")?;
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().context("cannot watch the daemon")? {
                return Ok(Some(status));
            }
            if let Ok(r) = http.get(format!("{}/readyz", self.metrics)).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return Ok(None);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon was not ready within {START_PATIENCE:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `tombstoned cleanup --dry-run` against the demo database: its standard output.
    async fn dry_run(&self) -> anyhow::Result<String> {
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let mut command = Command::new(exe);
        command
            .arg("--config")
            .arg(&self.config)
            .args(["cleanup", "--dry-run"])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        scrub_env(&mut command);
        let output = command
            .output()
            .await
            .context("cannot run tombstoned cleanup --dry-run")?;
        if !output.status.success() {
            bail!(
                "tombstoned cleanup --dry-run exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The last lines of the daemon's log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then wait; SIGKILL if it does not stop in time.
    async fn stop(mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = i32::try_from(self.pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        match tokio::time::timeout(STOP_PATIENCE, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => eprintln!(
                "tombstoned demo: the daemon exited with {status}:\n{}",
                self.log_tail()
            ),
            Ok(Err(e)) => eprintln!("tombstoned demo: cannot wait for the daemon: {e}"),
            Err(_) => {
                eprintln!(
                    "tombstoned demo: the daemon did not stop within {STOP_PATIENCE:?}; killing it"
                );
                let _ = self.child.kill().await;
            }
        }
    }
}

/// The line `--keep` prints for the README's curl walkthrough: a shell takes it whole, comment
/// and all, when pasted.
fn export_api_line(api: &str, window: Duration) -> String {
    format!(
        "export API={api}   # paste into a shell, then the README's curl walkthrough (\"The HTTP \
         API\"; replay window {})",
        window_text(window)
    )
}

/// The demo daemon's configuration file.
fn config_file(database_url: &str, api_port: u16, metrics_port: u16, window: Duration) -> String {
    let window = window_text(window);
    format!(
        "# Written by `tombstoned demo`; removed when it ends.\n\
         [database]\n\
         url = \"{database_url}\"\n\
         pool_size = 4\n\
         \n\
         [retention]\n\
         replay_window = \"{window}\"\n\
         \n\
         [cleanup]\n\
         schedule = \"{CLEANUP_SCHEDULE}\"\n\
         \n\
         [api]\n\
         listen = \"127.0.0.1:{api_port}\"\n\
         tokens_file = \"tokens.toml\"\n\
         \n\
         [metrics]\n\
         listen = \"127.0.0.1:{metrics_port}\"\n"
    )
}

fn scrub_env(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let Some(text) = name.to_str() else { continue };
        if text.starts_with(ENV_PREFIX_DROPPED) || ENV_DROPPED.contains(&text) {
            command.env_remove(&name);
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    crate::pg_cluster::free_loopback_port()
        .context("cannot bind a loopback port to find a free one")
}

/// The scripted client: acme/alice's token, one connection at a time.
struct Client {
    http: reqwest::Client,
    base: String,
}

/// An answer, read whole.
struct Answer {
    status: u16,
    reason: &'static str,
    headers: reqwest::header::HeaderMap,
    text: String,
    /// When it arrived.
    at: Instant,
    /// `METHOD path`, for errors.
    request: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.text)
            .with_context(|| format!("{}: the answer is not JSON: {}", self.request, self.text))
    }

    /// The problem type's short name, e.g. `idempotency-key-reused`.
    fn problem(&self) -> String {
        self.json()
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .and_then(|t| t.rsplit(':').next().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Fails the demo, with the body, unless the status is `status`.
    fn require(&self, status: u16) -> anyhow::Result<()> {
        if self.status != status {
            bail!(
                "{}: expected {status}, got {} {}: {}",
                self.request,
                self.status,
                self.reason,
                self.text
            );
        }
        Ok(())
    }
}

impl Client {
    fn new(base: &str) -> anyhow::Result<Self> {
        Ok(Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .context("cannot build the HTTP client")?,
            base: base.to_owned(),
        })
    }

    async fn create(&self, key: &str, body: &Value) -> anyhow::Result<Answer> {
        let request = self
            .http
            .post(format!("{}/v1/orders", self.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key)
            .json(body);
        read("POST /v1/orders", request).await
    }

    async fn key_status(&self, key: &str) -> anyhow::Result<Answer> {
        // UUID keys need no percent-encoding.
        let path = format!("/v1/idempotency-keys/{key}");
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        read(&format!("GET {path}"), request).await
    }

    /// GET an API path (`/v1/...`, with the token) or an absolute URL (the metrics listener).
    async fn get(&self, path_or_url: &str) -> anyhow::Result<Answer> {
        let request = if path_or_url.starts_with('/') {
            self.http
                .get(format!("{}{path_or_url}", self.base))
                .bearer_auth(TOKEN)
        } else {
            self.http.get(path_or_url)
        };
        read(&format!("GET {path_or_url}"), request).await
    }
}

async fn read(what: &str, request: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
    let response = request
        .send()
        .await
        .with_context(|| format!("{what}: no answer"))?;
    let status = response.status();
    let headers = response.headers().clone();
    let text = response
        .text()
        .await
        .with_context(|| format!("{what}: the answer could not be read"))?;
    Ok(Answer {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or(""),
        headers,
        text,
        at: Instant::now(),
        request: what.to_owned(),
    })
}

/// Writes the story to stdout (through the edge's [`Print`]): numbered steps, answers, quotes,
/// and one-line reasons. Bold and dim only at a terminal, and never with `NO_COLOR` set. A closed
/// stdout is an error (the story stops, everything is torn down, and the command ends quietly).
struct Printer {
    step: usize,
    styled: bool,
    write: Print,
}

impl Printer {
    fn new(write: Print) -> Self {
        Printer {
            step: 0,
            write,
            styled: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    fn style(&self, code: &str, text: &str) -> String {
        if self.styled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn print(&self, text: &str) -> anyhow::Result<()> {
        (self.write)(text)
    }

    fn title(&self, text: &str) -> anyhow::Result<()> {
        self.print(&format!("{}\n", self.style("1", text)))
    }

    fn step(&mut self, title: &str) -> anyhow::Result<()> {
        self.step += 1;
        let head = format!("[{}/{STEPS}] {title}", self.step);
        self.print(&format!("\n{}\n", self.style("1", &head)))
    }

    fn line(&self, text: &str) -> anyhow::Result<()> {
        self.print(&format!("      {text}\n"))
    }

    fn quote(&self, text: &str) -> anyhow::Result<()> {
        self.print(&format!("      | {text}\n"))
    }

    fn answer(&self, answer: &Answer, detail: &str) -> anyhow::Result<()> {
        let mut line = format!("-> {} {}", answer.status, answer.reason);
        if !detail.is_empty() {
            let _ = write!(line, "  {detail}");
        }
        self.print(&format!("      {}\n", self.style("1", &line)))
    }

    fn why(&self, text: &str) -> anyhow::Result<()> {
        self.print(&format!(
            "      {}\n",
            self.style("2", &format!("why: {text}"))
        ))
    }

    fn keep_notice(
        &self,
        daemon: &Daemon,
        cluster: &ThrowawayCluster,
        workdir: &Path,
        window: Duration,
    ) -> anyhow::Result<()> {
        self.print(&format!(
            "\n{}\n",
            self.style("1", "Still running (--keep):")
        ))?;
        self.line(&format!(
            "API       {}   e.g. curl -s -H 'Authorization: Bearer {TOKEN}' {}/v1/idempotency-keys/<key>",
            daemon.api, daemon.api
        ))?;
        self.line(&format!("metrics   {}/metrics", daemon.metrics))?;
        self.line(&format!(
            "database  psql {}   (schema tombstoned)",
            cluster.url("postgres")
        ))?;
        self.line(&format!(
            "files     {} (configuration, tokens, daemon.log)",
            workdir.display()
        ))?;
        self.line(&export_api_line(&daemon.api, window))?;
        self.print("Press Ctrl-C to stop the daemon and remove everything.\n")
    }

    fn done(&self, text: &str) -> anyhow::Result<()> {
        self.print(&format!("\n{text}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_configuration_is_valid_and_says_what_the_story_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tombstoned.toml");
        std::fs::write(dir.path().join("tokens.toml"), TOKENS).unwrap();
        std::fs::write(
            &path,
            config_file(
                "postgresql://postgres@127.0.0.1:5432/postgres",
                1,
                2,
                DEFAULT_REPLAY_WINDOW,
            ),
        )
        .unwrap();
        let c = Config::load_from(Some(&path), Vec::new(), &[]).unwrap();
        assert_eq!(c.retention.replay_window, Duration::from_secs(5));
        assert!(c.cleanup.enabled);
        let now = chrono::Utc::now();
        let next = c.cleanup.schedule.upcoming(now, 2);
        assert_eq!((next[1] - next[0]).num_seconds(), 2);
        assert_eq!(c.api.listen.port(), 1);
        assert_eq!(c.metrics.listen.port(), 2);
        assert_eq!(c.api.tokens_file, dir.path().join("tokens.toml"));
    }

    #[test]
    fn metrics_excerpt_keeps_the_story_series_and_drops_zero_label_sets() {
        let text = "# HELP x\n\
                    tombstoned_claims_total{outcome=\"created\"} 1\n\
                    tombstoned_claims_total{outcome=\"invalid\"} 0\n\
                    tombstoned_cleanup_rows_tombstoned_total 0\n\
                    tombstoned_cleanup_runs_total{outcome=\"success\"} 4\n\
                    tombstoned_http_requests_total{route=\"x\"} 9\n";
        assert_eq!(
            metrics_excerpt(text),
            [
                "tombstoned_claims_total{outcome=\"created\"} 1",
                "tombstoned_cleanup_rows_tombstoned_total 0",
                "tombstoned_cleanup_runs_total{outcome=\"success\"} 4",
            ]
        );
    }

    #[test]
    fn excerpts_cut_at_characters() {
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("ab", 3), "ab");
        assert_eq!(excerpt("ééé", 2), "éé…");
    }
}
