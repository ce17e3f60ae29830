//! The outbox relay (issue 16) against real HTTP receivers started here and a real PostgreSQL:
//! every event delivered once per sink with verified signatures; a relay SIGKILLed after the
//! receiver committed delivers again and the sink deduplicates; retries with growing delays,
//! dead letters and requeue; two relays at once; retention; no transaction open during an HTTP
//! call; shutdown; TLS; the CLI; and the V2 migration on a populated V1 database.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, RunLimits};
use tombstoned::config::Config;
use tombstoned::db::{Conn, Pooler};
use tombstoned::outbox::Relay;
use tombstoned::schema::migrations;
use uuid::Uuid;

use crate::api_support::order;
use crate::daemon_support::{Daemon, Spec, BOB};
use crate::harness::{binary, config_for, TestDb};
use crate::outbox_support::*;

/// Configuration around the relay: no cleanup scheduler noise, API off unless a test wants it.
const QUIET: &str = "[api]\nenabled = false\n[cleanup]\nenabled = false\n";

fn relay_spec(
    db: &TestDb,
    receiver: &Receiver,
    secret: &std::path::Path,
    extra: &[(&str, &str)],
) -> Spec {
    Spec::new(&db.url)
        .config(&outbox_section(&receiver.url, secret, extra))
        .config(QUIET)
}

