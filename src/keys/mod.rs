//! `tombstoned keys explain`: why a key of one scope (tenant, principal, operation) answers what
//! it answers — whether it has a record, its state, the stored status and resource (the body
//! only when asked), whether an intent's fingerprint matches it and so what a retry of that
//! intent gets, and which open transaction holds it. Returns an [`Explanation`]; the CLI renders
//! it. Nothing here prints.
//!
//! # Reading without getting in the way
//!
//! Everything is read in one `READ ONLY` transaction (statements in [`sql`]). It takes no row
//! lock — `FOR SHARE` is refused in a read-only transaction, and a share lock would make the
//! cleaner (and a claim behind it) wait — so who holds a record is found from what PostgreSQL
//! shows to a reader:
//!
//! - **A committed record's row lock** (a replay's `FOR SHARE`, the cleaner tombstoning it): the
//!   row's `xmax` is the locker's transaction id; `pg_locks` shows which session has that id
//!   open ([`sql::HOLDER`]). PostgreSQL lists row-lock *waiters* in `pg_locks`, never holders; a
//!   lock several transactions share (a multixact) is not resolved, and is reported as not held.
//! - **An uncommitted claim** is invisible to every other snapshot: the record "does not exist"
//!   for a plain read, yet a claim of the key now would wait for it. Its entry is in the primary
//!   key's index already, though, and an index scan returns it before the visibility check hides
//!   it: the explain scans the key's index entries twice ([`sql::PROBE_RECORD`]; the first pass
//!   marks dead entries, which the second no longer returns) and compares the entries the scan
//!   returned (this backend's `pg_stat_get_xact_tuples_returned`) with the rows it saw. An entry
//!   more, while an open transaction has written records (a `RowExclusiveLock` and a transaction
//!   id in `pg_locks`, [`sql::RECORD_WRITERS`]), is an uncommitted claim: the key is *in flight*,
//!   held by one of those transactions (which one, no read can tell). The scope's unique key is
//!   probed alike when the scope itself has no committed row (the SQL API inserts a new scope in
//!   the claim's transaction). Limits: a version deleted so recently that an older snapshot may
//!   still see it (a purge while a long transaction is open) counts as an entry too, so a purged
//!   key can read as in flight while such a snapshot and a writer are open; with
//!   `track_counts = off` the probe cannot count and says so ([`Probe::Unavailable`]).
//! - **Who a session is**, how long its transaction has been open, its state and what it waits
//!   for come from `pg_stat_activity`, which shows them only for the role's own sessions or to
//!   members of `pg_read_all_stats` (`pg_monitor`): otherwise only the pid, role and
//!   application name, and the explanation says so ([`Transaction::visible`]).

pub mod sql;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::claim::{RecordState, RetryAnswer, OPERATION_CREATE_ORDER};
use crate::config::{ApiConfig, SUPPORTED_API_VERSIONS};
use crate::db::{self, Conn, DbError, ErrorClass};
use crate::fingerprint::Fingerprint;
use crate::order_request::{self, OrderRequestError, RequestDefaults};

/// The server-side bound on each statement of the explain (they are index lookups and catalogue
/// views).
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a read waits for a table lock (only DDL, such as a migration, holds one that a
/// read-only transaction must wait for).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// At most how many statements one explain sends: its client-side bound is that many
/// [`STATEMENT_TIMEOUT`]s.
const STATEMENTS: u32 = 16;

/// What is asked: one key of one scope.
#[derive(Debug, Clone)]
pub struct ExplainRequest<'a> {
    /// The scope's tenant.
    pub tenant: &'a str,
    /// The scope's principal.
    pub principal: &'a str,
    /// The scope's operation (`create-order` is the endpoint's).
    pub operation: &'a str,
    /// The idempotency key.
    pub key: &'a str,
    /// An intent (JSON text) to compare with the stored fingerprint: for `create-order` the
    /// order request body, validated and fingerprinted as the endpoint does; for any other
    /// operation the SQL API's intent, fingerprinted by its `fingerprint(jsonb)`.
    pub intent: Option<&'a str>,
    /// Read the stored body too.
    pub show_body: bool,
}

