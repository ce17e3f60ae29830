//! The Grafana dashboard (`config/grafana/tombstoned.json`): its shape is the one Grafana imports
//! (uid, title, schemaVersion, a datasource variable, rows, panels with gridPos, type and
//! targets), every query parses as PromQL (promtool), and every panel's query returns data from
//! a real Prometheus that scraped a real `tombstoned serve` after a workload producing every
//! event a panel shows.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;
use tombstoned::metrics::CLAIM_OUTCOMES;

use crate::api_support::{order, TestApi};
use crate::cleanup_support::{seed_live, DUE};
use crate::daemon_support::{Daemon, Spec, ALICE, BOB};
use crate::harness::TestDb;
use crate::ops_support::{prometheus_tool, repo_root};
use crate::prometheus::PrometheusServer;

/// acme/carol's example token (config/tokens.toml): the principal that hits the rate limit.
const CAROL: &str = "example-globex-carol-token";

/// The dashboard's uid: links, provisioning and bookmarks refer to it, so it never changes.
const UID: &str = "tombstoned";

/// One row per concern, in this order.
const ROWS: &[&str] = &["Cleaner", "API", "Database", "Process"];

/// Generous: CI machines are slow, and Prometheus needs two scrapes for a rate.
const PATIENCE: Duration = Duration::from_secs(60);

/// The fields Grafana requires of an imported dashboard (unknown fields are allowed: Grafana
/// keeps many more).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Dashboard {
    uid: String,
    title: String,
    schema_version: u32,
    templating: Templating,
    panels: Vec<Panel>,
}

#[derive(Debug, Deserialize)]
struct Templating {
    list: Vec<Variable>,
}