/// Runs the binary with `args` against `db` and the given environment; waits for it.
async fn cli(db: &TestDb, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", &db.url);
    for (k, v) in env {
        command.env(k, v);
    }
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

async fn table_checksum(client: &tokio_postgres::Client) -> String {
    client
        .query_one(
            "SELECT coalesce(md5(string_agg(e::text, ',' ORDER BY event_id)), 'empty')
             FROM outbox_events e",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Issue 16, test 1: 500 orders through the real API; the relay inside `serve` delivers each
/// event once to a receiver that verifies every signature and deduplicates in its transaction.
#[tokio::test]
async fn five_hundred_orders_reach_the_sink_once_each_with_valid_signatures() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let spec = Spec::new(&db.url)
        .config(&outbox_section(
            &receiver.url,
            &secret,
            &[
                ("concurrency", "8"),
                ("batch_size", "50"),
                // Generous: a retry here would be the machine's load, not the relay.
                ("request_timeout", "\"15s\""),
                ("lease_duration", "\"40s\""),
            ],
        ))
        .config(
            "[api]\nrate_limit_per_second = 100000\nrate_limit_burst = 100000\n\
             [cleanup]\nenabled = false\n",
        );
    let daemon = Daemon::start(spec).await;

    let statuses: Vec<u16> = futures::stream::iter(0..500)
        .map(|n| {
            let daemon = &daemon;
            async move {
                daemon
                    .create_order(BOB, &format!("outbox-key-{n}"), &order(&format!("req-{n}")))
                    .await
                    .status
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");

    wait_all_settled(&client).await;
    let counts = client
        .query_one(
            "SELECT (SELECT count(*) FROM orders),
                    (SELECT count(*) FROM outbox_events),
                    (SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL),
                    (SELECT count(*) FROM outbox_events WHERE sequence = 1 AND attempts = 1),
                    (SELECT count(*) FROM receiver.sink),
                    (SELECT count(*) FROM receiver.shipments),
                    (SELECT count(*) FROM receiver.sink s JOIN outbox_events e
                        ON e.event_id = s.webhook_id AND e.order_id = s.order_id)",
            &[],
        )
        .await
        .unwrap();
    let counts: Vec<i64> = (0..7).map(|i| counts.get(i)).collect();
    assert_eq!(
        counts, [500; 7],
        "orders, events, delivered, first attempts, sink rows, business effects, matching ids"
    );
    let stats = receiver.stats();
    assert_eq!(
        stats,
        Stats {
            requests: 500,
            bad_signatures: 0,
            overlaps: 0,
            duplicates: 0,
            out_of_order: 0,
        }
    );
    assert_eq!(
        daemon
            .metric("tombstoned_outbox_deliveries_total{outcome=\"delivered\"}")
            .await,
        Some(500.0)
    );
    daemon
        .wait_for_metric("tombstoned_outbox_backlog_events", |v| v == 0.0)
        .await;
    daemon
        .wait_for_metric("tombstoned_outbox_oldest_undelivered_age_seconds", |v| {
            v == 0.0
        })
        .await;
    let histogram = daemon
        .metric("tombstoned_outbox_delivery_duration_seconds_count")
        .await;
    assert_eq!(histogram, Some(500.0));
}

/// Issue 16, test 2: the receiver commits, the relay is SIGKILLed before it records the
/// result; after a restart the event is delivered again (same webhook-id), the sink still has
/// one row, and the relay's record ends delivered.
#[tokio::test]
async fn a_relay_killed_after_the_receiver_committed_delivers_again_and_the_sink_dedupes() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let event = seed_events(&client, 1, 1).await[0][0];
    receiver.script(&[Behaviour::Hold]);
    let spec = relay_spec(
        &db,
        &receiver,
        &secret,
        // The kill must come before the request times out: 6 s of margin on a loaded machine.
        &[("request_timeout", "\"6s\""), ("lease_duration", "\"12s\"")],
    );
    let mut first = Daemon::start(spec.clone()).await;
    receiver.wait_held(1).await;
    assert_eq!(sink_rows(&client).await, 1, "the receiver committed");
    first.signal(Signal::SIGKILL);
    first.wait_exit(PATIENCE).await;
    let leased = record(&client, event).await;
    assert!(!leased.delivered && !leased.dead, "{leased:?}");
    assert_eq!(leased.attempts, 1);
    assert!(leased.locked_by.is_some(), "the dead relay's lease stays");
    receiver.release(); // the answer goes to a closed connection

    let _second = Daemon::start(spec).await;
    let done = wait_record(&client, event, |r| r.delivered).await;
    assert_eq!(done.attempts, 2);
    assert_eq!(done.locked_by, None);
    assert_eq!(done.last_status, Some(204));
    let arrivals = receiver.arrivals_of(event);
    assert_eq!(arrivals.len(), 2, "sent twice with the same webhook-id");
    assert_eq!(sink_rows(&client).await, 1, "deduplicated by webhook-id");
    let stats = receiver.stats();
    assert_eq!((stats.duplicates, stats.overlaps), (1, 0), "{stats:?}");
    assert_eq!(stats.bad_signatures, 0);
}

/// Issue 16, test 3: 503s, then timeouts, then 2xx: retried with growing (measured) delays,
/// never dead-lettered although the failures outnumber max_attempts; a permanent 400
/// dead-letters after max_attempts and `requeue` delivers it once fixed; 410 dead-letters at
/// once.
#[tokio::test]
async fn failures_retry_with_growing_delays_and_permanent_refusals_dead_letter_until_requeued() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let stall = Behaviour::Stall(Duration::from_millis(2500));
    let unavailable = Behaviour::Status(503);
    receiver.script(&[unavailable, unavailable, unavailable, stall, stall]);
    let event = seed_events(&client, 1, 1).await[0][0];
    let daemon = Daemon::start(relay_spec(
        &db,
        &receiver,
        &secret,
        &[
            ("request_timeout", "\"1s\""),
            ("lease_duration", "\"2s\""),
            ("backoff_initial", "\"250ms\""),
            ("backoff_max", "\"5s\""),
            ("max_attempts", "3"),
        ],
    ))
    .await;

    let done = wait_record(&client, event, |r| r.delivered).await;
    assert_eq!(done.attempts, 6);
    assert!(!done.dead);
    let arrivals = receiver.arrivals_of(event);
    assert_eq!(arrivals.len(), 6);
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1].at - w[0].at).collect();
    // Attempt n failed -> wait 250ms * 2^(n-1) (no jitter); a stalled attempt first costs its
    // 1 s timeout.
    let ms = Duration::from_millis;
    let least = [ms(250), ms(500), ms(1000), ms(1000 + 2000), ms(1000 + 4000)];
    eprintln!("retry gaps: {gaps:?}");
    for (i, (gap, least)) in gaps.iter().zip(least).enumerate() {
        assert!(
            *gap + ms(20) >= least,
            "gap {i} {gap:?} shorter than its backoff {least:?}"
        );
        assert!(
            *gap < least + ms(1500),
            "gap {i} {gap:?} far longer than {least:?}"
        );
    }
    assert!(
        gaps.windows(2).all(|w| w[1] > w[0]),
        "delays must grow: {gaps:?}"
    );
    for (outcome, n) in [
        ("retryable_status", 3.0),
        ("timeout", 2.0),
        ("delivered", 1.0),
        ("dead_lettered", 0.0),
    ] {
        let series = format!("tombstoned_outbox_deliveries_total{{outcome=\"{outcome}\"}}");
        assert_eq!(daemon.metric(&series).await, Some(n), "{series}");
    }

    // A receiver that refuses the request itself: dead letter after max_attempts (3).
    let bad = Behaviour::Status(400);
    receiver.script(&[bad, bad, bad]);
    let refused = seed_events(&client, 1, 1).await[0][0];
    let dead = wait_record(&client, refused, |r| r.dead).await;
    assert_eq!((dead.attempts, dead.last_status), (3, Some(400)));
    assert_eq!(dead.locked_by, None);
    daemon
        .wait_for_metric("tombstoned_outbox_dead_letters", |v| v == 1.0)
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        receiver.arrivals_of(refused).len(),
        3,
        "no attempt after it"
    );

    let listed = cli(&db, &["outbox", "list", "--dead-letters"], &[]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert!(text.contains("1 dead letter, oldest first:"), "{text}");
    assert!(
        text.contains(&format!(
            "{refused}  order.created  seq 1  dead_letter  attempts 3"
        )),
        "{text}"
    );
    assert!(text.contains("last: HTTP 400 Bad Request"), "{text}");

    // Fixed (the receiver accepts again): requeue delivers it, once.
    let requeued = cli(
        &db,
        &["outbox", "requeue", "--event", &refused.to_string()],
        &[],
    )
    .await;
    assert!(requeued.status.success(), "{}", stderr(&requeued));
    assert!(stdout(&requeued).contains("requeued 1 dead letter (due now"));
    let done = wait_record(&client, refused, |r| r.delivered).await;
    assert_eq!(done.attempts, 1, "attempts count from zero after a requeue");
    assert_eq!(receiver.arrivals_of(refused).len(), 4);

    // 410 Gone: a dead letter at once, whatever max_attempts says.
    receiver.script(&[Behaviour::Status(410)]);
    let gone = seed_events(&client, 1, 1).await[0][0];
    let dead = wait_record(&client, gone, |r| r.dead).await;
    assert_eq!((dead.attempts, dead.last_status), (1, Some(410)));
    let unknown = cli(
        &db,
        &["outbox", "requeue", "--event", &Uuid::now_v7().to_string()],
        &[],
    )
    .await;
    assert_eq!(unknown.status.code(), Some(64), "{}", stdout(&unknown));
    assert!(stdout(&unknown).contains("not a dead letter"));
    let all = cli(&db, &["outbox", "requeue", "--all-dead-letters"], &[]).await;
    assert!(all.status.success());
    wait_record(&client, gone, |r| r.delivered).await;
    assert_eq!(sink_rows(&client).await, 3, "each event applied once");
    assert_eq!(receiver.stats().duplicates, 0);
}

/// Issue 16, test 4: two `serve` relays, one database, one receiver: every event delivered,
/// none in flight twice at once, each order's events in sequence.
#[tokio::test]
async fn two_relays_share_the_work_without_overlap_and_keep_each_orders_sequence() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    receiver.set_default(Behaviour::Slow(Duration::from_millis(15)));
    let (_dir, secret) = secret_file();
    let spec = relay_spec(
        &db,
        &receiver,
        &secret,
        &[
            ("concurrency", "4"),
            ("batch_size", "8"),
            ("request_timeout", "\"10s\""),
            ("lease_duration", "\"30s\""),
        ],
    );
    let (a, b) = tokio::join!(Daemon::start(spec.clone()), Daemon::start(spec));
    let events = seed_events(&client, 60, 3).await;
    wait_all_settled(&client).await;

    let total: i64 = events.iter().map(|e| e.len() as i64).sum();
    assert_eq!(total, 180);
    assert_eq!(sink_rows(&client).await, total);
    let stats = receiver.stats();
    assert_eq!(
        stats,
        Stats {
            requests: 180,
            bad_signatures: 0,
            overlaps: 0,
            duplicates: 0,
            out_of_order: 0,
        }
    );
    let series = "tombstoned_outbox_deliveries_total{outcome=\"delivered\"}";
    let (by_a, by_b) = (
        a.metric(series).await.unwrap(),
        b.metric(series).await.unwrap(),
    );
    assert_eq!(by_a + by_b, 180.0);
    assert!(
        by_a > 0.0 && by_b > 0.0,
        "both relays worked: {by_a} {by_b}"
    );
    // In the sink, each order's events arrived in sequence order.
    let misordered: i64 = client
        .query_one(
            "SELECT count(*) FROM (
                 SELECT sequence, lag(sequence) OVER (PARTITION BY order_id ORDER BY received_at)
                        AS previous
                 FROM receiver.sink) s
             WHERE previous IS NOT NULL AND previous <> sequence - 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(misordered, 0);
}

