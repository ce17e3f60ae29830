//! High availability against the real daemon (issue 12): a primary with a streaming standby
//! (`tombstoned_testkit::standby`) failed over under the stress load — synchronous replication
//! loses nothing acknowledged, asynchronous replication's losses are counted — with the daemon,
//! never restarted, following a multi-host URL to the promoted standby and its cleaner taking
//! the lease there; the first host of the URL unreachable at start-up (silent, closed); a
//! standby-only URL (not ready, no cleanup run); and three daemons on one database, whose
//! cleaners take turns. Every barrier is an observed state (an answer, a query, a metric).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::ClusterOptionsTestExt as _;
use tombstoned_testkit::standby::{self, Replication, Standby, StandbyOptions};
use uuid::Uuid;

use crate::daemon::{connect, free_port, sample, Daemon, DaemonSpec};
use crate::faults::until;
use crate::harness::{self, silent_listener, TestDb};
use crate::ledger::{self, Answer, CheckOptions, DbState, Exchange, Kind, Ledger, SharedPool};
use crate::load::{self, Api, LoadSpec, Mix};

const BOUND: Duration = Duration::from_secs(30);
/// Test 3's per-host connect timeout, and what a loaded 2-core machine needs on top of it:
/// long enough that paying the timeout twice (the start-up check, then the pool's first
/// connection, one after the other) breaks the bound.
const FIRST_HOST_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const FIRST_HOST_MARGIN: Duration = Duration::from_secs(2);

/// A primary with a migrated database `ha` and a streaming standby of it.
struct Pair {
    primary: ThrowawayCluster,
    standby: Standby,
}

impl Pair {
    async fn start(replication: Replication) -> Pair {
        // Commits flushed locally (the tests' default is off); with a synchronous standby they
        // also wait for it.
        let options = ClusterOptions::for_tests().set("synchronous_commit", "on");
        let primary = {
            let options = options.clone();
            tokio::task::spawn_blocking(move || ThrowawayCluster::start(&options).unwrap())
                .await
                .unwrap()
        };
        let admin = connect(&primary.url("postgres"), "test").await;
        admin.batch_execute("CREATE DATABASE ha").await.unwrap();
        tombstoned::schema::migrations::migrate(
            &harness::config_for(&primary.url("ha"), &[]).database,
        )
        .await
        .expect("migrate");
        let standby = Standby::start(
            &primary,
            &StandbyOptions::new(replication).settings(options),
        )
        .await
        .unwrap();
        standby.catch_up(&admin, BOUND).await.unwrap();
        Pair { primary, standby }
    }

    /// `host=primary,standby`, read-write sessions only: what a client of a Patroni or
    /// pg_auto_failover pair is given.
    fn multi_host_url(&self) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=ha \
             target_session_attrs=read-write",
            self.primary.port(),
            self.standby.port()
        )
    }
}

/// Daemon settings for a load with the cleaner busy: records due 3 s after their creation,
/// a run every second.
fn busy_cleaner(url: &str) -> DaemonSpec {
    DaemonSpec::new(url)
        .set("retention", "replay_window", "\"3s\"")
        .set("cleanup", "schedule", "\"* * * * * *\"")
        .set("cleanup", "batch_size", "25")
        .set("cleanup", "lock_timeout", "\"500ms\"")
        .set("database", "connect_timeout", "\"1s\"")
}

/// The stress clients running in the background, spread over one or more daemons, all
/// recording into one ledger and picking retries from one pool (as behind a load balancer).
struct Background {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    ledger: Arc<Ledger>,
    pool: SharedPool,
    apis: Vec<Api>,
}

impl Background {
    fn start(api_bases: &[&str], clients_each: usize, tag: &str) -> Background {
        let ledger = Arc::new(Ledger::default());
        let pool: SharedPool = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let apis: Vec<Api> = api_bases
            .iter()
            .map(|base| Api::new(base, Duration::from_secs(20)))
            .collect();
        let tasks = apis
            .iter()
            .enumerate()
            .map(|(i, api)| {
                let spec = LoadSpec {
                    clients: clients_each,
                    mix: Mix::stress(),
                    seed: 12 + i as u64,
                    tag: format!("{tag}{i}"),
                };
                let (api, ledger, pool, stop) =
                    (api.clone(), ledger.clone(), pool.clone(), stop.clone());
                tokio::spawn(async move { load::run(&api, &spec, &ledger, &pool, &stop).await })
            })
            .collect();
        Background {
            stop,
            tasks,
            ledger,
            pool,
            apis,
        }
    }