/// Where the key stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// An open transaction has claimed the key and not committed: a claim of it now waits.
    InFlight,
    /// Completed, inside its replay window: a retry of the same intent replays the answer.
    Completed,
    /// Its window has closed and the cleaner has not tombstoned it yet: answered as expired.
    PastDeadline,
    /// A tombstone: the body is gone; key, fingerprint, status and resource stay.
    Tombstoned,
    /// Committed without a stored answer (written outside the protocol): no retry can be
    /// answered from it.
    Unfinished,
    /// No record, committed or in flight: a request with the key now claims it.
    Free,
}

impl KeyState {
    /// Whether a record of the key exists (committed, or held by an open transaction).
    pub fn has_record(self) -> bool {
        self != KeyState::Free
    }
}

/// The committed record, as read (never locked).
#[derive(Debug, Clone, Serialize)]
pub struct StoredRecord {
    /// When the key was claimed.
    pub created_at: DateTime<Utc>,
    /// The end of its replay window.
    pub replay_deadline: DateTime<Utc>,
    /// When the cleaner tombstoned it.
    pub expired_at: Option<DateTime<Utc>>,
    /// The stored answer's status (HTTP status for the endpoint, the service's own for the SQL
    /// API).
    pub status_code: Option<u16>,
    /// The SQL API's resource id.
    pub resource_id: Option<String>,
    /// The endpoint's order.
    pub order_id: Option<Uuid>,
    /// The stored intent's fingerprint, hex.
    pub fingerprint: String,
    /// Whether the body was read (`--show-body`).
    pub body_shown: bool,
    /// The stored body, exactly as stored (JSON text), when shown; `None` for a tombstone.
    pub response_body: Option<String>,
}

/// How a transaction holds the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldKind {
    /// It holds the committed record's row lock (the row's `xmax` is its transaction).
    RowLock,
    /// One of these open transactions inserted the record and has not committed (which one, a
    /// read cannot tell: each of them has written records).
    UncommittedClaim,
}

/// A session with an open transaction, as this role may see it.
#[derive(Debug, Clone, Serialize)]
pub struct Transaction {
    /// Its server process id.
    pub pid: i32,
    /// Its `application_name`.
    pub application_name: Option<String>,
    /// Its role.
    pub role: Option<String>,
    /// Whether this role may see its state (its own role's session, or `pg_read_all_stats`);
    /// when false, the fields below that `pg_stat_activity` hides are `None`.
    pub visible: bool,
    /// `active`, `idle in transaction`, ...
    pub state: Option<String>,
    /// How long its transaction has been open.
    pub transaction_seconds: Option<f64>,
    /// What it waits on: `Lock`, `Client`, ... and the event.
    pub wait_event_type: Option<String>,
    /// The wait event (`transactionid`, `ClientRead`, ...).
    pub wait_event: Option<String>,
    /// The sessions it waits for (`pg_blocking_pids`).
    pub waiting_for: Vec<i32>,
    /// The lock modes it holds on the records table.
    pub record_locks: Vec<String>,
    /// The sessions waiting for it.
    pub blocking: Vec<i32>,
}

/// Which transaction holds the key, and how.
#[derive(Debug, Clone, Serialize)]
pub struct Holding {
    /// How.
    pub how: HoldKind,
    /// The holder (row lock), or the candidates (uncommitted claim), by pid.
    pub transactions: Vec<Transaction>,
}

/// What the uncommitted-claim probe could tell (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Probe {
    /// Not needed: a committed record answers.
    NotNeeded,
    /// The index has no entry this snapshot does not show.
    Clear,
    /// It has one, and open transactions write records: an uncommitted claim.
    UncommittedEntry,
    /// The server does not count index reads (`track_counts = off`): an uncommitted claim
    /// cannot be seen.
    Unavailable,
}

