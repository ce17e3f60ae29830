//! Every request the load clients sent and every answer they got, and the invariants checked
//! against the database afterwards (issue 7): one order and one event per creation, no key or
//! request_id with two orders, replays byte-identical, nothing replayed after the window, no
//! changed intent answered with the stored order, no 5xx but the documented 503s, no request past
//! its deadline. Plus a monitor that snapshots every record's identity during the run, so a key
//! that was deleted or whose fingerprint changed is caught even if it changed back.

#![allow(dead_code)] // each test module uses a different subset

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A principal the load uses: token and scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Who {
    pub token: &'static str,
    pub tenant: &'static str,
    pub principal: &'static str,
}

/// The principals with `orders:create` in config/tokens.toml.
pub const WRITERS: [Who; 3] = [
    Who {
        token: crate::daemon::ALICE,
        tenant: "acme",
        principal: "alice",
    },
    Who {
        token: crate::daemon::BOB,
        tenant: "acme",
        principal: "bob",
    },
    Who {
        token: crate::daemon::CAROL,
        tenant: "globex",
        principal: "carol",
    },
];

/// One business intent: a key and the parameters its fingerprint covers.
#[derive(Debug, Clone)]
pub struct Intent {
    pub who: Who,
    pub key: String,
    pub request_id: String,
    pub amount_minor: i64,
    pub item: String,
    pub quantity: i32,
    pub recipient: String,
}

impl Intent {
    /// The body, spelled one of several equivalent ways (`spelling`): amount as a padded or
    /// trimmed decimal string or as `amount_minor`, currency omitted or spelled out in lower
    /// case, quantity omitted or explicit, field order, and metadata that is not part of the
    /// fingerprint. Every spelling of one intent has the same fingerprint.
    pub fn body(&self, spelling: u64) -> String {
        let s = |v: &str| serde_json::to_string(v).unwrap();
        let a = self.amount_minor;
        let amount = match spelling % 3 {
            0 => format!("\"amount\":\"{}.{:02}\"", a / 100, a % 100),
            1 if a % 100 == 0 => format!("\"amount\":\"{}\"", a / 100),
            1 if a % 10 == 0 => format!("\"amount\":\"{}.{}\"", a / 100, (a % 100) / 10),
            1 => format!("\"amount\":\"{}.{:02}\"", a / 100, a % 100),
            _ => format!("\"amount_minor\":{a}"),
        };
        let mut fields = vec![
            format!("\"request_id\":{}", s(&self.request_id)),
            amount,
            format!("\"item\":{}", s(&self.item)),
            format!("\"recipient\":{}", s(&self.recipient)),
        ];
        if self.quantity != 1 || spelling % 2 == 1 {
            fields.push(format!("\"quantity\":{}", self.quantity));
        }
        if spelling % 5 == 1 {
            fields.push("\"currency\":\"cny\"".into());
        }
        if spelling % 7 == 3 {
            fields.push(format!("\"metadata\":{{\"trace_id\":\"t-{spelling}\"}}"));
        }
        if spelling % 4 >= 2 {
            fields.reverse();
        }
        format!("{{{}}}", fields.join(","))
    }

    /// The fingerprint the server computes (default currency CNY, default API version).
    pub fn fingerprint(&self) -> [u8; 32] {
        use tombstoned::fingerprint::Fingerprint;
        use tombstoned::money::Currency;
        use tombstoned::order_request::{parse_order, RequestDefaults};
        let defaults = RequestDefaults {
            currency: Currency::parse("CNY").unwrap(),
        };
        let order = parse_order(self.body(0).as_bytes(), &defaults).unwrap();
        *Fingerprint::of(&order, "2026-12-01").unwrap().as_bytes()
    }

    /// Whether `order` carries exactly this intent's business parameters.
    fn same_business(&self, order: &Order) -> bool {
        order.principal == self.who.principal
            && order.amount_minor == self.amount_minor
            && order.currency == "CNY"
            && order.item == self.item
            && order.quantity == self.quantity
            && order.recipient == self.recipient
    }
}

