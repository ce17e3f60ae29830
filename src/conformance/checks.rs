//! The nine checks, each one rule of the idempotency contract asked of the service over HTTP and
//! judged from its answers alone. They run in [`CHECKS`]' order on one [`Run`], which remembers
//! the first check's key and answer for the checks that ask about that key again. Keys are fresh
//! random UUIDs per check, and each key's bodies carry an id of their own in place of
//! `{{uuid}}`, so a run can be repeated against a live service.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use tokio::sync::Barrier;
use tokio::time::Instant;
use uuid::Uuid;

use super::body::{excerpt, repeated, respelled};
use super::client::{retry_after, Client, Outgoing, MAX_PENDING_RETRIES};
use super::plan::Plan;
use super::report::{Answer, CheckReport, Exchange, NoAnswer, Outcome};

/// The checks' names, in the order they run and are reported.
pub const CHECKS: [&str; 9] = [
    "first",
    "replay",
    "replay_reordered",
    "key_reused",
    "concurrent",
    "missing_key",
    "invalid_key",
    "scoped",
    "expired",
];

/// 4xx statuses that are not a final answer to a first request: refused before the key counted
/// (bad request, credentials, route), or the key's other answers (in progress, reused, limited).
const NOT_FINAL: [u16; 7] = [400, 401, 403, 404, 409, 422, 429];

/// The longest idempotency key the protocol accepts; `invalid_key` sends one character more.
pub const MAX_KEY_CHARS: usize = 255;

/// What a first answer is, in the report's words.
const FINAL: &str = "2xx, or a 4xx other than 400, 401, 403, 404, 409, 422 and 429";

/// One key, and the id its bodies carry in place of `{{uuid}}`.
#[derive(Debug, Clone)]
struct Intent {
    key: String,
    id: Uuid,
}

impl Intent {
    fn fresh() -> Intent {
        Intent {
            key: Uuid::new_v4().to_string(),
            id: Uuid::new_v4(),
        }
    }
}

/// The `first` check's key and answer, and when the answer came.
#[derive(Debug)]
struct First {
    intent: Intent,
    answer: Answer,
    at: Instant,
}

/// What a judgement found wrong: the part of the rule not met, and what came instead.
type Broken = (String, String);

/// A check under way.
struct Check {
    name: &'static str,
    expected: String,
    requests: Vec<Exchange>,
}

impl Check {
    fn new(name: &'static str, expected: impl Into<String>) -> Check {
        Check {
            name,
            expected: expected.into(),
            requests: Vec::new(),
        }
    }

    /// Keeps `exchange` in the report; its answer, or why there is none.
    fn record(&mut self, exchange: Exchange) -> Result<Answer, NoAnswer> {
        let outcome = match (&exchange.answer, &exchange.error) {
            (Some(answer), _) => Ok(answer.clone()),
            (None, Some(error)) => Err(error.clone()),
            (None, None) => Err(NoAnswer::Failed("nothing came".to_owned())),
        };
        self.requests.push(exchange);
        outcome
    }

    fn report(self, result: Outcome, expected: String, got: String) -> CheckReport {
        CheckReport {
            name: self.name,
            result,
            expected,
            got,
            requests: self.requests,
        }
    }

    fn pass(self, got: String) -> CheckReport {
        let expected = self.expected.clone();
        self.report(Outcome::Pass, expected, got)
    }

    fn fail(self, (expected, got): Broken) -> CheckReport {
        self.report(Outcome::Fail, expected, got)
    }

    /// A failure for want of an answer: the check's whole expectation, and why none came.
    fn no_answer(self, why: &NoAnswer) -> CheckReport {
        let expected = self.expected.clone();
        self.report(Outcome::Fail, expected, why.to_string())
    }

    fn skip(self, why: impl Into<String>) -> CheckReport {
        let expected = self.expected.clone();
        self.report(Outcome::Skip, expected, why.into())
    }

    fn verdict(self, judged: Result<String, Broken>) -> CheckReport {
        match judged {
            Ok(got) => self.pass(got),
            Err(broken) => self.fail(broken),
        }
    }
}