    fn count(&self, pred: impl Fn(&Exchange) -> bool) -> usize {
        self.ledger.count(pred)
    }

    /// Stops the clients, then retries every intent until it has a definite answer.
    async fn stop_and_settle(self) -> Arc<Ledger> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        load::settle(
            &self.apis[0],
            &self.ledger,
            &self.pool,
            Duration::from_secs(90),
        )
        .await;
        self.ledger
    }
}

fn created(e: &Exchange) -> bool {
    matches!(&e.answer, Answer::Reply(r) if r.status == 201 && !r.replayed)
}

/// The order an answer names: a 201 or 200 (the order itself) or a 410 (the expired record's).
fn order_id_of(e: &Exchange) -> Option<Uuid> {
    order_id_in(&e.answer)
}

/// The `order_id` an answer's JSON body names (a 200/201 order or key status, a 410).
fn order_id_in(answer: &Answer) -> Option<Uuid> {
    match answer {
        Answer::Reply(r) if matches!(r.status, 200 | 201 | 410) => {
            serde_json::from_str::<serde_json::Value>(&r.text)
                .ok()?
                .get("order_id")?
                .as_str()
                .and_then(|s| Uuid::parse_str(s).ok())
        }
        _ => None,
    }
}

/// A 422 over the approval limit: the refusal is stored as the key's outcome.
fn is_stored_rejection(e: &Exchange) -> bool {
    matches!(&e.answer, Answer::Reply(r) if r.status == 422 && r.problem() == "approval-limit-exceeded")
}

fn is_outcome_unknown(e: &Exchange) -> bool {
    matches!(&e.answer, Answer::Reply(r) if r.status == 503 && r.problem() == "outcome-unknown")
}

fn five_hundreds(ledger: &Ledger) -> usize {
    let exchanges = ledger.exchanges.lock().unwrap();
    let reads = ledger.reads.lock().unwrap();
    let is_500 = |a: &Answer| matches!(a, Answer::Reply(r) if r.status == 500);
    exchanges.iter().filter(|e| is_500(&e.answer)).count()
        + reads.iter().filter(|r| is_500(&r.answer)).count()
}

/// What one failover under load measured.
struct Failover {
    verdict: ledger::Verdict,
    figures: String,
    lost_acknowledged: usize,
    /// Keys and request ids answered by the old primary from what the new one lacks (none may
    /// be, when every commit waited for the standby).
    erased_keys: usize,
    /// Reads that named an order the new primary lacks.
    reads_of_lost_orders: usize,
    unknown_keys: usize,
}

