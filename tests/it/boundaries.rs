//! Service boundaries in the SQL API (issue 36), with real roles on a real PostgreSQL: two
//! service roles with the documented grants, each granted its own operation through
//! `tombstoned operations grant`, each confined to it — refused (42501, nothing written, nothing
//! revealed) on the other's operation, on `create-order`, on every internal and endpoint
//! function and on every table; directly, through PgBouncer in transaction mode and after SET
//! ROLE. Then revoke on an open pooled connection, the command's refusals and audit, events
//! that name their sender inside the signed webhook body, and the transitional grants `status`
//! and `check-config` report.

use std::collections::BTreeMap;

use tokio_postgres::Client;

use crate::harness::TestDb;
use crate::operations_support::{
    claim_sql, complete_sql, connect, create, grant, literal, lookup_sql, message, must,
    operations_cli, service_role, session_as, sqlstate, value,
};
use crate::pooler_support::{PgBouncer, PoolMode};

/// The two services' operations.
const OP_A: &str = "create-payment";
const OP_B: &str = "create-refund";
/// The SQL API: what the documented grants are for.
const API: &[&str] = &[
    "api_version",
    "claim",
    "complete",
    "enqueue_event",
    "fingerprint",
    "lookup",
];

/// Every table's content, by name (a digest of its rows): what "nothing written" compares.
async fn snapshot(admin: &Client) -> BTreeMap<String, String> {
    let tables: Vec<String> = admin
        .query(
            "SELECT c.relname::text FROM pg_class c
             WHERE c.relnamespace = 'tombstoned'::regnamespace AND c.relkind IN ('r', 'p')
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = BTreeMap::new();
    for table in tables {
        let digest: String = admin
            .query_one(
                &format!(
                    "SELECT count(*) || ':' || coalesce(md5(string_agg(t::text, ',' \
                     ORDER BY t::text)), '') FROM tombstoned.{table} AS t"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        out.insert(table, digest);
    }
    out
}

/// `sql` fails on `client` with 42501 (or `expected`); its message.
async fn refused_with(client: &Client, sql: &str, expected: &str, label: &str) -> String {
    match value(client, sql).await {
        Ok(v) => panic!("{label}: {sql} was not refused: {v:?}"),
        Err(e) => {
            assert_eq!(sqlstate(&e), expected, "{label}: {sql}: {e:?}");
            message(&e)
        }
    }
}

/// The one function outside the API a service role may call, and why (docs/api.md, "Why the
/// internals refuse on their own"): the replay window's rule compares its two arguments, reads
/// nothing and writes nothing, and must stay inlinable into the endpoint's statements.
const PURE: &[&str] = &["replay_window_open"];

/// Every function of the schema but the API's and [`PURE`]'s, each called with NULL arguments of
/// its types, and whether it is a trigger function (which PostgreSQL refuses to call directly).
async fn internal_calls(admin: &Client) -> Vec<(String, bool)> {
    admin
        .query(
            "SELECT format('SELECT tombstoned.%I(%s)', p.proname,
                           coalesce((SELECT string_agg('NULL::' || format_type(t, NULL), ', '
                                                       ORDER BY o)
                                     FROM unnest(p.proargtypes) WITH ORDINALITY AS a(t, o)),
                                    '')),
                    p.prorettype = 'trigger'::regtype
             FROM pg_proc p
             WHERE p.pronamespace = 'tombstoned'::regnamespace
               AND p.proname <> ALL ($1) AND p.proname <> ALL ($2)
             ORDER BY p.proname",
            &[&API, &PURE],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Every statement a role could try on the schema's relations: each table read, written,
/// emptied; each view read; each sequence advanced.
async fn relation_statements(admin: &Client) -> Vec<String> {
    let rows = admin
        .query(
            "SELECT c.relname::text, c.relkind::text,
                    (SELECT a.attname::text FROM pg_attribute a
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                       AND a.attidentity = '' AND a.attgenerated = ''
                     ORDER BY a.attnum LIMIT 1)
             FROM pg_class c
             WHERE c.relnamespace = 'tombstoned'::regnamespace
               AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let mut statements = Vec::new();
    for row in rows {
        let (name, kind, column): (String, String, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let t = format!("tombstoned.{name}");
        match kind.as_str() {
            "S" => {
                statements.push(format!("SELECT nextval('{t}')"));
                statements.push(format!("SELECT last_value FROM {t}"));
            }
            "v" | "m" => statements.push(format!("SELECT * FROM {t} LIMIT 1")),
            _ => {
                let column = column.unwrap();
                statements.extend([
                    format!("SELECT * FROM {t} LIMIT 1"),
                    format!("INSERT INTO {t} DEFAULT VALUES"),
                    format!("UPDATE {t} SET {column} = {column}"),
                    format!("DELETE FROM {t}"),
                    format!("TRUNCATE {t}"),
                ]);
            }
        }
    }
    statements
}

/// The whole refusal: `client` (logged in as `login`) on another service's operation and key
/// (and on a key nobody used), on `create-order`, on every internal and endpoint function and on
/// every table: 42501 each time, the same message whether the key exists or not, and no table
/// changed by any of it.
async fn assert_confined(
    label: &str,
    admin: &Client,
    client: &Client,
    login: &str,
    foreign_operation: &str,
    foreign_key: &str,
) {
    let before = snapshot(admin).await;
    for operation in [foreign_operation, "create-order"] {
        let expected = format!("role \"{login}\" may not use operation \"{operation}\"");
        for key in [foreign_key, "a-key-nobody-used"] {
            // The foreign key's own intent (1) and another (2): no answer tells them apart.
            for n in [1, 2] {
                for sql in [
                    claim_sql(operation, key, n),
                    lookup_sql(operation, key, n),
                    complete_sql(operation, key),
                ] {
                    let said = refused_with(client, &sql, "42501", label).await;
                    assert_eq!(said, expected, "{label}: {sql}");
                }
            }
        }
        // Inside a transaction too, where the claim would have been the owner's first step.
        must(client, "BEGIN").await;
        refused_with(
            client,
            &claim_sql(operation, "in-a-transaction", 1),
            "42501",
            label,
        )
        .await;
        must(client, "ROLLBACK").await;
    }
    for (call, trigger) in internal_calls(admin).await {
        // A trigger function cannot be called at all (0A000); the others refuse the role.
        let expected = if trigger { "0A000" } else { "42501" };
        refused_with(client, &call, expected, label).await;
    }
    for statement in relation_statements(admin).await {
        refused_with(client, &statement, "42501", label).await;
    }
    // The pure function answers from its arguments alone, and only them.
    assert_eq!(
        value(
            client,
            "SELECT tombstoned.replay_window_open(now() + interval '1 second', now())::text"
        )
        .await
        .unwrap()
        .as_deref(),
        Some("true"),
        "{label}: replay_window_open"
    );
    assert_eq!(
        snapshot(admin).await,
        before,
        "{label}: something was written"
    );
}

/// Two services on one database, each with its operation granted through the command.
struct Services {
    db: TestDb,
    admin: Client,
    a: String,
    b: String,
}

impl Services {
    async fn start() -> Services {
        let db = TestDb::new().await;
        let admin = db.client().await;
        let (a, b) = (format!("svc_a_{}", db.name), format!("svc_b_{}", db.name));
        for (role, operation) in [(&a, OP_A), (&b, OP_B)] {
            service_role(&admin, role).await;
            let run = operations_cli(&db, &["grant", operation, role]).await;
            assert_eq!(run.code, Some(0), "{}", run.stderr);
            assert_eq!(
                run.stdout,
                format!("granted operation \"{operation}\" to role \"{role}\"\n")
            );
        }
        Services { db, admin, a, b }
    }
}

/// Each service completes its own flow — claim, event, complete, commit; the retry replays, a
/// lookup answers — and is refused everything else, directly and after SET ROLE.
#[tokio::test]
async fn each_service_reaches_only_its_own_operation() {
    let s = Services::start().await;
    let a = session_as(&s.db, &s.a).await;
    let b = session_as(&s.db, &s.b).await;
    for (client, operation) in [(&a, OP_A), (&b, OP_B)] {
        create(client, operation, "k-1").await;
        assert_eq!(
            must(client, &claim_sql(operation, "k-1", 1))
                .await
                .as_deref(),
            Some("replay")
        );
        assert_eq!(
            must(client, &lookup_sql(operation, "k-1", 1))
                .await
                .as_deref(),
            Some("replay")
        );
        assert_eq!(
            must(client, &claim_sql(operation, "k-1", 2))
                .await
                .as_deref(),
            Some("key_reused")
        );
    }
    // Both used the same tenant, principal and key: two records, one per operation.
    let records: i64 = s
        .admin
        .query_one(
            "SELECT count(*) FROM idempotency_cards WHERE idempotency_key = 'k-1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 2);

    assert_confined("b on a's", &s.admin, &b, &s.b, OP_A, "k-1").await;
    assert_confined("a on b's", &s.admin, &a, &s.a, OP_B, "k-1").await;

    // SET ROLE changes the role privileges are checked as, not the one logged in: b, acting as
    // a group role with the same documented grants, keeps its own operation and nothing else.
    let group = format!("grp_{}", s.db.name);
    s.admin
        .batch_execute(&format!(
            "CREATE ROLE {group} NOLOGIN; GRANT {group} TO {}; {}",
            s.b,
            crate::clients_support::documented_grants("tombstoned", &group)
        ))
        .await
        .unwrap();
    let b_as_group = session_as(&s.db, &s.b).await;
    must(&b_as_group, &format!("SET ROLE {group}")).await;
    create(&b_as_group, OP_B, "k-set-role").await;
    assert_confined("b after SET ROLE", &s.admin, &b_as_group, &s.b, OP_A, "k-1").await;
}

/// The same refusals through PgBouncer in transaction mode (two clients sharing one server
/// connection per role), where each statement may run on a server connection another client
/// used last.
#[tokio::test]
async fn the_boundary_holds_through_pgbouncer_in_transaction_mode() {
    let s = Services::start().await;
    let bouncer = PgBouncer::start_with_logins(PoolMode::Transaction, 1, &[&s.a, &s.b]).await;
    let through = |role: &str| {
        let url = bouncer.url_as(&s.db.name, role);
        async move { connect(&url.parse().unwrap()).await }
    };
    let (a, b) = (through(&s.a).await, through(&s.b).await);
    let b_again = through(&s.b).await;
    create(&a, OP_A, "k-pooled").await;
    create(&b, OP_B, "k-pooled").await;
    assert_eq!(
        must(&b_again, &lookup_sql(OP_B, "k-pooled", 1))
            .await
            .as_deref(),
        Some("replay")
    );
    assert_confined("b through PgBouncer", &s.admin, &b, &s.b, OP_A, "k-pooled").await;
    assert_confined("a through PgBouncer", &s.admin, &a, &s.a, OP_B, "k-pooled").await;
    // The client that shares b's server connection still works on b's own operation.
    assert_eq!(
        must(&b_again, &claim_sql(OP_B, "k-pooled", 1))
            .await
            .as_deref(),
        Some("replay")
    );
}

/// A login role that is a member of a granted role uses its operations; a superuser is refused
/// nothing; a role that holds no operation may not enqueue events, one that holds any may.
#[tokio::test]
async fn members_inherit_operations_and_events_need_one() {
    let s = Services::start().await;
    let member = format!("member_{}", s.db.name);
    s.admin
        .batch_execute(&format!("CREATE ROLE {member} LOGIN IN ROLE {}", s.a))
        .await
        .unwrap();
    let as_member = session_as(&s.db, &member).await;
    create(&as_member, OP_A, "k-member").await;
    refused_with(
        &as_member,
        &claim_sql(OP_B, "k-member", 1),
        "42501",
        "member",
    )
    .await;

    // The superuser (the harness's administrator) is bound by nothing, as everywhere.
    must(&s.admin, "BEGIN").await;
    for operation in [OP_A, OP_B, "create-order", "anything-else"] {
        assert_eq!(
            must(&s.admin, &claim_sql(operation, "k-admin", 1))
                .await
                .as_deref(),
            Some("owner")
        );
    }
    must(&s.admin, "ROLLBACK").await;

    let idle = format!("idle_{}", s.db.name);
    service_role(&s.admin, &idle).await;
    let as_idle = session_as(&s.db, &idle).await;
    let before = snapshot(&s.admin).await;
    let said = refused_with(
        &as_idle,
        "SELECT tombstoned.enqueue_event('acme', 'agg-1', 'thing.happened', '{}')",
        "42501",
        "no operation",
    )
    .await;
    assert_eq!(
        said,
        format!("role \"{idle}\" holds no operation: enqueue_event() is for a role granted one")
    );
    assert_eq!(snapshot(&s.admin).await, before);
    grant(&s.db, "something", &idle).await;
    let id = must(
        &as_idle,
        "SELECT tombstoned.enqueue_event('acme', 'agg-1', 'thing.happened', '{}')",
    )
    .await
    .unwrap();
    let sender = must(
        &s.admin,
        &format!(
            "SELECT sender FROM outbox_events WHERE event_id = {}",
            literal(&id)
        ),
    )
    .await;
    assert_eq!(sender.as_deref(), Some(idle.as_str()));
}

/// A revoke takes effect at the next transaction of a connection that is already open: a
/// direct session, a client of PgBouncer whose server connection was in use before, and a
/// connection a client-side pool (deadpool, one connection) hands out again.
#[tokio::test]
async fn a_revoke_takes_effect_at_the_next_transaction_of_open_pooled_connections() {
    let s = Services::start().await;
    let bouncer = PgBouncer::start_with_logins(PoolMode::Transaction, 1, &[&s.a]).await;
    let pooled = connect(&bouncer.url_as(&s.db.name, &s.a).parse().unwrap()).await;
    let direct = session_as(&s.db, &s.a).await;
    create(&pooled, OP_A, "k-pooled").await;
    create(&direct, OP_A, "k-direct").await;
    let client_pool = tombstoned::db::pool(
        &crate::harness::config_for(&crate::operations_support::url_as(&s.db, &s.a), &[]).database,
        "svc",
        1,
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    let first = client_pool.get().await.unwrap();
    create(&first, OP_A, "k-client-pool").await;
    let first_pid = must(&first, "SELECT pg_backend_pid()").await;
    drop(first);

    let run = operations_cli(&s.db, &["revoke", OP_A, &s.a]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!("revoked operation \"{OP_A}\" from role \"{}\"\n", s.a)
    );
    for (client, key) in [(&pooled, "k-pooled"), (&direct, "k-direct")] {
        for sql in [claim_sql(OP_A, key, 1), lookup_sql(OP_A, key, 1)] {
            refused_with(client, &sql, "42501", key).await;
        }
    }
    let again = client_pool.get().await.unwrap();
    assert_eq!(
        must(&again, "SELECT pg_backend_pid()").await,
        first_pid,
        "the pool's same connection"
    );
    refused_with(
        &again,
        &lookup_sql(OP_A, "k-client-pool", 1),
        "42501",
        "pool",
    )
    .await;
    drop(again);
    // Granted again: the next transaction may again.
    grant(&s.db, OP_A, &s.a).await;
    for (client, key) in [(&pooled, "k-pooled"), (&direct, "k-direct")] {
        assert_eq!(
            must(client, &lookup_sql(OP_A, key, 1)).await.as_deref(),
            Some("replay")
        );
    }
}

/// `tombstoned operations`: a role that does not exist, `create-order` without `--force`, `*`,
/// an empty operation, and a role that may not change the grants are each refused with exit 64
/// and one line saying why, changing nothing; `--force` grants `create-order` and the grant says
/// so; granting twice and revoking what is not held change nothing. `list` (and `--json`) shows
/// the grants in force and every change: who (the login role that ran it), when, what.
#[tokio::test]
async fn the_operations_command_refuses_what_it_must_and_records_every_change() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = format!("svc_{}", db.name);
    service_role(&admin, &svc).await;
    let missing = format!("nosuch_{}", db.name);
    let before = snapshot(&admin).await;
    let started: chrono::DateTime<chrono::Utc> =
        admin.query_one("SELECT now()", &[]).await.unwrap().get(0);
    for (args, says) in [
        (
            vec!["grant", OP_A, missing.as_str()],
            format!("role \"{missing}\" does not exist"),
        ),
        (
            vec!["revoke", OP_A, missing.as_str()],
            format!("role \"{missing}\" does not exist"),
        ),
        (
            vec!["grant", "create-order", svc.as_str()],
            "reserved to the daemon's role: a role granted it can claim keys in the endpoint's \
             scopes"
                .to_owned(),
        ),
        (
            vec!["grant", "*", svc.as_str()],
            "which only the upgrade to schema V8 gives".to_owned(),
        ),
        (
            vec!["grant", "", svc.as_str()],
            "an operation is a non-empty name".to_owned(),
        ),
    ] {
        let run = operations_cli(&db, &args).await;
        assert_eq!(run.code, Some(64), "{args:?}: {}", run.stderr);
        let line = run.error_line(64);
        assert!(line.contains(&says), "{args:?}: {line}");
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
    // The service itself may not grant itself anything.
    let as_service = crate::conn_support::run_binary(
        &["operations", "grant", OP_B, &svc],
        &crate::operations_support::url_as(&db, &svc),
        &[],
    )
    .await;
    assert_eq!(as_service.code, Some(64), "{}", as_service.stderr);
    assert!(
        as_service
            .error_line(64)
            .contains("may not change the operation grants"),
        "{}",
        as_service.stderr
    );
    assert_eq!(
        snapshot(&admin).await,
        before,
        "a refusal changed something"
    );

    // An operator that is not the owner, given the grants tables: its changes are its own.
    let operator = format!("operator_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {operator} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {operator};
             GRANT SELECT ON tombstoned.schema_history, tombstoned.operation_grant_changes
                 TO {operator};
             GRANT SELECT, INSERT, DELETE ON tombstoned.operation_grants TO {operator};"
        ))
        .await
        .unwrap();
    let by_operator = |args: &'static [&'static str]| {
        let url = crate::operations_support::url_as(&db, &operator);
        let svc = svc.clone();
        async move {
            let mut all = vec!["operations"];
            all.extend(
                args.iter()
                    .map(|a| if *a == "SVC" { svc.as_str() } else { a }),
            );
            crate::conn_support::run_binary(&all, &url, &[]).await
        }
    };
    for (args, out) in [
        (
            &["grant", OP_A, "SVC"][..],
            format!("granted operation \"{OP_A}\" to role \"{svc}\"\n"),
        ),
        (
            &["grant", OP_A, "SVC"],
            format!("role \"{svc}\" already holds operation \"{OP_A}\"; nothing changed\n"),
        ),
        (
            &["grant", "create-order", "SVC", "--force"],
            format!("granted operation \"create-order\" to role \"{svc}\"\n"),
        ),
        (
            &["revoke", OP_A, "SVC"],
            format!("revoked operation \"{OP_A}\" from role \"{svc}\"\n"),
        ),
        (
            &["revoke", OP_A, "SVC"],
            format!("role \"{svc}\" does not hold operation \"{OP_A}\"; nothing changed\n"),
        ),
    ] {
        let run = by_operator(args).await;
        assert_eq!(run.code, Some(0), "{args:?}: {}", run.stderr);
        assert_eq!(run.stdout, out, "{args:?}");
    }
    // Granted create-order by force, the service may claim in it.
    let session = session_as(&db, &svc).await;
    must(&session, "BEGIN").await;
    assert_eq!(
        must(&session, &claim_sql("create-order", "k-forced", 1))
            .await
            .as_deref(),
        Some("owner")
    );
    must(&session, "ROLLBACK").await;

    let admin_role: String = admin
        .query_one("SELECT session_user::text", &[])
        .await
        .unwrap()
        .get(0);
    let run = operations_cli(&db, &["list", "--json"]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let listing: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let grants: Vec<(String, String, bool, String)> = listing["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["operation"].as_str().unwrap().to_owned(),
                g["role"].as_str().unwrap().to_owned(),
                g["forced"].as_bool().unwrap(),
                g["granted_by"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        grants,
        [
            (
                "create-order".to_owned(),
                admin_role.clone(),
                false,
                admin_role.clone()
            ),
            (
                "create-order".to_owned(),
                svc.clone(),
                true,
                operator.clone()
            ),
        ]
    );
    let changes: Vec<(String, String, String, String, bool)> = listing["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["changed_by"].as_str().unwrap().to_owned(),
                c["action"].as_str().unwrap().to_owned(),
                c["operation"].as_str().unwrap().to_owned(),
                c["role"].as_str().unwrap().to_owned(),
                c["forced"].as_bool().unwrap(),
            )
        })
        .collect();
    let change = |by: &str, action: &str, operation: &str, role: &str, forced: bool| {
        (
            by.to_owned(),
            action.to_owned(),
            operation.to_owned(),
            role.to_owned(),
            forced,
        )
    };
    assert_eq!(
        changes,
        [
            // The migration's own grant (the template was migrated by the administrator).
            change(&admin_role, "grant", "create-order", &admin_role, false),
            change(&operator, "grant", OP_A, &svc, false),
            change(&operator, "grant", "create-order", &svc, true),
            change(&operator, "revoke", OP_A, &svc, false),
        ]
    );
    for c in listing["changes"].as_array().unwrap().iter().skip(1) {
        let at: chrono::DateTime<chrono::Utc> = c["changed_at"].as_str().unwrap().parse().unwrap();
        assert!(at >= started, "{c}");
    }
    // The same, for a person.
    let text = operations_cli(&db, &["list"]).await;
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    for needle in [
        "grants:",
        &format!("create-order  {svc}"),
        "changes, oldest first:",
        &format!("{operator}  revoke  {OP_A}"),
        &format!("{svc} (--force)"),
    ] {
        assert!(
            text.stdout.contains(needle),
            "{needle:?} in\n{}",
            text.stdout
        );
    }
}

/// A minimal webhook receiver: every request's headers and body, answered 204.
async fn capture() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, Vec<u8>)>>>,
) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let router = axum::Router::new().route(
        "/hooks",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let sink = sink.clone();
                async move {
                    sink.lock().unwrap().push((headers, body.to_vec()));
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (url, seen)
}

/// The webhook body of an event a service enqueued names that service; an order event names the
/// role of the daemon that created the order; both inside the signed body, so a receiver that
/// checks the signature can authorise by it (a body with another sender fails the check).
#[tokio::test]
async fn webhooks_name_their_sender_inside_the_signed_body() {
    use base64::Engine as _;
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = format!("svc_{}", db.name);
    service_role(&admin, &svc).await;
    grant(&db, OP_A, &svc).await;
    let service_event = create(&session_as(&db, &svc).await, OP_A, "k-event").await;

    let daemon_role = format!("daemon_{}", db.name);
    crate::operations_support::daemon_role(&admin, &daemon_role).await;
    let daemon = crate::daemon_support::Daemon::start(crate::daemon_support::Spec::new(
        &crate::operations_support::url_as(&db, &daemon_role),
    ))
    .await;
    let created = daemon
        .create_order(
            crate::daemon_support::ALICE,
            "k-order",
            &crate::api_support::order("req-order"),
        )
        .await;
    created.expect(201);
    let order_id = created.json()["order_id"].as_str().unwrap().to_owned();

    let (url, seen) = capture().await;
    let (_dir, secret) = crate::outbox_support::secret_file();
    let secret = secret.display().to_string();
    let run = crate::conn_support::run_binary(
        &["outbox", "deliver"],
        &db.url,
        &[
            ("TOMBSTONED_OUTBOX__ENDPOINT", url.as_str()),
            ("TOMBSTONED_OUTBOX__SECRET_FILE", secret.as_str()),
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let key = base64::engine::general_purpose::STANDARD
        .decode(
            crate::outbox_support::SECRET
                .strip_prefix("whsec_")
                .unwrap(),
        )
        .unwrap();
    let mut senders = BTreeMap::new();
    for (headers, body) in &seen {
        let id = crate::outbox_support::signature_ok(&key, headers, body)
            .expect("the relay's signature verifies");
        let event: serde_json::Value = serde_json::from_slice(body).unwrap();
        let sender = event["sender"].as_str().unwrap().to_owned();
        // The same body claiming another sender is not the relay's.
        let forged = String::from_utf8(body.clone()).unwrap().replace(
            &format!("\"sender\":\"{sender}\""),
            "\"sender\":\"somebody_else\"",
        );
        assert_ne!(forged.as_bytes(), body.as_slice());
        assert!(
            crate::outbox_support::signature_ok(&key, headers, forged.as_bytes()).is_none(),
            "the signature covers the sender"
        );
        senders.insert(id, (sender, event["order_id"].as_str().map(str::to_owned)));
    }
    assert_eq!(senders[&service_event], (svc.clone(), None));
    let order_event = senders
        .iter()
        .find(|(id, _)| **id != service_event)
        .map(|(_, v)| v.clone())
        .unwrap();
    assert_eq!(order_event, (daemon_role.clone(), Some(order_id)));
}

/// The grants README.md and docs/api.md give a service role are exactly
/// `clients_support::documented_grants` (what these tests and the clients' suites give theirs),
/// and the clients' suites' set-up grants its role the suites' operation through the command:
/// that role completes a flow in it and is refused any other.
#[tokio::test]
async fn the_documented_grants_and_the_client_suites_set_up() {
    use crate::clients_support::{documented_grants, ClientEnv, SUITE_OPERATION};
    let normalise = |sql: &str| -> Vec<String> {
        sql.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let expected = normalise(&documented_grants("tombstoned", "payments_service"));
    for file in ["README.md", "docs/api.md"] {
        let text = std::fs::read_to_string(crate::ops_support::repo_root().join(file)).unwrap();
        let block = text
            .split("```sql\n")
            .skip(1)
            .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
            .find(|block| block.contains("GRANT USAGE ON SCHEMA tombstoned TO payments_service"))
            .unwrap_or_else(|| panic!("{file} gives no service role's grants"));
        assert_eq!(normalise(block), expected, "{file}");
    }

    let env = ClientEnv::new("probe").await;
    let var = |name: &str| {
        env.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let service = connect(&var("TOMBSTONED_TEST_SERVICE_URL").parse().unwrap()).await;
    create(&service, SUITE_OPERATION, "k-suite").await;
    let said = refused_with(&service, &claim_sql(OP_B, "k-suite", 1), "42501", "suite").await;
    assert_eq!(
        said,
        format!(
            "role \"{}\" may not use operation \"{OP_B}\"",
            env.service_role
        )
    );
}

/// A `user=` forced in PgBouncer's `[databases]` makes every client of that entry the role it
/// names: a client that logs in as b gets a's operations there (the boundary is the entry's),
/// while logged in directly b is still refused them.
#[tokio::test]
async fn a_user_forced_in_pgbouncer_makes_its_clients_that_role() {
    let s = Services::start().await;
    let bouncer =
        PgBouncer::start_with_forced_user(PoolMode::Transaction, 1, &[&s.a, &s.b], &s.a).await;
    let b_through_forced = connect(&bouncer.url_as(&s.db.name, &s.b).parse().unwrap()).await;
    assert_eq!(
        must(&b_through_forced, "SELECT session_user::text").await,
        Some(s.a.clone())
    );
    create(&b_through_forced, OP_A, "k-forced").await;
    refused_with(
        &b_through_forced,
        &claim_sql(OP_B, "k-forced", 1),
        "42501",
        "forced",
    )
    .await;
    let b = session_as(&s.db, &s.b).await;
    refused_with(&b, &claim_sql(OP_A, "k-forced", 1), "42501", "direct").await;
}
