//! `tombstoned conformance` (issue 39), the real binary against real HTTP endpoints: the
//! built-in `POST /v1/orders` of a running `serve`, the three example services and the clients'
//! sample apps of their other adapters (Django, Fastify) pass every check, `expired` included;
//! endpoints broken here in one way each fail exactly the checks that rule guards and pass the
//! others; the `--json` document holds every request and answer with
//! the credentials redacted; usage errors and an unreachable URL exit 64 and 69 with one line.

use std::time::Duration;

use serde_json::Value;

use crate::conformance_support::{
    assert_lines, conformance, endpoint, expected, results, strings, Endpoint, Fault, Ran, ALICE,
    BOB, CHECKS,
};
use crate::daemon_support::{self, Daemon, Spec};
use crate::examples::{self, Example};
use crate::harness::TestDb;

/// The broken endpoints' replay window: long enough for the checks between `first` and
/// `scoped` on a loaded machine (they take milliseconds), short enough for `expired`.
const WINDOW: Duration = Duration::from_secs(2);
/// What `--expiry` allows for it: generous, the check ends at the 410.
const EXPIRY: &str = "30s";

/// The run against one of this file's endpoints, as alice with bob for `scoped`.
async fn check(endpoint: &Endpoint, extra: &[&str]) -> Ran {
    let alice = format!("Authorization: Bearer {ALICE}");
    let bob = format!("Authorization: Bearer {BOB}");
    let mut args = vec![
        endpoint.url.as_str(),
        "--body",
        r#"{"request_id": "{{uuid}}", "amount": "100.00", "item": "book"}"#,
        "--other-body",
        r#"{"request_id": "{{uuid}}", "amount": "120.00", "item": "book"}"#,
        "--header",
        &alice,
        "--other-principal-header",
        &bob,
        "--concurrency",
        "4",
        "--expiry",
        EXPIRY,
        "--json",
    ];
    args.extend_from_slice(extra);
    conformance(&args).await
}

/// Runs the checks (with `extra` flags) against an endpoint broken by `fault`, and asserts the
/// whole vector: the checks in `failed` fail, those in `skipped` are skipped, every other passes,
/// the exit status says so.
async fn broken(fault: Fault, extra: &[&str], failed: &[&str], skipped: &[&str]) -> Value {
    let endpoint = endpoint(fault, WINDOW).await;
    let ran = check(&endpoint, extra).await;
    let doc = ran.json();
    let context = format!("{fault:?} {extra:?}:\n{}", ran.stdout);
    assert_eq!(results(&doc), expected(failed, skipped), "{context}");
    let code = if failed.is_empty() { 0 } else { 1 };
    assert_eq!(ran.code, Some(code), "{context}\n{}", ran.stderr);
    assert_eq!(ran.stderr, "", "{context}");
    doc
}

/// The `got` of check `name`.
fn got<'a>(doc: &'a Value, name: &str) -> &'a str {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["got"].as_str())
        .unwrap()
}

/// Each broken endpoint: its fault, extra flags, the checks it fails, the checks skipped, and
/// what the first failing (or skipped) check's `got` says.
type Case = (
    Fault,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
);

const BROKEN: [Case; 7] = [
    // A stored answer replayed for another body.
    (
        Fault::IgnoresFingerprint,
        &[],
        &["key_reused"],
        &[],
        "201 with Idempotent-Replayed: true",
    ),
    // Byte identity is what `replay`, `replay_reordered` and `concurrent` (whose replays must be
    // the original's bytes) each require: re-serialising breaks those three.
    (
        Fault::ReserialisesAnswers,
        &[],
        &["replay", "replay_reordered", "concurrent"],
        &[],
        "differing from byte",
    ),
    (
        Fault::ForgetsAfterWindow,
        &[],
        &["expired"],
        &[],
        "a fresh execution after",
    ),
    (Fault::Unscoped, &[], &["scoped"], &[], "a replay"),
    // The endpoint waits until the 4 racers have all looked the key up before any inserts: the
    // race happens on every run, and each racer executes.
    (
        Fault::CheckThenInsert(4),
        &[],
        &["concurrent"],
        &[],
        "4 (201, 201, 201, 201): the request ran more than once",
    ),
    (
        Fault::AcceptsNoKey,
        &[],
        &["missing_key"],
        &[],
        "201, Location /orders/",
    ),
    // Said to be optional, the key's absence is a skip.
    (
        Fault::AcceptsNoKey,
        &["--key-optional"],
        &[],
        &["missing_key"],
        "the key is optional (--key-optional)",
    ),
];

/// Every broken endpoint at once (each run mostly waits for its window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_broken_endpoint_fails_exactly_the_checks_its_fault_breaks() {
    let runs = BROKEN
        .iter()
        .map(|&(fault, extra, failed, skipped, says)| async move {
            let doc = broken(fault, extra, failed, skipped).await;
            let name = failed.first().or(skipped.first()).unwrap();
            let said = got(&doc, name);
            assert!(said.contains(says), "{fault:?}: {name}: {said}");
        });
    futures::future::join_all(runs).await;
}