/// Issue 16, test 5: retention deletes only delivered events older than the setting, in
/// batches, with the purge's lock discipline; never a pending event or a dead letter; the dry
/// run counts without changing anything.
#[tokio::test]
async fn retention_deletes_only_old_delivered_events_in_batches_and_the_dry_run_only_counts() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let ids: Vec<Uuid> = seed_events(&client, 40, 1)
        .await
        .into_iter()
        .flatten()
        .collect();
    let (old, rest) = ids.split_at(25);
    let (recent, rest) = rest.split_at(5);
    let (pending, dead) = rest.split_at(5);
    client
        .execute(
            "UPDATE outbox_events SET created_at = now() - interval '10 days'",
            &[],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE outbox_events AS e
             SET published_at = now() - interval '10 days' + n.i * interval '1 second',
                 attempts = 1, last_status = 204
             FROM unnest($1::uuid[]) WITH ORDINALITY AS n(id, i)
             WHERE e.event_id = n.id",
            &[&old.to_vec()],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE outbox_events SET published_at = now() - interval '1 day', attempts = 1
             WHERE event_id = ANY ($1)",
            &[&recent.to_vec()],
        )
        .await
        .unwrap();
    client
        .execute(
            "UPDATE outbox_events SET dead_lettered_at = now() - interval '10 days',
                    attempts = 3, last_status = 400
             WHERE event_id = ANY ($1)",
            &[&dead.to_vec()],
        )
        .await
        .unwrap();

    // Off by default: nothing deleted, nothing planned.
    let default = db.config_with(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")]);
    let report = crate::cleanup_support::run(&default).await;
    assert_eq!(report.outbox_events_deleted, 0);
    assert_eq!(report.outbox_delete_before, None);

    let env = [
        ("TOMBSTONED_RETENTION__OUTBOX_KEEP_DELIVERED", "7d"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "200ms"),
    ];
    let config = db.config_with(&env);
    let before = table_checksum(&client).await;
    let dry = cleanup::dry_run_with_purge(
        &config.database,
        &config.cleanup,
        Some(&config.retention),
        false,
    )
    .await
    .unwrap();
    assert_eq!(dry.outbox.delivered, 30);
    assert_eq!(dry.outbox.events_to_delete, Some(25));
    assert_eq!(dry.outbox.counts.pending, 5);
    assert_eq!(dry.outbox.counts.dead_letters, 5);
    let shown = cli(
        &db,
        &["cleanup", "--dry-run"],
        &[(env[0].0, env[0].1.to_owned())],
    )
    .await;
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(
        text.contains("outbox            5 pending (oldest 10days"),
        "{text}"
    );
    assert!(text.contains("5 dead letters, 30 delivered"), "{text}");
    assert!(
        text.contains("outbox retention  25 events delivered before"),
        "{text}"
    );
    assert_eq!(
        table_checksum(&client).await,
        before,
        "the dry run changed nothing"
    );

    // One old delivered event locked by another session: its batch times out, the rest is
    // deleted around it (SKIP LOCKED), and it is left for the next run.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM outbox_events WHERE event_id = $1 FOR UPDATE",
            &[&old[3]],
        )
        .await
        .unwrap();
    let report = cleanup::run_once(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        &CancellationToken::new(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(report.outbox_events_deleted, 24);
    assert!(report.outbox_batches >= 3, "{report:?}");
    assert!(report.lock_timeouts >= 1, "{report:?}");
    assert!(report.outbox_delete_before.is_some());
    holder.batch_execute("COMMIT").await.unwrap();
    let again = crate::cleanup_support::run(&config).await;
    assert_eq!(again.outbox_events_deleted, 1);

    let left: Vec<Uuid> = client
        .query("SELECT event_id FROM outbox_events ORDER BY event_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut kept: Vec<Uuid> = [recent, pending, dead].concat();
    kept.sort();
    assert_eq!(
        left, kept,
        "recent deliveries, pending events and dead letters stay"
    );
}

/// Issue 16, test 6: while the receiver holds a delivery, no session of the relay is idle in
/// a transaction (or has one open): the lease committed before the call.
#[tokio::test]
async fn no_relay_session_holds_a_transaction_while_the_receiver_stalls() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let event = seed_events(&client, 1, 1).await[0][0];
    receiver.script(&[Behaviour::Hold]);
    let _daemon = Daemon::start(relay_spec(
        &db,
        &receiver,
        &secret,
        &[
            ("request_timeout", "\"20s\""),
            ("lease_duration", "\"60s\""),
        ],
    ))
    .await;
    receiver.wait_held(1).await;
    let leased = record(&client, event).await;
    assert!(
        leased.locked_by.is_some() && !leased.delivered,
        "{leased:?}"
    );
    let started = Instant::now();
    let mut samples = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        let (sessions, in_transaction) = relay_sessions(&client, "tombstoned/outbox-relay").await;
        assert!(sessions >= 1, "the relay's session is connected");
        assert_eq!(
            in_transaction, 0,
            "a relay transaction is open during the HTTP call"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.held(), 1, "still in flight during the observation");
    assert!(samples > 10);
    receiver.release();
    wait_record(&client, event, |r| r.delivered).await;
}

/// SIGTERM stops the relay from taking work; a delivery in flight gets outbox.shutdown_grace
/// and is then abandoned, leased; once the lease expires another relay sends it again.
#[tokio::test]
async fn sigterm_abandons_a_delivery_after_the_grace_and_it_is_redelivered_after_its_lease() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let event = seed_events(&client, 1, 1).await[0][0];
    receiver.script(&[Behaviour::Hold]);
    let spec = relay_spec(
        &db,
        &receiver,
        &secret,
        // The signal and the grace must come before the request times out: 6 s of margin.
        &[
            ("request_timeout", "\"6s\""),
            ("lease_duration", "\"12s\""),
            ("shutdown_grace", "\"1s\""),
        ],
    );
    let mut daemon = Daemon::start(spec.clone()).await;
    receiver.wait_held(1).await;
    let stopping = Instant::now();
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(PATIENCE).await;
    let took = stopping.elapsed();
    let log = daemon.log();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        took >= Duration::from_secs(1),
        "the grace was given: {took:?}"
    );
    // Abandoned by the grace (not by the request's 6 s timeout: only the grace logs this), and
    // right after it, by the daemon's own clock (its log's timestamps: a slow test cannot stretch
    // it); the exit follows.
    let at = |needle: &str| {
        crate::harness::logged_at(&log, needle)
            .unwrap_or_else(|| panic!("no {needle:?} in the log:\n{log}"))
    };
    let grace = at("delivery abandoned at shutdown")
        .duration_since(at("shutting down:"))
        .unwrap_or_default();
    assert!(
        grace >= Duration::from_secs(1) && grace < Duration::from_millis(1900),
        "abandoned {grace:?} after SIGTERM, grace 1 s:\n{log}"
    );
    assert!(
        took < Duration::from_secs(10),
        "exit {took:?} after SIGTERM"
    );
    let abandoned = record(&client, event).await;
    assert!(
        abandoned.locked_by.is_some() && !abandoned.delivered,
        "{abandoned:?}"
    );
    receiver.release();

    let _next = Daemon::start(spec).await;
    let done = wait_record(&client, event, |r| r.delivered).await;
    assert_eq!(done.attempts, 2);
    assert_eq!(sink_rows(&client).await, 1);
    assert_eq!(receiver.stats().duplicates, 1);
}