/// What a retry of the intent gets now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// The stored answer, as a replay.
    Replay,
    /// Refused: the key was used for another intent (the endpoint's 422, the SQL API's
    /// `key_reused`).
    KeyReused,
    /// Beyond the replay window (410, `expired`): never re-executed.
    Expired,
    /// It waits for the transaction that holds the key (then answers from what it committed, or
    /// owns the key if it rolled back; past the claim's lock timeout: in progress, 409 / 55P03).
    WaitsForHolder,
    /// It claims the key: the business runs.
    Claims,
    /// The endpoint refuses the body before any claim (the key is not consumed).
    RefusedBeforeClaim,
    /// It cannot be told: the intent's fingerprint could not be computed, or the record has no
    /// answer.
    Unknown,
}

impl From<RetryAnswer> for Retry {
    fn from(answer: RetryAnswer) -> Retry {
        match answer {
            RetryAnswer::Replay => Retry::Replay,
            RetryAnswer::KeyReused => Retry::KeyReused,
            RetryAnswer::Expired => Retry::Expired,
        }
    }
}

/// The intent compared with the record.
#[derive(Debug, Clone, Serialize)]
pub struct IntentCheck {
    /// The intent's fingerprint, hex (`None`: it could not be computed, see `unknown`).
    pub fingerprint: Option<String>,
    /// Whether it is the stored one (`None`: no committed record, or no fingerprint).
    pub matches: Option<bool>,
    /// `create-order`: the `Api-Version` it was fingerprinted with (the one that matched, else
    /// `api.default_api_version`, what a request without the header gets).
    pub api_version: Option<String>,
    /// `create-order`: why the endpoint refuses the body before any claim.
    pub refused: Option<String>,
    /// Why the fingerprint is unknown.
    pub unknown: Option<String>,
    /// What a retry of this intent with the key gets now.
    pub retry: Retry,
}

/// What `keys explain` found.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The schema read.
    pub schema: String,
    /// The scope's tenant.
    pub tenant: String,
    /// The scope's principal.
    pub principal: String,
    /// The scope's operation.
    pub operation: String,
    /// Whether it is the endpoint's operation (`create-order`: HTTP answers) or an SQL API one.
    pub endpoint: bool,
    /// The key.
    pub key: String,
    /// The database clock of the read (the window is judged on it).
    pub read_at: DateTime<Utc>,
    /// Where the key stands.
    pub state: KeyState,
    /// The committed record.
    pub record: Option<StoredRecord>,
    /// The transaction holding it, when one does.
    pub held: Option<Holding>,
    /// The uncommitted-claim probe's finding.
    pub probe: Probe,
    /// The role that read.
    pub role: String,
    /// Whether it sees every session's state (`pg_read_all_stats`).
    pub sees_all_sessions: bool,
    /// The intent, when one was given.
    pub intent: Option<IntentCheck>,
    /// Other operations of the tenant and principal with a record of this key.
    pub other_operations: Vec<String>,
}

/// Why the explain failed.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// `--intent` is not JSON.
    #[error("--intent is not JSON: {0}")]
    IntentNotJson(String),
    /// `--intent` is JSON that PostgreSQL's jsonb refuses (e.g. a `\u0000` in a string).
    #[error("--intent is not a JSON value PostgreSQL accepts as jsonb")]
    IntentNotJsonb(#[source] DbError),
    /// The role may not read what the explain reads.
    #[error(
        "role {role:?} may not read the idempotency records ({step}): GRANT USAGE ON SCHEMA \
         {schema} and SELECT ON {schema}.idempotency_scopes, {schema}.idempotency_records to it \
         (README, \"Why did this key answer that?\")"
    )]
    NotPermitted {
        /// The role.
        role: String,
        /// The schema.
        schema: String,
        /// What was being read.
        step: &'static str,
        /// The error (42501).
        #[source]
        source: DbError,
    },
    /// A statement failed, or the database did not answer in time.
    #[error("cannot explain the key ({step})")]
    Database {
        /// What was being read.
        step: &'static str,
        /// Why.
        #[source]
        source: DbError,
    },
}

