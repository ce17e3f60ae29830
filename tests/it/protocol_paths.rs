//! One protocol suite, two implementations (issue 23). The endpoint keeps its fused statement
//! (BENCHMARKS.md, scenario 8: the SQL API path costs more than the 10 % issue 23 allows), so
//! every case of the protocol's experiment (docs/protocol.md, "What the original experiment
//! proved") runs against both, with the same records, the same barriers and the same answers:
//!
//! - **fused**: `tombstoned::claim::claim`, exactly what `POST /v1/orders` runs;
//! - **functions**: the SQL API in the caller's transaction — `claim`, the order and its event,
//!   `complete`, COMMIT — as any other service writes it;
//! - **fused in its function**: `tombstoned::claim::claim` with `database.pooler =
//!   "transaction"`, what `POST /v1/orders` runs behind a transaction pooler: every statement
//!   unnamed, and the fused statement run by its function (`endpoint_claim_order`, V6).
//!
//! All use the endpoint's scope (`create-order`) and fingerprint, so a record one path wrote is
//! answered by the other: the cross-path case checks that, byte for byte.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tombstoned::claim::{
    self, ClaimOutcome, ClaimRequest, ClaimSettings, Decision, OPERATION_CREATE_ORDER,
};
use tombstoned::config::Config;
use tombstoned::db::Pool;
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::OrderRequest;
use uuid::Uuid;

use crate::cleanup_support::run;
use crate::harness::{wait_until_app_lock_wait, TestDb};

const TENANT: &str = "acme";
const PRINCIPAL: &str = "alice";
const API_VERSION: &str = "2024-06-01";
const PATIENCE: Duration = Duration::from_secs(30);
/// Long enough for any wait the cases end on purpose, short enough for the 55P03 case.
const WAIT: Duration = Duration::from_secs(20);
const SHORT_WAIT: Duration = Duration::from_millis(200);

/// The two implementations, the endpoint's in both of its shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Fused,
    Functions,
    FusedInFunction,
}

const PATHS: [Path; 3] = [Path::Fused, Path::Functions, Path::FusedInFunction];

/// What either path answered, in the protocol's words.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Created(String),
    Replayed(String),
    KeyReused,
    /// With the business object the key produced.
    Expired(Option<String>),
    InProgress,
    /// The request's business id already has an order (23505): nothing of this key recorded.
    DuplicateRequest,
}

/// A test database with a pool for the fused path, one configured for a transaction pooler
/// (the fused statement in its function), and a session for the functions path.
struct Ctx {
    db: TestDb,
    config: Config,
    pool: Pool,
    in_function: (Config, Pool),
    session: Client,
    admin: Client,
}

impl Ctx {
    /// Orders in the database.
    async fn orders(&self) -> i64 {
        self.admin
            .query_one("SELECT count(*) FROM orders", &[])
            .await
            .unwrap()
            .get(0)
    }

    async fn new() -> Ctx {
        let db = TestDb::new().await;
        let config = db.config();
        let pool = tombstoned::db::pool(&config.database, "api", 4, Duration::from_secs(10))
            .expect("pool");
        let pooled = db.config_with(&[("TOMBSTONED_DATABASE__POOLER", "transaction")]);
        let pooled_pool = tombstoned::db::pool(&pooled.database, "api", 4, Duration::from_secs(10))
            .expect("pool");
        let session = db.client().await;
        let admin = db.client().await;
        Ctx {
            db,
            config,
            pool,
            in_function: (pooled, pooled_pool),
            session,
            admin,
        }
    }
}

fn order(request_id: &str, amount_minor: i64) -> OrderRequest {
    OrderRequest {
        request_id: request_id.to_owned(),
        amount_minor,
        currency: Currency::parse("CNY").unwrap(),
        item: "book".to_owned(),
        quantity: 1,
        recipient: "Li Wei".to_owned(),
        metadata: None,
    }
}