/// HTTPS: verified against outbox.ca_file; without it (system roots) the private CA's server is
/// refused and the event is retried, not delivered.
#[tokio::test]
async fn https_endpoints_are_verified_against_the_configured_ca_only() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let pki = TestPki::create();
    let receiver = Receiver::start_tls(&db, &pki).await;
    let (_dir, secret) = secret_file();
    let event = seed_events(&client, 1, 1).await[0][0];
    let env = |ca: Option<&std::path::Path>| {
        let mut vars = vec![
            ("TOMBSTONED_OUTBOX__ENDPOINT", receiver.url.clone()),
            (
                "TOMBSTONED_OUTBOX__SECRET_FILE",
                secret.display().to_string(),
            ),
            ("TOMBSTONED_OUTBOX__REQUEST_TIMEOUT", "5s".to_owned()),
            ("TOMBSTONED_OUTBOX__LEASE_DURATION", "10s".to_owned()),
        ];
        if let Some(ca) = ca {
            vars.push(("TOMBSTONED_OUTBOX__CA_FILE", ca.display().to_string()));
        }
        vars
    };
    let config_of = |vars: Vec<(&str, String)>| -> Config {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        config_for(&db.url, &vars)
    };
    let never = CancellationToken::new();

    let untrusted = config_of(env(None));
    let relay = Relay::new(
        &untrusted.database,
        &untrusted.outbox,
        "outbox-deliver",
        None,
    )
    .unwrap();
    let report = relay.drain(None, &never).await.unwrap();
    assert_eq!(
        (report.picked, report.retried, report.delivered),
        (1, 1, 0),
        "{report:?}"
    );
    let refused = record(&client, event).await;
    assert_eq!(
        refused.last_status, None,
        "no HTTP answer: the TLS handshake failed"
    );
    let reason: String = client
        .query_one(
            "SELECT last_error FROM outbox_events WHERE event_id = $1",
            &[&event],
        )
        .await
        .unwrap()
        .get(0);
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    assert_eq!(receiver.stats().requests, 0);

    client
        .execute(
            "UPDATE outbox_events SET next_attempt_at = now() WHERE event_id = $1",
            &[&event],
        )
        .await
        .unwrap();
    let trusted = config_of(env(Some(&pki.ca_cert)));
    let relay = Relay::new(&trusted.database, &trusted.outbox, "outbox-deliver", None).unwrap();
    let report = relay.drain(None, &never).await.unwrap();
    assert_eq!((report.picked, report.delivered), (1, 1), "{report:?}");
    assert_eq!(sink_rows(&client).await, 1);
    assert_eq!(receiver.stats().bad_signatures, 0);
}

