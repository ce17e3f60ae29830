//! The load clients: concurrent tasks sending a weighted mix of requests (new keys, retries,
//! dropped responses and their retries, changed amounts, existing request_ids under new keys,
//! bursts of one request at once, reads), each recorded in the [`Ledger`].

#![allow(dead_code)] // each test module uses a different subset

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

use crate::ledger::{
    Answer, Exchange, Intent, Kind, Ledger, Read, ReadKind, Reply, SharedPool, Who, WRITERS,
};

/// A small deterministic generator (xorshift64*), so a failing run can be replayed by seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Weights of the request mix.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    pub new: u64,
    pub over_limit: u64,
    pub retry: u64,
    pub dropped: u64,
    pub changed: u64,
    pub duplicate_same: u64,
    pub duplicate_other: u64,
    pub burst: u64,
    pub read: u64,
}

impl Mix {
    /// The stress mix.
    pub fn stress() -> Mix {
        Mix {
            new: 26,
            over_limit: 2,
            retry: 24,
            dropped: 10,
            changed: 8,
            duplicate_same: 7,
            duplicate_other: 5,
            burst: 6,
            read: 12,
        }
    }

    /// Mostly new keys and retries (fault tests).
    pub fn simple() -> Mix {
        Mix {
            new: 50,
            over_limit: 0,
            retry: 30,
            dropped: 5,
            changed: 5,
            duplicate_same: 5,
            duplicate_other: 0,
            burst: 5,
            read: 0,
        }
    }

    fn total(&self) -> u64 {
        self.new
            + self.over_limit
            + self.retry
            + self.dropped
            + self.changed
            + self.duplicate_same
            + self.duplicate_other
            + self.burst
            + self.read
    }
}

/// One load client's connection to the API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    /// The client's deadline for one request.
    pub deadline: Duration,
}

impl Api {
    pub fn new(base: &str, deadline: Duration) -> Api {
        Api {
            base: base.to_owned(),
            http: reqwest::Client::builder()
                .timeout(deadline)
                .pool_max_idle_per_host(64)
                .build()
                .unwrap(),
            deadline,
        }
    }

    /// A sent request's result, read whole.
    pub async fn answer_of(result: Result<reqwest::Response, reqwest::Error>) -> Answer {
        answer(match result {
            Ok(response) => Reply::read(response).await,
            Err(e) => Err(e),
        })
    }

    /// `POST /v1/orders`, read whole.
    pub async fn post(&self, who: Who, key: &str, body: String) -> Answer {
        let result = self
            .http
            .post(format!("{}/v1/orders", self.base))
            .bearer_auth(who.token)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        answer(match result {
            Ok(response) => Reply::read(response).await,
            Err(e) => Err(e),
        })
    }

    /// `GET <path>`, read whole.
    pub async fn get(&self, who: Who, path: &str) -> Answer {
        let result = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(who.token)
            .send()
            .await;
        answer(match result {
            Ok(response) => Reply::read(response).await,
            Err(e) => Err(e),
        })
    }

    /// Sends the whole request on a fresh connection and closes it without reading anything.
    pub async fn post_and_vanish(&self, who: Who, key: &str, body: &str) {
        let address = self.base.trim_start_matches("http://").to_owned();
        let Ok(mut socket) = tokio::net::TcpStream::connect(&address).await else {
            return;
        };
        let request = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\n\
             Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            who.token,
            body.len()
        );
        let _ = socket.write_all(request.as_bytes()).await;
        drop(socket);
    }

    /// Sends through reqwest and abandons the future after `after` (possibly before anything
    /// was sent, possibly while the server works on it).
    pub async fn post_and_abandon(&self, who: Who, key: &str, body: String, after: Duration) {
        let _ = tokio::time::timeout(after, self.post(who, key, body)).await;
    }
}

fn answer(result: Result<Reply, reqwest::Error>) -> Answer {
    match result {
        Ok(reply) => Answer::Reply(reply),
        Err(e) if e.is_timeout() => Answer::TimedOut,
        Err(e) => Answer::Transport(format!("{e:?}")),
    }
}

/// A load: `clients` tasks against `api` until `stop` is set, each with its own generator.
pub struct LoadSpec {
    pub clients: usize,
    pub mix: Mix,
    pub seed: u64,
    /// Prefix for keys and request ids (unique per run).
    pub tag: String,
}

