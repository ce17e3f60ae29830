//! The `[tracing]` section on the real daemon, the real binary's `check-config`, a real
//! PostgreSQL and a real OTLP/HTTP receiver (`traces_support`): `sample_ratio` applied by a
//! SIGHUP while the exporter's keys wait for a restart, as the README's reload rules say; an
//! https collector trusted through `tracing.ca_file` and through no other CA; `tracing.headers`
//! sent with every export, a wrong credential's spans dropped and counted, and the values shown
//! nowhere (trace-level logs, `check-config`); `check-config` refusing what `serve` refuses.
//!
//! Absence is never waited for: a sampled request after the ones that must leave nothing is the
//! fence (spans end child first and are exported in the order they ended), and a failed export
//! shows as `tombstoned_trace_spans_dropped_total`.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::conn_support::run_binary;
use crate::daemon_support::{Daemon, Spec, PATIENCE};
use crate::harness::TestDb;
use crate::tls_support::TestPki;
use crate::traces::post;
use crate::traces_support::{new_ids, Collector, ExportedSpan};

const DROPPED: &str = "tombstoned_trace_spans_dropped_total";
/// OTLP's server span kind.
const SERVER: i32 = 2;
/// The request span's name.
const REQUEST: &str = "POST /v1/orders";

/// `[tracing]` exporting to `endpoint` with `extra` keys, the cleaner off (its runs would be
/// traces of their own).
fn section(endpoint: &str, extra: &str) -> String {
    format!("[cleanup]\nenabled = false\n[tracing]\notlp_endpoint = {endpoint:?}\n{extra}\n")
}

fn trace_ids(spans: &[ExportedSpan]) -> BTreeSet<String> {
    spans.iter().map(|s| s.trace_id.clone()).collect()
}

/// A request with a sampled `traceparent` of a new trace (recorded whatever the ratio), until
/// its request span reaches `collector`: every span that ended before it was exported before it,
/// or counted dropped. Answers the trace id.
async fn fence(daemon: &Daemon, collector: &Collector, key: &str) -> String {
    let (trace, caller) = new_ids();
    let traceparent = format!("00-{trace}-{caller}-01");
    assert_eq!(post(daemon, key, Some(&traceparent)).await, 201);
    collector
        .wait_for("the sampled request's span", PATIENCE, |spans| {
            spans
                .iter()
                .any(|s| s.trace_id == trace && s.name == REQUEST && s.parent_span_id == caller)
        })
        .await;
    trace
}

/// A request without a `traceparent`, until its request span (the root of a trace `collector`
/// had not seen) arrives; answers that trace id. Only with a ratio of 1: nothing else makes
/// traces in these daemons.
async fn recorded_without_traceparent(daemon: &Daemon, collector: &Collector, key: &str) -> String {
    let known = trace_ids(&collector.spans());
    assert_eq!(post(daemon, key, None).await, 201);
    let is_new_root =
        |s: &ExportedSpan| s.name == REQUEST && s.kind == SERVER && s.parent_span_id.is_empty();
    let spans = collector
        .wait_for("a new trace's request span", PATIENCE, |spans| {
            spans
                .iter()
                .any(|s| is_new_root(s) && !known.contains(&s.trace_id))
        })
        .await;
    let new: Vec<_> = spans
        .iter()
        .filter(|s| is_new_root(s) && !known.contains(&s.trace_id))
        .collect();
    assert_eq!(new.len(), 1, "one request, one new trace: {new:#?}");
    new[0].trace_id.clone()
}

