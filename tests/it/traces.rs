//! Traces (issue 40) against a real OTLP/HTTP receiver on loopback (`traces_support`: our own
//! axum server decoding the protobuf with `opentelemetry-proto`), the real daemon, the real relay
//! and webhook receiver, and a real PostgreSQL: one trace from a caller's `traceparent` through
//! the claim and its statement to the delivery of its outbox event and the receiver's
//! `traceparent`; a sampled-out caller recorded nowhere; the SQL API's `tombstoned.traceparent`
//! continued by the relay's delivery (a span link); a cleanup run's run and batch spans; log
//! lines carrying the ids; no key, body, token or password in any span; and a collector that
//! fails, answers late or is down costing the requests nothing, its drops counted.

use std::time::{Duration, Instant};

use crate::api_support::order;
use crate::cleanup_support::{seed_live, DUE};
use crate::clients_support::{run_suite, ClientEnv};
use crate::daemon_support::{Daemon, Spec, BOB, PATIENCE};
use crate::harness::{binary, TestDb};
use crate::outbox_support::{outbox_section, secret_file, Receiver, SECRET};
use crate::traces_support::{new_ids, Answer, Collector, ExportedSpan};

/// OTLP's span kinds.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;

fn tracing_section(collector: &Collector, ratio: &str) -> String {
    format!(
        "[tracing]\notlp_endpoint = \"{}\"\nsample_ratio = {ratio}\n",
        collector.url
    )
}

/// `POST /v1/orders` with an optional `traceparent`.
pub(crate) async fn post(daemon: &Daemon, key: &str, traceparent: Option<&str>) -> u16 {
    let mut request = daemon
        .http
        .post(format!("{}/v1/orders", daemon.api))
        .bearer_auth(BOB)
        .header("Idempotency-Key", key)
        .json(&order(&format!("req-{key}")));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.unwrap().status().as_u16()
}

/// The outbox event of the order the claim of `key` created: its id and stored traceparent.
async fn order_event(client: &tokio_postgres::Client, key: &str) -> (uuid::Uuid, Option<String>) {
    let row = client
        .query_one(
            "SELECT e.event_id, e.traceparent FROM outbox_events e
               JOIN idempotency_records r ON r.order_id = e.order_id
              WHERE r.idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

fn in_trace<'a>(spans: &'a [ExportedSpan], trace_id: &str) -> Vec<&'a ExportedSpan> {
    spans.iter().filter(|s| s.trace_id == trace_id).collect()
}

fn one<'a>(spans: &[&'a ExportedSpan], name: &str) -> &'a ExportedSpan {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one span {name:?} in {spans:#?}");
    found[0]
}