/// Runs clients until `stop` becomes true; returns when every client has finished its current
/// request.
pub async fn run(
    api: &Api,
    spec: &LoadSpec,
    ledger: &Arc<Ledger>,
    pool: &SharedPool,
    stop: &Arc<AtomicBool>,
) {
    let tasks: Vec<_> = (0..spec.clients)
        .map(|c| {
            let client = Client {
                id: c,
                api: api.clone(),
                ledger: Arc::clone(ledger),
                pool: Arc::clone(pool),
                rng: Rng::new(spec.seed ^ ((c as u64 + 1) << 32)),
                mix: spec.mix,
                tag: spec.tag.clone(),
                counter: 0,
            };
            let stop = Arc::clone(stop);
            tokio::spawn(async move { client.run(stop).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// Runs clients for `duration`.
pub async fn run_for(
    api: &Api,
    spec: &LoadSpec,
    ledger: &Arc<Ledger>,
    pool: &SharedPool,
    duration: Duration,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            stop.store(true, Ordering::SeqCst);
        })
    };
    run(api, spec, ledger, pool, &stop).await;
    timer.await.unwrap();
}

struct Client {
    id: usize,
    api: Api,
    ledger: Arc<Ledger>,
    pool: SharedPool,
    rng: Rng,
    mix: Mix,
    tag: String,
    counter: u64,
}

impl Client {
    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::SeqCst) {
            self.step().await;
        }
    }

    fn fresh(&mut self, who: Who) -> Intent {
        self.counter += 1;
        let n = self.counter;
        let (tag, id) = (&self.tag, self.id);
        Intent {
            who,
            key: format!("k-{tag}-{id}-{n}"),
            request_id: format!("r-{tag}-{id}-{n}"),
            // 1.00 .. 4999.99 CNY: within alice's limit.
            amount_minor: 100 + self.rng.below(499_900) as i64,
            item: format!("item-{}", self.rng.below(50)),
            quantity: 1 + (self.rng.below(4) as i32) * i32::from(self.rng.below(3) == 0),
            recipient: format!("recipient-{tag}-{id}-{n}@example.com"),
        }
    }

    fn writer(&mut self) -> Who {
        WRITERS[self.rng.below(WRITERS.len() as u64) as usize]
    }

    /// An intent from the pool: half the time one of the most recent (likely still inside the
    /// replay window), otherwise any (likely a tombstone by now).
    fn pick(&mut self) -> Option<Intent> {
        let pool = self.pool.lock().unwrap();
        let n = pool.intents.len() as u64;
        if n == 0 {
            return None;
        }
        let i = if self.rng.below(2) == 0 {
            n - 1 - self.rng.below(n.min(64))
        } else {
            self.rng.below(n)
        };
        Some(pool.intents[i as usize].clone())
    }

    fn remember(&self, intent: &Intent) {
        self.pool.lock().unwrap().intents.push(intent.clone());
    }

    /// A known intent half the time (when there is one), else a fresh one, remembered.
    fn known_or_fresh(&mut self) -> Intent {
        match self.pick() {
            Some(i) if self.rng.below(2) == 0 => i,
            _ => {
                let who = self.writer();
                let i = self.fresh(who);
                self.remember(&i);
                i
            }
        }
    }

    async fn send(&mut self, kind: Kind, intent: &Intent) -> Answer {
        let spelling = self.rng.next();
        let sent_at = SystemTime::now();
        let answer = self
            .api
            .post(intent.who, &intent.key, intent.body(spelling))
            .await;
        self.record(kind, intent, sent_at, answer.clone());
        answer
    }

    fn record(&self, kind: Kind, intent: &Intent, sent_at: SystemTime, answer: Answer) {
        if let Answer::Reply(r) = &answer {
            if matches!(r.status, 200 | 201) {
                if let Some(id) = serde_json::from_str::<serde_json::Value>(&r.text)
                    .ok()
                    .and_then(|j| j["order_id"].as_str().and_then(|s| Uuid::parse_str(s).ok()))
                {
                    self.pool.lock().unwrap().orders.push((id, intent.clone()));
                }
            }
        }
        self.ledger.record(Exchange {
            client: self.id,
            kind,
            intent: intent.clone(),
            fingerprint: intent.fingerprint(),
            sent_at,
            answered_at: SystemTime::now(),
            answer,
        });
    }

    async fn step(&mut self) {
        let mut roll = self.rng.below(self.mix.total());
        let mut take = |weight: u64| {
            let hit = roll < weight;
            roll = roll.saturating_sub(weight);
            hit
        };
        let m = self.mix;
        if take(m.new) {
            let who = self.writer();
            let intent = self.fresh(who);
            self.remember(&intent);
            self.send(Kind::New, &intent).await;
        } else if take(m.over_limit) {
            // alice's limit is 5000.00 CNY: a stored 422, replayed like a success.
            let mut intent = self.fresh(WRITERS[0]);
            intent.amount_minor = 500_001 + self.rng.below(1_000_000) as i64;
            self.remember(&intent);
            self.send(Kind::OverLimit, &intent).await;
        } else if take(m.retry) {
            let Some(intent) = self.pick() else { return };
            let was_dropped = self.pool.lock().unwrap().dropped.remove(&intent.key);
            let kind = if was_dropped {
                Kind::RetryAfterDrop
            } else {
                Kind::Retry
            };
            self.send(kind, &intent).await;
        } else if take(m.dropped) {
            let intent = self.known_or_fresh();
            self.pool.lock().unwrap().dropped.insert(intent.key.clone());
            let sent_at = SystemTime::now();
            let body = intent.body(self.rng.next());
            if self.rng.below(2) == 0 {
                self.api
                    .post_and_vanish(intent.who, &intent.key, &body)
                    .await;
            } else {
                let after = Duration::from_millis(self.rng.below(8));
                self.api
                    .post_and_abandon(intent.who, &intent.key, body, after)
                    .await;
            }
            self.record(Kind::Dropped, &intent, sent_at, Answer::Dropped);
        } else if take(m.changed) {
            let Some(mut intent) = self.pick() else {
                return;
            };
            intent.amount_minor += 1 + self.rng.below(100) as i64;
            self.send(Kind::ChangedAmount, &intent).await;
        } else if take(m.duplicate_same) {
            let Some(mut intent) = self.pick() else {
                return;
            };
            self.counter += 1;
            intent.key = format!("k-{}-{}-{}-dup", self.tag, self.id, self.counter);
            self.remember(&intent);
            self.send(Kind::DuplicateSame, &intent).await;
        } else if take(m.duplicate_other) {
            let Some(mut intent) = self.pick() else {
                return;
            };
            self.counter += 1;
            intent.key = format!("k-{}-{}-{}-other", self.tag, self.id, self.counter);
            // Another principal of the same tenant, or other parameters.
            match (intent.who.principal, self.rng.below(2)) {
                ("alice", 0) => intent.who = WRITERS[1],
                ("bob", 0) => intent.who = WRITERS[0],
                _ => intent.item.push_str("-changed"),
            }
            self.remember(&intent);
            self.send(Kind::DuplicateOther, &intent).await;
        } else if take(m.burst) {
            let intent = self.known_or_fresh();
            let copies = 2 + self.rng.below(3);
            let sends: Vec<_> = (0..copies)
                .map(|_| {
                    let (api, body) = (self.api.clone(), intent.body(self.rng.next()));
                    let (who, key) = (intent.who, intent.key.clone());
                    async move {
                        let sent_at = SystemTime::now();
                        (sent_at, api.post(who, &key, body).await)
                    }
                })
                .collect();
            for (sent_at, answer) in futures::future::join_all(sends).await {
                self.record(Kind::Burst, &intent, sent_at, answer);
            }
        } else {
            self.read().await;
        }
    }

    async fn read(&mut self) {
        match self.rng.below(4) {
            0 | 1 => {
                let Some(intent) = self.pick() else { return };
                let path = format!("/v1/idempotency-keys/{}", intent.key);
                let (kind, reader) = if self.rng.below(4) == 0 {
                    (ReadKind::KeyStatusOtherTenant, other_tenant(intent.who))
                } else {
                    (ReadKind::KeyStatus, intent.who)
                };
                let answer = self.api.get(reader, &path).await;
                self.ledger.record_read(Read {
                    kind,
                    reader,
                    intent,
                    order_id: None,
                    answer,
                });
            }
            _ => {
                let picked = {
                    let pool = self.pool.lock().unwrap();
                    let n = pool.orders.len() as u64;
                    (n > 0).then(|| pool.orders[self.rng.below(n) as usize].clone())
                };
                let Some((id, intent)) = picked else { return };
                let (kind, reader) = if self.rng.below(3) == 0 {
                    (ReadKind::OrderOtherTenant, other_tenant(intent.who))
                } else {
                    (ReadKind::Order, intent.who)
                };
                let answer = self.api.get(reader, &format!("/v1/orders/{id}")).await;
                self.ledger.record_read(Read {
                    kind,
                    reader,
                    intent,
                    order_id: Some(id),
                    answer,
                });
            }
        }
    }
}