impl KeysError {
    /// Whether the operator's invocation or grants are to fix (exit status 64).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            KeysError::IntentNotJson(_)
                | KeysError::IntentNotJsonb(_)
                | KeysError::NotPermitted { .. }
        )
    }

    /// The database error's class, when there is one.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            KeysError::IntentNotJson(_) => None,
            KeysError::IntentNotJsonb(e)
            | KeysError::NotPermitted { source: e, .. }
            | KeysError::Database { source: e, .. } => Some(e.class()),
        }
    }
}

/// The explain's session and the role it reads as, for errors that name it.
struct Reader<'c, 'a> {
    conn: &'c Conn<'a>,
    role: String,
}

impl Reader<'_, '_> {
    /// A failed statement as a [`KeysError`]: 42501 is the role's grants.
    fn failed(&self, step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> KeysError {
        let (role, schema) = (self.role.clone(), self.conn.schema().to_owned());
        move |e| failure(e, step, role, schema)
    }

    async fn one(
        &self,
        step: &'static str,
        template: &'static str,
        params: &[&dyn db::Param],
    ) -> Result<tokio_postgres::Row, KeysError> {
        self.conn
            .query_one(template, params)
            .await
            .map_err(self.failed(step))
    }

    async fn all(
        &self,
        step: &'static str,
        template: &'static str,
        params: &[&dyn db::Param],
    ) -> Result<Vec<tokio_postgres::Row>, KeysError> {
        self.conn
            .query(template, params)
            .await
            .map_err(self.failed(step))
    }

    /// The first column of every row.
    async fn column<T: for<'r> tokio_postgres::types::FromSql<'r>>(
        &self,
        step: &'static str,
        template: &'static str,
        params: &[&dyn db::Param],
    ) -> Result<Vec<T>, KeysError> {
        self.all(step, template, params)
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(self.failed(step))
    }
}

fn failure(
    e: tokio_postgres::Error,
    step: &'static str,
    role: String,
    schema: String,
) -> KeysError {
    if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        KeysError::NotPermitted {
            role,
            schema,
            step,
            source: DbError::Query(e),
        }
    } else {
        KeysError::Database {
            step,
            source: DbError::Query(e),
        }
    }
}

/// Explains `request` on `conn` (a session of its own, whose schema the caller checked), with
/// the endpoint's request defaults from `api`. One read-only transaction, bounded on the server
/// (`statement_timeout`, `lock_timeout`) and on the client; on failure the caller drops the
/// session, which ends the transaction.
#[tracing::instrument(skip_all, fields(operation = request.operation))]
pub async fn explain(
    conn: &Conn<'_>,
    api: &ApiConfig,
    request: &ExplainRequest<'_>,
) -> Result<Explanation, KeysError> {
    // The intent is JSON or the command line is wrong, before anything is read.
    let intent = request
        .intent
        .map(|text| {
            serde_json::from_str::<serde_json::Value>(text)
                .map(|_| text)
                .map_err(|e| KeysError::IntentNotJson(e.to_string()))
        })
        .transpose()?;
    let bound = db::deadline::beyond(STATEMENT_TIMEOUT.saturating_mul(STATEMENTS));
    let unnamed = |step| {
        let schema = conn.schema().to_owned();
        move |e| failure(e, step, String::new(), schema)
    };
    let read = async {
        conn.client()
            .batch_execute(sql::BEGIN)
            .await
            .map_err(unnamed("starting a read-only transaction"))?;
        let lock_timeout = db::sql::duration_setting(LOCK_TIMEOUT);
        let statement_timeout = db::sql::duration_setting(STATEMENT_TIMEOUT);
        let role: String = conn
            .query_one(sql::SETTINGS, &[&lock_timeout, &statement_timeout])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(unnamed("setting the transaction's timeouts"))?;
        let reader = Reader { conn, role };
        let explanation = read(&reader, api, request, intent).await?;
        conn.client()
            .batch_execute(sql::END)
            .await
            .map_err(reader.failed("ending the read-only transaction"))?;
        Ok(explanation)
    };
    match db::deadline::within(bound, "the explain", read).await {
        Ok(result) => result,
        Err(timeout) => Err(KeysError::Database {
            step: "reading the key",
            source: timeout,
        }),
    }
}

