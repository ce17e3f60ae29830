//! Helpers of the `tombstoned conformance` tests: the real binary run against a URL (its exit
//! status, its output, its `--json` document read back), and one small idempotent endpoint
//! written here (axum) that each test breaks in exactly one way ([`Fault`]) — so that each
//! check is shown to fail on the rule it guards and only there.

#![allow(dead_code)] // each test uses a different subset

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::harness::binary;

/// The checks, in the order the command runs and reports them, as issue 39 names them (written
/// out here, not taken from the crate: the names are a contract checked from outside).
#[rustfmt::skip]
pub const CHECKS: [&str; 9] = [
    "first", "replay", "replay_reordered", "key_reused", "concurrent", "missing_key", "invalid_key",
    "scoped", "expired",
];

/// What one run of the binary did.
#[derive(Debug)]
pub struct Ran {
    /// Its exit status.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    /// The `--json` document on stdout.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

/// `tombstoned conformance ARGS...`, with an empty environment (it reads no configuration).
pub async fn conformance(args: &[&str]) -> Ran {
    let output = tokio::process::Command::new(binary())
        .arg("conformance")
        .args(args)
        .env_clear()
        .kill_on_drop(true)
        .output()
        .await
        .expect("run tombstoned conformance");
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `name=result` for every check of a `--json` document, in its order.
pub fn results(doc: &Value) -> Vec<String> {
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .map(|c| {
            format!(
                "{}={}",
                c["name"].as_str().unwrap(),
                c["result"].as_str().unwrap()
            )
        })
        .collect()
}

/// The vector every check passing but `failed` (fail) and `skipped` (skip).
pub fn expected(failed: &[&str], skipped: &[&str]) -> Vec<String> {
    CHECKS
        .iter()
        .map(|name| {
            let result = if failed.contains(name) {
                "fail"
            } else if skipped.contains(name) {
                "skip"
            } else {
                "pass"
            };
            format!("{name}={result}")
        })
        .collect()
}

/// The text report every check passing but `failed` and `skipped` gives, line by line: the
/// check lines' starts (`PASS name`, `FAIL name: expected`, `SKIP name: `) and the summary.
pub fn assert_lines(ran: &Ran, failed: &[&str], skipped: &[&str]) {
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        CHECKS.len() + 1,
        "{}\n{}",
        ran.stdout,
        ran.stderr
    );
    for (line, name) in lines.iter().zip(CHECKS) {
        let start = if failed.contains(&name) {
            format!("FAIL {name}: expected ")
        } else if skipped.contains(&name) {
            format!("SKIP {name}: ")
        } else {
            format!("PASS {name}")
        };
        assert!(
            line.starts_with(&start) && (start.ends_with(' ') || line.len() == start.len()),
            "{line:?} should be {start:?}…\n{}",
            ran.stdout
        );
        if failed.contains(&name) {
            assert!(line.contains(", got "), "{line}");
        }
    }
    let passed = CHECKS.len() - failed.len() - skipped.len();
    assert_eq!(
        lines[CHECKS.len()],
        format!(
            "{passed} passed, {} failed, {} skipped",
            failed.len(),
            skipped.len()
        )
    );
}

/// One way to break the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// None: the endpoint keeps every rule.
    None,
    /// Inside the window a stored answer is replayed for any body of the key.
    IgnoresFingerprint,
    /// A replay is the stored answer serialised again (compact, sorted), not its bytes.
    ReserialisesAnswers,
    /// After its window a key is forgotten: the request executes again.
    ForgetsAfterWindow,
    /// Keys are not scoped by principal: any principal's key is everyone's.
    Unscoped,
    /// Looks the key up, then inserts, without a lock; on the run's second key (the
    /// `concurrent` check's: the first is `first`'s) it waits until this many requests have
    /// looked before any inserts, so that the race happens on every run.
    CheckThenInsert(usize),
    /// A request without a key is executed (and remembered under no key).
    AcceptsNoKey,
}

/// A stored answer.
#[derive(Debug, Clone)]
struct Record {
    fingerprint: Value,
    status: u16,
    body: Vec<u8>,
    location: String,
    order_id: Uuid,
    at: Instant,
}

struct Shared {
    fault: Fault,
    window: Duration,
    records: Mutex<HashMap<(String, String), Record>>,
    keys: Mutex<Vec<String>>,
    race: tokio::sync::Barrier,
    executions: Mutex<usize>,
}

/// A running endpoint of this file.
pub struct Endpoint {
    /// `http://127.0.0.1:PORT/orders`.
    pub url: String,
    shared: Arc<Shared>,
    _server: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// How many requests it executed (created an order for).
    pub fn executions(&self) -> usize {
        *self.shared.executions.lock().unwrap()
    }
}

/// The bearer tokens it knows: principal `alice` and `bob` of one tenant.
pub const ALICE: &str = "alice-token";
/// The other principal.
pub const BOB: &str = "bob-token";

