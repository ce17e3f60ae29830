//! The benchmark's data: idempotency records as the API writes them — the real 201 body shape
//! (~400 bytes of order JSON), UUID keys, 4 tenants × 16 principals, a fingerprint that is the
//! real fingerprint of the request that created the record (so HTTP replays of seeded records
//! are real replays) — generated in SQL (`generate_series`) for speed, and the same records
//! generated in Rust for the load generators. [`verify`] checks that both agree, through
//! `tombstoned::fingerprint`, before any number is taken.
//!
//! Seeding drops the table's indexes and constraints' indexes, inserts in deadline order (so heap
//! order follows deadline order, as it does when records are claimed over time), and recreates
//! them from the definitions read from the catalogue (checked to be identical afterwards); then
//! `VACUUM (FREEZE, ANALYZE)` and `CHECKPOINT`, so every copy starts with settled pages.

use std::time::Instant;

use anyhow::{ensure, Context as _, Result};
use md5::Digest as _;
use sha2::{Digest as _, Sha256};
use tokio_postgres::Client;
use tombstoned::fingerprint::Fingerprint;
use tombstoned::order_request::{parse_order, RequestDefaults};

/// Tenants × principals: principal `p` (0-15) belongs to tenant `p / 4`.
pub const PRINCIPALS: i64 = 16;
/// [`Keys::Md5`]'s scopes: 10 tenants × 1,000 principals, principal `p` in tenant `p / 1000`.
pub const MD5_PRINCIPALS: i64 = 10_000;
/// [`Keys::Md5`]'s principals per tenant.
pub const MD5_PRINCIPALS_PER_TENANT: i64 = 1_000;

/// The shape of a data set's keys and scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Keys {
    /// UUID-shaped keys spread over [`PRINCIPALS`] principals in 4 tenants.
    Uuid,
    /// Decimal keys in principal 0's scope (the pgbench replay set).
    Decimal,
    /// `md5(i)` keys over [`MD5_PRINCIPALS`] principals in 10 tenants (issue 28's layout:
    /// 10,000 scopes, primary-key order unrelated to deadline order).
    Md5,
}

impl Keys {
    /// How [`RECORDS`] names it (`$6`).
    fn sql(self) -> &'static str {
        match self {
            Keys::Uuid => "uuid",
            Keys::Decimal => "decimal",
            Keys::Md5 => "md5",
        }
    }

    /// The principal of record `i`.
    fn principal(self, i: i64) -> i64 {
        match self {
            Keys::Uuid => i % PRINCIPALS,
            Keys::Decimal => 0,
            Keys::Md5 => i % MD5_PRINCIPALS,
        }
    }

    /// The tenant of principal `p`.
    fn tenant(self, p: i64) -> i64 {
        match self {
            Keys::Md5 => p / MD5_PRINCIPALS_PER_TENANT,
            Keys::Uuid | Keys::Decimal => p / 4,
        }
    }
}
/// The API version the seeded fingerprints were computed for (the default).
pub const API_VERSION: &str = "2026-12-01";
/// `api.claim_lock_timeout` (default) as the API sends it (pgbench's claims and the floor's).
pub use tombstoned_testkit::pgbench_scripts::LOCK_TIMEOUT;
/// `retention.replay_window` (default 24 h) in microseconds, as the API sends it.
pub const WINDOW_US: &str = "86400000000";
/// Replay window of the seeded records (the default 24 h): `created_at = deadline - window`.
pub const WINDOW: &str = "24 hours";
/// Keys of the decimal-key replay set start above this (pgbench can only make integers).
pub use tombstoned_testkit::pgbench_scripts::DECIMAL_KEY_BASE;

const ITEMS: [&str; 4] = [
    "Ergonomic mesh office chair with adjustable lumbar support, black",
    "Stainless steel insulated water bottle 750 ml, brushed finish",
    "Noise-cancelling over-ear wireless headphones, 30 h battery",
    "Organic cotton bath towel set of four, 600 gsm, slate grey",
];