#[tokio::test]
async fn one_trace_from_the_callers_request_through_the_claim_and_the_outbox_to_the_receiver() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let collector = Collector::start().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    // Ratio 0: only a caller's sampled trace is recorded (parent-based).
    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config(&outbox_section(&receiver.url, &secret, &[]))
            .config("[cleanup]\nenabled = false\n")
            .config(&tracing_section(&collector, "0.0"))
            .env("RUST_LOG", "info,tombstoned::outbox=debug")
            .flag("--log-format")
            .flag("json"),
    )
    .await;

    // A caller whose trace is sampled out, and one without a trace: nothing recorded, and their
    // events stored without a context, delivered as before traces.
    let (unsampled_trace, unsampled_parent) = new_ids();
    let unsampled = format!("00-{unsampled_trace}-{unsampled_parent}-00");
    assert_eq!(
        post(&daemon, "trace-key-unsampled", Some(&unsampled)).await,
        201
    );
    assert_eq!(post(&daemon, "trace-key-untraced", None).await, 201);
    for key in ["trace-key-unsampled", "trace-key-untraced"] {
        let (event, stored) = order_event(&client, key).await;
        assert_eq!(stored, None, "{key}");
        receiver.wait_arrivals(event, 1).await;
        assert_eq!(receiver.arrivals_of(event)[0].traceparent, None, "{key}");
    }

    // A caller's sampled trace.
    let (trace, caller_span) = new_ids();
    let caller = format!("00-{trace}-{caller_span}-01");
    assert_eq!(post(&daemon, "trace-key-sampled", Some(&caller)).await, 201);

    // A service's own transaction through the SQL API, its trace context set locally.
    let (service_trace, service_span) = new_ids();
    let service_context = format!("00-{service_trace}-{service_span}-01");
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            "SELECT set_config('tombstoned.traceparent', $1, true)",
            &[&service_context],
        )
        .await
        .unwrap();
    let enqueued: uuid::Uuid = client
        .query_one(
            "SELECT enqueue_event('acme', 'invoice-7', 'invoice.sent', '{\"n\": 7}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client.batch_execute("COMMIT").await.unwrap();
    // Without the setting (and with a wrong one) an event has no context: delivered as before.
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            "SELECT set_config('tombstoned.traceparent', 'not-a-traceparent', true)",
            &[],
        )
        .await
        .unwrap();
    let plain: uuid::Uuid = client
        .query_one(
            "SELECT enqueue_event('acme', 'invoice-8', 'invoice.sent', '{}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    client.batch_execute("COMMIT").await.unwrap();

    let (order_event_id, stored) = order_event(&client, "trace-key-sampled").await;
    let stored = stored.expect("the endpoint stores the request's trace context");
    assert!(stored.starts_with(&format!("00-{trace}-")), "{stored}");
    let stored_span = stored[36..52].to_owned();
    receiver.wait_arrivals(order_event_id, 1).await;
    receiver.wait_arrivals(enqueued, 1).await;
    receiver.wait_arrivals(plain, 1).await;

    let spans = collector
        .wait_for(
            "the request's and the deliveries' spans",
            PATIENCE,
            |spans| {
                in_trace(spans, &trace).len() >= 4 && !in_trace(spans, &service_trace).is_empty()
            },
        )
        .await;

    // server -> claim -> statement, in the caller's trace.
    let request = in_trace(&spans, &trace);
    let server = one(&request, "POST /v1/orders");
    assert_eq!(server.kind, SERVER);
    assert_eq!(server.parent_span_id, caller_span);
    assert_eq!(server.service, "tombstoned");
    assert_eq!(server.attribute("http.route"), Some("/v1/orders"));
    assert_eq!(server.attribute("http.response.status_code"), Some("201"));
    let claim = one(&request, "claim create-order");
    assert_eq!(claim.parent_span_id, server.span_id);
    assert_eq!(claim.attribute("tombstoned.outcome"), Some("created"));
    let statement = one(&request, "claim_and_create");
    assert_eq!(statement.parent_span_id, claim.span_id);
    assert_eq!(statement.kind, CLIENT);
    assert_eq!(statement.attribute("db.system.name"), Some("postgresql"));
    assert_eq!(
        claim.span_id, stored_span,
        "the event stores its claim's span"
    );

    // The delivery: in the trace, linked to where the event was enqueued, and the receiver
    // continues it from the delivery span.
    let delivery = one(&request, "POST");
    assert_eq!(delivery.kind, CLIENT);
    assert_eq!(delivery.links, [(trace.clone(), stored_span.clone())]);
    let order_event_text = order_event_id.to_string();
    assert_eq!(
        delivery.attribute("tombstoned.outbox.event_id"),
        Some(order_event_text.as_str())
    );
    assert_eq!(delivery.attribute("tombstoned.outbox.attempt"), Some("1"));
    assert_eq!(delivery.attribute("http.response.status_code"), Some("204"));
    let arrived = receiver.arrivals_of(order_event_id);
    assert_eq!(
        arrived[0].traceparent.as_deref(),
        Some(format!("00-{trace}-{}-01", delivery.span_id).as_str())
    );

    // The SQL API's event: the relay continues the service's trace, linked to its span.
    let service = in_trace(&spans, &service_trace);
    let service_delivery = one(&service, "POST");
    assert_eq!(service_delivery.parent_span_id, service_span);
    assert_eq!(
        service_delivery.links,
        [(service_trace.clone(), service_span.clone())]
    );
    assert_eq!(
        receiver.arrivals_of(enqueued)[0].traceparent.as_deref(),
        Some(format!("00-{service_trace}-{}-01", service_delivery.span_id).as_str())
    );
    // No context stored: no traceparent, exactly as before traces.
    assert_eq!(receiver.arrivals_of(plain)[0].traceparent, None);
    let plain_stored: Option<String> = client
        .query_one(
            "SELECT traceparent FROM outbox_events WHERE event_id = $1",
            &[&plain],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain_stored, None);

    // Sampled out, or no caller trace with ratio 0: nothing at all. Their spans ended before
    // the ones above were queued, and the queue is sent in order.
    assert!(in_trace(&spans, &unsampled_trace).is_empty(), "{spans:#?}");
    let traces: std::collections::BTreeSet<_> = spans.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 2, "only the two sampled traces: {traces:?}");

    // Log lines inside a span carry its ids (JSON logs as fields).
    daemon
        .wait_for_log(&[&format!("\"trace_id\":\"{trace}\""), "\"span_id\":\""])
        .await;

    // A cleanup run (the command, every run recorded): its run span and its batches inside.
    seed_live(&client, "traced", 20, DUE).await;
    let cleanup = tokio::process::Command::new(binary())
        .arg("cleanup")
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url)
        .env("TOMBSTONED_TRACING__SAMPLE_RATIO", "1.0")
        .env("OTEL_SERVICE_NAME", "tombstoned-cleanup")
        .output()
        .await
        .unwrap();
    assert!(cleanup.status.success(), "{cleanup:?}");
    // The command flushes before it exits: its spans are there now.
    let spans = collector.spans();
    let run_spans: Vec<_> = spans
        .iter()
        .filter(|s| s.service == "tombstoned-cleanup")
        .collect();
    let run = one(&run_spans, "cleanup run");
    assert_eq!(run.parent_span_id, "");
    assert_eq!(
        run.attribute("tombstoned.cleanup.rows_tombstoned"),
        Some("20")
    );
    let batches: Vec<_> = run_spans
        .iter()
        .filter(|s| s.name == "cleanup batch")
        .collect();
    assert!(!batches.is_empty(), "{run_spans:#?}");
    assert!(batches
        .iter()
        .all(|b| b.parent_span_id == run.span_id && b.trace_id == run.trace_id));
    assert!(batches.iter().any(
        |b| b.attribute("tombstoned.cleanup.phase") == Some("tombstone")
            && b.attribute("tombstoned.cleanup.rows") == Some("20")
    ));

    // Over every span of the run: no key, body, token or password.
    let password = reqwest::Url::parse(&db.url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned));
    let mut secrets = vec![
        "trace-key-".to_owned(),
        BOB.to_owned(),
        SECRET.to_owned(),
        "reader@example.com".to_owned(),
        "req-trace-key".to_owned(),
        "invoice-7".to_owned(),
        "\"n\": 7".to_owned(),
    ];
    secrets.extend(password.filter(|p| !p.is_empty()));
    for span in &spans {
        let text = format!("{} {:?}", span.name, span.attributes);
        for secret in &secrets {
            assert!(!text.contains(secret.as_str()), "{secret:?} in {span:#?}");
        }
    }
}