/// One request on `path`.
async fn attempt(
    ctx: &Ctx,
    path: Path,
    key: &str,
    order: &OrderRequest,
    lock_timeout: Duration,
) -> Answer {
    let fingerprint = Fingerprint::of(order, API_VERSION).unwrap();
    match path {
        Path::Fused => {
            fused(
                &ctx.pool,
                &ctx.config,
                key,
                order,
                fingerprint,
                lock_timeout,
            )
            .await
        }
        Path::Functions => functions(&ctx.session, key, order, fingerprint, lock_timeout).await,
        Path::FusedInFunction => {
            let (config, pool) = &ctx.in_function;
            fused(pool, config, key, order, fingerprint, lock_timeout).await
        }
    }
}

async fn fused(
    pool: &Pool,
    config: &Config,
    key: &str,
    order: &OrderRequest,
    fingerprint: Fingerprint,
    lock_timeout: Duration,
) -> Answer {
    let settings = ClaimSettings {
        lock_timeout,
        replay_window: Duration::from_secs(3600),
    };
    let request = ClaimRequest {
        tenant: TENANT.to_owned(),
        principal: PRINCIPAL.to_owned(),
        key: key.to_owned(),
        fingerprint,
        order: order.clone(),
        decision: Decision::Create,
    };
    match claim::claim(pool, &config.database, &settings, &request)
        .await
        .unwrap()
    {
        ClaimOutcome::Created { body, .. } => Answer::Created(body),
        ClaimOutcome::Replayed { body, .. } => Answer::Replayed(body),
        ClaimOutcome::KeyReused => Answer::KeyReused,
        ClaimOutcome::Expired { order_id } => Answer::Expired(order_id.map(|o| o.to_string())),
        ClaimOutcome::InProgress => Answer::InProgress,
        ClaimOutcome::DuplicateRequestSameOrder { .. } | ClaimOutcome::DuplicateRequestConflict => {
            Answer::DuplicateRequest
        }
        other @ ClaimOutcome::Rejected { .. } => panic!("no rejection asked for: {other:?}"),
    }
}

/// The owner's transaction as a service writes it against the SQL API.
async fn functions(
    session: &Client,
    key: &str,
    order: &OrderRequest,
    fingerprint: Fingerprint,
    lock_timeout: Duration,
) -> Answer {
    let fp = fingerprint.as_bytes().to_vec();
    let wait = format!("{} ms", lock_timeout.as_millis());
    session.batch_execute("BEGIN").await.unwrap();
    let claimed = session
        .query_one(
            "SELECT outcome, response_body, resource_id
             FROM claim($1, $2, $3, $4, $5, '1 hour', $6::text::interval)",
            &[
                &TENANT,
                &PRINCIPAL,
                &OPERATION_CREATE_ORDER,
                &key,
                &fp,
                &wait,
            ],
        )
        .await;
    let row = match claimed {
        Ok(row) => row,
        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            session.batch_execute("ROLLBACK").await.unwrap();
            return Answer::InProgress;
        }
        Err(e) => panic!("claim: {e:?}"),
    };
    let outcome: String = row.get(0);
    let answer = match outcome.as_str() {
        "owner" => {
            let order_id = Uuid::now_v7();
            let created = session
                .execute(
                    "INSERT INTO orders (order_id, tenant_id, principal_id, request_id,
                                         amount_minor, currency, item, quantity, recipient)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[
                        &order_id,
                        &TENANT,
                        &PRINCIPAL,
                        &order.request_id,
                        &order.amount_minor,
                        &order.currency.code(),
                        &order.item,
                        &order.quantity,
                        &order.recipient,
                    ],
                )
                .await;
            match created {
                Ok(_) => {}
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                    session.batch_execute("ROLLBACK").await.unwrap();
                    return Answer::DuplicateRequest;
                }
                Err(e) => panic!("order: {e:?}"),
            }
            let body = serde_json::json!({
                "order_id": order_id,
                "request_id": order.request_id,
                "amount_minor": order.amount_minor,
                "status": "created",
            });
            session
                .execute(
                    "INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)
                     VALUES ($1, $2, $3, 'order.created', jsonb_build_object('order', $4::jsonb))",
                    &[&Uuid::now_v7(), &TENANT, &order_id, &body],
                )
                .await
                .unwrap();
            let text: String = session
                .query_one(
                    "SELECT complete($1, $2, $3, $4, 201, $5, $6)",
                    &[
                        &TENANT,
                        &PRINCIPAL,
                        &OPERATION_CREATE_ORDER,
                        &key,
                        &body,
                        &order_id.to_string(),
                    ],
                )
                .await
                .unwrap()
                .get(0);
            Answer::Created(text)
        }
        "replay" => Answer::Replayed(row.get(1)),
        "key_reused" => Answer::KeyReused,
        "expired" => Answer::Expired(row.get(2)),
        other => panic!("unknown outcome {other}"),
    };
    session.batch_execute("COMMIT").await.unwrap();
    answer
}