/// `tombstoned outbox deliver`: the dry run sends and changes nothing; a run delivers what is
/// due (at most --max-events) and exits 0, or 75 when something was left for a retry; an
/// exposed secret file or a missing endpoint is a configuration error (64).
#[tokio::test]
async fn the_one_shot_command_delivers_previews_and_refuses_unsafe_configuration() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let receiver = Receiver::start(&db).await;
    let (dir, secret) = secret_file();
    let events: Vec<Uuid> = seed_events(&client, 3, 1)
        .await
        .into_iter()
        .flatten()
        .collect();
    let env = vec![
        ("TOMBSTONED_OUTBOX__ENDPOINT", receiver.url.clone()),
        (
            "TOMBSTONED_OUTBOX__SECRET_FILE",
            secret.display().to_string(),
        ),
    ];

    let before = table_checksum(&client).await;
    let dry = cli(&db, &["outbox", "deliver", "--dry-run"], &env).await;
    assert!(dry.status.success(), "{}", stderr(&dry));
    let text = stdout(&dry);
    assert!(text.contains("nothing was sent or changed"), "{text}");
    assert!(text.contains("would send      3 events now"), "{text}");
    for id in &events {
        assert!(text.contains(&id.to_string()), "{text}");
    }
    assert_eq!(table_checksum(&client).await, before);
    assert_eq!(receiver.stats().requests, 0);

    let two = cli(&db, &["outbox", "deliver", "--max-events", "2"], &env).await;
    assert_eq!(two.status.code(), Some(0), "{}", stderr(&two));
    assert!(
        stdout(&two).contains("2 events attempted"),
        "{}",
        stdout(&two)
    );
    assert!(stdout(&two).contains("delivered         2"));
    assert!(record(&client, events[0]).await.delivered);
    assert!(record(&client, events[1]).await.delivered);

    receiver.set_default(Behaviour::Status(503));
    let failing = cli(&db, &["outbox", "deliver", "--json"], &env).await;
    assert_eq!(failing.status.code(), Some(75), "{}", stderr(&failing));
    let report: serde_json::Value = serde_json::from_slice(&failing.stdout).unwrap();
    assert_eq!(report["retried"], 1);
    let left = record(&client, events[2]).await;
    assert!(
        !left.delivered && !left.dead && left.locked_by.is_none(),
        "{left:?}"
    );
    assert_eq!(left.last_status, Some(503));

    // Group-readable secret: refused before anything is sent.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    let exposed = cli(&db, &["outbox", "deliver"], &env).await;
    assert_eq!(exposed.status.code(), Some(64), "{}", stderr(&exposed));
    assert!(
        stderr(&exposed).contains("outbox.secret_file"),
        "{}",
        stderr(&exposed)
    );
    assert!(
        stderr(&exposed).contains("chmod 600"),
        "{}",
        stderr(&exposed)
    );
    let checked = cli(&db, &["check-config"], &env).await;
    assert_eq!(checked.status.code(), Some(64), "{}", stderr(&checked));
    let enabled_without_endpoint = cli(
        &db,
        &["check-config"],
        &[("TOMBSTONED_OUTBOX__ENABLED", "true".to_owned())],
    )
    .await;
    assert_eq!(enabled_without_endpoint.status.code(), Some(64));
    assert!(stderr(&enabled_without_endpoint).contains("outbox.endpoint"));
    let no_endpoint = cli(&db, &["outbox", "deliver"], &[]).await;
    assert_eq!(
        no_endpoint.status.code(),
        Some(64),
        "{}",
        stderr(&no_endpoint)
    );
    // `serve` with the relay on refuses the exposed secret before readiness.
    let mut serve_env = env.clone();
    serve_env.extend([
        ("TOMBSTONED_OUTBOX__ENABLED", "true".to_owned()),
        ("TOMBSTONED_API__ENABLED", "false".to_owned()),
        ("TOMBSTONED_METRICS__LISTEN", "127.0.0.1:0".to_owned()),
    ]);
    let serve = cli(&db, &["serve"], &serve_env).await;
    assert_eq!(serve.status.code(), Some(64), "{}", stderr(&serve));
    assert!(stderr(&serve).contains("chmod 600"), "{}", stderr(&serve));
    drop(dir);
}