/// A collector that answers 500, then answers only after 5 s, then is down: every claim still
/// answers at once, and the spans it could not take are dropped, counted and logged at most once
/// a minute. Then, with the collector stalling again, a SIGTERM: the daemon still exits within
/// the flush bound, the spans it could not send counted in its last log line.
#[tokio::test]
async fn a_failing_slow_or_absent_collector_costs_the_requests_nothing() {
    let db = TestDb::new().await;
    let mut collector = Collector::start().await;
    let mut daemon = Daemon::start(
        Spec::new(&db.url)
            .config("[cleanup]\nenabled = false\n")
            .config(&tracing_section(&collector, "1.0")),
    )
    .await;
    let dropped = "tombstoned_trace_spans_dropped_total";
    assert_eq!(daemon.metric(dropped).await, Some(0.0));
    let started = Instant::now();
    let mut n = 0;
    let mut claims = |count: usize| -> Vec<String> {
        (0..count)
            .map(|_| {
                n += 1;
                format!("fault-{n}")
            })
            .collect()
    };
    // The slowest claim of `keys`, one after another (an export in their way would show here).
    async fn slowest(daemon: &Daemon, keys: Vec<String>) -> Duration {
        let mut slowest = Duration::ZERO;
        for key in keys {
            let started = Instant::now();
            assert_eq!(post(daemon, &key, None).await, 201);
            slowest = slowest.max(started.elapsed());
        }
        slowest
    }
    async fn wait_until(what: &str, done: impl AsyncFn() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done().await {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let drops = async |daemon: &Daemon| daemon.metric(dropped).await.unwrap_or(0.0);

    collector.answer(Answer::Status(500));
    let failing = slowest(&daemon, claims(30)).await;
    wait_until("a drop counted for HTTP 500", async || {
        drops(&daemon).await >= 1.0
    })
    .await;

    collector.answer(Answer::Late(Duration::from_secs(5)));
    let requests = collector.requests();
    let mut late = slowest(&daemon, claims(30)).await;
    wait_until("an export reached the late collector", async || {
        collector.requests() > requests
    })
    .await;
    // Claims while that export waits for its answer.
    late = late.max(slowest(&daemon, claims(10)).await);

    let before_down = drops(&daemon).await;
    collector.down().await;
    let down = slowest(&daemon, claims(30)).await;
    wait_until("a drop counted with the collector down", async || {
        drops(&daemon).await > before_down
    })
    .await;
    println!("slowest claim: collector 500 {failing:?}, late {late:?}, down {down:?}");
    // Far below the 5 s the late collector takes: no claim waited for an export.
    for slowest in [failing, late, down] {
        assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    }
    let log = daemon.log();
    let lines = log
        .matches("trace spans dropped (tombstoned_trace_spans_dropped_total)")
        .count() as u64;
    let minutes = started.elapsed().as_secs() / 60;
    assert!((1..=1 + minutes).contains(&lines), "{lines} lines: {log}");

    // Stalling again, with spans queued and an export waiting for its answer: a SIGTERM ends
    // the daemon within the flush bound (5 s) and a little, not the collector's time.
    collector.up().await;
    let requests = collector.requests();
    slowest(&daemon, claims(10)).await;
    wait_until("an export reached the stalling collector", async || {
        collector.requests() > requests
    })
    .await;
    slowest(&daemon, claims(10)).await;
    let stopping = Instant::now();
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_exit(PATIENCE).await;
    let took = stopping.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took < tombstoned::telemetry::FLUSH_BOUND + Duration::from_secs(3),
        "stopped after {took:?}"
    );
    daemon
        .wait_for_log(&["trace spans dropped since the last report"])
        .await;
}

/// The Python client (issue 38) passes its caller's trace on: a service's `enqueue_event` inside
/// an active OpenTelemetry span (the OpenTelemetry API package, as the caller's instrumentation
/// makes one current) reaches the webhook receiver as a `traceparent` of that trace, through the
/// relay's delivery span linked to the caller's. Its pytest file for the stored context first.
#[tokio::test]
async fn the_python_clients_caller_trace_reaches_the_receiver() {
    let python = crate::clients_python::setup();
    let project = crate::ops_support::repo_root().join("clients/python");
    let env = ClientEnv::new("pytrace").await;
    run_suite(
        &env,
        &project,
        &python,
        &[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_trace.py",
        ],
        &[],
    )
    .await;

    let relay = TracedRelay::start(&env).await;
    let (trace, caller_span) = new_ids();
    let script = r#"
import os, psycopg, tombstoned
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

caller = SpanContext(int(os.environ["TRACE_ID"], 16), int(os.environ["SPAN_ID"], 16),
                     is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
with psycopg.connect(os.environ["TOMBSTONED_TEST_SERVICE_URL"]) as conn:
    with conn.transaction(), trace.use_span(NonRecordingSpan(caller)):
        event = tombstoned.enqueue_event(conn, "acme", "py-invoice", "invoice.sent", {"n": 1},
                                         schema=os.environ["TOMBSTONED_TEST_SCHEMA"])
print(event)
"#;
    let mut caller = tokio::process::Command::new(&python);
    caller
        .args(["-c", script])
        .env("PYTHONPATH", project.join("src"));
    relay
        .enqueue_in_span_and_check(caller, &env, &trace, &caller_span)
        .await;
}

/// A relay (the daemon, API off) delivering to a webhook receiver, with traces on (ratio 0: only
/// a caller's sampled trace is recorded) and exported to a collector.
struct TracedRelay {
    collector: Collector,
    receiver: Receiver,
    _secret: tempfile::TempDir,
    _daemon: Daemon,
}

impl TracedRelay {
    async fn start(env: &ClientEnv) -> TracedRelay {
        let collector = Collector::start().await;
        let receiver = Receiver::start(&env.db).await;
        let (dir, secret) = secret_file();
        let daemon = Daemon::start(
            Spec::new(&env.db.url)
                .config(&outbox_section(&receiver.url, &secret, &[]))
                .config("[api]\nenabled = false\n[cleanup]\nenabled = false\n")
                .config(&tracing_section(&collector, "0.0")),
        )
        .await;
        TracedRelay {
            collector,
            receiver,
            _secret: dir,
            _daemon: daemon,
        }
    }

    /// Runs `caller` (a client's script printing the id of the event it enqueued inside a span
    /// `TRACE_ID`/`SPAN_ID`) with the suite's variables, then checks that event's delivery.
    async fn enqueue_in_span_and_check(
        &self,
        mut caller: tokio::process::Command,
        env: &ClientEnv,
        trace: &str,
        caller_span: &str,
    ) {
        let output = caller
            .envs(env.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("TRACE_ID", trace)
            .env("SPAN_ID", caller_span)
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        let event: uuid::Uuid = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap();
        self.assert_caller_trace_delivered(event, trace, caller_span)
            .await;
    }

    /// `event`, enqueued inside the caller's span `caller_span` of `trace`, was delivered with a
    /// span of that trace linked to it, and the receiver got that span's `traceparent`.
    async fn assert_caller_trace_delivered(
        &self,
        event: uuid::Uuid,
        trace: &str,
        caller_span: &str,
    ) {
        self.receiver.wait_arrivals(event, 1).await;
        let spans = self
            .collector
            .wait_for("the delivery's span", PATIENCE, |spans| {
                !in_trace(spans, trace).is_empty()
            })
            .await;
        let delivery = one(&in_trace(&spans, trace), "POST");
        assert_eq!(delivery.links, [(trace.to_owned(), caller_span.to_owned())]);
        assert_eq!(delivery.parent_span_id, caller_span);
        assert_eq!(
            self.receiver.arrivals_of(event)[0].traceparent.as_deref(),
            Some(format!("00-{trace}-{}-01", delivery.span_id).as_str())
        );
    }
}

/// The Node client (issue 38) passes its caller's trace on, as the Python client does: its
/// `enqueueEvent` inside an active span (`@opentelemetry/api` with the SDK's async-hooks context
/// manager) reaches the receiver as a `traceparent` of that trace. Its node:test file first.
#[tokio::test]
async fn the_node_clients_caller_trace_reaches_the_receiver() {
    crate::clients_node::setup();
    let project = crate::ops_support::repo_root().join("clients/node");
    let env = ClientEnv::new("nodetrace").await;
    let node = std::path::Path::new("node");
    run_suite(&env, &project, node, &["--test", "test/trace.test.js"], &[]).await;

    let relay = TracedRelay::start(&env).await;
    let (trace, caller_span) = new_ids();
    let script = r#"
import pg from 'pg';
import { context, trace, TraceFlags } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { enqueueEvent } from '@tombstoned/client';

context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const client = new pg.Client({ connectionString: process.env.TOMBSTONED_TEST_SERVICE_URL });
await client.connect();
const caller = trace.wrapSpanContext({
  traceId: process.env.TRACE_ID, spanId: process.env.SPAN_ID, traceFlags: TraceFlags.SAMPLED,
});
await client.query('BEGIN');
const event = await context.with(trace.setSpan(context.active(), caller), () =>
  enqueueEvent(client, 'acme', 'node-invoice', 'invoice.sent', { n: 1 },
               { schema: process.env.TOMBSTONED_TEST_SCHEMA }));
await client.query('COMMIT');
await client.end();
console.log(event);
"#;
    let mut caller = tokio::process::Command::new(node);
    caller
        .args(["--input-type=module", "-e", script])
        .current_dir(&project);
    relay
        .enqueue_in_span_and_check(caller, &env, &trace, &caller_span)
        .await;
}

/// Through PgBouncer in transaction mode the claim is one call of its function, an implicit
/// transaction; a traced claim runs it in an explicit one whose first statement sets the trace
/// context, so its order event is stored with the claim's span there too.
#[tokio::test]
async fn a_traced_claim_through_a_transaction_pooler_stores_its_context() {
    use crate::pooler_support::{PgBouncer, PoolMode};
    let bouncer = PgBouncer::start(PoolMode::Transaction, 4).await;
    let db = TestDb::new().await;
    let client = db.client().await;
    let collector = Collector::start().await;
    let daemon = Daemon::start(
        Spec::new(&bouncer.url(&db.name))
            .env(
                "TOMBSTONED_DATABASE__POOLER",
                PoolMode::Transaction.setting(),
            )
            .env("TOMBSTONED_DATABASE__POOL_SIZE", "4")
            .config("[cleanup]\nenabled = false\n")
            .config(&tracing_section(&collector, "0.0")),
    )
    .await;
    let (trace, caller_span) = new_ids();
    let caller = format!("00-{trace}-{caller_span}-01");
    assert_eq!(post(&daemon, "pooled-sampled", Some(&caller)).await, 201);
    assert_eq!(post(&daemon, "pooled-untraced", None).await, 201);
    let spans = collector
        .wait_for("the pooled claim's span", PATIENCE, |spans| {
            spans
                .iter()
                .any(|s| s.trace_id == trace && s.name == "claim create-order")
        })
        .await;
    let claim = one(&in_trace(&spans, &trace), "claim create-order");
    let (_, stored) = order_event(&client, "pooled-sampled").await;
    assert_eq!(stored, Some(format!("00-{trace}-{}-01", claim.span_id)));
    assert_eq!(order_event(&client, "pooled-untraced").await.1, None);
}
