//! Helpers for the cleanup and scheduler tests: seeding records with plain SQL, table checksums,
//! replay-reader sessions that hold row locks, and barriers on `pg_stat_activity`.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, CleanupError, LeasedRun, RunLimits, RunReport};
use tombstoned::config::Config;
use tombstoned::metrics::Metrics;

/// Deadlines of due rows start here (fixed, so two databases seeded alike are byte-identical).
pub const DUE: &str = "2020-01-01T00:00:00Z";
/// Deadlines of rows that are not due start here.
pub const NOT_DUE: &str = "2999-01-01T00:00:00Z";

/// How long a barrier waits before failing the test.
pub const BARRIER: Duration = Duration::from_secs(20);

/// The seeds' order body of row `i` (of tag `p.tag`), ~400 bytes.
const SEED_BODY: &str = "jsonb_build_object(
                        'order_id', md5('order' || p.tag || i)::uuid,
                        'status', 'created',
                        'amount_minor', 1000 + i,
                        'currency', 'CNY',
                        'item', 'sku-' || (i % 97),
                        'quantity', 1 + i % 5,
                        'recipient', 'recipient-' || md5('r' || i),
                        'request_id', md5('q' || p.tag || i),
                        'created_at', '2019-12-31T00:00:00Z',
                        'links', jsonb_build_object('self', '/v1/orders/' || md5('order' || p.tag || i)::uuid),
                        'note', repeat('x', 60))";

/// The rest of a seed row after its scope: key, fingerprint, status, body, order id, created
/// and deadline.
const SEED_LIVE_ROWS: &str = "substr(md5(p.tag || i), 1, 16) || '-' || p.tag || '-' || i,
                    sha256((p.tag || i)::bytea), 201, {body},
                    md5('order' || p.tag || i)::uuid,
                    p.first - interval '1 day',
                    p.first + i * interval '1 ms'
             FROM generate_series(1, $3::bigint) AS i,
                  (SELECT $1::text AS tag, $2::text::timestamptz AS first) AS p";

/// Inserts `count` live records with ~400-byte order bodies. Row `i` (1-based) has deadline
/// `first_deadline + i ms`; its key starts with an md5 so key order differs from deadline order.
/// Tenants `tenant-0..2`, principals `principal-0..4`, operation `create-order`.
pub async fn seed_live(client: &Client, tag: &str, count: i64, first_deadline: &str) {
    seed_scopes(client).await;
    let rows = SEED_LIVE_ROWS.replace("{body}", SEED_BODY);
    client
        .execute(
            &format!(
                "INSERT INTO idempotency_records (scope_id, idempotency_key,
                     fingerprint, status_code, response_body, order_id, created_at,
                     replay_deadline)
                 SELECT (SELECT s.scope_id FROM idempotency_scopes s
                         WHERE s.tenant_id = 'tenant-' || (i % 3)
                           AND s.principal_id = 'principal-' || (i % 5)
                           AND s.operation = 'create-order'),
                        {rows}"
            ),
            &[&tag, &first_deadline, &count],
        )
        .await
        .expect("seed live records");
}

/// [`seed_live`] on a schema before V5 (the scope in three text columns), for upgrade tests.
pub async fn seed_live_before_v5(client: &Client, tag: &str, count: i64, first_deadline: &str) {
    let rows = SEED_LIVE_ROWS.replace("{body}", SEED_BODY);
    client
        .execute(
            &format!(
                "INSERT INTO idempotency_records (tenant_id, principal_id, operation,
                     idempotency_key, fingerprint, status_code, response_body, order_id,
                     created_at, replay_deadline)
                 SELECT 'tenant-' || (i % 3), 'principal-' || (i % 5), 'create-order',
                        {rows}"
            ),
            &[&tag, &first_deadline, &count],
        )
        .await
        .expect("seed live records");
}

/// Inserts `count` tombstones that expired at `expired_at` (deadlines long past).
pub async fn seed_tombstones(client: &Client, tag: &str, count: i64, expired_at: &str) {
    seed_scopes(client).await;
    client
        .execute(
            "INSERT INTO idempotency_records (scope_id, idempotency_key,
                 fingerprint, status_code, response_body, order_id, created_at, replay_deadline,
                 expired, expired_at)
             SELECT (SELECT s.scope_id FROM idempotency_scopes s
                     WHERE s.tenant_id = 'tenant-' || (i % 3)
                       AND s.principal_id = 'principal-' || (i % 5)
                       AND s.operation = 'create-order'),
                    substr(md5(p.tag || i), 1, 16) || '-' || p.tag || '-' || i,
                    sha256((p.tag || i)::bytea), 201, NULL, md5('order' || p.tag || i)::uuid,
                    '2010-01-01T00:00:00Z'::timestamptz,
                    '2010-01-02T00:00:00Z'::timestamptz + i * interval '1 ms',
                    true, p.expired_at
             FROM generate_series(1, $3::bigint) AS i,
                  (SELECT $1::text AS tag, $2::text::timestamptz AS expired_at) AS p",
            &[&tag, &expired_at, &count],
        )
        .await
        .expect("seed tombstones");
}