/// A transaction of the test's that owns `key` (as any owner does: the record inserted with its
/// answer, not yet committed), for the races.
async fn hold_key(ctx: &Ctx, key: &str, order: &OrderRequest) -> (Client, String) {
    let holder = ctx.db.client().await;
    let fp = Fingerprint::of(order, API_VERSION)
        .unwrap()
        .as_bytes()
        .to_vec();
    let body = format!(r#"{{"held": "{key}"}}"#);
    // The scope committed first (V5): only the record is held.
    holder
        .execute(
            "SELECT ensure_scope($1, $2, $3)",
            &[&TENANT, &PRINCIPAL, &OPERATION_CREATE_ORDER],
        )
        .await
        .unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "INSERT INTO idempotency_records (scope_id,
                 idempotency_key, fingerprint, status_code, response_body, order_id,
                 replay_deadline)
             VALUES (ensure_scope($1, $2, $3), $4, $5, 201, $6::text::jsonb, NULL,
                     now() + interval '1 hour')",
            &[
                &TENANT,
                &PRINCIPAL,
                &OPERATION_CREATE_ORDER,
                &key,
                &fp,
                &body,
            ],
        )
        .await
        .unwrap();
    let stored: String = holder
        .query_one(
            "SELECT response_body::text FROM idempotency_records WHERE idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    (holder, stored)
}

/// Lost response and retry: the stored answer, byte for byte; another intent: key reuse.
#[tokio::test]
async fn both_paths_replay_byte_for_byte_and_refuse_reuse() {
    for path in PATHS {
        let ctx = Ctx::new().await;
        let intent = order("req-1", 100);
        let Answer::Created(first) = attempt(&ctx, path, "k", &intent, WAIT).await else {
            panic!("{path:?}: not created")
        };
        assert_eq!(
            attempt(&ctx, path, "k", &intent, WAIT).await,
            Answer::Replayed(first.clone()),
            "{path:?}"
        );
        assert_eq!(
            attempt(&ctx, path, "k", &order("req-1", 200), WAIT).await,
            Answer::KeyReused,
            "{path:?}"
        );
        let orders = ctx.orders().await;
        assert_eq!(orders, 1, "{path:?}: one order for the key");
    }
}

/// Commit race: the waiting request replays what the owner committed. Rollback race: it becomes
/// the owner. Lock-timeout race: 55P03 (in progress), then the retry replays.
#[tokio::test]
async fn both_paths_wait_for_an_in_flight_owner_and_answer_its_outcome() {
    for path in PATHS {
        let ctx = Ctx::new().await;
        let intent = order("req-race", 100);
        for owner_ends in ["COMMIT", "ROLLBACK"] {
            let key = format!("race-{owner_ends}");
            let (holder, stored) = hold_key(&ctx, &key, &intent).await;
            let (answer, ()) = tokio::join!(attempt(&ctx, path, &key, &intent, WAIT), async {
                wait_until_app_lock_wait(&ctx.admin, "", PATIENCE).await;
                holder.batch_execute(owner_ends).await.unwrap();
            });
            match owner_ends {
                "COMMIT" => assert_eq!(answer, Answer::Replayed(stored), "{path:?}"),
                _ => assert!(matches!(answer, Answer::Created(_)), "{path:?}: {answer:?}"),
            }
        }
        let (holder, stored) = hold_key(&ctx, "held", &order("req-held", 1)).await;
        assert_eq!(
            attempt(&ctx, path, "held", &order("req-held", 1), SHORT_WAIT).await,
            Answer::InProgress,
            "{path:?}"
        );
        holder.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            attempt(&ctx, path, "held", &order("req-held", 1), WAIT).await,
            Answer::Replayed(stored),
            "{path:?}: the retry with the same key"
        );
    }
}