/// Starts the endpoint, broken by `fault`, answering 410 once a key is `window` old.
pub async fn endpoint(fault: Fault, window: Duration) -> Endpoint {
    let race = match fault {
        Fault::CheckThenInsert(n) => n,
        _ => 1,
    };
    let shared = Arc::new(Shared {
        fault,
        window,
        records: Mutex::new(HashMap::new()),
        keys: Mutex::new(Vec::new()),
        race: tokio::sync::Barrier::new(race),
        executions: Mutex::new(0),
    });
    let router = axum::Router::new()
        .route("/orders", axum::routing::post(order))
        .with_state(Arc::clone(&shared));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/orders", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    Endpoint {
        url,
        shared,
        _server: server,
    }
}

fn problem(status: u16, title: &str, extra: Option<(&str, Value)>) -> Response {
    let mut body = json!({"type": "about:blank", "title": title, "status": status});
    if let Some((name, value)) = extra {
        body[name] = value;
    }
    (
        StatusCode::from_u16(status).unwrap(),
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

fn answer(record: &Record, replayed: bool, reserialise: bool) -> Response {
    let body = if reserialise {
        serde_json::to_vec(&serde_json::from_slice::<Value>(&record.body).unwrap()).unwrap()
    } else {
        record.body.clone()
    };
    let mut response = (StatusCode::from_u16(record.status).unwrap(), body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&record.location).unwrap(),
    );
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// Executes the request: a new order, its answer spelled with spaces (as a service's own
/// serialiser might), remembered.
fn execute(shared: &Shared, fingerprint: Value) -> Record {
    *shared.executions.lock().unwrap() += 1;
    let order_id = Uuid::new_v4();
    let body = format!(
        "{{\"order_id\": \"{order_id}\", \"request_id\": {}, \"status\": \"created\"}}",
        fingerprint["request_id"]
    );
    Record {
        fingerprint,
        status: 201,
        body: body.into_bytes(),
        location: format!("/orders/{order_id}"),
        order_id,
        at: Instant::now(),
    }
}

async fn order(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let principal = match headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        Some("Bearer alice-token") => "alice",
        Some("Bearer bob-token") => "bob",
        _ => return problem(401, "unauthenticated", None),
    };
    let Ok(fingerprint) = serde_json::from_slice::<Value>(&body) else {
        return problem(400, "malformed JSON", None);
    };
    let key = match headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or(""))
    {
        None if shared.fault == Fault::AcceptsNoKey => {
            return answer(&execute(&shared, fingerprint), false, false)
        }
        None => return problem(400, "Idempotency-Key required", None),
        Some(key) if key.is_empty() || key.len() > 255 => {
            return problem(400, "Idempotency-Key: 1 to 255 characters", None)
        }
        Some(key) => key.to_owned(),
    };
    let scope = if shared.fault == Fault::Unscoped {
        String::new()
    } else {
        principal.to_owned()
    };
    let id = (scope, key.clone());
    if let Fault::CheckThenInsert(_) = shared.fault {
        let second_key = {
            let mut keys = shared.keys.lock().unwrap();
            if !keys.contains(&key) {
                keys.push(key.clone());
            }
            keys.iter().position(|k| *k == key) == Some(1)
        };
        let absent = !shared.records.lock().unwrap().contains_key(&id);
        if second_key && absent {
            // Every racer has looked and found nothing: each inserts its own.
            shared.race.wait().await;
            let record = execute(&shared, fingerprint);
            shared.records.lock().unwrap().insert(id, record.clone());
            return answer(&record, false, false);
        }
    }
    let mut records = shared.records.lock().unwrap();
    let Some(record) = records.get(&id).cloned() else {
        let record = execute(&shared, fingerprint);
        records.insert(id, record.clone());
        return answer(&record, false, false);
    };
    let same = record.fingerprint == fingerprint;
    if record.at.elapsed() >= shared.window {
        if !same {
            return problem(422, "the key was used for another request", None);
        }
        if shared.fault == Fault::ForgetsAfterWindow {
            let record = execute(&shared, fingerprint);
            records.insert(id, record.clone());
            return answer(&record, false, false);
        }
        let mut gone = problem(
            410,
            "beyond the replay window",
            Some(("order_id", json!(record.order_id))),
        );
        gone.headers_mut().insert(
            header::LOCATION,
            HeaderValue::from_str(&record.location).unwrap(),
        );
        return gone;
    }
    if !same && shared.fault != Fault::IgnoresFingerprint {
        return problem(422, "the key was used for another request", None);
    }
    answer(&record, true, shared.fault == Fault::ReserialisesAnswers)
}

/// Every string of `doc`, however deep (to look for what must not be there).
pub fn strings(doc: &Value) -> HashSet<String> {
    let mut out = HashSet::new();
    fn walk(v: &Value, out: &mut HashSet<String>) {
        match v {
            Value::String(s) => {
                out.insert(s.clone());
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    walk(doc, &mut out);
    out
}
