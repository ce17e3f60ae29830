//! Read-only lookups behind the GET routes: an order within the caller's tenant, and the status
//! of an idempotency key within the caller's scope — never its stored body.

use std::time::Duration;

use crate::db::Pool;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::claim::{RecordState, OPERATION_CREATE_ORDER};
use crate::config::DatabaseConfig;
use crate::db::{self, Conn, DbError, ErrorClass, Param};
use crate::money::Currency;

/// The statements, by name.
pub mod sql {
    /// `$1` order id, `$2` tenant. Another tenant's order is simply not found.
    pub const ORDER_BY_ID: &str = "\
SELECT order_id, request_id, amount_minor, currency::text AS currency, item, quantity,
       recipient, status, created_at
FROM {schema}.orders
WHERE order_id = $1 AND tenant_id = $2";

    /// `$1` tenant, `$2` principal, `$3` operation, `$4` key. No `response_body`: the status
    /// resource never reveals the stored response.
    pub const KEY_STATUS: &str = "\
SELECT status_code, order_id, expired, created_at, replay_deadline, expired_at,
       NOT {schema}.replay_window_open(replay_deadline, now()) AS past_deadline
FROM {schema}.idempotency_records
WHERE scope_id = (SELECT scope_id FROM {schema}.idempotency_scopes
                  WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3)
  AND idempotency_key = $4";
}

/// An order as `GET /v1/orders/{order_id}` shows it (the same fields as the 201 body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderView {
    /// The order id.
    pub order_id: Uuid,
    /// The business id of the purchase request.
    pub request_id: String,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// Amount as a decimal string with the currency's minor digits.
    pub amount: String,
    /// ISO 4217 code.
    pub currency: String,
    /// Item.
    pub item: String,
    /// Quantity.
    pub quantity: i32,
    /// Recipient.
    pub recipient: String,
    /// Order status (`created`).
    pub status: String,
    /// Creation time, RFC 3339 UTC with microseconds.
    pub created_at: String,
}

/// Whether a key's stored response can still be replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    /// Inside the replay window: a retry with the same request replays the stored response.
    Completed,
    /// Past `replay_deadline` (tombstoned, or about to be): a retry gets 410.
    Expired,
}

/// `GET /v1/idempotency-keys/{key}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyStatus {
    /// The key.
    pub idempotency_key: String,
    /// Always `create-order` for now.
    pub operation: &'static str,
    /// `completed` or `expired`.
    pub state: KeyState,
    /// The stored outcome's HTTP status (201, or 422 for a stored rejection).
    pub status_code: Option<u16>,
    /// The order the key created, if any.
    pub order_id: Option<Uuid>,
    /// When the key was claimed.
    pub created_at: String,
    /// End of the replay window.
    pub replay_deadline: String,
    /// When the cleaner tombstoned the record; `null` while not (yet) tombstoned.
    pub expired_at: Option<String>,
}