/// After the window: 'expired' with the order, before and after the real cleaner made the
/// tombstone, never a re-execution; another intent stays refused.
#[tokio::test]
async fn both_paths_answer_expired_with_the_order_and_never_execute_again() {
    for path in PATHS {
        let ctx = Ctx::new().await;
        let intent = order("req-old", 100);
        assert!(matches!(
            attempt(&ctx, path, "old", &intent, WAIT).await,
            Answer::Created(_)
        ));
        let order_id: Uuid = ctx
            .admin
            .query_one("SELECT order_id FROM orders", &[])
            .await
            .unwrap()
            .get(0);
        ctx.admin
            .batch_execute(
                "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'",
            )
            .await
            .unwrap();
        let expected = Answer::Expired(Some(order_id.to_string()));
        assert_eq!(attempt(&ctx, path, "old", &intent, WAIT).await, expected);
        assert_eq!(run(&ctx.config).await.rows_tombstoned, 1);
        assert_eq!(attempt(&ctx, path, "old", &intent, WAIT).await, expected);
        assert_eq!(
            attempt(&ctx, path, "old", &order("req-old", 5), WAIT).await,
            Answer::KeyReused
        );
        let orders = ctx.orders().await;
        assert_eq!(orders, 1, "{path:?}: never executed again");
    }
}

/// A new key for a business id that already has an order: the whole transaction rolls back
/// (23505 on the order's unique constraint), so the new key is not recorded.
#[tokio::test]
async fn both_paths_leave_nothing_of_a_key_whose_business_id_exists() {
    for path in PATHS {
        let ctx = Ctx::new().await;
        assert!(matches!(
            attempt(&ctx, path, "first", &order("req-dup", 100), WAIT).await,
            Answer::Created(_)
        ));
        assert_eq!(
            attempt(&ctx, path, "second", &order("req-dup", 300), WAIT).await,
            Answer::DuplicateRequest,
            "{path:?}"
        );
        let row = ctx
            .admin
            .query_one(
                "SELECT (SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'second'),
                        (SELECT count(*) FROM orders), (SELECT count(*) FROM outbox_events)",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, i64>(2)
            ),
            (0, 1, 1),
            "{path:?}"
        );
    }
}

/// A record one path wrote is answered by the other, byte for byte: one protocol, one table.
#[tokio::test]
async fn a_record_written_by_one_path_is_replayed_identically_by_the_other() {
    for (writer, reader) in [
        (Path::Fused, Path::Functions),
        (Path::Functions, Path::Fused),
        (Path::FusedInFunction, Path::Functions),
        (Path::Functions, Path::FusedInFunction),
        (Path::Fused, Path::FusedInFunction),
    ] {
        let ctx = Ctx::new().await;
        let intent = order("req-x", 100);
        let Answer::Created(first) = attempt(&ctx, writer, "x", &intent, WAIT).await else {
            panic!("{writer:?}: not created")
        };
        assert_eq!(
            attempt(&ctx, reader, "x", &intent, WAIT).await,
            Answer::Replayed(first),
            "written by {writer:?}, read by {reader:?}"
        );
        assert_eq!(
            attempt(&ctx, reader, "x", &order("req-x", 1), WAIT).await,
            Answer::KeyReused
        );
    }
}