/// The daemon's "configuration reloaded" entries (JSON log), once there are `n`.
async fn reloads(daemon: &Daemon, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let entries: Vec<Value> = daemon
            .log()
            .lines()
            .filter(|l| l.contains("configuration reloaded"))
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|e| e["target"] == "tombstoned::daemon")
            .collect();
        if entries.len() >= n {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "{n} reloads expected:\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// README, SIGHUP and the `[tracing]` rows: `sample_ratio` is applied by a reload, every other
/// tracing key waits for a restart (named in the reload's lines), and an invalid value is refused
/// keeping the running configuration.
#[tokio::test]
async fn a_reload_applies_sample_ratio_and_keeps_the_exporter_until_a_restart() {
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    let other = Collector::start().await;
    let spec = |sections: &str| {
        Spec::new(&db.url)
            .config(sections)
            .flag("--log-format")
            .flag("json")
            .env("RUST_LOG", "info")
    };
    // A header whose value changes below (restart-only, as the endpoint).
    let first_tenant = "headers = { x-tenant = \"first\" }";
    let ratio = |ratio: &str| format!("sample_ratio = {ratio}\n{first_tenant}");
    let mut daemon = Daemon::start(spec(&section(&collector.url, &ratio("0.0")))).await;

    // Ratio 0: requests without a traceparent start no trace. The fence's request came after
    // theirs and its spans are the only ones there, none dropped: theirs were never made.
    for i in 0..5 {
        assert_eq!(post(&daemon, &format!("ratio-0-{i}"), None).await, 201);
    }
    let first = fence(&daemon, &collector, "ratio-fence-1").await;
    assert_eq!(trace_ids(&collector.spans()), BTreeSet::from([first]));
    assert_eq!(daemon.metric(DROPPED).await, Some(0.0));

    // SIGHUP with ratio 1: applied (a clean reload, nothing left for a restart), and every new
    // request is a trace from then on.
    daemon.rewrite_config(&section(&collector.url, &ratio("1.0")));
    daemon.signal(Signal::SIGHUP);
    let entry = &reloads(&daemon, 1).await[0];
    assert_eq!(entry["level"], "INFO", "{entry}");
    assert!(entry.get("not_applied").is_none(), "{entry}");
    let second = recorded_without_traceparent(&daemon, &collector, "ratio-1-a").await;
    let third = recorded_without_traceparent(&daemon, &collector, "ratio-1-b").await;
    assert_ne!(second, third);

    // An invalid ratio: the reload is refused naming the key, and the running ratio stays.
    daemon.rewrite_config(&section(&collector.url, &ratio("1.5")));
    daemon.signal(Signal::SIGHUP);
    let refused = daemon
        .wait_for_log(&["configuration reload rejected"])
        .await;
    assert!(refused.contains("tracing.sample_ratio"), "{refused}");
    recorded_without_traceparent(&daemon, &collector, "ratio-kept").await;

    // Another collector, service name and header with ratio 0: the ratio is applied, the
    // exporter's keys are named as waiting for a restart and keep their running values.
    let moved = section(
        &other.url,
        "sample_ratio = 0.0\nservice_name = \"renamed\"\nheaders = { x-tenant = \"second\" }",
    );
    daemon.rewrite_config(&moved);
    daemon.signal(Signal::SIGHUP);
    let entry = &reloads(&daemon, 2).await[1];
    assert_eq!(entry["level"], "INFO", "{entry}");
    assert_eq!(
        entry["not_applied"],
        "tracing.otlp_endpoint (at the next restart); tracing.service_name (at the next \
         restart); tracing.headers (at the next restart)",
        "{entry}"
    );
    let warning = daemon
        .wait_for_log(&["take effect only after a restart"])
        .await;
    let warning: Value = serde_json::from_str(&warning).unwrap();
    assert_eq!(warning["level"], "WARN");
    assert_eq!(
        warning["keys"], "tracing.otlp_endpoint, tracing.service_name, tracing.headers",
        "{warning}"
    );
    let before = trace_ids(&collector.spans());
    for i in 0..5 {
        assert_eq!(
            post(&daemon, &format!("ratio-0-again-{i}"), None).await,
            201
        );
    }
    let fourth = fence(&daemon, &collector, "ratio-fence-2").await;
    let spans = collector.spans();
    let new: BTreeSet<_> = trace_ids(&spans).difference(&before).cloned().collect();
    assert_eq!(new, BTreeSet::from([fourth.clone()]), "ratio 0 again");
    assert!(
        spans
            .iter()
            .filter(|s| s.trace_id == fourth)
            .all(|s| s.service == "tombstoned"),
        "the running service name: {spans:#?}"
    );
    assert_eq!(other.requests(), 0, "the running endpoint is kept");
    let tenants = |collector: &Collector| -> BTreeSet<String> {
        collector
            .request_headers()
            .iter()
            .map(|h| h["x-tenant"].to_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(tenants(&collector), BTreeSet::from(["first".to_owned()]));
    assert_eq!(daemon.metric(DROPPED).await, Some(0.0));

    // At the restart the file's endpoint and service name take effect.
    daemon.stop().await;
    let restarted = Daemon::start(spec(&moved)).await;
    let fifth = fence(&restarted, &other, "ratio-fence-3").await;
    let spans = other.spans();
    assert!(
        spans
            .iter()
            .all(|s| s.trace_id == fifth && s.service == "renamed"),
        "{spans:#?}"
    );
    assert_eq!(tenants(&other), BTreeSet::from(["second".to_owned()]));
}

/// `tracing.ca_file` as the relay's `outbox.ca_file`: an https collector whose certificate it
/// signs gets the spans; a daemon trusting another CA sends it nothing (the handshake fails), its
/// spans are dropped and counted, and its requests answer as usual.
#[tokio::test]
async fn an_https_collector_is_trusted_through_its_ca_file_alone() {
    let db = TestDb::new().await;
    let pki = TestPki::create();
    let stranger = TestPki::create();
    let collector = Collector::start_tls(&pki).await;
    assert!(collector.url.starts_with("https://"), "{}", collector.url);
    let trusting = |ca: &Path, service: &str| {
        section(
            &collector.url,
            &format!(
                "ca_file = {:?}\nservice_name = {service:?}",
                ca.display().to_string()
            ),
        )
    };
    let mut trusted =
        Daemon::start(Spec::new(&db.url).config(&trusting(&pki.ca_cert, "trusted"))).await;
    let refused = Daemon::start(
        Spec::new(&db.url)
            .config(&trusting(&stranger.ca_cert, "refused"))
            .flag("--log-format")
            .flag("json"),
    )
    .await;

    let trace = recorded_without_traceparent(&trusted, &collector, "tls-trusted").await;
    assert!(collector
        .spans()
        .iter()
        .filter(|s| s.trace_id == trace)
        .all(|s| s.service == "trusted"));
    assert_eq!(trusted.metric(DROPPED).await, Some(0.0));
    // Stopped (its last spans flushed): from now on, any export reaching the collector would be
    // the other daemon's.
    trusted.stop().await;
    let exports = collector.requests();

    // Another CA: every request still answers at once, and its spans are dropped, counted.
    for i in 0..3 {
        let started = Instant::now();
        assert_eq!(post(&refused, &format!("tls-refused-{i}"), None).await, 201);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    // Three request spans at least, each with its claim's and statements' spans.
    refused.wait_for_metric(DROPPED, |v| v >= 3.0).await;
    let line = refused
        .wait_for_log(&["trace spans dropped (tombstoned_trace_spans_dropped_total)"])
        .await;
    let entry: Value = serde_json::from_str(&line).unwrap();
    let reason = entry["reason"].as_str().unwrap_or_default();
    // The handshake refused the collector's certificate (signed by a CA it does not trust).
    assert!(
        reason.contains("cannot reach the collector")
            && reason.contains("invalid peer certificate"),
        "{entry}"
    );
    let spans = collector.spans();
    assert!(
        spans.iter().all(|s| s.service == "trusted"),
        "nothing from the daemon that does not trust the collector: {spans:#?}"
    );
    // Its exports failed in the handshake: none reached the collector as a request.
    assert_eq!(collector.requests(), exports);
}

/// `tracing.headers`: both sent with every export (the collector wants one, 401 otherwise); a
/// wrong credential's spans are dropped and counted; the values appear in no log line, at trace
/// level, nor in `check-config`, which names the headers.
#[tokio::test]
async fn export_headers_reach_the_collector_and_their_values_are_never_shown() {
    const TOKEN: &str = "Bearer trace-secret-5f1c2a9e";
    const WRONG: &str = "Bearer trace-secret-wrong-77d0";
    let db = TestDb::new().await;
    let collector = Collector::start().await;
    collector.require_header("authorization", TOKEN);
    let with_headers = |authorization: &str, service: &str| {
        section(
            &collector.url,
            &format!(
                "service_name = {service:?}\n\
                 headers = {{ Authorization = {authorization:?}, \"X-Tenant\" = \"acme-traces\" }}"
            ),
        )
    };
    // Every crate's debug and trace lines too (the HTTP client's among them).
    let spec = |sections: String| {
        Spec::new(&db.url)
            .config(&sections)
            .env("RUST_LOG", "trace")
    };
    let mut good = Daemon::start(spec(with_headers(TOKEN, "credentialed"))).await;
    let mut bad = Daemon::start(spec(with_headers(WRONG, "wrong-credential"))).await;

    let trace = recorded_without_traceparent(&good, &collector, "headers-good").await;
    assert!(collector
        .spans()
        .iter()
        .filter(|s| s.trace_id == trace)
        .all(|s| s.service == "credentialed"));
    let accepted: Vec<_> = collector
        .request_headers()
        .into_iter()
        .filter(|h| h.get("authorization").is_some_and(|v| v == TOKEN))
        .collect();
    assert!(!accepted.is_empty());
    for headers in &accepted {
        assert_eq!(
            headers.get("x-tenant").and_then(|v| v.to_str().ok()),
            Some("acme-traces"),
            "{headers:?}"
        );
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/x-protobuf")
        );
    }

    // The wrong credential: 401, the spans dropped and counted, the requests unaffected.
    for i in 0..3 {
        assert_eq!(post(&bad, &format!("headers-bad-{i}"), None).await, 201);
    }
    bad.wait_for_metric(DROPPED, |v| v >= 3.0).await;
    bad.wait_for_log(&["trace spans dropped", "the collector answered HTTP 401"])
        .await;
    assert!(collector
        .request_headers()
        .iter()
        .any(|h| h.get("authorization").is_some_and(|v| v == WRONG)));
    assert!(
        collector
            .spans()
            .iter()
            .all(|s| s.service == "credentialed"),
        "nothing kept from the wrong credential"
    );
    assert_eq!(good.metric(DROPPED).await, Some(0.0));

    // Their logs to the end (the last flush included): neither value, at any level.
    good.stop().await;
    bad.stop().await;
    for (daemon, name) in [(&good, "credentialed"), (&bad, "wrong-credential")] {
        let log = daemon.log();
        assert!(log.contains("exporting traces"), "{name}: {log}");
        assert!(
            log.contains(" TRACE "),
            "{name} logged at trace level: {log}"
        );
        assert!(
            !log.contains("trace-secret"),
            "{name} logged a header value"
        );
    }

    // check-config on the file the daemon ran with: the names, never the values.
    let path = good.config_path.display().to_string();
    let checked = run_binary(
        &["--config", &path, "check-config"],
        &db.url,
        &[("RUST_LOG", "trace")],
    )
    .await;
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    let line = checked
        .stdout
        .lines()
        .find(|l| l.starts_with("tracing: "))
        .unwrap_or_else(|| panic!("no tracing line: {}", checked.stdout));
    assert!(
        line.contains("2 headers authorization, x-tenant (values not shown)"),
        "{line}"
    );
    for output in [&checked.stdout, &checked.stderr] {
        assert!(!output.contains("trace-secret"), "{output}");
    }
    // OTEL_EXPORTER_OTLP_HEADERS's form through tombstoned's variable: the same.
    let checked = run_binary(
        &["--config", &path, "check-config"],
        &db.url,
        &[(
            "TOMBSTONED_TRACING__HEADERS",
            "authorization=Bearer%20trace-secret-from-env",
        )],
    )
    .await;
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    assert!(
        checked
            .stdout
            .contains("1 header authorization (values not shown)"),
        "{}",
        checked.stdout
    );
    for output in [&checked.stdout, &checked.stderr] {
        assert!(!output.contains("trace-secret"), "{output}");
    }
}

/// `check-config` validates `[tracing]` as `serve` does: every refused value named in one run
/// (exit 64) and no secret repeated, and a CA file that holds no certificate refused by both.
#[tokio::test]
async fn check_config_refuses_what_serve_refuses_in_tracing() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let check = async |text: &str| {
        let path = dir.path().join("tombstoned.toml");
        std::fs::write(&path, text).unwrap();
        let path = path.display().to_string();
        run_binary(&["--config", &path, "check-config"], &db.url, &[]).await
    };

    let checked = check(
        "[tracing]\n\
         otlp_endpoint = \"https://user:url-secret@collector.invalid\"\n\
         sample_ratio = 1.5\n\
         headers = { \"bad name\" = \"header-secret\" }\n",
    )
    .await;
    assert_eq!(checked.code, Some(64), "{}", checked.stderr);
    for key in [
        "tracing.otlp_endpoint",
        "tracing.sample_ratio",
        "tracing.headers",
    ] {
        assert!(checked.stderr.contains(key), "{key}: {}", checked.stderr);
    }
    for secret in ["url-secret", "header-secret"] {
        assert!(
            !checked.stderr.contains(secret) && !checked.stdout.contains(secret),
            "{secret}: {checked:?}"
        );
    }

    // A CA file with no certificate in it.
    let ca = dir.path().join("not-a-ca.pem");
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let sections = format!(
        "[tracing]\notlp_endpoint = \"https://127.0.0.1:4318\"\nca_file = {:?}\n",
        ca.display().to_string()
    );
    let checked = check(&sections).await;
    assert_eq!(checked.code, Some(64), "{checked:?}");
    assert!(
        checked.stderr.contains("tracing.ca_file"),
        "{}",
        checked.stderr
    );
    let mut serve = Daemon::spawn(Spec::new(&db.url).config(&sections)).await;
    let status = serve.wait_exit(PATIENCE).await;
    assert_eq!(status.code(), Some(64), "{}", serve.log());
    assert!(serve.log().contains("tracing.ca_file"), "{}", serve.log());
}