/// The seeds' scopes (`tenant-0..2` x `principal-0..4`, `create-order`), in a fixed order so two
/// databases seeded alike number them alike. Idempotent.
pub async fn seed_scopes(client: &Client) {
    client
        .execute(
            "INSERT INTO idempotency_scopes (tenant_id, principal_id, operation)
             SELECT 'tenant-' || t, 'principal-' || p, 'create-order'
             FROM generate_series(0, 2) AS t, generate_series(0, 4) AS p
             ORDER BY t, p
             ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING",
            &[],
        )
        .await
        .expect("seed scopes");
}

/// `idempotency_records.scope_id` of the scope `$1` tenant, `$2` principal, `$3` operation (V5):
/// a scalar subquery for tests' own statements.
pub const SCOPE_ID: &str = "(SELECT scope_id FROM idempotency_scopes
     WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3)";

/// The primary key of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pk {
    pub tenant_id: String,
    pub principal_id: String,
    pub operation: String,
    pub idempotency_key: String,
}

/// The primary key of the `n`-th (0-based) live record by deadline.
pub async fn nth_live(client: &Client, n: i64) -> Pk {
    let row = client
        .query_one(
            "SELECT tenant_id, principal_id, operation, idempotency_key FROM idempotency_cards
             WHERE NOT expired ORDER BY replay_deadline OFFSET $1 LIMIT 1",
            &[&n],
        )
        .await
        .expect("nth live record");
    Pk {
        tenant_id: row.get(0),
        principal_id: row.get(1),
        operation: row.get(2),
        idempotency_key: row.get(3),
    }
}

/// A record's full row as text (every column), or `None` when it does not exist.
pub async fn row_text(client: &Client, pk: &Pk) -> Option<String> {
    client
        .query_opt(
            &format!(
                "SELECT t::text FROM idempotency_records t
                 WHERE scope_id = {SCOPE_ID} AND idempotency_key = $4"
            ),
            &[
                &pk.tenant_id,
                &pk.principal_id,
                &pk.operation,
                &pk.idempotency_key,
            ],
        )
        .await
        .expect("read record")
        .map(|r| r.get(0))
}

/// Whether a record is a tombstone.
pub async fn is_tombstone(client: &Client, pk: &Pk) -> bool {
    client
        .query_one(
            &format!(
                "SELECT expired FROM idempotency_records
                 WHERE scope_id = {SCOPE_ID} AND idempotency_key = $4"
            ),
            &[
                &pk.tenant_id,
                &pk.principal_id,
                &pk.operation,
                &pk.idempotency_key,
            ],
        )
        .await
        .expect("read record")
        .get(0)
}

/// md5 over every byte of every row, in the order of the rows' text (any schema version's layout).
pub async fn checksum(client: &Client) -> String {
    client
        .query_one(
            "SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), 'empty')
             FROM idempotency_records t",
            &[],
        )
        .await
        .expect("checksum")
        .get(0)
}

/// md5 over every row with `expired_at` reduced to whether it is set (cleaners stamp the time).
pub async fn checksum_without_expiry_time(client: &Client) -> String {
    client
        .query_one(
            "SELECT coalesce(md5(string_agg(concat_ws('|', tenant_id, principal_id, operation,
                 idempotency_key, encode(fingerprint, 'hex'), status_code, response_body::text,
                 order_id, expired, created_at, replay_deadline, expired_at IS NOT NULL),
                 ',' ORDER BY tenant_id, principal_id, operation, idempotency_key)), 'empty')
             FROM idempotency_cards",
            &[],
        )
        .await
        .expect("checksum")
        .get(0)
}

/// `(tombstones, live records)`.
pub async fn counts(client: &Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE expired), count(*) FILTER (WHERE NOT expired)
             FROM idempotency_records",
            &[],
        )
        .await
        .expect("count records");
    (row.get(0), row.get(1))
}

/// A replay reader: a session inside an open transaction holding a row lock (`FOR SHARE` or
/// `FOR KEY SHARE`) on one record, as the claim/replay path does.
pub struct Reader {
    pub client: Client,
    pub pid: i32,
}

impl Reader {
    /// Opens a session, begins, locks `pk` with `lock` (`"FOR SHARE"` / `"FOR KEY SHARE"`) and
    /// returns with the transaction open. The body read under the lock is returned too.
    pub async fn lock(db: &crate::harness::TestDb, pk: &Pk, lock: &str) -> (Self, Option<String>) {
        let client = db.client().await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        client.batch_execute("BEGIN").await.unwrap();
        let body: Option<String> = client
            .query_one(
                &format!(
                    "SELECT response_body::text FROM idempotency_records
                     WHERE scope_id = {SCOPE_ID} AND idempotency_key = $4
                     {lock}"
                ),
                &[
                    &pk.tenant_id,
                    &pk.principal_id,
                    &pk.operation,
                    &pk.idempotency_key,
                ],
            )
            .await
            .unwrap()
            .get(0);
        (Self { client, pid }, body)
    }