/// An answer in one line: status, problem type, replay mark, `Location`, body.
fn describe(answer: &Answer) -> String {
    let mut out = answer.status.to_string();
    if answer.is_problem() {
        out.push_str(" application/problem+json");
    }
    if answer.replayed() {
        out.push_str(" with Idempotent-Replayed: true");
    }
    if let Some(location) = answer.location() {
        out.push_str(&format!(", Location {location}"));
    }
    format!("{out}, body {}", excerpt(&answer.body))
}

fn is_final(status: u16) -> bool {
    (200..300).contains(&status) || ((400..500).contains(&status) && !NOT_FINAL.contains(&status))
}

/// A final answer to a request under a fresh key, not marked as a replay.
fn fresh_answer(answer: &Answer) -> Result<String, Broken> {
    if !is_final(answer.status) {
        return Err((format!("a final answer ({FINAL})"), describe(answer)));
    }
    if answer.replayed() {
        return Err((
            "a fresh answer, not marked Idempotent-Replayed (a business id used before turns a \
             fresh key into a replay: write it as {{uuid}} in --body)"
                .to_owned(),
            describe(answer),
        ));
    }
    Ok(describe(answer))
}

/// `answer` is a replay of `original` (`whose`, e.g. "the first answer"): the same status, the
/// same body byte for byte, `Idempotent-Replayed: true`, and `original`'s `Location` if it had
/// one.
fn replay_of(original: &Answer, answer: &Answer, whose: &str) -> Result<String, Broken> {
    if answer.status != original.status {
        return Err((
            format!("{whose}'s status {} again", original.status),
            describe(answer),
        ));
    }
    if !answer.replayed() {
        return Err((
            "Idempotent-Replayed: true".to_owned(),
            format!("{} without it", describe(answer)),
        ));
    }
    if answer.body != original.body {
        let at = answer
            .body
            .iter()
            .zip(&original.body)
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| answer.body.len().min(original.body.len()));
        return Err((
            format!("{whose}'s body byte for byte ({})", excerpt(&original.body)),
            format!("{}, differing from byte {at} on", excerpt(&answer.body)),
        ));
    }
    if let Some(location) = original.location() {
        if answer.location() != Some(location) {
            return Err((
                format!("{whose}'s Location {location}"),
                answer
                    .location()
                    .map_or_else(|| "no Location".to_owned(), |l| format!("Location {l}")),
            ));
        }
    }
    Ok(format!("a replay: {}", describe(answer)))
}

/// `answer` refuses a key reused for another intent: 422, a problem document, and nothing of
/// `first`'s body in it but what `sent` carried.
fn reuse_refused(first: &Answer, sent: &str, answer: &Answer) -> Result<String, Broken> {
    if answer.status != 422 {
        return Err((
            "422 (the key was used for another request)".to_owned(),
            describe(answer),
        ));
    }
    if !answer.is_problem() {
        return Err((
            "Content-Type application/problem+json".to_owned(),
            format!(
                "{} of Content-Type {}",
                describe(answer),
                answer.header("content-type").unwrap_or("(none)")
            ),
        ));
    }
    let leaked = repeated(&first.body, sent.as_bytes(), &answer.body);
    if !leaked.is_empty() {
        return Err((
            "nothing of the first answer in the refusal".to_owned(),
            format!("{} repeating {}", describe(answer), leaked.join(", ")),
        ));
    }
    Ok(describe(answer))
}

/// A 400 problem.
fn bad_request(answer: &Answer, what: &str) -> Result<String, Broken> {
    if answer.status == 400 && answer.is_problem() {
        Ok(describe(answer))
    } else {
        Err((
            format!("400 application/problem+json for {what}"),
            describe(answer),
        ))
    }
}

/// How long to wait before asking again, when `answer` says the key is in progress (409 with
/// `Retry-After`).
fn in_progress(answer: &Answer) -> Option<Duration> {
    (answer.status == 409)
        .then(|| answer.header("retry-after").and_then(retry_after))
        .flatten()
}

/// An answer that asks to be retried later without answering: in progress (409), limited (429)
/// or unavailable (503), each with `Retry-After`.
fn asks_to_wait(answer: &Answer) -> Option<Duration> {
    [409, 429, 503]
        .contains(&answer.status)
        .then(|| answer.header("retry-after").and_then(retry_after))
        .flatten()
}