/// Why a lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// No connection, or it failed.
    #[error("database unavailable")]
    Unavailable(#[source] DbError),
    /// Anything else.
    #[error("unexpected database error")]
    Database(#[source] DbError),
}

impl LookupError {
    /// The database error inside.
    pub fn db_error(&self) -> &DbError {
        match self {
            LookupError::Unavailable(e) | LookupError::Database(e) => e,
        }
    }
}

/// The client-side bound on one lookup once it holds a connection: one indexed read, so the
/// claim's statement allowance plus the deadline's slack.
pub const LOOKUP_DEADLINE: Duration = Duration::from_secs(
    crate::claim::STATEMENT_ALLOWANCE.as_secs() + db::deadline::SLACK.as_secs(),
);

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

async fn query_opt(
    pool: &Pool,
    database: &DatabaseConfig,
    sql: &'static str,
    params: &[&dyn Param],
) -> Result<Option<tokio_postgres::Row>, LookupError> {
    let client = pool
        .get()
        .await
        .map_err(|e| LookupError::Unavailable(DbError::Pool(e)))?;
    let conn = Conn::pooled(&client, &database.schema, database.pooler);
    let bounded =
        db::deadline::within(LOOKUP_DEADLINE, "the lookup", conn.query_opt(sql, params)).await;
    let result = match bounded {
        Ok(result) => result,
        Err(timeout) => {
            // Silent or stuck: discarded with its idle siblings, as a timed-out claim's are.
            db::discard(client);
            db::retire_idle(pool);
            return Err(LookupError::Unavailable(timeout));
        }
    };
    result.map_err(|e| {
        let class = db::classify(&e);
        db::discard(client);
        match class {
            // The API's sessions carry the claim's lock timeout (`db::pooled`): a lookup that
            // waited that long for a table lock (DDL in progress) is as unanswerable right now
            // as an unreachable database.
            ErrorClass::Unavailable | ErrorClass::LockNotAvailable => {
                LookupError::Unavailable(DbError::Query(e))
            }
            _ => LookupError::Database(DbError::Query(e)),
        }
    })
}

/// The order `order_id` if it belongs to `tenant` (on a connection of `pool`, opened for
/// `database`).
#[tracing::instrument(skip(pool, database))]
pub async fn order(
    pool: &Pool,
    database: &DatabaseConfig,
    tenant: &str,
    order_id: Uuid,
) -> Result<Option<OrderView>, LookupError> {
    let Some(row) = query_opt(pool, database, sql::ORDER_BY_ID, &[&order_id, &tenant]).await?
    else {
        return Ok(None);
    };
    let get = |e| LookupError::Database(DbError::Query(e));
    let currency: String = row.try_get("currency").map_err(get)?;
    let amount_minor: i64 = row.try_get("amount_minor").map_err(get)?;
    // Every stored currency was validated on the way in; fall back to minor units otherwise.
    let amount = Currency::parse(&currency)
        .map(|c| c.format(amount_minor))
        .unwrap_or_else(|_| amount_minor.to_string());
    Ok(Some(OrderView {
        order_id: row.try_get("order_id").map_err(get)?,
        request_id: row.try_get("request_id").map_err(get)?,
        amount_minor,
        amount,
        currency,
        item: row.try_get("item").map_err(get)?,
        quantity: row.try_get("quantity").map_err(get)?,
        recipient: row.try_get("recipient").map_err(get)?,
        status: row.try_get("status").map_err(get)?,
        created_at: rfc3339(row.try_get("created_at").map_err(get)?),
    }))
}

/// The status of `key` in the scope (tenant, principal, create-order).
#[tracing::instrument(skip(pool, database, key))]
pub async fn key_status(
    pool: &Pool,
    database: &DatabaseConfig,
    tenant: &str,
    principal: &str,
    key: &str,
) -> Result<Option<KeyStatus>, LookupError> {
    let Some(row) = query_opt(
        pool,
        database,
        sql::KEY_STATUS,
        &[&tenant, &principal, &OPERATION_CREATE_ORDER, &key],
    )
    .await?
    else {
        return Ok(None);
    };
    let get = |e| LookupError::Database(DbError::Query(e));
    let record = RecordState::read(&row).map_err(get)?;
    let status_code: Option<i16> = row.try_get("status_code").map_err(get)?;
    let expired_at: Option<DateTime<Utc>> = row.try_get("expired_at").map_err(get)?;
    Ok(Some(KeyStatus {
        idempotency_key: key.to_owned(),
        operation: OPERATION_CREATE_ORDER,
        state: if record.is_replayable() {
            KeyState::Completed
        } else {
            KeyState::Expired
        },
        status_code: status_code.and_then(|s| u16::try_from(s).ok()),
        order_id: row.try_get("order_id").map_err(get)?,
        created_at: rfc3339(row.try_get("created_at").map_err(get)?),
        replay_deadline: rfc3339(row.try_get("replay_deadline").map_err(get)?),
        expired_at: expired_at.map(rfc3339),
    }))
}