/// Why a request was sent (for the figures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A new key.
    New,
    /// A new key over the principal's approval limit (a stored 422).
    OverLimit,
    /// The same request again (respelled).
    Retry,
    /// A retry of a request whose response the client dropped.
    RetryAfterDrop,
    /// Sent, then the client went away before reading the answer.
    Dropped,
    /// The same key with a changed amount.
    ChangedAmount,
    /// A new key for an existing request_id, same principal and parameters.
    DuplicateSame,
    /// A new key for an existing request_id, other parameters or another principal.
    DuplicateOther,
    /// The same request several times at once.
    Burst,
    /// A retry after a fault (daemon killed, database restarted).
    RetryAfterFault,
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub location: Option<String>,
    pub content_type: Option<String>,
    pub text: String,
}

impl Reply {
    /// Reads a reqwest response whole.
    pub async fn read(response: reqwest::Response) -> Result<Reply, reqwest::Error> {
        let h = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (replayed, retry_after, location, content_type) = (
            h("idempotent-replayed").as_deref() == Some("true"),
            h("retry-after"),
            h("location"),
            h("content-type"),
        );
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok(Reply {
            status,
            replayed,
            retry_after,
            location,
            content_type,
            text,
        })
    }

    fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.text).ok()
    }

    /// The problem type's short name, or "".
    pub fn problem(&self) -> String {
        self.json()
            .and_then(|j| j["type"].as_str().map(str::to_owned))
            .and_then(|t| t.rsplit(':').next().map(str::to_owned))
            .unwrap_or_default()
    }

    /// A label for the figures: `201`, `201 replay`, `409 request-in-progress`, ...
    pub fn label(&self) -> String {
        match (self.status, self.replayed) {
            (200 | 201, true) => format!("{} replay", self.status),
            (200 | 201, false) => self.status.to_string(),
            (s, true) => format!("{s} {} replay", self.problem()),
            (s, false) => format!("{s} {}", self.problem()),
        }
    }
}

/// What came back.
#[derive(Debug, Clone)]
pub enum Answer {
    Reply(Reply),
    /// The client abandoned the request before reading an answer (on purpose).
    Dropped,
    /// The connection failed (refused, reset): the daemon was killed.
    Transport(String),
    /// The client's deadline passed without an answer.
    TimedOut,
}

/// One POST.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub client: usize,
    pub kind: Kind,
    pub intent: Intent,
    pub fingerprint: [u8; 32],
    pub sent_at: SystemTime,
    pub answered_at: SystemTime,
    pub answer: Answer,
}

/// What a GET asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReadKind {
    /// `GET /v1/idempotency-keys/{key}` in the key's own scope.
    KeyStatus,
    /// The same key's status asked by a principal of another tenant.
    KeyStatusOtherTenant,
    /// `GET /v1/orders/{id}` by the order's tenant.
    Order,
    /// ... by another tenant.
    OrderOtherTenant,
}

/// One GET.
#[derive(Debug, Clone)]
pub struct Read {
    pub kind: ReadKind,
    pub reader: Who,
    /// The key's intent (key status) or the order's creator intent (orders).
    pub intent: Intent,
    pub order_id: Option<Uuid>,
    pub answer: Answer,
}

/// Everything sent and received.
#[derive(Default)]
pub struct Ledger {
    pub exchanges: Mutex<Vec<Exchange>>,
    pub reads: Mutex<Vec<Read>>,
}

impl Ledger {
    /// Answers matching `pred` so far.
    pub fn count(&self, pred: impl Fn(&Exchange) -> bool) -> usize {
        self.exchanges
            .lock()
            .unwrap()
            .iter()
            .filter(|e| pred(e))
            .count()
    }

    pub fn record(&self, e: Exchange) {
        self.exchanges.lock().unwrap().push(e);
    }

    pub fn record_read(&self, r: Read) {
        self.reads.lock().unwrap().push(r);
    }
}

// ---- the database at the end ---------------------------------------------------------------

/// One idempotency record's identity and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub fingerprint: Vec<u8>,
    pub status: Option<i16>,
    pub order_id: Option<Uuid>,
    pub expired: bool,
    pub body_null: bool,
    pub created_at: SystemTime,
    pub deadline: SystemTime,
}