/// The reads, inside the transaction.
async fn read(
    reader: &Reader<'_, '_>,
    api: &ApiConfig,
    request: &ExplainRequest<'_>,
    intent: Option<&str>,
) -> Result<Explanation, KeysError> {
    let endpoint = request.operation == OPERATION_CREATE_ORDER;
    // Fingerprinted first: a value jsonb refuses fails the transaction before anything is read.
    let intent = match intent {
        None => None,
        Some(text) if endpoint => Some(order_intent(text, api)),
        Some(text) => Some(sql_api_intent(reader, text).await?),
    };

    const RECORD: &str = "reading the record";
    let row = reader
        .one(
            RECORD,
            sql::RECORD,
            &[
                &request.tenant,
                &request.principal,
                &request.operation,
                &request.key,
            ],
        )
        .await?;
    let get = |e| reader.failed(RECORD)(e);
    let scope_id: Option<i32> = row.try_get("scope_id").map_err(get)?;
    let read_at: DateTime<Utc> = row.try_get("read_at").map_err(get)?;
    let sees_all_sessions: bool = row.try_get("sees_all_sessions").map_err(get)?;
    let found: bool = row.try_get("found").map_err(get)?;

    let mut record = None;
    let mut state = KeyState::Free;
    let mut record_state = None;
    let mut held = None;
    let mut probe = Probe::NotNeeded;
    if found {
        let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(get)?;
        let status_code: Option<i16> = row.try_get("status_code").map_err(get)?;
        let window = RecordState::read(&row).map_err(get)?;
        record_state = Some(window);
        state = match (status_code, window) {
            (None, _) => KeyState::Unfinished,
            (Some(_), RecordState::Replayable) => KeyState::Completed,
            (Some(_), RecordState::PastDeadline) => KeyState::PastDeadline,
            (Some(_), RecordState::Tombstone) => KeyState::Tombstoned,
        };
        let response_body = match (request.show_body, scope_id) {
            (true, Some(scope_id)) => reader
                .column::<Option<String>>(
                    "reading the stored body",
                    sql::BODY,
                    &[&scope_id, &request.key],
                )
                .await?
                .into_iter()
                .next()
                .flatten(),
            _ => None,
        };
        record = Some(StoredRecord {
            created_at: row.try_get("created_at").map_err(get)?,
            replay_deadline: row.try_get("replay_deadline").map_err(get)?,
            expired_at: row.try_get("expired_at").map_err(get)?,
            status_code: status_code.and_then(|s| u16::try_from(s).ok()),
            resource_id: row.try_get("resource_id").map_err(get)?,
            order_id: row.try_get("order_id").map_err(get)?,
            fingerprint: hex::encode(&fingerprint),
            body_shown: request.show_body,
            response_body,
        });
        let xmax: String = row.try_get("xmax").map_err(get)?;
        let holder: Vec<i32> = reader
            .column("finding the row lock's holder", sql::HOLDER, &[&xmax])
            .await?;
        if !holder.is_empty() {
            held = Some(Holding {
                how: HoldKind::RowLock,
                transactions: sessions(reader, &holder).await?,
            });
        }
    } else {
        // The key's entries in the records' primary key; without a committed scope, the
        // scope's in the scopes' unique key.
        let schema = reader.conn.schema();
        let (table, found) = match scope_id {
            Some(scope_id) => (
                "idempotency_records",
                uncommitted_entry(
                    reader,
                    &format!("{schema}.idempotency_records_pkey"),
                    sql::PROBE_RECORD,
                    &[&scope_id, &request.key],
                )
                .await?,
            ),
            None => (
                "idempotency_scopes",
                uncommitted_entry(
                    reader,
                    &format!("{schema}.idempotency_scopes_scope_key"),
                    sql::PROBE_SCOPE,
                    &[&request.tenant, &request.principal, &request.operation],
                )
                .await?,
            ),
        };
        let table = format!("{schema}.{table}");
        probe = match found {
            None => Probe::Unavailable,
            Some(false) => Probe::Clear,
            Some(true) => {
                let pids: Vec<i32> = reader
                    .column("listing the open writers", sql::WRITERS, &[&table])
                    .await?;
                if pids.is_empty() {
                    // Entries no snapshot shows, and nobody writing: dead versions.
                    Probe::Clear
                } else {
                    held = Some(Holding {
                        how: HoldKind::UncommittedClaim,
                        transactions: sessions(reader, &pids).await?,
                    });
                    state = KeyState::InFlight;
                    Probe::UncommittedEntry
                }
            }
        };
    }

    let other_operations: Vec<String> = reader
        .column(
            "reading other operations",
            sql::OTHER_OPERATIONS,
            &[
                &request.tenant,
                &request.principal,
                &request.key,
                &request.operation,
            ],
        )
        .await?;

    let intent = intent.map(|candidate| candidate.against(state, record_state, record.as_ref()));
    Ok(Explanation {
        schema: reader.conn.schema().to_owned(),
        tenant: request.tenant.to_owned(),
        principal: request.principal.to_owned(),
        operation: request.operation.to_owned(),
        endpoint,
        key: request.key.to_owned(),
        read_at,
        state,
        record,
        held,
        probe,
        role: reader.role.clone(),
        sees_all_sessions,
        intent,
        other_operations,
    })
}