/// V2 upgrades a V1 database with rows in place: existing events become pending first events
/// of their orders, due now; a delivered mark survives; the relay then sends only the rest.
#[tokio::test]
async fn v2_upgrades_a_populated_v1_database_and_its_events_are_then_delivered() {
    let db = TestDb::empty().await;
    let config = db.config();
    let client = db.client().await;
    assert_eq!(crate::schema_support::migrate_to(&db, 1).await, [1]);
    // V1 rows, written the way a V1 binary wrote them.
    let mut events = Vec::new();
    for n in 0..3 {
        let order = Uuid::now_v7();
        let event = Uuid::now_v7();
        client
            .execute(
                "INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                                     currency, item, quantity, recipient)
                 VALUES ($1, 'acme', 'alice', $2, 100, 'CNY', 'book', 1, 'r')",
                &[&order, &format!("v1-{n}")],
            )
            .await
            .unwrap();
        client
            .execute(
                "INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)
                 VALUES ($1, 'acme', $2, 'order.created', '{\"v\": 1}')",
                &[&event, &order],
            )
            .await
            .unwrap();
        events.push(event);
    }
    client
        .execute(
            "UPDATE outbox_events SET published_at = now() WHERE event_id = $1",
            &[&events[0]],
        )
        .await
        .unwrap();

    let upgraded = migrations::migrate(&config.database).await.unwrap();
    assert_eq!(
        upgraded.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(1)
    );
    let status = migrations::status(&Conn::dedicated(&client, "tombstoned", Pooler::None), None)
        .await
        .unwrap();
    assert!(status.is_current(), "{status:?}");
    let rows = client
        .query(
            "SELECT sequence, attempts, next_attempt_at <= now(), locked_by IS NULL,
                    published_at IS NOT NULL, dead_lettered_at IS NULL
             FROM outbox_events ORDER BY event_id",
            &[],
        )
        .await
        .unwrap();
    let rows: Vec<(i32, i32, bool, bool, bool, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    assert_eq!(
        rows,
        [
            (1, 0, true, true, true, true),
            (1, 0, true, true, false, true),
            (1, 0, true, true, false, true)
        ]
    );

    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let mut relay_config = config.clone();
    relay_config.outbox = config_for(
        &db.url,
        &[
            ("TOMBSTONED_OUTBOX__ENDPOINT", &receiver.url),
            (
                "TOMBSTONED_OUTBOX__SECRET_FILE",
                &secret.display().to_string(),
            ),
        ],
    )
    .outbox;
    let relay = Relay::new(
        &relay_config.database,
        &relay_config.outbox,
        "outbox-deliver",
        None,
    )
    .unwrap();
    let report = relay.drain(None, &CancellationToken::new()).await.unwrap();
    assert_eq!((report.picked, report.delivered), (2, 2), "{report:?}");
    assert!(
        receiver.arrivals_of(events[0]).is_empty(),
        "already delivered"
    );
    assert_eq!(sink_rows(&client).await, 2);
}