/// An endpoint keeping every rule passes every check. The document: every check with its
/// fields, the requests as sent (the same key always the same body; the re-spelled body the same
/// JSON) with their answers, no credential anywhere.
#[tokio::test]
async fn the_json_document_records_every_request_without_credentials() {
    let endpoint = endpoint(Fault::None, WINDOW).await;
    let ran = check(&endpoint, &[]).await;
    let doc = ran.json();
    assert_eq!(results(&doc), expected(&[], &[]), "{}", ran.stdout);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    assert_eq!(
        doc["summary"],
        serde_json::json!({"passed": 9, "failed": 0, "skipped": 0})
    );
    assert_eq!(doc["url"], endpoint.url.as_str());
    assert_eq!(doc["method"], "POST");
    let checks = doc["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, CHECKS);
    for check in checks {
        for field in ["expected", "got"] {
            assert!(
                check[field].as_str().is_some_and(|s| !s.is_empty()),
                "{check:#}"
            );
        }
        assert!(
            !check["requests"].as_array().unwrap().is_empty(),
            "{check:#}"
        );
    }
    let sent: u64 = checks
        .iter()
        .map(|c| c["requests"].as_array().unwrap().len() as u64)
        .sum();
    assert_eq!(doc["requests_sent"], sent);
    // Nothing of the tokens, anywhere; their headers are there, redacted.
    assert!(!ran.stdout.contains(ALICE) && !ran.stdout.contains(BOB));
    let request = |check: usize, i: usize| &checks[check]["requests"][i]["request"];
    let header = |request: &Value, name: &str| -> Option<String> {
        request["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == name)
            .map(|h| h["value"].as_str().unwrap().to_owned())
    };
    let first = request(0, 0);
    assert_eq!(
        header(first, "authorization").as_deref(),
        Some("[redacted]")
    );
    let scoped = request(7, 0);
    assert_eq!(
        header(scoped, "authorization").as_deref(),
        Some("[redacted]")
    );
    // The same key: the same body, byte for byte; re-spelled, the same JSON in other bytes.
    let key = header(first, "idempotency-key").unwrap();
    assert_eq!(header(request(1, 0), "idempotency-key").unwrap(), key);
    assert_eq!(request(1, 0)["body"], first["body"]);
    assert_eq!(header(scoped, "idempotency-key").unwrap(), key);
    assert_eq!(scoped["body"], first["body"]);
    let body = |r: &Value| serde_json::from_str::<Value>(r["body"].as_str().unwrap()).unwrap();
    assert_ne!(request(2, 0)["body"], first["body"]);
    assert_eq!(body(request(2, 0)), body(first));
    // The {{uuid}} was replaced; a fresh key for `concurrent` carries a fresh id.
    let id = body(first)["request_id"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    let racer = request(4, 0);
    assert_ne!(header(racer, "idempotency-key").unwrap(), key);
    assert_ne!(body(racer)["request_id"], id.as_str());
    // Answers whole: the first's status, headers and body.
    let answer = &checks[0]["requests"][0]["answer"];
    assert_eq!(answer["status"], 201);
    assert!(answer["body"].as_str().unwrap().contains(&id));
    assert!(strings(answer).iter().any(|s| s.starts_with("/orders/")));
    // Executions: `first`'s, `concurrent`'s and bob's own in `scoped`, nothing else.
    assert_eq!(endpoint.executions(), 3);
}

/// The built-in endpoint with a short replay window and cleanup every second: every check
/// passes, in the text report, and the run created exactly the orders it should: `first`'s and
/// `concurrent`'s (bob's request in `scoped` is refused: the request_id is alice's).
#[tokio::test]
async fn the_built_in_endpoint_passes_every_check() {
    let db = TestDb::new().await;
    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config("[retention]\nreplay_window = \"3s\"\n[cleanup]\nschedule = \"* * * * * *\""),
    )
    .await;
    let url = format!("{}/v1/orders", daemon.api);
    let alice = format!("Authorization: Bearer {}", daemon_support::ALICE);
    let bob = format!("Authorization: Bearer {}", daemon_support::BOB);
    let ran = conformance(&[
        &url,
        "--body",
        r#"{"request_id": "PR-{{uuid}}", "amount": "100.00", "item": "SKU-42", "recipient": "Li Wei"}"#,
        "--other-body",
        r#"{"request_id": "PR-{{uuid}}", "amount": "120.00", "item": "SKU-42", "recipient": "Li Wei"}"#,
        "--header",
        &alice,
        "--other-principal-header",
        &bob,
        "--expiry",
        EXPIRY,
    ])
    .await;
    assert_lines(&ran, &[], &[]);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let orders: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 2, "{}", daemon.log());
}

/// One example service, or a client's sample app, started with a replay window of 3 seconds on
/// `db` (whose daemon cleans every second) as the service role `url`: every check passes,
/// `expired` included, with the other principal's credentials for `scoped`.
async fn example_passes_every_check(example: Example, db: &TestDb, url: &str) {
    let service = examples::start_with_window(example, db, url, "3 seconds").await;
    let endpoint = format!("{}/payments", service.base);
    let token = |t: &str| format!("Authorization: Bearer {t}");
    let (billing, audit) = (token(examples::TOKEN), token(examples::OTHER_TOKEN));
    let ran = conformance(&[
        &endpoint,
        "--body",
        r#"{"request_id": "PR-{{uuid}}", "amount": "12.50", "currency": "EUR", "payee": "ACME Ltd"}"#,
        "--other-body",
        r#"{"request_id": "PR-{{uuid}}", "amount": "13.00", "currency": "EUR", "payee": "ACME Ltd"}"#,
        "--header",
        &billing,
        "--other-principal-header",
        &audit,
        "--expiry",
        EXPIRY,
    ])
    .await;
    let context = format!("{example:?} (its log: {})", service.log.display());
    assert_eq!(ran.code, Some(0), "{context}\n{}{}", ran.stdout, ran.stderr);
    assert_lines(&ran, &[], &[]);
}

/// The three examples and the clients' two other adapters' sample apps (Django, Fastify), at once
/// on one database whose daemon's cleaner runs every second (each run mostly waits for its
/// window): the four adapters and the Rust example keep the contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_and_each_adapters_sample_app_pass_every_check() {
    let db = TestDb::new().await;
    let url = examples::service_role(&db).await;
    let daemon =
        Daemon::start(Spec::new(&db.url).config("[cleanup]\nschedule = \"* * * * * *\"")).await;
    let apps = [
        Example::Python,
        Example::Django,
        Example::Node,
        Example::Fastify,
        Example::Rust,
    ];
    futures::future::join_all(apps.map(|app| example_passes_every_check(app, &db, &url))).await;
    // The cleaner ran beside them: the apps' records past their window become tombstones.
    let admin = db.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tombstones: i64 = admin
            .query_one(
                "SELECT count(*) FROM idempotency_records WHERE expired AND response_body IS NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if tombstones > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the daemon's cleaner made no tombstone: {}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Values the command cannot use: exit 64, one line on stderr naming the flag, nothing on
/// stdout; a URL nothing listens on: exit 69, one line.
#[tokio::test]
async fn usage_errors_exit_64_and_an_unreachable_url_69_with_one_line() {
    let url = "http://127.0.0.1:1/orders";
    let body = r#"{"request_id": "{{uuid}}", "amount": "1.00"}"#;
    let other = r#"{"request_id": "{{uuid}}", "amount": "2.00"}"#;
    let cases: [(&[&str], i32, &str); 9] = [
        (&[url, "--body", "{\"a\": 1", "--other-body", other], 64, "tombstoned: error: --body is not JSON (EOF while parsing"),
        (&[url, "--body", body, "--other-body", "{{uuid}}"], 64, "tombstoned: error: --other-body is not JSON ("),
        (&[url, "--body", body, "--other-body", body], 64, "tombstoned: error: --other-body is the same intent as --body"),
        (&[url, "--body", body, "--other-body", other, "--header", "Authorization Bearer x"], 64, "tombstoned: error: --header \"Authorization Bearer x\" is not `Name: value` (no colon)"),
        (&[url, "--body", body, "--other-body", other, "--other-principal-header", "Bad Name: x"], 64, "tombstoned: error: --other-principal-header \"Bad Name: x\" is not `Name: value`"),
        (&["localhost/orders", "--body", body, "--other-body", other], 64, "tombstoned: error: the URL \"localhost/orders\" is not an http:// or https:// URL"),
        (&[url, "--body", body, "--other-body", other, "--expiry", "soon"], 64, "tombstoned: error: --expiry \"soon\": not a duration"),
        (&[url, "--body", body, "--other-body", other, "--concurrency", "0"], 64, "tombstoned: error: --concurrency \"0\": give a whole number from 2 to 32"),
        (&[url, "--body", body, "--other-body", other], 69, "tombstoned: error: cannot reach http://127.0.0.1:1/orders: Connection refused"),
    ];
    for (args, code, says) in cases {
        let ran = conformance(args).await;
        assert_eq!(ran.code, Some(code), "{args:?}: {ran:?}");
        assert_eq!(ran.stdout, "", "{args:?}");
        assert_eq!(ran.stderr.lines().count(), 1, "one line: {ran:?}");
        assert!(
            ran.stderr.starts_with(says),
            "{:?} should start with {says:?}",
            ran.stderr
        );
    }
}