/// One order.
#[derive(Debug, Clone)]
pub struct Order {
    pub tenant: String,
    pub principal: String,
    pub request_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub item: String,
    pub quantity: i32,
    pub recipient: String,
    pub created_at: SystemTime,
}

/// `(tenant, principal, key)`.
pub type Scope = (String, String, String);

pub fn scope_of(i: &Intent) -> Scope {
    (
        i.who.tenant.to_owned(),
        i.who.principal.to_owned(),
        i.key.clone(),
    )
}

/// The tables, read once after the load stopped.
pub struct DbState {
    pub records: HashMap<Scope, Record>,
    pub orders: HashMap<Uuid, Order>,
    pub events: HashMap<Uuid, i64>,
    pub stray_events: i64,
}

const RECORDS: &str = "SELECT tenant_id, principal_id, idempotency_key, fingerprint, status_code,
        order_id, expired, response_body IS NULL, created_at, replay_deadline
    FROM idempotency_cards WHERE operation = 'create-order'";

fn record_of(row: &tokio_postgres::Row) -> (Scope, Record) {
    (
        (row.get(0), row.get(1), row.get(2)),
        Record {
            fingerprint: row.get(3),
            status: row.get(4),
            order_id: row.get(5),
            expired: row.get(6),
            body_null: row.get(7),
            created_at: row.get(8),
            deadline: row.get(9),
        },
    )
}

impl DbState {
    pub async fn load(client: &Client) -> DbState {
        let records = client
            .query(RECORDS, &[])
            .await
            .unwrap()
            .iter()
            .map(record_of)
            .collect();
        let orders = client
            .query(
                "SELECT order_id, tenant_id, principal_id, request_id, amount_minor,
                        currency::text, item, quantity, recipient, created_at FROM orders",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    Order {
                        tenant: r.get(1),
                        principal: r.get(2),
                        request_id: r.get(3),
                        amount_minor: r.get(4),
                        currency: r.get(5),
                        item: r.get(6),
                        quantity: r.get(7),
                        recipient: r.get(8),
                        created_at: r.get(9),
                    },
                )
            })
            .collect();
        let events = client
            .query(
                "SELECT order_id, count(*) FROM outbox_events
                 WHERE event_type = 'order.created' GROUP BY order_id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let stray_events: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox_events e
                 WHERE e.event_type <> 'order.created'
                    OR NOT EXISTS (SELECT 1 FROM orders o WHERE o.order_id = e.order_id)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        DbState {
            records,
            orders,
            events,
            stray_events,
        }
    }

    pub fn tombstones(&self) -> usize {
        self.records.values().filter(|r| r.expired).count()
    }
}

// ---- the checks ----------------------------------------------------------------------------

/// What the checks found, and the figures.
#[derive(Default)]
pub struct Verdict {
    pub violations: Vec<String>,
    pub by_kind: BTreeMap<String, usize>,
    pub by_outcome: BTreeMap<String, usize>,
    pub reads: BTreeMap<String, usize>,
    pub requests: usize,
}

impl Verdict {
    fn violation(&mut self, text: String) {
        self.violations.push(text);
    }