/// One record per `i` in `[$1, $2]`: scope, key, request fields, and the canonical JSON its
/// fingerprint hashes. `$3` tag (namespaces keys per data set), `$4` deadline of `i = 0`, `$5`
/// step between deadlines, `$6` the [`Keys`] shape (`uuid`, `decimal`: principal 0's scope, the
/// pgbench replay set; `md5`: 10 tenants × 1,000 principals).
const RECORDS: &str = "
SELECT i, p.tenant_id, p.principal_id, p.idempotency_key, p.request_id, p.order_id,
       p.amount_minor, p.amount, p.item, p.quantity, p.recipient, p.deadline,
       '{\"amount_minor\":\"' || p.amount_minor || '\",\"api_version\":\"' || $7::text
       || '\",\"currency\":\"CNY\",\"fingerprint_version\":1,\"item\":' || to_json(p.item)
       || ',\"quantity\":' || p.quantity || ',\"recipient\":' || to_json(p.recipient)
       || ',\"request_id\":' || to_json(p.request_id) || '}' AS canonical
FROM generate_series($1::bigint, $2::bigint) AS i
CROSS JOIN LATERAL (
    SELECT 'tenant-' || (s.principal / CASE WHEN $6::text = 'md5' THEN 1000 ELSE 4 END) AS tenant_id,
           'principal-' || s.principal AS principal_id,
           CASE $6::text WHEN 'decimal' THEN ($8::bigint + i)::text
                         WHEN 'md5' THEN md5(i::text)
                ELSE encode(substr(sha256(convert_to('key/' || $3::text || '/' || i, 'UTF8')), 1, 16), 'hex')::uuid::text
           END AS idempotency_key,
           encode(substr(sha256(convert_to('req/' || $3::text || '/' || i, 'UTF8')), 1, 16), 'hex')::uuid::text AS request_id,
           encode(substr(sha256(convert_to('ord/' || $3::text || '/' || i, 'UTF8')), 1, 16), 'hex')::uuid AS order_id,
           s.amount_minor,
           (s.amount_minor / 100) || '.' || lpad((s.amount_minor % 100)::text, 2, '0') AS amount,
           (ARRAY['Ergonomic mesh office chair with adjustable lumbar support, black',
                  'Stainless steel insulated water bottle 750 ml, brushed finish',
                  'Noise-cancelling over-ear wireless headphones, 30 h battery',
                  'Organic cotton bath towel set of four, 600 gsm, slate grey'])[1 + i % 4] AS item,
           (1 + i % 5)::int AS quantity,
           'Customer ' || (i % 9973) || ' <customer' || (i % 9973) || '@example.com>' AS recipient,
           $4::timestamptz + i * $5::text::interval AS deadline
    FROM (SELECT CASE $6::text WHEN 'decimal' THEN 0 WHEN 'md5' THEN i % 10000 ELSE i % 16 END
                     AS principal,
                 100 + (i * 7919) % 1000000 AS amount_minor) AS s
) AS p";

/// A generated record's scope id (V5): one probe of the scope table, whose rows [`seed_scopes`]
/// inserted first.
const SCOPE_OF_ROW: &str = "(SELECT s.scope_id FROM idempotency_scopes s
                 WHERE s.tenant_id = r.tenant_id AND s.principal_id = r.principal_id
                   AND s.operation = 'create-order')";