/// The failover scenario, for both replication modes: load through a multi-host URL, the
/// primary stopped `-m immediate`, the standby promoted; the daemon must serve from it and
/// its cleaner run there. The ledger is checked against the new primary; in asynchronous mode
/// the keys whose acknowledged order did not reach the standby are counted and left out of the
/// per-request checks (the database-wide ones still cover everything).
async fn failover_under_load(replication: Replication, tag: &str) -> Failover {
    let pair = Pair::start(replication).await;
    let mut daemon = Daemon::start(busy_cleaner(&pair.multi_host_url())).await;
    let load = Background::start(&[&daemon.api], 8, tag);
    let old = connect(&pair.primary.url("ha"), "test").await;
    until(
        "claims flow and a cleanup run is recorded",
        BOUND,
        || async {
            load.count(created) >= 200
                && old
                    .query_one(
                        "SELECT count(*) FROM cleanup_runs WHERE outcome = 'success'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
                    > 0
        },
    )
    .await;
    // The standby stalls (its WAL receiver stopped), as a slow network or an overloaded standby
    // would, so the crash finds work in flight: synchronous commits waiting for the standby's
    // confirmation with their COMMIT sent (the outcome-unknown 503s); asynchronous commits
    // acknowledged that the standby may never receive.
    pair.standby.stall_wal_receiver().await.unwrap();
    match replication {
        Replication::Synchronous => {
            until(
                "claims wait for the standby's confirmation",
                BOUND,
                || async {
                    old.query_one(
                        "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = 'tombstoned/api' AND wait_event = 'SyncRep'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
                        >= 3
                },
            )
            .await;
        }
        Replication::Asynchronous => {
            // WAL the walsender already wrote into the socket still reaches the standby when
            // it resumes. Once the socket is full the walsender sends nothing more (its
            // sent_lsn stays put while filler WAL is written): a commit acknowledged after that
            // cannot reach the standby. Filler WAL gets there quickly.
            let admin = connect(&pair.primary.url("postgres"), "test").await;
            admin
                .batch_execute("CREATE TABLE public.filler (x text)")
                .await
                .unwrap();
            let sent_lsn = || async {
                admin
                    .query_one("SELECT sent_lsn::text FROM pg_stat_replication", &[])
                    .await
                    .unwrap()
                    .get::<_, String>(0)
            };
            until(
                "the walsender stops sending to the stalled standby",
                BOUND,
                || async {
                    let before = sent_lsn().await;
                    admin
                        .batch_execute(
                            "INSERT INTO public.filler \
                         SELECT repeat('x', 1000) FROM generate_series(1, 8000)",
                        )
                        .await
                        .unwrap();
                    sent_lsn().await == before
                },
            )
            .await;
            let blocked_at = SystemTime::now();
            until(
                "claims acknowledged after the walsender blocked",
                BOUND,
                || async { load.count(|e| e.sent_at >= blocked_at && created(e)) >= 20 },
            )
            .await;
        }
    }
    let acknowledged_before = load.count(created);
    tokio::task::block_in_place(|| standby::stop_immediately(&pair.primary)).unwrap();
    let killed = Instant::now();
    let stopped_at = SystemTime::now();
    pair.standby.resume_wal_receiver().unwrap();
    pair.standby.promote().await.unwrap();
    let promoted_at = SystemTime::now();
    let promotion_took = killed.elapsed();
    let new = connect(&pair.standby.url("ha"), "test").await;
    let promoted_db_clock: SystemTime = new.query_one("SELECT now()", &[]).await.unwrap().get(0);

    // The daemon serves from the new primary: the first fresh key created after the promotion.
    until(
        "a fresh key is created on the new primary",
        BOUND,
        || async {
            load.count(|e| e.kind == Kind::New && e.sent_at >= promoted_at && created(e)) > 0
        },
    )
    .await;
    let first_201 = load
        .ledger
        .exchanges
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind == Kind::New && e.sent_at >= promoted_at && created(e))
        .map(|e| {
            e.answered_at
                .duration_since(promoted_at)
                .unwrap_or_default()
        })
        .min()
        .unwrap();

    // The scheduled cleaner runs on the new primary: the replicated lease row names a backend
    // of the old server, which does not exist here, so the next fire takes it.
    let success_before = daemon
        .metric("tombstoned_cleanup_runs_total{outcome=\"success\"}")
        .await;
    let cleaner_back = until(
        "a cleanup run succeeds on the new primary",
        BOUND,
        || async {
            new.query_one(
                "SELECT count(*) FROM cleanup_runs WHERE outcome = 'success' AND started_at >= $1",
                &[&promoted_db_clock],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
                > 0
        },
    )
    .await;
    let lease_retaken: bool = new
        .query_one(
            "SELECT count(*) > 0 FROM cleanup_lease WHERE acquired_at >= $1",
            &[&promoted_db_clock],
        )
        .await
        .unwrap()
        .get(0);
    assert!(lease_retaken, "the lease row was taken on the new primary");
    until(
        "the daemon counts the new primary's runs",
        BOUND,
        || async {
            daemon
                .metric("tombstoned_cleanup_runs_total{outcome=\"success\"}")
                .await
                > success_before
        },
    )
    .await;
    // Some load on the new primary, with the cleaner running, before the settling.
    let wanted = load.count(|_| true) + 500;
    until("load on the new primary", BOUND, || async {
        load.count(|_| true) >= wanted
    })
    .await;

    let ledger = load.stop_and_settle().await;
    let metrics = daemon.metrics().await;
    let status = daemon.terminate().await;
    assert!(status.success(), "exit {status}:\n{}", daemon.stderr());
    assert!(daemon.starts == 1, "never restarted");
    let state = DbState::load(&new).await;

    // Acknowledged orders the new primary does not have (asynchronous replication's loss):
    // every answer that named one (a 201, first or replayed, a 200 for a duplicate).
    let exchanges = ledger.exchanges.lock().unwrap().clone();
    let lost_orders: HashSet<Uuid> = exchanges
        .iter()
        .filter_map(order_id_of)
        .filter(|id| !state.orders.contains_key(id))
        .collect();
    let lost: Vec<&Exchange> = exchanges
        .iter()
        .filter(|e| order_id_of(e).is_some_and(|id| lost_orders.contains(&id)))
        .collect();
    // Stored rejections are acknowledged writes too: a 422 over the approval limit answered by
    // the old primary whose record the new one lacks (or holds for another request, written
    // after the loss freed the key). Only answers given before the primary stopped can be lost.
    let lost_rejections: Vec<&Exchange> = exchanges
        .iter()
        .filter(|e| e.answered_at <= stopped_at && is_stored_rejection(e))
        .filter(|e| {
            !state
                .records
                .get(&ledger::scope_of(&e.intent))
                .is_some_and(|rec| rec.fingerprint == e.fingerprint && rec.status == Some(422))
        })
        .collect();
    let lost_rejected_keys: HashSet<&str> = lost_rejections
        .iter()
        .map(|e| e.intent.key.as_str())
        .collect();
    let lost_order_keys: HashSet<&str> = lost.iter().map(|e| e.intent.key.as_str()).collect();
    // Other answers the old primary gave from a record the new one lacks or wrote afresh after
    // the loss (a 410, a 422 for a reused key, a replay of a request the client dropped): they
    // cannot be checked against the new primary. Counted in the figures, left out of the
    // per-request checks like the keys above.
    let erased_keys: HashSet<&str> = exchanges
        .iter()
        .filter(|e| {
            e.answered_at <= stopped_at
                && matches!(&e.answer, Answer::Reply(r) if matches!(r.status, 201 | 410 | 422))
        })
        .filter(|e| {
            state
                .records
                .get(&ledger::scope_of(&e.intent))
                .is_none_or(|rec| rec.created_at > stopped_at)
        })
        .map(|e| e.intent.key.as_str())
        .filter(|key| !lost_order_keys.contains(key) && !lost_rejected_keys.contains(key))
        .collect();
    let lost_keys: HashSet<&str> = lost_order_keys
        .iter()
        .chain(&lost_rejected_keys)
        .chain(&erased_keys)
        .copied()
        .collect();
    // A 409 duplicate-request-id the old primary gave for an order the new one lacks (its
    // creating answer never reached the client, so no answer above named it). The loss frees
    // the request_id: the new primary may hold an order for it created after the stop, from
    // another intent (the very one refused with the 409, retried), so only an order from
    // before the stop is the one the 409 saw.
    let erased_requests: HashSet<(&str, &str)> = exchanges
        .iter()
        .filter(|e| {
            e.answered_at <= stopped_at
                && matches!(&e.answer, Answer::Reply(r)
                    if r.status == 409 && r.problem() == "duplicate-request-id")
        })
        .map(|e| (e.intent.who.tenant, e.intent.request_id.as_str()))
        .filter(|(tenant, request_id)| {
            !state.orders.values().any(|o| {
                o.tenant == *tenant && o.request_id == *request_id && o.created_at <= stopped_at
            })
        })
        .collect();
    let lost_requests: HashSet<(&str, &str)> = lost
        .iter()
        .map(|e| (e.intent.who.tenant, e.intent.request_id.as_str()))
        .chain(erased_requests.iter().copied())
        .collect();
    let touches_loss = |e: &Exchange| {
        lost_keys.contains(e.intent.key.as_str())
            || lost_requests.contains(&(e.intent.who.tenant, e.intent.request_id.as_str()))
    };
    let checked = Ledger::default();
    for e in exchanges.iter().filter(|e| !touches_loss(e)) {
        checked.record(e.clone());
    }
    // A read that names an order the new primary lacks was answered by the old primary from
    // what was lost (also an order whose creating answer the client never saw: dropped, or an
    // outcome-unknown 503); reads carry no time, so that is how they are told apart.
    let mut reads_of_lost_orders = 0;
    for r in ledger.reads.lock().unwrap().iter() {
        let names_lost_order = [r.order_id, order_id_in(&r.answer)]
            .into_iter()
            .flatten()
            .any(|id| !state.orders.contains_key(&id));
        reads_of_lost_orders += usize::from(names_lost_order);
        let lost_read = lost_keys.contains(r.intent.key.as_str())
            || lost_requests.contains(&(r.intent.who.tenant, r.intent.request_id.as_str()))
            || names_lost_order;
        if !lost_read {
            checked.record_read(r.clone());
        }
    }
    let verdict = ledger::check(&checked, &state, CheckOptions::default());

    // Every outcome-unknown 503 was retried with its key (settle) until a definite answer: an
    // order the new primary has (created or replayed: one order, the database-wide checks make
    // sure there is no second), or a refusal that wrote nothing (another order has the
    // request_id, key reuse, the approval limit).
    let unknown: HashSet<&str> = exchanges
        .iter()
        .filter(|e| is_outcome_unknown(e) && !touches_loss(e))
        .map(|e| e.intent.key.as_str())
        .collect();
    let mut unknown_ended_in_order = 0;
    let mut unknown_endings = std::collections::BTreeMap::<String, usize>::new();
    for key in &unknown {
        let last = exchanges
            .iter()
            .rev()
            .find(|e| e.intent.key == *key)
            .unwrap();
        let first_unknown = exchanges
            .iter()
            .find(|e| e.intent.key == *key && is_outcome_unknown(e))
            .unwrap();
        if let Answer::Reply(r) = &last.answer {
            *unknown_endings
                .entry(format!("{:?} -> {}", first_unknown.kind, r.label()))
                .or_default() += 1;
        }
        match &last.answer {
            // Created or replayed, or created and its replay window closed since (a 410 naming
            // an order): the order the answer names is on the new primary.
            Answer::Reply(r)
                if matches!(r.status, 200 | 201)
                    || (r.status == 410 && order_id_of(last).is_some()) =>
            {
                let id = order_id_of(last).unwrap();
                assert!(
                    state.orders.contains_key(&id),
                    "key {key}: retried into order {id}, which the new primary lacks"
                );
                unknown_ended_in_order += 1;
            }
            // Refused without an order: over the approval limit (stored, replayed, or expired
            // since: a 410 naming no order), another order has the request_id, key reuse.
            Answer::Reply(r)
                if matches!(r.status, 410 | 422)
                    || (r.status == 409 && r.problem() == "duplicate-request-id") => {}
            other => panic!("outcome-unknown key {key} never settled: {other:?}"),
        }
    }
    assert_eq!(five_hundreds(&ledger), 0, "no 500");

    let figures = format!(
        "{replication:?} replication, 8 stress clients through host=primary,standby \
         target_session_attrs=read-write; the standby's WAL receiver stalled (SIGSTOP), then the \
         primary stopped -m immediate after {acknowledged_before} orders acknowledged\n\
         promotion (pg_ctl promote until pg_is_in_recovery() = false): {promotion_took:?}\n\
         first 201 for a fresh key after the promotion: {first_201:?}\n\
         first cleanup run recorded on the new primary: {cleaner_back:?} after the first 201\n\
         acknowledged orders lost: {} ({} answers named them, for {} keys); stored rejections \
         lost: {} keys ({} answers); other keys whose record was lost: {}; request ids whose \
         order was lost: {}; reads naming a lost order: {reads_of_lost_orders}; outcome-unknown \
         503 keys: {} ({unknown_ended_in_order} retried into an order, the others refused \
         without writing): {unknown_endings:?}\n\
         daemon: {} cleanup runs succeeded, {} skipped read-only, {} failed\n{}",
        lost_orders.len(),
        lost.len(),
        lost_order_keys.len(),
        lost_rejected_keys.len(),
        lost_rejections.len(),
        erased_keys.len(),
        erased_requests.len(),
        unknown.len(),
        sample(
            &metrics,
            "tombstoned_cleanup_runs_total{outcome=\"success\"}"
        ),
        sample(
            &metrics,
            "tombstoned_cleanup_runs_total{outcome=\"skipped_read_only\"}"
        ),
        sample(
            &metrics,
            "tombstoned_cleanup_runs_total{outcome=\"failed\"}"
        ),
        verdict.figures()
    );
    assert!(
        first_201 <= Duration::from_secs(10),
        "the daemon served from the new primary only {first_201:?} after the promotion\n{figures}"
    );
    Failover {
        verdict,
        figures,
        lost_acknowledged: lost_orders.len() + lost_rejected_keys.len(),
        erased_keys: erased_keys.len() + erased_requests.len(),
        reads_of_lost_orders,
        unknown_keys: unknown.len(),
    }
}

/// Test 1: synchronous replication loses nothing that was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_synchronous_replication_loses_no_acknowledged_claim() {
    let run = failover_under_load(Replication::Synchronous, "fs").await;
    crate::publish_figures("failover-synchronous", &run.figures);
    assert_eq!(run.lost_acknowledged, 0, "{}", run.figures);
    assert_eq!(run.erased_keys, 0, "{}", run.figures);
    assert_eq!(run.reads_of_lost_orders, 0, "{}", run.figures);
    run.verdict.assert_clean();
    // Claims were waiting for the stalled standby when the primary died, their COMMIT sent.
    assert!(
        run.unknown_keys >= 1,
        "no outcome-unknown 503: {}",
        run.figures
    );
}

/// Test 2: asynchronous replication: acknowledged claims are lost (counted and published; the
/// stalled standby makes sure some are); everything else holds — no key with two orders, no
/// 500, retried unknowns end in one order, and every other answer is checked as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_asynchronous_replication_counts_lost_claims_and_keeps_the_rest() {
    let run = failover_under_load(Replication::Asynchronous, "fa").await;
    crate::publish_figures("failover-asynchronous", &run.figures);
    run.verdict.assert_clean();
    // By construction some were: 20 claims were acknowledged after the walsender had stopped
    // sending. Seeing them proves the count counts.
    assert!(run.lost_acknowledged >= 1, "{}", run.figures);
}