    /// Fails the test listing (the first 40) violations.
    pub fn assert_clean(&self) {
        if !self.violations.is_empty() {
            let shown: Vec<&String> = self.violations.iter().take(40).collect();
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            for v in &self.violations {
                *kinds
                    .entry(v.split([':', '(']).next().unwrap_or(v))
                    .or_default() += 1;
            }
            panic!(
                "{} invariant violation(s), by kind: {kinds:#?}\nthe first ones:\n{}",
                self.violations.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }

    /// Count of answers with this label.
    pub fn outcome(&self, label: &str) -> usize {
        self.by_outcome.get(label).copied().unwrap_or(0)
    }

    /// The figures as text.
    pub fn figures(&self) -> String {
        let mut s = String::new();
        writeln!(s, "requests (POST): {}", self.requests).unwrap();
        writeln!(s, "by kind:").unwrap();
        for (k, n) in &self.by_kind {
            writeln!(s, "  {k:<28} {n}").unwrap();
        }
        writeln!(s, "by outcome:").unwrap();
        for (k, n) in &self.by_outcome {
            writeln!(s, "  {k:<40} {n}").unwrap();
        }
        writeln!(s, "reads (GET):").unwrap();
        for (k, n) in &self.reads {
            writeln!(s, "  {k:<40} {n}").unwrap();
        }
        writeln!(s, "violations: {}", self.violations.len()).unwrap();
        s
    }
}

/// How strict the checks are about failed connections.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckOptions {
    /// Connection failures are expected (the daemon was killed during the load).
    pub allow_transport: bool,
}

/// Order fields that no refusal, expiry or key-reuse answer may carry.
const ORDER_FIELDS: [&str; 6] = [
    "amount",
    "amount_minor",
    "item",
    "recipient",
    "request_id",
    "created_at",
];

/// Checks every exchange and read against the final database state.
pub fn check(ledger: &Ledger, db: &DbState, options: CheckOptions) -> Verdict {
    let mut v = Verdict::default();
    global_checks(db, &mut v);
    let exchanges = ledger.exchanges.lock().unwrap();
    v.requests = exchanges.len();
    // Every body answered for a key / an order, to compare byte for byte.
    let mut key_texts: HashMap<Scope, Vec<&str>> = HashMap::new();
    let mut order_texts: HashMap<Uuid, Vec<&str>> = HashMap::new();
    let mut created_per_key: HashMap<Scope, usize> = HashMap::new();
    let mut created_per_request: HashMap<(String, String), usize> = HashMap::new();

    for e in exchanges.iter() {
        *v.by_kind.entry(format!("{:?}", e.kind)).or_default() += 1;
        let scope = scope_of(&e.intent);
        let rec = db.records.get(&scope);
        let r = match &e.answer {
            Answer::Reply(r) => r,
            Answer::Dropped => {
                *v.by_outcome
                    .entry("(dropped by the client)".into())
                    .or_default() += 1;
                continue;
            }
            Answer::Transport(err) => {
                *v.by_outcome
                    .entry("(connection failed)".into())
                    .or_default() += 1;
                if !options.allow_transport {
                    v.violation(format!("connection failed without a fault: {err} ({e:?})"));
                }
                continue;
            }
            Answer::TimedOut => {
                *v.by_outcome
                    .entry("(no answer by the deadline)".into())
                    .or_default() += 1;
                v.violation(format!("request hung past its deadline: {e:?}"));
                continue;
            }
        };
        *v.by_outcome.entry(r.label()).or_default() += 1;
        let ctx = || {
            format!(
                "{:?} key {} request_id {} -> {} {}",
                e.kind, e.intent.key, e.intent.request_id, r.status, r.text
            )
        };
        let json = r.json();
        let body_order_id = json
            .as_ref()
            .and_then(|j| j["order_id"].as_str())
            .and_then(|s| Uuid::parse_str(s).ok());
        match (r.status, r.replayed) {
            (201, replayed) => {
                let Some(rec) = rec else {
                    v.violation(format!("201 but no record: {}", ctx()));
                    continue;
                };
                if rec.fingerprint != e.fingerprint {
                    v.violation(format!(
                        "a changed fingerprint was answered with the stored order: {}",
                        ctx()
                    ));
                }
                if rec.status != Some(201)
                    || rec.order_id.is_none()
                    || rec.order_id != body_order_id
                {
                    v.violation(format!("201 does not match its record {rec:?}: {}", ctx()));
                }
                match body_order_id.and_then(|id| db.orders.get(&id)) {
                    Some(o) if o.request_id == e.intent.request_id && e.intent.same_business(o) => {
                    }
                    other => v.violation(format!("201 without its order ({other:?}): {}", ctx())),
                }
                if replayed {
                    if e.sent_at >= rec.deadline {
                        v.violation(format!(
                            "a body was replayed after the replay window ({:?} after the deadline): {}",
                            e.sent_at.duration_since(rec.deadline).unwrap_or_default(),
                            ctx()
                        ));
                    }
                } else {
                    *created_per_key.entry(scope.clone()).or_default() += 1;
                    *created_per_request
                        .entry((e.intent.who.tenant.into(), e.intent.request_id.clone()))
                        .or_default() += 1;
                }
                if r.location.as_deref()
                    != body_order_id
                        .map(|id| format!("/v1/orders/{id}"))
                        .as_deref()
                {
                    v.violation(format!(
                        "201 with a wrong Location {:?}: {}",
                        r.location,
                        ctx()
                    ));
                }
                key_texts.entry(scope.clone()).or_default().push(&r.text);
                if let Some(id) = body_order_id {
                    order_texts.entry(id).or_default().push(&r.text);
                }
            }
            (200, true) => {
                // A new key for a request_id that has this principal's identical order.
                match body_order_id.and_then(|id| db.orders.get(&id).map(|o| (id, o))) {
                    Some((id, o))
                        if o.tenant == e.intent.who.tenant
                            && o.request_id == e.intent.request_id
                            && e.intent.same_business(o) =>
                    {
                        order_texts.entry(id).or_default().push(&r.text);
                    }
                    other => v.violation(format!(
                        "200 duplicate answered with a foreign order ({other:?}): {}",
                        ctx()
                    )),
                }
            }
            (409, false) if r.problem() == "request-in-progress" => {
                if r.retry_after.as_deref() != Some("1") {
                    v.violation(format!("409 without Retry-After: 1: {}", ctx()));
                }
            }
            (409, false) if r.problem() == "duplicate-request-id" => {
                let differs = db.orders.values().any(|o| {
                    o.tenant == e.intent.who.tenant
                        && o.request_id == e.intent.request_id
                        && !e.intent.same_business(o)
                });
                if !differs {
                    v.violation(format!(
                        "409 duplicate-request-id without a differing order: {}",
                        ctx()
                    ));
                }
                if r.text.contains("order_id") || r.location.is_some() {
                    v.violation(format!("409 leaks the other order: {}", ctx()));
                }
            }
            (410, false) => {
                let Some(rec) = rec else {
                    v.violation(format!("410 but no record: {}", ctx()));
                    continue;
                };
                if rec.fingerprint != e.fingerprint {
                    v.violation(format!("410 for a changed fingerprint: {}", ctx()));
                }
                if e.answered_at < rec.deadline {
                    v.violation(format!(
                        "410 before the replay deadline ({:?} early): {}",
                        rec.deadline
                            .duration_since(e.answered_at)
                            .unwrap_or_default(),
                        ctx()
                    ));
                }
                expect_no_order_fields(&mut v, r, &ctx);
                if body_order_id != rec.order_id {
                    v.violation(format!(
                        "410 names another order than the record's: {}",
                        ctx()
                    ));
                }
            }
            (422, replayed) if r.problem() == "approval-limit-exceeded" => {
                match rec {
                    Some(rec) if rec.fingerprint == e.fingerprint && rec.status == Some(422) => {
                        if replayed && e.sent_at >= rec.deadline {
                            v.violation(format!("422 replayed after the window: {}", ctx()));
                        }
                        if rec.order_id.is_some() {
                            v.violation(format!("stored rejection with an order: {}", ctx()));
                        }
                    }
                    other => v.violation(format!(
                        "422 rejection without its record {other:?}: {}",
                        ctx()
                    )),
                }
                key_texts.entry(scope.clone()).or_default().push(&r.text);
            }
            (422, false) if r.problem() == "idempotency-key-reused" => {
                match rec {
                    Some(rec) if rec.fingerprint != e.fingerprint => {}
                    other => v.violation(format!(
                        "422 key-reused but the record has this fingerprint ({other:?}): {}",
                        ctx()
                    )),
                }
                expect_no_order_fields(&mut v, r, &ctx);
                if r.text.contains("order_id") {
                    v.violation(format!("422 key-reused names an order: {}", ctx()));
                }
            }
            (503, false)
                if matches!(
                    r.problem().as_str(),
                    "database-unavailable" | "outcome-unknown"
                ) =>
            {
                if r.retry_after.is_none() {
                    v.violation(format!("503 without Retry-After: {}", ctx()));
                }
            }
            (s, _) if s >= 500 => v.violation(format!("undocumented 5xx: {}", ctx())),
            _ => v.violation(format!("unexpected answer: {}", ctx())),
        }
    }
    for (scope, n) in created_per_key {
        if n > 1 {
            v.violation(format!("key {scope:?} answered 201-created {n} times"));
        }
    }
    for (request, n) in created_per_request {
        if n > 1 {
            v.violation(format!("request_id {request:?} created {n} times"));
        }
    }
    for (scope, texts) in key_texts {
        if texts.iter().any(|t| *t != texts[0]) {
            v.violation(format!(
                "key {scope:?}: answers differ byte for byte: {texts:?}"
            ));
        }
    }
    for (id, texts) in order_texts {
        if texts.iter().any(|t| *t != texts[0]) {
            v.violation(format!("order {id}: representations differ: {texts:?}"));
        }
    }
    drop(exchanges);
    check_reads(ledger, db, &mut v);
    v
}

fn expect_no_order_fields(v: &mut Verdict, r: &Reply, ctx: &dyn Fn() -> String) {
    if let Some(Value::Object(map)) = r.json() {
        for field in ORDER_FIELDS {
            if map.contains_key(field) {
                v.violation(format!("answer carries the order's {field}: {}", ctx()));
            }
        }
    } else {
        v.violation(format!("answer is not a JSON object: {}", ctx()));
    }
}

fn global_checks(db: &DbState, v: &mut Verdict) {
    let mut records_per_order: HashMap<Uuid, usize> = HashMap::new();
    for (scope, rec) in &db.records {
        if rec.expired != rec.body_null {
            v.violation(format!(
                "record {scope:?}: expired {} but body null {}",
                rec.expired, rec.body_null
            ));
        }
        match (rec.status, rec.order_id) {
            (Some(201), Some(id)) => {
                *records_per_order.entry(id).or_default() += 1;
                match db.orders.get(&id) {
                    Some(o) if o.tenant == scope.0 && o.principal == scope.1 => {}
                    other => v.violation(format!("record {scope:?} points at {other:?}")),
                }
            }
            (Some(422), None) => {}
            other => v.violation(format!("record {scope:?} has status/order {other:?}")),
        }
    }
    let mut per_request: HashMap<(&str, &str), usize> = HashMap::new();
    for (id, o) in &db.orders {
        *per_request.entry((&o.tenant, &o.request_id)).or_default() += 1;
        match records_per_order.get(id) {
            Some(1) => {}
            n => v.violation(format!("order {id} is referenced by {n:?} records")),
        }
        match db.events.get(id) {
            Some(1) => {}
            n => v.violation(format!("order {id} has {n:?} order.created events")),
        }
    }
    for (request, n) in per_request {
        if n > 1 {
            v.violation(format!("request_id {request:?} has {n} orders"));
        }
    }
    if db.stray_events != 0 {
        v.violation(format!("{} events without their order", db.stray_events));
    }
}

fn check_reads(ledger: &Ledger, db: &DbState, v: &mut Verdict) {
    for read in ledger.reads.lock().unwrap().iter() {
        let Answer::Reply(r) = &read.answer else {
            *v.reads
                .entry(format!("{:?} (no answer)", read.kind))
                .or_default() += 1;
            if matches!(read.answer, Answer::TimedOut) {
                v.violation(format!("read hung past its deadline: {read:?}"));
            }
            continue;
        };
        *v.reads
            .entry(format!("{:?} {}", read.kind, r.label()))
            .or_default() += 1;
        let ctx = || {
            format!(
                "{:?} {} -> {} {}",
                read.kind, read.intent.key, r.status, r.text
            )
        };
        if r.status == 503 {
            continue;
        }
        if r.status >= 500 {
            v.violation(format!("undocumented 5xx on a read: {}", ctx()));
            continue;
        }
        let json = r.json().unwrap_or(Value::Null);
        match read.kind {
            ReadKind::KeyStatus => match r.status {
                200 => {
                    let rec = db.records.get(&scope_of(&read.intent));
                    let order = json["order_id"]
                        .as_str()
                        .and_then(|s| Uuid::parse_str(s).ok());
                    match rec {
                        Some(rec) if rec.order_id == order => {}
                        other => {
                            v.violation(format!("key status disagrees with {other:?}: {}", ctx()))
                        }
                    }
                    if !matches!(json["state"].as_str(), Some("completed" | "expired")) {
                        v.violation(format!("key status state: {}", ctx()));
                    }
                    if r.text.contains(&read.intent.recipient) || r.text.contains(&read.intent.item)
                    {
                        v.violation(format!("key status shows the body: {}", ctx()));
                    }
                }
                404 => {}
                _ => v.violation(format!("unexpected key status answer: {}", ctx())),
            },
            ReadKind::KeyStatusOtherTenant | ReadKind::OrderOtherTenant => {
                if r.status != 404 || r.text.contains(&read.intent.recipient) {
                    v.violation(format!("another tenant saw something: {}", ctx()));
                }
            }
            ReadKind::Order => {
                let ok = r.status == 200
                    && json["order_id"].as_str() == read.order_id.map(|i| i.to_string()).as_deref();
                if !ok {
                    v.violation(format!("an order read failed: {}", ctx()));
                }
            }
        }
    }
}

// ---- the monitor ---------------------------------------------------------------------------

/// Snapshots every record's identity while the load runs: a record must never disappear (purge
/// is off), its fingerprint, status, order, creation time and deadline never change, `expired`
/// never goes back to false, and a tombstone never carries a body.
pub struct Monitor {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<MonitorReport>,
}

/// What the monitor saw.
#[derive(Debug, Default)]
pub struct MonitorReport {
    pub snapshots: usize,
    /// Snapshots that failed (the database restarting, say), with why: the test decides whether
    /// any may fail.
    pub failed_snapshots: Vec<String>,
    pub violations: Vec<String>,
    pub records_seen: usize,
    /// Records seen live in one snapshot and tombstoned in a later one.
    pub seen_crossing: usize,
}

impl Monitor {
    /// Starts snapshotting every `every`.
    pub fn start(client: Client, every: Duration) -> Monitor {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut report = MonitorReport::default();
            let mut known: HashMap<Scope, Record> = HashMap::new();
            loop {
                let cancelled = token.is_cancelled();
                // A failed snapshot (the database restarting) is counted and skipped; the next
                // one compares.
                match client.query(RECORDS, &[]).await {
                    Ok(rows) => {
                        report.snapshots += 1;
                        let now: HashMap<Scope, Record> = rows.iter().map(record_of).collect();
                        compare(&known, &now, &mut report);
                        known = now;
                    }
                    Err(e) => report.failed_snapshots.push(e.to_string()),
                }
                if cancelled {
                    break;
                }
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = tokio::time::sleep(every) => {}
                }
            }
            report.records_seen = known.len();
            report
        });
        Monitor { stop, task }
    }

    /// Takes a last snapshot and returns the report.
    pub async fn stop(self) -> MonitorReport {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

fn compare(
    before: &HashMap<Scope, Record>,
    now: &HashMap<Scope, Record>,
    report: &mut MonitorReport,
) {
    for (scope, rec) in now {
        if rec.expired && !rec.body_null {
            report
                .violations
                .push(format!("tombstone with a body: {scope:?}"));
        }
    }
    for (scope, old) in before {
        let Some(new) = now.get(scope) else {
            report
                .violations
                .push(format!("record deleted (key reopened): {scope:?}"));
            continue;
        };
        if (
            &old.fingerprint,
            old.status,
            old.order_id,
            old.created_at,
            old.deadline,
        ) != (
            &new.fingerprint,
            new.status,
            new.order_id,
            new.created_at,
            new.deadline,
        ) {
            report.violations.push(format!(
                "record identity changed: {scope:?}: {old:?} -> {new:?}"
            ));
        }
        if old.expired && !new.expired {
            report
                .violations
                .push(format!("tombstone came back to life: {scope:?}"));
        }
        if !old.expired && new.expired {
            report.seen_crossing += 1;
        }
    }
}

/// Shared list of intents the clients pick retries from, and orders they may read.
#[derive(Default)]
pub struct Pool {
    pub intents: Vec<Intent>,
    /// Intents whose last request was dropped by the client.
    pub dropped: std::collections::HashSet<String>,
    pub orders: Vec<(Uuid, Intent)>,
}

/// A pool shared by the clients.
pub type SharedPool = Arc<Mutex<Pool>>;