/// A writer of another tenant.
pub fn other_tenant(who: Who) -> Who {
    *WRITERS
        .iter()
        .find(|w| w.tenant != who.tenant)
        .expect("two tenants")
}

/// After a fault: every intent whose last answer was not a definite one (dropped, connection
/// failed, 503, 409 in progress) is retried until it gets one, so each key's fate is settled.
pub async fn settle(api: &Api, ledger: &Arc<Ledger>, pool: &SharedPool, within: Duration) {
    let deadline = Instant::now() + within;
    let intents = pool.lock().unwrap().intents.clone();
    for intent in intents {
        let mut spelling = 0;
        loop {
            let sent_at = SystemTime::now();
            let answer = api
                .post(intent.who, &intent.key, intent.body(spelling))
                .await;
            spelling += 1;
            let settled = match &answer {
                Answer::Reply(r) => {
                    !(r.status == 503 || (r.status == 409 && r.problem() == "request-in-progress"))
                }
                _ => false,
            };
            ledger.record(Exchange {
                client: usize::MAX,
                kind: Kind::RetryAfterFault,
                intent: intent.clone(),
                fingerprint: intent.fingerprint(),
                sent_at,
                answered_at: SystemTime::now(),
                answer,
            });
            if settled {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "key {} never settled after the fault",
                intent.key
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