/// Starts `serve` on `url` (connect_timeout [`FIRST_HOST_CONNECT_TIMEOUT`]) and posts until its
/// first 201. Returns how long after the spawn the API pool's first session on the second host
/// began (the database's `backend_start`: when the daemon got through, whatever this test was
/// doing) and when the first order's transaction began (the database clock: this test's polling
/// is in it). The first 201 must have taken under the connect timeout as the daemon timed it, so
/// the request did not try the first host again.
async fn time_to_first_order(db: &TestDb, url: &str) -> (Duration, Duration) {
    let spawned = SystemTime::now();
    let mut daemon = Daemon::launch(DaemonSpec::new(url).set(
        "database",
        "connect_timeout",
        &format!("\"{}s\"", FIRST_HOST_CONNECT_TIMEOUT.as_secs()),
    ))
    .await;
    let started = Instant::now();
    let api = Api::new(&daemon.api, Duration::from_secs(20));
    let who = ledger::WRITERS[1];
    let body = r#"{"request_id":"first","amount":"12.00","item":"x","recipient":"r@example.com"}"#;
    loop {
        if let Answer::Reply(r) = api.post(who, "first-order", body.to_owned()).await {
            if r.status == 201 {
                break;
            }
        }
        assert!(daemon.alive(), "serve exited:\n{}", daemon.stderr());
        assert!(started.elapsed() < BOUND, "no 201:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = daemon.metrics().await;
    let series = |suffix: &str, le: &str| {
        sample(
            &metrics,
            &format!(
                "tombstoned_http_request_duration_seconds_{suffix}{{route=\"/v1/orders\"{le}}}"
            ),
        )
    };
    assert_eq!(
        series("bucket", ",le=\"2.5\""),
        series("count", ""),
        "a POST took over 2.5 s in the daemon (connect_timeout {FIRST_HOST_CONNECT_TIMEOUT:?})"
    );
    let observer = connect(&db.url, "test").await;
    let row = observer
        .query_one(
            "SELECT (SELECT min(backend_start) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'tombstoned/api'),
                    (SELECT created_at FROM orders)",
            &[],
        )
        .await
        .unwrap();
    let (pooled, ordered): (SystemTime, SystemTime) = (row.get(0), row.get(1));
    assert!(daemon.terminate().await.success());
    let since_spawn = |t: SystemTime| t.duration_since(spawned).unwrap_or_default();
    (since_spawn(pooled), since_spawn(ordered))
}

/// Test 3: the first host of the daemon's URL unreachable — a listener that never answers, a
/// closed port: `serve` starts and creates an order through the second host within the
/// connect timeout plus a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_starts_and_serves_through_the_second_host_when_the_first_is_unreachable() {
    let real_port = harness::server().get_ports()[0];
    let (silent, _held) = silent_listener().await;
    let closed = free_port();
    let mut figures = String::new();
    for (what, first) in [("silent listener", silent), ("closed port", closed)] {
        // Each run on a database of its own (the order's request_id is fixed).
        let db = TestDb::new().await;
        let url = format!(
            "{} host=127.0.0.1,127.0.0.1 port={first},{real_port}",
            db.url
        );
        let (pooled, ordered) = time_to_first_order(&db, &url).await;
        figures += &format!(
            "first host a {what}: the API pool's first session on the second host {pooled:?} \
             after the spawn, the first order's transaction {ordered:?} (connect_timeout \
             {FIRST_HOST_CONNECT_TIMEOUT:?})\n"
        );
        assert!(
            pooled <= FIRST_HOST_CONNECT_TIMEOUT + FIRST_HOST_MARGIN,
            "{figures}"
        );
    }
    crate::publish_figures("failover-first-host-unreachable", &figures);
}

/// Test 5: a daemon whose URL reaches only a standby is not ready (503, the reason in the
/// body) and never starts a cleanup run there: its scheduler counts the skips.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readyz_on_a_standby_only_url_is_not_ready_and_no_cleanup_run_is_attempted() {
    let pair = Pair::start(Replication::Asynchronous).await;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=ha",
        pair.standby.port()
    );
    let mut daemon = Daemon::launch(DaemonSpec::new(&url)).await;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let body = loop {
        assert!(daemon.alive(), "serve exited:\n{}", daemon.stderr());
        if let Ok(r) = http.get(format!("{}/readyz", daemon.ops)).send().await {
            if r.status() == 503 {
                let body = r.text().await.unwrap();
                if body.contains("read-only") {
                    break body;
                }
            }
        }
        assert!(started.elapsed() < BOUND, "/readyz never said read-only");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.contains("pg_is_in_recovery"), "{body}");
    let skipped = "tombstoned_cleanup_runs_total{outcome=\"skipped_read_only\"}";
    until(
        "the scheduler skips a run on the standby",
        BOUND,
        || async { daemon.metric(skipped).await >= 2.0 },
    )
    .await;
    let metrics = daemon.metrics().await;
    for outcome in ["success", "failed", "partial", "skipped_lease"] {
        let series = format!("tombstoned_cleanup_runs_total{{outcome=\"{outcome}\"}}");
        assert_eq!(sample(&metrics, &series), 0.0, "{series}\n{metrics}");
    }
    assert!(daemon.terminate().await.success());
    // Nothing reached the primary either (the standby can write nothing by itself).
    let primary = connect(&pair.primary.url("ha"), "test").await;
    let (runs, leases): (i64, i64) = {
        let row = primary
            .query_one(
                "SELECT (SELECT count(*) FROM cleanup_runs), (SELECT count(*) FROM cleanup_lease)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((runs, leases), (0, 0), "no run recorded, no lease taken");
    crate::publish_figures(
        "failover-standby-only",
        &format!(
            "standby-only URL: /readyz 503 with {body:?}; {} runs skipped read-only, none \
             started\n",
            sample(&metrics, skipped)
        ),
    );
}

/// Three daemons on one database, the stress clients spread over them: every invariant holds,
/// and the cleaners take turns — no two recorded runs' [started, finished] intervals overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_daemons_on_one_database_keep_the_invariants_and_clean_one_at_a_time() {
    let db = TestDb::new().await;
    let spec = busy_cleaner(&db.url).set("cleanup", "history_runs", "10000");
    let mut daemons = Vec::new();
    for _ in 0..3 {
        daemons.push(Daemon::start(spec.clone()).await);
    }
    let bases: Vec<&str> = daemons.iter().map(|d| d.api.as_str()).collect();
    let load = Background::start(&bases, 4, "three");
    let observer = connect(&db.url, "test").await;
    let started = Instant::now();
    // Load for a while, with several cleanup runs recorded.
    until(
        "runs recorded under load",
        Duration::from_secs(60),
        || async {
            started.elapsed() >= Duration::from_secs(15)
                && observer
                    .query_one("SELECT count(*) FROM cleanup_runs", &[])
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
                    >= 5
        },
    )
    .await;
    let ledger = load.stop_and_settle().await;
    let mut per_daemon = Vec::new();
    for d in &mut daemons {
        let m = d.metrics().await;
        per_daemon.push((
            sample(&m, "tombstoned_cleanup_runs_total{outcome=\"success\"}"),
            sample(
                &m,
                "tombstoned_cleanup_runs_total{outcome=\"skipped_lease\"}",
            ),
        ));
        let status = d.terminate().await;
        assert!(status.success(), "exit {status}:\n{}", d.stderr());
    }
    let state = DbState::load(&observer).await;
    let verdict = ledger::check(&ledger, &state, CheckOptions::default());
    let overlaps: Vec<String> = observer
        .query(
            "SELECT format('%s [%s, %s] %s/%s %s batches and %s [%s, %s] %s/%s %s batches',
                           a.instance, a.started_at, a.finished_at, a.outcome, a.stopped_by,
                           a.batches, b.instance, b.started_at, b.finished_at, b.outcome,
                           b.stopped_by, b.batches)
             FROM cleanup_runs a JOIN cleanup_runs b ON a.run_id < b.run_id
             WHERE a.started_at < b.finished_at AND b.started_at < a.finished_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let row = observer
        .query_one(
            "SELECT count(*), count(DISTINCT split_part(instance, ':', 2)),
                    coalesce(sum(rows_tombstoned), 0)::bigint,
                    count(*) FILTER (WHERE stopped_by = 'lease_lost')
             FROM cleanup_runs",
            &[],
        )
        .await
        .unwrap();
    let (runs, cleaning_daemons, tombstoned, lease_lost): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    let figures = format!(
        "three daemons, 4 stress clients each, {:.1} s: {runs} cleanup runs recorded by {} \
         daemon(s), {tombstoned} rows tombstoned, {} overlapping runs, {lease_lost} stopped by a \
         lost lease; per daemon (success, \
         skipped_lease): {per_daemon:?}\n{}",
        started.elapsed().as_secs_f64(),
        cleaning_daemons,
        overlaps.len(),
        verdict.figures()
    );
    crate::publish_figures("three-daemons", &figures);
    assert!(overlaps.is_empty(), "runs overlapped: {overlaps:#?}");
    // A run loses its lease only to a taker that judged it gone: none here (every holder lived).
    assert_eq!(lease_lost, 0, "{figures}");
    verdict.assert_clean();
    assert_eq!(five_hundreds(&ledger), 0, "no 500");
    let successes: f64 = per_daemon.iter().map(|(s, _)| s).sum();
    let skipped: f64 = per_daemon.iter().map(|(_, k)| k).sum();
    assert!(successes >= 5.0 && tombstoned > 0, "{figures}");
    assert!(skipped > 0.0, "the lease was contended: {figures}");
}