/// The probe (module documentation): `Some(true)` when the unique index returns an entry of the
/// key that this snapshot does not show, after a first scan marked the dead ones; `None` when the
/// server does not count index reads.
async fn uncommitted_entry(
    reader: &Reader<'_, '_>,
    index: &str,
    probe: &'static str,
    params: &[&dyn db::Param],
) -> Result<Option<bool>, KeysError> {
    const STEP: &str = "probing the key's index for an uncommitted claim";
    let read_counters = || async {
        let row = reader.one(STEP, sql::INDEX_COUNTERS, &[&index]).await?;
        let scans: i64 = row.try_get(0).map_err(reader.failed(STEP))?;
        let entries: i64 = row.try_get(1).map_err(reader.failed(STEP))?;
        Ok::<_, KeysError>((scans, entries))
    };
    // A first scan marks the entries whose row is dead to everyone (the record's own read did,
    // through the same index, but with a plan of its own); its counts are not used.
    reader.one(STEP, probe, params).await?;
    let (scans_before, entries_before) = read_counters().await?;
    let visible: i64 = reader
        .one(STEP, probe, params)
        .await?
        .try_get(0)
        .map_err(reader.failed(STEP))?;
    let (scans_after, entries_after) = read_counters().await?;
    if scans_after <= scans_before {
        return Ok(None);
    }
    Ok(Some(entries_after - entries_before > visible))
}