#[derive(Debug, Deserialize)]
struct Variable {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    query: serde_json::Value,
    #[serde(default)]
    datasource: Option<DatasourceRef>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
struct DatasourceRef {
    #[serde(rename = "type")]
    kind: String,
    uid: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Panel {
    id: u32,
    #[serde(rename = "type")]
    kind: String,
    title: String,
    grid_pos: GridPos,
    #[serde(default)]
    datasource: Option<DatasourceRef>,
    #[serde(default)]
    targets: Vec<Target>,
    #[serde(default)]
    description: String,
}

#[derive(Debug, Deserialize, Clone, Copy)]
struct GridPos {
    h: u32,
    w: u32,
    x: u32,
    y: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Target {
    ref_id: String,
    expr: String,
    datasource: DatasourceRef,
}

fn dashboard() -> Dashboard {
    let path = repo_root().join("config/grafana/tombstoned.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a Grafana dashboard: {e}", path.display()))
}

fn the_datasource() -> DatasourceRef {
    DatasourceRef {
        kind: "prometheus".into(),
        uid: "${datasource}".into(),
    }
}

/// A query with Grafana's variables replaced the way Grafana would for one job and all its
/// instances; `$__rate_interval` by `rate_interval`.
fn substituted(expr: &str, rate_interval: &str) -> String {
    let out = expr
        .replace("$__rate_interval", rate_interval)
        .replace("$job", "tombstoned")
        .replace("$instance", ".*");
    assert!(!out.contains('$'), "unknown variable in {expr}");
    out
}

/// Every (panel, target) of the dashboard.
fn queries(d: &Dashboard) -> Vec<(&Panel, &Target)> {
    d.panels
        .iter()
        .flat_map(|p| p.targets.iter().map(move |t| (p, t)))
        .collect()
}

#[test]
fn the_dashboard_has_grafanas_shape_a_datasource_variable_and_one_row_per_concern() {
    let d = dashboard();
    assert_eq!(d.uid, UID);
    assert_eq!(d.title, "tombstoned");
    assert!(d.schema_version >= 36, "schemaVersion {}", d.schema_version);

    // The datasource is chosen at import (and switchable): a variable every query refers to.
    let datasource = d
        .templating
        .list
        .iter()
        .find(|v| v.kind == "datasource")
        .expect("a datasource variable");
    assert_eq!(datasource.name, "datasource");
    assert_eq!(datasource.query, json!("prometheus"));
    for v in d.templating.list.iter().filter(|v| v.kind == "query") {
        assert_eq!(v.datasource, Some(the_datasource()), "variable {}", v.name);
    }

    let rows: Vec<&str> = d
        .panels
        .iter()
        .filter(|p| p.kind == "row")
        .map(|p| p.title.as_str())
        .collect();
    assert_eq!(rows, ROWS);
    assert_eq!(d.panels[0].kind, "row", "the first panel opens a row");

    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in &d.panels {
        assert!(ids.insert(p.id), "panel id {} twice", p.id);
        let g = p.grid_pos;
        assert!(g.w > 0 && g.h > 0 && g.x + g.w <= 24, "{}: {g:?}", p.title);
        for x in g.x..g.x + g.w {
            for y in g.y..g.y + g.h {
                assert!(cells.insert((x, y)), "{} overlaps another panel", p.title);
            }
        }
        if p.kind == "row" {
            assert!(p.targets.is_empty(), "row {}", p.title);
            continue;
        }
        assert_eq!(p.datasource, Some(the_datasource()), "{}", p.title);
        assert!(!p.targets.is_empty(), "{} has no query", p.title);
        assert!(
            !p.description.is_empty(),
            "{}: say what it answers",
            p.title
        );
        let mut ref_ids = BTreeSet::new();
        for t in &p.targets {
            assert!(ref_ids.insert(&t.ref_id), "{}: refId twice", p.title);
            assert_eq!(t.datasource, the_datasource(), "{}", p.title);
            assert!(
                t.expr.contains("job=~\"$job\", instance=~\"$instance\""),
                "{}: {} ignores the job/instance variables",
                p.title,
                t.expr
            );
        }
    }

    // Panels follow their row: sorted by position, the rows split them into the concerns.
    let mut by_position: Vec<&Panel> = d.panels.iter().collect();
    by_position.sort_by_key(|p| (p.grid_pos.y, p.grid_pos.x));
    let order: Vec<u32> = by_position.iter().map(|p| p.id).collect();
    let listed: Vec<u32> = d.panels.iter().map(|p| p.id).collect();
    assert_eq!(order, listed, "panels are listed in reading order");

    // The README says what each panel answers.
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Dashboard")
        .nth(1)
        .expect("README has a Dashboard section");
    let section = section.split("\n## ").next().unwrap();
    for p in d.panels.iter().filter(|p| p.kind != "row") {
        assert!(
            section.contains(&format!("**{}**", p.title)),
            "README's Dashboard section does not describe **{}**",
            p.title
        );
    }
}

/// Every query, and the selector of every variable's `label_values(...)`, as recording rules
/// for `promtool check rules`, which parses them as PromQL.
#[test]
fn every_dashboard_query_parses_as_promql() {
    let d = dashboard();
    let mut rules = Vec::new();
    for (panel, target) in queries(&d) {
        rules.push(json!({
            "record": format!("dashboard:panel_{}_{}", panel.id, target.ref_id),
            "expr": substituted(&target.expr, "5m"),
        }));
    }
    for v in d.templating.list.iter().filter(|v| v.kind == "query") {
        let query = v.query["query"].as_str().unwrap();
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(", "))
            .map(|(selector, _label)| selector)
            .unwrap_or_else(|| panic!("variable {}: {query}", v.name));
        rules.push(json!({
            "record": format!("dashboard:variable_{}", v.name),
            "expr": substituted(selector, "5m"),
        }));
    }
    let count = rules.len();
    assert!(count >= 20, "{count} queries");
    // JSON is YAML: promtool reads it as a rule file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yml");
    let groups = json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    std::fs::write(&file, groups.to_string()).unwrap();
    let output = std::process::Command::new(prometheus_tool("promtool"))
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "promtool check rules:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(&format!("{count} rules found")), "{stdout}");
}

/// The first sample values of an instant query.
async fn values(prometheus: &PrometheusServer, promql: &str) -> Vec<f64> {
    let data = prometheus.api("/api/v1/query", &[("query", promql)]).await;
    data["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["value"][1].as_str().unwrap().parse::<f64>().unwrap())
        .collect()
}

/// Polls `promql` until one of its samples satisfies `ok`; fails after `PATIENCE`.
async fn wait_until(prometheus: &PrometheusServer, promql: &str, ok: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let found = values(prometheus, promql).await;
        if found.iter().any(|v| ok(*v)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{promql} returned {found:?} for {PATIENCE:?}\n{}",
            prometheus.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_dashboard_panel_shows_data_from_a_real_prometheus_scraping_a_real_daemon() {
    let binary = prometheus_tool("prometheus"); // first: a missing tool fails here, with advice
    let d = dashboard();
    let db = TestDb::new().await;

    // A due record locked by another session (as a long replay read would): every cleanup run
    // waits cleanup.lock_timeout for it, rolls that batch back and counts a lock timeout.
    let client = db.client().await;
    seed_live(&client, "held", 1, DUE).await;
    let row_holder = db.client().await;
    row_holder.batch_execute("BEGIN").await.unwrap();
    row_holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key LIKE '%-held-1' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();

    // Cleanup every second, a 3-second replay window, one API connection (so that a blocked
    // claim makes the next request wait for the pool), a claim lock wait long enough to look at
    // the blocked request, and a rate limit carol can exceed.
    let mut daemon = Daemon::start(Spec::new(&db.url).config(
        "[retention]\nreplay_window = \"3s\"\n\
         [cleanup]\nschedule = \"* * * * * *\"\nlock_timeout = \"100ms\"\nbatch_size = 5\n\
         [database]\npool_size = 1\nconnect_timeout = \"60s\"\n\
         [api]\nclaim_lock_timeout = \"12s\"\nrate_limit_per_second = 1\nrate_limit_burst = 10",
    ))
    .await;
    let target: SocketAddr = format!("127.0.0.1:{}", daemon.ops_port).parse().unwrap();
    let prometheus = PrometheusServer::start(&binary, target).await;
    prometheus
        .wait_for_value("up{job=\"tombstoned\"}", "1")
        .await;

    daemon
        .wait_for_metric("tombstoned_cleanup_lock_timeouts_total", |v| v >= 1.0)
        .await;
    row_holder.batch_execute("ROLLBACK").await.unwrap();

    // Claims of every outcome but in_progress and expired.
    let first = order("dashboard-r1");
    daemon
        .create_order(ALICE, "k-created", &first)
        .await
        .expect(201);
    let replay = daemon.create_order(ALICE, "k-created", &first).await;
    assert!(replay.expect(201).replayed());
    let mut other = first.clone();
    other["amount"] = json!("101.00");
    daemon
        .create_order(ALICE, "k-created", &other)
        .await
        .expect(422);
    let mut too_much = order("dashboard-r2");
    too_much["amount"] = json!("6000.00");
    daemon
        .create_order(ALICE, "k-rejected", &too_much)
        .await
        .expect(422);
    daemon
        .create_order(ALICE, "k-invalid", &json!({}))
        .await
        .expect(400);
    daemon
        .create_order(ALICE, "k-duplicate", &first)
        .await
        .expect(200);

    // in_progress: bob's retry waits on a lock held by another session until
    // claim_lock_timeout; meanwhile it is in flight and holds the pool's only connection, so a
    // read waits for the pool.
    let blocked_body = order("dashboard-r3");
    let created = daemon.create_order(BOB, "k-blocked", &blocked_body).await;
    let order_id = created.expect(201).json()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let claim_holder = db.client().await;
    claim_holder.batch_execute("BEGIN").await.unwrap();
    claim_holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key = 'k-blocked' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let retry = {
        let http = daemon.http.clone();
        let url = format!("{}/v1/orders", daemon.api);
        tokio::spawn(async move {
            let response = http
                .post(url)
                .bearer_auth(BOB)
                .header("Idempotency-Key", "k-blocked")
                .json(&blocked_body)
                .send()
                .await
                .unwrap();
            TestApi::reply(response).await
        })
    };
    let observer = db.client().await;
    let holder_pid = crate::api_support::backend_pid(&claim_holder).await;
    crate::api_support::wait_until_api_blocked_by(&observer, holder_pid, PATIENCE).await;
    daemon
        .wait_for_metric("tombstoned_http_requests_in_flight", |v| v == 1.0)
        .await;
    let read = {
        let http = daemon.http.clone();
        let url = format!("{}/v1/orders/{order_id}", daemon.api);
        tokio::spawn(async move {
            let response = http.get(url).bearer_auth(BOB).send().await.unwrap();
            TestApi::reply(response).await
        })
    };
    daemon
        .wait_for_metric("tombstoned_db_pool_waiting", |v| v == 1.0)
        .await;
    // Prometheus sees both while they last (the claim waits 12 s).
    wait_until(
        &prometheus,
        "max_over_time(tombstoned_db_pool_waiting{job=\"tombstoned\"}[5m])",
        |v| v >= 1.0,
    )
    .await;
    wait_until(
        &prometheus,
        "max_over_time(tombstoned_http_requests_in_flight{job=\"tombstoned\"}[5m])",
        |v| v >= 2.0,
    )
    .await;
    let answer = retry.await.unwrap();
    assert_eq!(answer.expect(409).problem(), "request-in-progress");
    read.await.unwrap().expect(200);
    claim_holder.batch_execute("ROLLBACK").await.unwrap();

    // expired: once the cleaner has tombstoned alice's first record, its retry gets 410.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let expired: bool = client
            .query_one(
                "SELECT expired FROM idempotency_records WHERE idempotency_key = 'k-created'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if expired {
            break;
        }
        assert!(Instant::now() < deadline, "k-created never tombstoned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone = daemon.create_order(ALICE, "k-created", &first).await;
    assert_eq!(gone.expect(410).problem(), "replay-window-expired");

    // Rate-limited: carol (burst 10, then 1 per second) until she gets a 429.
    let mut refused = false;
    for i in 0..200 {
        let reply = daemon
            .create_order(
                CAROL,
                &format!("k-carol-{i}"),
                &order(&format!("carol-{i}")),
            )
            .await;
        if reply.status == 429 {
            refused = true;
            break;
        }
        reply.expect(201);
    }
    assert!(refused, "carol was never rate-limited");

    // Every event reached Prometheus.
    for outcome in CLAIM_OUTCOMES {
        wait_until(
            &prometheus,
            &format!("tombstoned_claims_total{{job=\"tombstoned\",outcome=\"{outcome}\"}}"),
            |v| v >= 1.0,
        )
        .await;
    }
    for promql in [
        "sum(tombstoned_http_requests_total{status=\"429\"})",
        "tombstoned_cleanup_lock_timeouts_total",
        "tombstoned_cleanup_rows_tombstoned_total",
        "tombstoned_cleanup_runs_total{outcome=\"success\"}",
        "tombstoned_db_errors_total{sqlstate_class=\"55\"}",
    ] {
        wait_until(&prometheus, promql, |v| v >= 1.0).await;
    }

    // Every panel's every query returns at least one number (not only NaN from empty
    // histograms) over a window that covers the workload; where the workload made the panel's
    // event happen, a number above 0.
    let events: BTreeSet<(&str, &str)> = [
        ("Rows tombstoned per second", "A"),
        ("Batch duration p99", "A"),
        ("Lock timeouts", "A"),
        ("Runs by outcome", "A"),
        ("Last success age", "A"),
        ("Requests by route and status", "A"),
        ("Claims by outcome", "A"),
        ("Latency p50 / p99", "A"),
        ("Latency p50 / p99", "B"),
        ("Rate-limited (429)", "A"),
        ("API pool: in use, max, waiting", "B"),
        ("Errors by SQLSTATE class", "A"),
        ("Resident memory", "A"),
        ("Open file descriptors", "A"),
        ("Open file descriptors", "B"),
    ]
    .into_iter()
    .collect();
    let mut seen = BTreeSet::new();
    for (panel, target) in queries(&d) {
        let promql = substituted(&target.expr, "1m");
        let key = (panel.title.as_str(), target.ref_id.as_str());
        let wanted = |v: f64| v.is_finite() && (v > 0.0 || !events.contains(&key));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let found = values(&prometheus, &promql).await;
            if found.iter().any(|v| wanted(*v)) {
                seen.insert(key);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "panel {:?} query {}: {promql} returned {found:?}",
                panel.title,
                target.ref_id
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    assert!(
        events.is_subset(&seen),
        "no such panel: {:?}",
        events.difference(&seen).collect::<Vec<_>>()
    );
    // Claims of every outcome in the last minute, each its own series above 0.
    let claims = d
        .panels
        .iter()
        .find(|p| p.title == "Claims by outcome")
        .unwrap();
    let rates = values(&prometheus, &substituted(&claims.targets[0].expr, "1m")).await;
    assert_eq!(rates.len(), CLAIM_OUTCOMES.len(), "{rates:?}");
    assert!(rates.iter().all(|r| *r > 0.0), "{rates:?}");

    prometheus.stop().await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(daemon.wait_exit(PATIENCE).await.success());
}