/// The scopes of the generated records (principal `p` in tenant `p / 4`) and of pgbench's
/// principal, in that order; or, for [`Keys::Md5`] data, only its 10,000 scopes. Idempotent.
pub async fn seed_scopes(client: &Client, keys: Keys) -> Result<()> {
    if keys == Keys::Md5 {
        client
            .execute(
                "INSERT INTO idempotency_scopes (tenant_id, principal_id, operation)
                 SELECT 'tenant-' || (p / $2::bigint), 'principal-' || p, 'create-order'
                 FROM generate_series(0, $1::bigint - 1) AS p ORDER BY p
                 ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING",
                &[&MD5_PRINCIPALS, &MD5_PRINCIPALS_PER_TENANT],
            )
            .await?;
        return Ok(());
    }
    client
        .execute(
            "INSERT INTO idempotency_scopes (tenant_id, principal_id, operation)
             SELECT 'tenant-' || (p / 4), 'principal-' || p, 'create-order'
             FROM generate_series(0, $1::bigint - 1) AS p ORDER BY p
             ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING",
            &[&PRINCIPALS],
        )
        .await?;
    client
        .execute(
            "INSERT INTO idempotency_scopes (tenant_id, principal_id, operation)
             VALUES ('tenant-0', $1, 'create-order')
             ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING",
            &[&PGBENCH_PRINCIPAL],
        )
        .await?;
    Ok(())
}

/// Live records exactly as `claim::sql::CLAIM_AND_CREATE` stores them: status 201, the order
/// JSON built like the API builds it (same keys, `created_at` to the microsecond), the order id,
/// `replay_deadline = created_at + window`.
fn insert_live_sql(layout: Layout) -> String {
    let (columns, scope) = layout.scope();
    format!(
        "INSERT INTO idempotency_records ({columns}, idempotency_key,
             fingerprint, status_code, response_body, order_id, created_at, replay_deadline)
         SELECT {scope}, r.idempotency_key,
                sha256(convert_to(r.canonical, 'UTF8')), 201,
                jsonb_build_object('order_id', r.order_id, 'request_id', r.request_id,
                    'amount_minor', r.amount_minor, 'amount', r.amount, 'currency', 'CNY',
                    'item', r.item, 'quantity', r.quantity, 'recipient', r.recipient,
                    'status', 'created',
                    'created_at', to_char((r.deadline - interval '{WINDOW}') AT TIME ZONE 'UTC',
                                          'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')),
                r.order_id, r.deadline - interval '{WINDOW}', r.deadline
         FROM ({RECORDS}) AS r"
    )
}

/// Tombstones as the cleaner leaves them: the same identity, no body, `expired_at` a few
/// minutes after the deadline.
fn insert_tombstones_sql(layout: Layout) -> String {
    let (columns, scope) = layout.scope();
    format!(
        "INSERT INTO idempotency_records ({columns}, idempotency_key,
             fingerprint, status_code, response_body, order_id, created_at, replay_deadline,
             expired, expired_at)
         SELECT {scope}, r.idempotency_key,
                sha256(convert_to(r.canonical, 'UTF8')), 201, NULL, r.order_id,
                r.deadline - interval '{WINDOW}', r.deadline, true,
                r.deadline + interval '3 minutes'
         FROM ({RECORDS}) AS r"
    )
}

/// The records table's layout to seed: the current one, or V4's (scope as three texts) for
/// scenario 5's side-by-side comparison and the upgrade's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Layout {
    /// Migrations V1-V4: tenant, principal and operation as text columns.
    V4,
    /// V5 on: `scope_id` into `idempotency_scopes`.
    V5,
}

impl Layout {
    /// The scope's columns of `idempotency_records` and their values for a generated row `r`.
    fn scope(self) -> (&'static str, &'static str) {
        match self {
            Layout::V4 => (
                "tenant_id, principal_id, operation",
                "r.tenant_id, r.principal_id, 'create-order'",
            ),
            Layout::V5 => ("scope_id", SCOPE_OF_ROW),
        }
    }
}

/// A run of records to insert: `i` in `[first, last]`, deadlines from `deadline0 + i * step`.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Key namespace.
    pub tag: &'static str,
    /// First `i`.
    pub first: i64,
    /// Last `i` (inclusive).
    pub last: i64,
    /// Deadline of `i = 0`, as an SQL expression over `now()` (e.g. `now() - interval '25h'`).
    pub deadline0: String,
    /// Step between deadlines, as an interval literal (`'86 ms'`).
    pub step: String,
    /// Tombstones instead of live records.
    pub tombstones: bool,
    /// The keys' and scopes' shape.
    pub keys: Keys,
}