/// The sessions `pids`, as this role may see them.
async fn sessions(reader: &Reader<'_, '_>, pids: &[i32]) -> Result<Vec<Transaction>, KeysError> {
    const STEP: &str = "reading the holding sessions";
    let pids = pids.to_vec();
    reader
        .all(STEP, sql::SESSIONS, &[&pids])
        .await?
        .iter()
        .map(|r| {
            Ok(Transaction {
                pid: r.try_get("pid")?,
                application_name: r.try_get("application_name")?,
                role: r.try_get("role")?,
                visible: r.try_get("visible")?,
                state: r.try_get("state")?,
                transaction_seconds: r.try_get("transaction_seconds")?,
                wait_event_type: r.try_get("wait_event_type")?,
                wait_event: r.try_get("wait_event")?,
                waiting_for: r.try_get("waiting_for")?,
                record_locks: r.try_get("record_locks")?,
                blocking: r.try_get("blocking")?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(reader.failed(STEP))
}

/// An intent fingerprinted, before it meets the record.
struct Candidate {
    /// Fingerprints to compare, first the one reported when none matches: (fingerprint, the
    /// endpoint's `Api-Version` it was made with).
    fingerprints: Vec<(Fingerprint, Option<String>)>,
    refused: Option<String>,
    unknown: Option<String>,
}

/// A `create-order` intent: the order request body, validated and fingerprinted exactly as the
/// endpoint does (`api.default_currency` for an omitted currency; `api.default_api_version`
/// first, what a request without an `Api-Version` header gets, then the other supported
/// versions).
fn order_intent(text: &str, api: &ApiConfig) -> Candidate {
    let defaults = RequestDefaults {
        currency: api.default_currency,
    };
    let order = match order_request::parse_order(text.as_bytes(), &defaults) {
        Ok(order) => order,
        Err(e) => {
            let refused = match e {
                OrderRequestError::Malformed(detail) => {
                    format!("400 malformed-json: {detail}")
                }
                OrderRequestError::Invalid(errors) => {
                    let fields: Vec<String> = errors
                        .iter()
                        .map(|e| format!("{} ({})", e.field, e.detail))
                        .collect();
                    format!("422 validation-failed: {}", fields.join("; "))
                }
            };
            return Candidate {
                fingerprints: Vec::new(),
                refused: Some(refused),
                unknown: None,
            };
        }
    };
    let mut versions = vec![api.default_api_version.as_str()];
    versions.extend(
        SUPPORTED_API_VERSIONS
            .iter()
            .copied()
            .filter(|v| *v != api.default_api_version),
    );
    let fingerprints = versions
        .into_iter()
        .filter_map(|v| {
            Fingerprint::of(&order, v)
                .ok()
                .map(|f| (f, Some(v.to_owned())))
        })
        .collect::<Vec<_>>();
    let unknown = fingerprints
        .is_empty()
        .then(|| "the request could not be fingerprinted".to_owned());
    Candidate {
        fingerprints,
        refused: None,
        unknown,
    }
}

/// An SQL API intent, fingerprinted by the schema's `fingerprint(jsonb)` when the role may call
/// it.
async fn sql_api_intent(reader: &Reader<'_, '_>, text: &str) -> Result<Candidate, KeysError> {
    const STEP: &str = "fingerprinting the intent";
    let may: bool = reader
        .one(STEP, sql::MAY_FINGERPRINT, &[])
        .await?
        .try_get(0)
        .map_err(reader.failed(STEP))?;
    if !may {
        return Ok(Candidate {
            fingerprints: Vec::new(),
            refused: None,
            unknown: Some(format!(
                "role {:?} may not execute {}.fingerprint(jsonb)",
                reader.role,
                reader.conn.schema()
            )),
        });
    }
    let row = reader
        .conn
        .query_one(sql::FINGERPRINT, &[&text])
        .await
        .map_err(|e| {
            // 22xxx: data the jsonb input refuses; anything else is the database's.
            if e.code().is_some_and(|c| c.code().starts_with("22")) {
                KeysError::IntentNotJsonb(DbError::Query(e))
            } else {
                reader.failed(STEP)(e)
            }
        })?;
    let bytes: Vec<u8> = row.try_get(0).map_err(reader.failed(STEP))?;
    Ok(Candidate {
        fingerprints: Fingerprint::from_slice(&bytes)
            .map(|f| vec![(f, None)])
            .unwrap_or_default(),
        refused: None,
        unknown: None,
    })
}

impl Candidate {
    /// What a retry of this intent gets, the key being in `state` (its window `window`, its
    /// record `record`).
    fn against(
        self,
        state: KeyState,
        window: Option<RecordState>,
        record: Option<&StoredRecord>,
    ) -> IntentCheck {
        let stored = record.map(|r| r.fingerprint.as_str());
        let matched =
            stored.and_then(|stored| self.fingerprints.iter().find(|(f, _)| f.to_hex() == stored));
        let shown = matched.or(self.fingerprints.first());
        let known = !self.fingerprints.is_empty();
        let matches = (known && stored.is_some()).then_some(matched.is_some());
        let retry = if self.refused.is_some() {
            Retry::RefusedBeforeClaim
        } else {
            match (state, window, matches) {
                (KeyState::Free, _, _) => Retry::Claims,
                (KeyState::InFlight, _, _) => Retry::WaitsForHolder,
                (KeyState::Unfinished, _, _) | (_, _, None) | (_, None, _) => Retry::Unknown,
                (_, Some(window), Some(same)) => window.answer(same).into(),
            }
        };
        IntentCheck {
            fingerprint: shown.map(|(f, _)| f.to_hex()),
            matches,
            api_version: shown.and_then(|(_, v)| v.clone()),
            refused: self.refused,
            unknown: self.unknown,
            retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fingerprint: &str) -> StoredRecord {
        StoredRecord {
            created_at: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            replay_deadline: DateTime::from_timestamp(1_800_086_400, 0).unwrap(),
            expired_at: None,
            status_code: Some(201),
            resource_id: None,
            order_id: None,
            fingerprint: fingerprint.to_owned(),
            body_shown: false,
            response_body: None,
        }
    }

    const BODY: &str =
        r#"{"request_id":"PR-1","amount":"100.00","item":"SKU-42","recipient":"Li Wei"}"#;

    #[test]
    fn an_order_intent_is_the_endpoints_fingerprint() {
        let api = ApiConfig::default();
        let candidate = order_intent(BODY, &api);
        let order = order_request::parse_order(
            BODY.as_bytes(),
            &RequestDefaults {
                currency: api.default_currency,
            },
        )
        .unwrap();
        let expected = Fingerprint::of(&order, &api.default_api_version).unwrap();
        assert_eq!(candidate.fingerprints[0].0, expected);
        // Field order, metadata and a spelled-out default currency change nothing.
        let respelled = format!(
            r#"{{"recipient":"Li Wei","currency":"{}","item":"SKU-42","amount":"100.00","request_id":"PR-1","metadata":{{"trace":"x"}}}}"#,
            api.default_currency.code()
        );
        assert_eq!(order_intent(&respelled, &api).fingerprints[0].0, expected);
    }

    #[test]
    fn a_retry_meets_the_protocols_answer() {
        let api = ApiConfig::default();
        let same = order_intent(BODY, &api);
        let stored = same.fingerprints[0].0.to_hex();
        let check = order_intent(BODY, &api).against(
            KeyState::Completed,
            Some(RecordState::Replayable),
            Some(&record(&stored)),
        );
        assert_eq!((check.matches, check.retry), (Some(true), Retry::Replay));
        let other = order_intent(&BODY.replace("100.00", "100.01"), &api).against(
            KeyState::Tombstoned,
            Some(RecordState::Tombstone),
            Some(&record(&stored)),
        );
        assert_eq!(
            (other.matches, other.retry),
            (Some(false), Retry::KeyReused)
        );
        let expired = order_intent(BODY, &api).against(
            KeyState::PastDeadline,
            Some(RecordState::PastDeadline),
            Some(&record(&stored)),
        );
        assert_eq!(expired.retry, Retry::Expired);
        let free = order_intent(BODY, &api).against(KeyState::Free, None, None);
        assert_eq!((free.matches, free.retry), (None, Retry::Claims));
        let in_flight = order_intent(BODY, &api).against(KeyState::InFlight, None, None);
        assert_eq!(in_flight.retry, Retry::WaitsForHolder);
    }

    #[test]
    fn a_body_the_endpoint_refuses_is_refused_before_the_claim() {
        let api = ApiConfig::default();
        let check =
            order_intent(r#"{"request_id":"PR-1"}"#, &api).against(KeyState::Free, None, None);
        assert_eq!(check.retry, Retry::RefusedBeforeClaim);
        assert!(
            check
                .refused
                .as_deref()
                .unwrap()
                .starts_with("422 validation-failed: "),
            "{check:?}"
        );
        let duplicate = order_intent(r#"{"item":"a","item":"b"}"#, &api);
        assert!(duplicate
            .refused
            .unwrap()
            .starts_with("400 malformed-json: "));
    }
}