    /// Commits, releasing the lock.
    pub async fn commit(self) {
        self.client.batch_execute("COMMIT").await.unwrap();
    }
}

/// Waits until `count` sessions of `application_name`, in the observer's database (tests run
/// in parallel on one server), wait on a heavyweight lock at the same time.
pub async fn wait_until_sessions_wait(observer: &Client, application_name: &str, count: i64) {
    let deadline = Instant::now() + BARRIER;
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND datname = current_database()
                   AND wait_event_type = 'Lock'",
                &[&application_name],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{count} sessions of {application_name} never waited on a lock together"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the cleaner's batch session (in the observer's database) waits on a row lock.
pub async fn wait_until_cleaner_waits(observer: &Client) {
    wait_until_sessions_wait(observer, "tombstoned/cleanup", 1).await;
}

/// md5 over the rows whose key carries `tag` (see [`seed_live`]).
pub async fn checksum_of(client: &Client, tag: &str) -> String {
    client
        .query_one(
            "SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), 'empty')
             FROM idempotency_records t
             WHERE idempotency_key LIKE '%-' || $1::text || '-%'",
            &[&tag],
        )
        .await
        .expect("checksum")
        .get(0)
}

/// Waits until no session of `application_name` is connected to this database any more.
pub async fn wait_until_gone(observer: &Client, application_name: &str) {
    let deadline = Instant::now() + BARRIER;
    loop {
        let left: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = $1 AND datname = current_database()",
                &[&application_name],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{application_name} sessions still connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sessions of `application_name` connected to this database.
pub async fn sessions(observer: &Client, application_name: &str) -> i64 {
    observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND datname = current_database()",
            &[&application_name],
        )
        .await
        .unwrap()
        .get(0)
}

/// One run with the configuration's settings, no metrics, no limits.
pub async fn run(config: &Config) -> RunReport {
    run_with(config, RunLimits::default(), &CancellationToken::new()).await
}

/// One run with limits and a shutdown token.
pub async fn run_with(
    config: &Config,
    limits: RunLimits,
    shutdown: &CancellationToken,
) -> RunReport {
    cleanup::run_once(
        &config.database,
        &config.cleanup,
        &config.retention,
        limits,
        shutdown,
        None,
    )
    .await
    .expect("cleanup run")
}

/// One run behind the cleanup lease, as a one-shot `tombstoned cleanup` makes it: the
/// configuration's settings, no limits, no shutdown.
pub async fn leased_run(
    config: &Config,
    metrics: Option<&Metrics>,
) -> Result<LeasedRun, CleanupError> {
    cleanup::run_leased(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        &CancellationToken::new(),
        metrics,
    )
    .await
}

/// A [`leased_run`] that must take the free lease and succeed: its report.
pub async fn leased_report(config: &Config) -> RunReport {
    match leased_run(config, None).await {
        Ok(LeasedRun::Ran(report)) => report,
        Ok(other) => panic!("the lease is free, yet: {other:?}"),
        Err(e) => panic!("cleanup run: {}", e.summary()),
    }
}

/// The schema the harness migrates (and every test config names).
pub const SCHEMA: &str = "tombstoned";

/// The cleanup lease row as it stands (`None`: never taken).
pub async fn lease_state(observer: &Client) -> Option<cleanup::LeaseState> {
    cleanup::LeaseState::read(&tombstoned::db::Conn::dedicated(
        observer,
        SCHEMA,
        tombstoned::db::Pooler::None,
    ))
    .await
    .unwrap()
}

/// Asserts that nobody holds the cleanup lease now (released, or never taken).
pub async fn assert_lease_free(observer: &Client) {
    if let Some(state) = lease_state(observer).await {
        assert!(!state.held, "the cleanup lease is still held: {state:?}");
    }
}

/// Ends whatever lease is in the row now, as its expiry passing would (a crashed holder's lease
/// expires after `lease_ttl`, minutes a test does not wait).
pub async fn expire_lease(observer: &Client) {
    observer
        .execute(
            "UPDATE tombstoned.cleanup_lease SET expires_at = now() WHERE name = 'cleanup'",
            &[],
        )
        .await
        .unwrap();
}

/// Takes the cleanup lease for a foreign holder (as another instance would), on `client`.
pub async fn take_lease(client: &Client, config: &Config, holder: &str) -> cleanup::Lease {
    cleanup::Lease::try_acquire(
        &tombstoned::db::Conn::dedicated(client, SCHEMA, tombstoned::db::Pooler::None),
        &config.cleanup,
        holder,
    )
    .await
    .unwrap()
    .expect("the lease was free")
}