/// `answer` (to `out`), or while it is in progress the answer to `out` sent again after each
/// `Retry-After`, at most `times` times: the exchanges of the retries, and the last answer.
async fn settle(
    client: &Client,
    out: &Outgoing,
    mut answer: Answer,
    times: usize,
) -> (Vec<Exchange>, Result<Answer, NoAnswer>) {
    let mut retries = Vec::new();
    for _ in 0..times {
        let Some(wait) = in_progress(&answer) else {
            break;
        };
        if let Err(out_of_time) = client.pause(wait).await {
            return (retries, Err(out_of_time));
        }
        let exchange = client.send(out.clone()).await;
        let next = exchange.answer.clone();
        let error = exchange.error.clone();
        retries.push(exchange);
        match (next, error) {
            (Some(next), _) => answer = next,
            (None, error) => {
                return (
                    retries,
                    Err(error.unwrap_or(NoAnswer::Failed("nothing came".to_owned()))),
                )
            }
        }
    }
    (retries, Ok(answer))
}

/// A run of the checks against one endpoint.
pub struct Run<'a> {
    plan: &'a Plan,
    client: Client,
    first: Option<First>,
}

impl<'a> Run<'a> {
    /// The checks of `plan`, sent through `client`.
    pub fn new(plan: &'a Plan, client: Client) -> Run<'a> {
        Run {
            plan,
            client,
            first: None,
        }
    }

    /// A request with `headers`, the key (if any) in the key header, and `body`.
    fn outgoing(
        &self,
        headers: &[(HeaderName, HeaderValue)],
        key: Option<&str>,
        body: String,
    ) -> Outgoing {
        let mut headers = headers.to_vec();
        if let Some(key) = key {
            // A key the header cannot carry is sent as the empty key (the checks' keys can).
            let value = HeaderValue::from_str(key).unwrap_or(HeaderValue::from_static(""));
            headers.push((self.plan.key_header.clone(), value));
        }
        Outgoing { headers, body }
    }

    /// `--body` under `intent`'s key, as the first principal.
    fn request(&self, intent: &Intent) -> Outgoing {
        self.outgoing(
            &self.plan.headers,
            Some(&intent.key),
            self.plan.body.render(intent.id),
        )
    }

    async fn send(&self, check: &mut Check, out: Outgoing) -> Result<Answer, NoAnswer> {
        check.record(self.client.send(out).await)
    }

    /// `first`: a fresh key gets a final answer, remembered for the checks after it. `Err` with
    /// the reason when no connection could be made at all.
    pub async fn first(&mut self) -> Result<CheckReport, String> {
        let mut check = Check::new(
            "first",
            format!("a final answer to a fresh key ({FINAL}), not marked Idempotent-Replayed"),
        );
        let intent = Intent::fresh();
        let out = self.request(&intent);
        let answer = match self.send(&mut check, out).await {
            Ok(answer) => answer,
            Err(NoAnswer::Unreachable(reason)) => return Err(reason),
            Err(why) => return Ok(check.no_answer(&why)),
        };
        let judged = fresh_answer(&answer);
        if judged.is_ok() {
            self.first = Some(First {
                intent,
                answer,
                at: Instant::now(),
            });
        }
        Ok(check.verdict(judged))
    }

    /// Skips `check` when `first` gave nothing to compare with.
    fn without_first(check: Check) -> CheckReport {
        check.skip("no first answer to compare with: `first` failed")
    }

    /// `replay`: the same key and body get the first answer again.
    pub async fn replay(&self) -> CheckReport {
        let check = Check::new(
            "replay",
            "the first answer again: its status, its body byte for byte, Idempotent-Replayed: \
             true, and its Location if it had one",
        );
        let Some(first) = &self.first else {
            return Run::without_first(check);
        };
        self.replayed(check, first, self.request(&first.intent))
            .await
    }

    async fn replayed(&self, mut check: Check, first: &First, out: Outgoing) -> CheckReport {
        match self.send(&mut check, out).await {
            Ok(answer) => {
                let judged = replay_of(&first.answer, &answer, "the first answer");
                check.verdict(judged)
            }
            Err(why) => check.no_answer(&why),
        }
    }

    /// `replay_reordered`: the same key, the body's members reordered and its whitespace
    /// changed at every level, gets the first answer again.
    pub async fn replay_reordered(&self) -> CheckReport {
        let check = Check::new(
            "replay_reordered",
            "the first answer again for the same body with its members reordered and other \
             whitespace: its status, its body byte for byte, Idempotent-Replayed: true, its \
             Location",
        );
        let Some(first) = &self.first else {
            return Run::without_first(check);
        };
        let Ok(body) = respelled(&self.plan.body.render(first.intent.id)) else {
            return check.skip("--body cannot be re-spelled");
        };
        let out = self.outgoing(&self.plan.headers, Some(&first.intent.key), body);
        self.replayed(check, first, out).await
    }

    /// `key_reused`: the first key with `--other-body` is refused with 422, naming nothing of
    /// the first answer.
    pub async fn key_reused(&self) -> CheckReport {
        let mut check = Check::new(
            "key_reused",
            "422 application/problem+json for the first key with --other-body, with nothing of \
             the first answer in it",
        );
        let Some(first) = &self.first else {
            return Run::without_first(check);
        };
        let sent = self.plan.other_body.render(first.intent.id);
        let out = self.outgoing(&self.plan.headers, Some(&first.intent.key), sent.clone());
        match self.send(&mut check, out).await {
            Ok(answer) => {
                let judged = reuse_refused(&first.answer, &sent, &answer);
                check.verdict(judged)
            }
            Err(why) => check.no_answer(&why),
        }
    }

    /// `concurrent`: `--concurrency` requests with one fresh key, released together by a
    /// barrier, get exactly one answer not marked replayed; every other answer is a replay of
    /// it, or a 409 with `Retry-After` that, retried after it, ends as one. The retries go out
    /// one after the other once the longest `Retry-After` has passed: the burst is what is
    /// checked, and a second burst would only meet a per-key admission limit again.
    pub async fn concurrent(&self) -> CheckReport {
        let n = self.plan.concurrency;
        let mut check = Check::new(
            "concurrent",
            format!(
                "of {n} requests with one fresh key sent at once, exactly one answer not marked \
                 replayed; every other a byte-for-byte replay of it, or a 409 with Retry-After \
                 that ends as one when retried"
            ),
        );
        let out = self.request(&Intent::fresh());
        let barrier = Arc::new(Barrier::new(n));
        let racers: Vec<_> = (0..n)
            .map(|_| {
                let (client, out, barrier) = (self.client.clone(), out.clone(), barrier.clone());
                // Each on a task of its own: sent in parallel once all are ready to send.
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.send(out).await
                })
            })
            .collect();
        let mut answers = Vec::with_capacity(n);
        for racer in racers {
            let exchange = match racer.await {
                Ok(exchange) => exchange,
                Err(e) => {
                    return check.fail((
                        "every request sent".to_owned(),
                        format!("a sender failed: {e}"),
                    ))
                }
            };
            let answer = check.record(exchange);
            if let Ok(answer) = &answer {
                if answer.status == 409 && in_progress(answer).is_none() {
                    return check.fail(("a 409 to carry Retry-After".to_owned(), describe(answer)));
                }
            }
            answers.push(answer);
        }
        let longest = answers
            .iter()
            .filter_map(|a| a.as_ref().ok().and_then(in_progress))
            .max();
        let mut pending = 0;
        if let Some(wait) = longest {
            if let Err(why) = self.client.pause(wait).await {
                return check.no_answer(&why);
            }
            for answer in &mut answers {
                if !answer.as_ref().is_ok_and(|a| in_progress(a).is_some()) {
                    continue;
                }
                pending += 1;
                let retried = self.send(&mut check, out.clone()).await;
                *answer = match retried {
                    Ok(again) => {
                        let (retries, last) =
                            settle(&self.client, &out, again, MAX_PENDING_RETRIES - 1).await;
                        check.requests.extend(retries);
                        last
                    }
                    Err(why) => Err(why),
                };
            }
        }
        let judged = judge_race(answers, pending);
        check.verdict(judged)
    }

    /// `missing_key`: a request without the key header is refused with a 400 problem; with
    /// `--key-optional` skipped, provided it is answered as a first request.
    pub async fn missing_key(&self) -> CheckReport {
        let mut check = Check::new(
            "missing_key",
            if self.plan.key_optional {
                format!("a first answer without the key (--key-optional): {FINAL}")
            } else {
                "400 application/problem+json for a request without the key header".to_owned()
            },
        );
        let out = self.outgoing(
            &self.plan.headers,
            None,
            self.plan.body.render(Uuid::new_v4()),
        );
        let answer = match self.send(&mut check, out).await {
            Ok(answer) => answer,
            Err(why) => return check.no_answer(&why),
        };
        if self.plan.key_optional {
            return match fresh_answer(&answer) {
                Ok(got) => check.skip(format!(
                    "the key is optional (--key-optional), and the request without it got a \
                     first answer: {got}"
                )),
                Err((expected, got)) => check.fail((
                    format!("{expected} to a request without the key (--key-optional)"),
                    got,
                )),
            };
        }
        let judged = bad_request(&answer, "a request without the key");
        check.verdict(judged)
    }

    /// `invalid_key`: an empty key and a key of 256 characters are refused with a 400 problem
    /// each.
    pub async fn invalid_key(&self) -> CheckReport {
        let mut check = Check::new(
            "invalid_key",
            "400 application/problem+json for an empty key and for a key of 256 characters",
        );
        let long = format!("{}-", Uuid::new_v4().simple());
        let long = format!("{long}{}", "k".repeat(MAX_KEY_CHARS + 1 - long.len()));
        let mut got = Vec::new();
        for (key, what) in [
            (String::new(), "an empty key"),
            (long, "a key of 256 characters"),
        ] {
            let out = self.outgoing(
                &self.plan.headers,
                Some(&key),
                self.plan.body.render(Uuid::new_v4()),
            );
            match self.send(&mut check, out).await {
                Ok(answer) => match bad_request(&answer, what) {
                    Ok(answered) => got.push(format!("{what}: {answered}")),
                    Err(broken) => return check.fail(broken),
                },
                Err(why) => return check.no_answer(&why),
            }
        }
        check.pass(got.join("; "))
    }

    /// `scoped`: the first key and body sent as another principal never get the first
    /// principal's answer: a fresh first answer, or a refusal that names nothing of it.
    pub async fn scoped(&self) -> CheckReport {
        let mut check = Check::new(
            "scoped",
            "for the first key and body sent as the other principal, never the first \
             principal's answer: a fresh first answer, or a refusal (4xx) naming nothing of it",
        );
        if self.plan.other_principal_headers.is_empty() {
            return check.skip(
                "give --other-principal-header (credentials of another principal of the same \
                 tenant) to check that keys are scoped by principal",
            );
        }
        let Some(first) = &self.first else {
            return Run::without_first(check);
        };
        let sent = self.plan.body.render(first.intent.id);
        let out = self.outgoing(
            &self.plan.other_principal(),
            Some(&first.intent.key),
            sent.clone(),
        );
        let answer = match self.send(&mut check, out.clone()).await {
            Ok(answer) => answer,
            Err(why) => return check.no_answer(&why),
        };
        let (retries, last) = settle(&self.client, &out, answer, MAX_PENDING_RETRIES).await;
        check.requests.extend(retries);
        let answer = match last {
            Ok(answer) => answer,
            Err(why) => return check.no_answer(&why),
        };
        let judged = other_principal(&first.answer, &sent, &answer);
        check.verdict(judged)
    }

    /// `expired`: the first key and body, asked about once a second until `--expiry` after the
    /// first answer, are replayed until a 410 problem (with the first answer's `Location`)
    /// comes, never executed afresh; then `--other-body` with the key is still refused with 422.
    pub async fn expired(&self) -> CheckReport {
        let mut check = Check::new(
            "expired",
            "replays of the first answer, then within --expiry of it 410 \
             application/problem+json (with its Location), never a fresh execution; then 422 \
             for --other-body with the key",
        );
        let Some(expiry) = self.plan.expiry else {
            return check.skip(
                "give --expiry DURATION (the replay window and the cleanup's delay) to check \
                 what the key answers after its window",
            );
        };
        let Some(first) = &self.first else {
            return Run::without_first(check);
        };
        let deadline = first.at + expiry;
        let window = humantime::format_duration(expiry);
        let mut replays = 0;
        let gone = loop {
            let answer = match self.send(&mut check, self.request(&first.intent)).await {
                Ok(answer) => answer,
                Err(why) => return check.no_answer(&why),
            };
            let mut wait = self.plan.expiry_interval();
            if answer.status == 410 {
                break answer;
            } else if let Some(asked) = asks_to_wait(&answer) {
                wait = wait.max(asked);
            } else if answer.replayed() && answer.status == first.answer.status {
                // Still inside the window. Its bytes are `replay`'s to judge; this check looks
                // for a fresh execution and for the 410.
                replays += 1;
            } else if (200..300).contains(&answer.status) && !answer.replayed() {
                return check.fail((
                    "a replay or 410, never a fresh execution".to_owned(),
                    format!(
                        "a fresh execution after {replays} replays: {}",
                        describe(&answer)
                    ),
                ));
            } else {
                return check.fail((
                    "a replay of the first answer, or 410".to_owned(),
                    describe(&answer),
                ));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return check.fail((
                    format!("410 within {window} of the first answer (--expiry)"),
                    format!(
                        "{replays} replays and no 410; the last answer: {}",
                        describe(&answer)
                    ),
                ));
            }
            // The last request goes out when the expiry is over.
            if let Err(why) = self.client.pause(wait.min(left)).await {
                return check.no_answer(&why);
            }
        };
        if !gone.is_problem() {
            return check.fail((
                "the 410 as application/problem+json".to_owned(),
                describe(&gone),
            ));
        }
        if let Some(location) = first.answer.location() {
            if gone.location() != Some(location) {
                return check.fail((
                    format!("the 410 with the first answer's Location {location}"),
                    describe(&gone),
                ));
            }
        }
        let sent = self.plan.other_body.render(first.intent.id);
        let out = self.outgoing(&self.plan.headers, Some(&first.intent.key), sent.clone());
        let reused = match self.send(&mut check, out).await {
            Ok(answer) => answer,
            Err(why) => return check.no_answer(&why),
        };
        match reuse_refused(&first.answer, &sent, &reused) {
            Ok(refused) => check.pass(format!(
                "{replays} replays, then {}; --other-body after it: {refused}",
                describe(&gone)
            )),
            Err((expected, got)) => check.fail((format!("after the 410, {expected}"), got)),
        }
    }
}