/// What seeding a database cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SeedReport {
    /// Database.
    pub database: String,
    /// Records inserted.
    pub rows: i64,
    /// Seconds inserting.
    pub insert_seconds: f64,
    /// Seconds rebuilding indexes.
    pub index_seconds: f64,
    /// Seconds in VACUUM (FREEZE, ANALYZE) and CHECKPOINT.
    pub vacuum_seconds: f64,
}

/// Inserts `batches` into `client`'s database with the table's indexes dropped, then recreates
/// them exactly, vacuums, analyses and checkpoints.
pub async fn seed(client: &Client, database: &str, batches: &[Batch]) -> Result<SeedReport> {
    seed_as(client, database, batches, Layout::V5).await
}

/// [`seed`] into a table of `layout`.
pub async fn seed_as(
    client: &Client,
    database: &str,
    batches: &[Batch],
    layout: Layout,
) -> Result<SeedReport> {
    if layout == Layout::V5 {
        let md5 = batches.iter().any(|b| b.keys == Keys::Md5);
        seed_scopes(client, if md5 { Keys::Md5 } else { Keys::Uuid }).await?;
    }
    let indexes = IndexDefinitions::read(client).await?;
    indexes.drop(client).await?;
    let started = Instant::now();
    let mut rows = 0;
    for b in batches {
        let sql = if b.tombstones {
            insert_tombstones_sql(layout)
        } else {
            insert_live_sql(layout)
        };
        // deadline0 is an expression over now(): evaluate it first, so it is a plain parameter.
        let deadline0: chrono::DateTime<chrono::Utc> = client
            .query_one(&format!("SELECT {}", b.deadline0), &[])
            .await?
            .get(0);
        let n = client
            .execute(
                &sql,
                &[
                    &b.first,
                    &b.last,
                    &b.tag,
                    &deadline0,
                    &b.step,
                    &b.keys.sql(),
                    &API_VERSION,
                    &DECIMAL_KEY_BASE,
                ],
            )
            .await
            .with_context(|| format!("seeding {database}"))?;
        rows += n as i64;
    }
    let insert_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    indexes.create(client).await?;
    let index_seconds = started.elapsed().as_secs_f64();
    let started = Instant::now();
    client
        .batch_execute("VACUUM (FREEZE, ANALYZE) idempotency_records")
        .await?;
    client.batch_execute("CHECKPOINT").await?;
    Ok(SeedReport {
        database: database.to_owned(),
        rows,
        insert_seconds,
        index_seconds,
        vacuum_seconds: started.elapsed().as_secs_f64(),
    })
}

/// The table's indexes, as the migrations made them, to drop before a bulk load and recreate
/// after it (building a B-tree from sorted input is several times faster than inserting into it
/// row by row).
struct IndexDefinitions {
    /// `(constraint name, definition)` of index-backed constraints (the primary key).
    constraints: Vec<(String, String)>,
    /// `(index name, CREATE INDEX statement)` of the other indexes.
    indexes: Vec<(String, String)>,
    /// Every index definition, to check the rebuild.
    all: Vec<String>,
}

const TABLE: &str = "tombstoned.idempotency_records";