/// `concurrent`'s rule over the last answer of each request (`pending` of them were retried
/// after a 409).
fn judge_race(lasts: Vec<Result<Answer, NoAnswer>>, pending: usize) -> Result<String, Broken> {
    let n = lasts.len();
    let mut answers = Vec::with_capacity(n);
    for last in lasts {
        match last {
            Ok(answer) => answers.push(answer),
            Err(why) => return Err(("an answer to every request".to_owned(), why.to_string())),
        }
    }
    if let Some(stuck) = answers.iter().find(|a| in_progress(a).is_some()) {
        return Err((
            format!("every 409 to end as a replay within {MAX_PENDING_RETRIES} retries"),
            format!("still {}", describe(stuck)),
        ));
    }
    let fresh: Vec<&Answer> = answers.iter().filter(|a| !a.replayed()).collect();
    let original = match fresh.as_slice() {
        [one] => *one,
        [] => {
            return Err((
                "exactly one answer not marked replayed".to_owned(),
                format!("none: all {n} marked Idempotent-Replayed: true"),
            ))
        }
        many => {
            let statuses: Vec<String> = many.iter().map(|a| a.status.to_string()).collect();
            let executed = many
                .iter()
                .filter(|a| (200..300).contains(&a.status))
                .count();
            let verdict = if executed > 1 {
                ": the request ran more than once"
            } else {
                ""
            };
            return Err((
                "exactly one answer not marked replayed".to_owned(),
                format!("{} ({}){verdict}", many.len(), statuses.join(", ")),
            ));
        }
    };
    if !is_final(original.status) {
        return Err((
            format!("the one answer not marked replayed to be final ({FINAL})"),
            describe(original),
        ));
    }
    for answer in answers.iter().filter(|a| a.replayed()) {
        replay_of(original, answer, "the one answer not marked replayed")?;
    }
    Ok(format!(
        "1 answer ({}) and {} byte-for-byte replays of it, {pending} of them after a 409 with \
         Retry-After",
        original.status,
        n - 1
    ))
}

/// `scoped`'s rule: the other principal's answer is not the first principal's.
fn other_principal(first: &Answer, sent: &str, answer: &Answer) -> Result<String, Broken> {
    let expected = "never the first principal's answer";
    if answer.replayed() {
        return Err((
            expected.to_owned(),
            format!("a replay: {}", describe(answer)),
        ));
    }
    if !first.body.is_empty() && answer.body == first.body {
        return Err((
            expected.to_owned(),
            format!("its body byte for byte: {}", describe(answer)),
        ));
    }
    if first.location().is_some() && answer.location() == first.location() {
        return Err((
            expected.to_owned(),
            format!("its Location: {}", describe(answer)),
        ));
    }
    if [401, 403].contains(&answer.status) {
        return Err((
            "an answer to the other principal's credentials (--other-principal-header)".to_owned(),
            format!("{}: they were refused", describe(answer)),
        ));
    }
    if (200..300).contains(&answer.status) {
        return Ok(format!("a fresh first answer: {}", describe(answer)));
    }
    if (400..500).contains(&answer.status) {
        let leaked = repeated(&first.body, sent.as_bytes(), &answer.body);
        if !leaked.is_empty() {
            return Err((
                "a refusal naming nothing of the first principal's answer".to_owned(),
                format!("{} repeating {}", describe(answer), leaked.join(", ")),
            ));
        }
        return Ok(format!("a refusal: {}", describe(answer)));
    }
    Err((
        "a fresh first answer (2xx) or a refusal (4xx)".to_owned(),
        describe(answer),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::report::Header;

    fn answer(status: u16, headers: &[(&str, &str)], body: &str) -> Answer {
        Answer {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: (*n).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            body: body.as_bytes().to_vec(),
        }
    }

    const BODY: &str =
        r#"{"order_id": "0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f", "status": "created"}"#;
    const REPLAYED: (&str, &str) = ("idempotent-replayed", "true");
    const LOCATION: (&str, &str) = ("location", "/v1/orders/0192f1c4");

    #[test]
    fn first_answers_are_final_and_fresh() {
        for status in [200, 201, 202, 402, 410, 418] {
            assert!(fresh_answer(&answer(status, &[], BODY)).is_ok(), "{status}");
        }
        for status in [301, 400, 401, 403, 404, 409, 422, 429, 500, 503] {
            assert!(
                fresh_answer(&answer(status, &[], BODY)).is_err(),
                "{status}"
            );
        }
        let (expected, _) = fresh_answer(&answer(201, &[REPLAYED], BODY)).unwrap_err();
        assert!(expected.contains("{{uuid}}"), "{expected}");
    }

    #[test]
    fn a_replay_is_the_same_status_bytes_mark_and_location() {
        let original = answer(201, &[LOCATION], BODY);
        assert!(replay_of(&original, &answer(201, &[LOCATION, REPLAYED], BODY), "it").is_ok());
        let cases = [
            (
                answer(200, &[LOCATION, REPLAYED], BODY),
                "it's status 201 again",
            ),
            (answer(201, &[LOCATION], BODY), "Idempotent-Replayed: true"),
            (
                answer(201, &[LOCATION, REPLAYED], &BODY.replace(", ", ",")),
                "it's body byte for byte",
            ),
            (
                answer(201, &[REPLAYED], BODY),
                "it's Location /v1/orders/0192f1c4",
            ),
        ];
        for (replay, expected) in cases {
            let (said, _) = replay_of(&original, &replay, "it").unwrap_err();
            assert!(said.starts_with(expected), "{said}");
        }
        let (_, got) = replay_of(
            &original,
            &answer(201, &[LOCATION, REPLAYED], &BODY.replace(", ", ",")),
            "it",
        )
        .unwrap_err();
        assert!(got.ends_with("differing from byte 52 on"), "{got}");
    }

    #[test]
    fn a_reused_key_is_a_422_problem_naming_nothing_of_the_first_answer() {
        let first = answer(201, &[], BODY);
        let problem = ("content-type", "application/problem+json; charset=utf-8");
        let sent = r#"{"request_id": "r-1", "amount": "120.00"}"#;
        assert!(reuse_refused(&first, sent, &answer(422, &[problem], r#"{"status":422}"#)).is_ok());
        for (refusal, expected) in [
            (answer(201, &[REPLAYED], BODY), "422"),
            (
                answer(422, &[("content-type", "application/json")], "{}"),
                "Content-Type",
            ),
            (
                answer(
                    422,
                    &[problem],
                    r#"{"detail":"order 0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f"}"#,
                ),
                "nothing of the first answer",
            ),
        ] {
            let (said, _) = reuse_refused(&first, sent, &refusal).unwrap_err();
            assert!(said.starts_with(expected), "{said}");
        }
    }

    #[test]
    fn a_race_has_one_fresh_answer_and_replays_of_it() {
        let fresh = || Ok(answer(201, &[LOCATION], BODY));
        let replay = || Ok(answer(201, &[LOCATION, REPLAYED], BODY));
        let got = judge_race(vec![replay(), fresh(), replay()], 1).unwrap();
        assert!(
            got.starts_with("1 answer (201) and 2 byte-for-byte replays"),
            "{got}"
        );
        let (_, got) = judge_race(vec![fresh(), fresh(), replay()], 0).unwrap_err();
        assert!(
            got.starts_with("2 (201, 201): the request ran more than once"),
            "{got}"
        );
        let (_, got) = judge_race(vec![replay(), replay()], 0).unwrap_err();
        assert!(got.starts_with("none"), "{got}");
        let stuck = answer(409, &[("retry-after", "1")], "{}");
        let (expected, _) = judge_race(vec![fresh(), Ok(stuck)], 1).unwrap_err();
        assert!(expected.contains("409 to end as a replay"), "{expected}");
        let other = Ok(answer(201, &[LOCATION, REPLAYED], "{}"));
        let (expected, _) = judge_race(vec![fresh(), other], 0).unwrap_err();
        assert!(expected.contains("body byte for byte"), "{expected}");
        let failed = Err(NoAnswer::Failed("reset".to_owned()));
        assert!(judge_race(vec![fresh(), failed], 0).is_err());
    }

    #[test]
    fn the_other_principal_never_gets_the_first_answer() {
        let first = answer(201, &[LOCATION], BODY);
        let sent = r#"{"request_id": "r-1"}"#;
        let fresh = answer(
            201,
            &[("location", "/v1/orders/other")],
            r#"{"order_id": "other-order-id"}"#,
        );
        assert!(other_principal(&first, sent, &fresh)
            .unwrap()
            .starts_with("a fresh first answer"));
        let refusal = answer(409, &[], r#"{"title": "request_id names another order"}"#);
        assert!(other_principal(&first, sent, &refusal)
            .unwrap()
            .starts_with("a refusal"));
        for broken in [
            answer(201, &[LOCATION, REPLAYED], BODY),
            answer(200, &[], BODY),
            answer(201, &[LOCATION], "{}"),
            answer(401, &[], "{}"),
            answer(
                410,
                &[],
                r#"{"order_id": "0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f"}"#,
            ),
            answer(500, &[], "{}"),
        ] {
            assert!(
                other_principal(&first, sent, &broken).is_err(),
                "{broken:?}"
            );
        }
    }

    #[test]
    fn in_progress_needs_a_409_with_retry_after() {
        assert_eq!(
            in_progress(&answer(409, &[("retry-after", "2")], "")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(in_progress(&answer(409, &[], "")), None);
        assert_eq!(in_progress(&answer(503, &[("retry-after", "2")], "")), None);
        assert!(asks_to_wait(&answer(503, &[("retry-after", "2")], "")).is_some());
        assert!(asks_to_wait(&answer(500, &[("retry-after", "2")], "")).is_none());
    }
}