impl IndexDefinitions {
    async fn read(client: &Client) -> Result<Self> {
        let constraints = client
            .query(
                "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE conrelid = $1::text::regclass AND contype IN ('p', 'u', 'x')
                 ORDER BY conname",
                &[&TABLE],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let indexes = client
            .query(
                "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
                 WHERE i.indrelid = $1::text::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
                 ORDER BY 1",
                &[&TABLE],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(IndexDefinitions {
            constraints,
            indexes,
            all: all_index_definitions(client).await?,
        })
    }

    async fn drop(&self, client: &Client) -> Result<()> {
        for (name, _) in &self.constraints {
            client
                .batch_execute(&format!("ALTER TABLE {TABLE} DROP CONSTRAINT {name}"))
                .await?;
        }
        for (name, _) in &self.indexes {
            client.batch_execute(&format!("DROP INDEX {name}")).await?;
        }
        Ok(())
    }

    async fn create(&self, client: &Client) -> Result<()> {
        client
            .batch_execute("SET maintenance_work_mem = '512MB'")
            .await?;
        for (name, def) in &self.constraints {
            client
                .batch_execute(&format!("ALTER TABLE {TABLE} ADD CONSTRAINT {name} {def}"))
                .await?;
        }
        for (_, def) in &self.indexes {
            client.batch_execute(def).await?;
        }
        client.batch_execute("RESET maintenance_work_mem").await?;
        let now = all_index_definitions(client).await?;
        ensure!(
            now == self.all,
            "the rebuilt indexes differ from the migrated ones:\n{now:#?}\nvs\n{:#?}",
            self.all
        );
        Ok(())
    }
}

async fn all_index_definitions(client: &Client) -> Result<Vec<String>> {
    Ok(client
        .query(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = $1::text::regclass
             ORDER BY 1",
            &[&TABLE],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// One seeded record as the load generators see it: what to send to replay it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Principal index (0-15 for [`Keys::Uuid`]: its token is [`token`]).
    pub principal: i64,
    /// Tenant index.
    pub tenant: i64,
    /// The idempotency key.
    pub key: String,
    /// The order's request_id.
    pub request_id: String,
    /// Amount in minor units (CNY).
    pub amount_minor: i64,
    /// The item.
    pub item: &'static str,
    /// Quantity.
    pub quantity: i32,
    /// Recipient.
    pub recipient: String,
}

fn uuid_of(namespace: &str, tag: &str, i: i64) -> String {
    let digest = Sha256::digest(format!("{namespace}/{tag}/{i}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::from_bytes(bytes).hyphenated().to_string()
}

impl Record {
    /// Record `i` of data set `tag` (the Rust twin of [`RECORDS`]).
    pub fn new(tag: &str, i: i64, decimal_keys: bool) -> Self {
        Record::of(
            tag,
            i,
            if decimal_keys {
                Keys::Decimal
            } else {
                Keys::Uuid
            },
        )
    }

    /// Record `i` of data set `tag` with keys and scopes shaped as `keys`.
    pub fn of(tag: &str, i: i64, keys: Keys) -> Self {
        let principal = keys.principal(i);
        Record {
            principal,
            tenant: keys.tenant(principal),
            key: match keys {
                Keys::Decimal => (DECIMAL_KEY_BASE + i).to_string(),
                Keys::Md5 => hex::encode(md5::Md5::digest(i.to_string().as_bytes())),
                Keys::Uuid => uuid_of("key", tag, i),
            },
            request_id: uuid_of("req", tag, i),
            amount_minor: 100 + (i * 7919) % 1_000_000,
            item: ITEMS[(i % 4) as usize],
            quantity: 1 + (i % 5) as i32,
            recipient: format!("Customer {0} <customer{0}@example.com>", i % 9973),
        }
    }

    /// The request body that created this record (replaying it is a replay).
    pub fn body(&self) -> String {
        serde_json::json!({
            "request_id": self.request_id,
            "amount_minor": self.amount_minor,
            "currency": "CNY",
            "item": self.item,
            "quantity": self.quantity,
            "recipient": self.recipient,
        })
        .to_string()
    }

    /// The record's scope.
    pub fn scope(&self) -> (String, String) {
        (
            format!("tenant-{}", self.tenant),
            format!("principal-{}", self.principal),
        )
    }
}

/// The bearer token of principal `p` in the benchmark's tokens file.
pub fn token(principal: i64) -> String {
    format!("bench-token-{principal}")
}

/// The tokens file the benchmark's daemons use: one token per principal, `orders:create` and
/// `orders:read`, no approval limit.
pub fn tokens_file() -> String {
    let mut out = String::from("# Generated by the benchmark (benches/scenarios/seed.rs).\n");
    for p in 0..PRINCIPALS {
        out.push_str(&format!(
            "\n[[token]]\nsha256 = \"{}\"\ntenant = \"tenant-{}\"\nprincipal = \"principal-{p}\"\n\
             permissions = [\"orders:create\", \"orders:read\"]\n",
            tombstoned::auth::token_digest_hex(&token(p)),
            p / 4
        ));
    }
    out
}

/// The scope of pgbench's replay set (`api_limit`): a twin of the decimal-key replay set.
pub const PGBENCH_PRINCIPAL: &str = "principal-pgbench";

/// The fingerprint pgbench sends with every claim and replay (`-D fingerprint`), as bytes.
pub const PGBENCH_FINGERPRINT: [u8; 32] = [0xab; 32];

/// A twin of the decimal-key replay set in [`PGBENCH_PRINCIPAL`]'s scope, each record with
/// [`PGBENCH_FINGERPRINT`]: pgbench cannot hash a request, so its replays send one constant
/// fingerprint, and a replay reads the body (FOR SHARE) only when the fingerprint matches — the
/// twin lets pgbench's replays do the very work the API's do, on records of the same shape.
pub async fn pgbench_replay_twin(client: &Client) -> Result<()> {
    client
        .execute(
            "INSERT INTO idempotency_records (scope_id,
                 idempotency_key, fingerprint, status_code, response_body, order_id,
                 created_at, replay_deadline)
             SELECT (SELECT scope_id FROM idempotency_scopes
                     WHERE tenant_id = 'tenant-0' AND principal_id = $1
                       AND operation = 'create-order'),
                    idempotency_key, $2, status_code,
                    response_body, order_id, created_at, replay_deadline
             FROM idempotency_cards
             WHERE tenant_id = 'tenant-0' AND principal_id = 'principal-0'
               AND idempotency_key ~ '^[0-9]+$'",
            &[&PGBENCH_PRINCIPAL, &&PGBENCH_FINGERPRINT[..]],
        )
        .await?;
    client
        .batch_execute("VACUUM ANALYZE idempotency_records")
        .await?;
    Ok(())
}

/// Checks that the records seeded in SQL are the records the Rust side would replay: for a few
/// `i`, the stored row exists under the Rust key and scope, and its fingerprint is the one
/// `tombstoned::fingerprint` computes from the Rust request body.
pub async fn verify(client: &Client, tag: &str, samples: &[i64], keys: Keys) -> Result<()> {
    let defaults = RequestDefaults {
        currency: tombstoned::money::Currency::parse("CNY")?,
    };
    for &i in samples {
        let record = Record::of(tag, i, keys);
        let order = parse_order(record.body().as_bytes(), &defaults)
            .map_err(|e| anyhow::anyhow!("the bench's request body is invalid: {e}"))?;
        let expected = Fingerprint::of(&order, API_VERSION)?;
        let (tenant, principal) = record.scope();
        let row = client
            .query_opt(
                "SELECT fingerprint, response_body->>'request_id' FROM idempotency_cards
                 WHERE tenant_id = $1 AND principal_id = $2 AND operation = 'create-order'
                   AND idempotency_key = $3",
                &[&tenant, &principal, &record.key],
            )
            .await?
            .with_context(|| format!("seeded record {tag}/{i} not found under its Rust key"))?;
        let stored: Vec<u8> = row.get(0);
        ensure!(
            stored == expected.as_bytes(),
            "seeded record {tag}/{i}: SQL and Rust fingerprints differ"
        );
        let request_id: Option<String> = row.get(1);
        if let Some(request_id) = request_id {
            ensure!(
                request_id == record.request_id,
                "record {tag}/{i}: request_id differs"
            );
        }
    }
    Ok(())
}
