//! What one delivery attempt's result means for its event — delivered, retried later (and
//! when), or a dead letter — and the label it is counted under. Pure logic.
//!
//! * 2xx: delivered.
//! * 410 Gone: the receiver says the endpoint will never take it: a dead letter at once.
//! * Another 4xx except 408 and 429 (400, 401, 403, 404, 413, 422, ...): the receiver refuses
//!   this request; retrying the same bytes cannot help until someone fixes something, so it is
//!   retried with backoff and becomes a dead letter once the event has had
//!   `outbox.max_attempts` attempts ("forever": never).
//! * Anything else — 5xx, 408, 429, 1xx/3xx (redirects are not followed), a timeout, a
//!   connection error — is transient: retried with backoff, never dead-lettered. A timeout is
//!   "outcome unknown": the receiver may have applied the event, so the retry is a possible
//!   duplicate that the receiver's deduplication absorbs. An endpoint that stays down shows as
//!   a growing backlog (`tombstoned_outbox_oldest_undelivered_age_seconds`), not as dead letters.

use std::time::Duration;

use super::webhook::AttemptResult;
use crate::config::OutboxConfig;

/// What happens to the event after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Record it delivered.
    Delivered,
    /// Try again after this delay.
    Retry(Duration),
    /// Give up until requeued.
    DeadLetter,
}

/// How an attempt is counted (`tombstoned_outbox_deliveries_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// 2xx.
    Delivered,
    /// A transient status (5xx, 408, 429, 3xx): retried.
    RetryableStatus,
    /// A permanent 4xx with attempts left: retried.
    PermanentStatus,
    /// 410, or a permanent 4xx on the last allowed attempt: now a dead letter.
    DeadLettered,
    /// No answer within `outbox.request_timeout`: outcome unknown, retried.
    Timeout,
    /// No connection, TLS failure, or the connection broke: retried.
    ConnectionError,
    /// Cut off by shutdown after `outbox.shutdown_grace`: outcome unknown, sent again once its
    /// lease expires.
    Abandoned,
}

/// Every outcome label, for pre-initialising the counter: the closed label set is the metric's
/// (`metrics` sits below the services and names none of them).
pub use crate::metrics::OUTBOX_DELIVERY_OUTCOMES as DELIVERY_OUTCOMES;

impl DeliveryOutcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Delivered => "delivered",
            DeliveryOutcome::RetryableStatus => "retryable_status",
            DeliveryOutcome::PermanentStatus => "permanent_status",
            DeliveryOutcome::DeadLettered => "dead_lettered",
            DeliveryOutcome::Timeout => "timeout",
            DeliveryOutcome::ConnectionError => "connection_error",
            DeliveryOutcome::Abandoned => "abandoned",
        }
    }
}

/// A 4xx that retrying unchanged cannot fix (408 Request Timeout and 429 Too Many Requests are
/// about timing, so they are not).
pub fn is_permanent(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// The decision for the `attempts`-th attempt of an event (counting this one), with `random`
/// uniform in `[0, 1)` for the jitter.
pub fn decide(
    result: &AttemptResult,
    attempts: u32,
    config: &OutboxConfig,
    random: f64,
) -> (Decision, DeliveryOutcome) {
    let retry = || Decision::Retry(backoff(attempts, config, random));
    match *result {
        AttemptResult::Status(s) if (200..300).contains(&s) => {
            (Decision::Delivered, DeliveryOutcome::Delivered)
        }
        AttemptResult::Status(410) => (Decision::DeadLetter, DeliveryOutcome::DeadLettered),
        AttemptResult::Status(s) if is_permanent(s) => {
            if config.max_attempts.exhausted(attempts) {
                (Decision::DeadLetter, DeliveryOutcome::DeadLettered)
            } else {
                (retry(), DeliveryOutcome::PermanentStatus)
            }
        }
        AttemptResult::Status(_) => (retry(), DeliveryOutcome::RetryableStatus),
        AttemptResult::Timeout => (retry(), DeliveryOutcome::Timeout),
        AttemptResult::Connection(_) => (retry(), DeliveryOutcome::ConnectionError),
    }
}

/// The delay after the `attempts`-th failed attempt: `backoff_initial` doubled per earlier
/// attempt, capped at `backoff_max`, then up to `backoff_jitter` of it taken off at random
/// (`random` in `[0, 1)`), so the cap stays a cap and relays that failed together spread out.
pub fn backoff(attempts: u32, config: &OutboxConfig, random: f64) -> Duration {
    let doublings = attempts.saturating_sub(1);
    let base = if doublings >= 32 {
        config.backoff_max
    } else {
        config
            .backoff_initial
            .checked_mul(1u32 << doublings)
            .map_or(config.backoff_max, |d| d.min(config.backoff_max))
    };
    let keep = 1.0 - config.backoff_jitter * random.clamp(0.0, 1.0);
    base.mul_f64(keep.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MaxAttempts;

    fn config(jitter: f64, max: MaxAttempts) -> OutboxConfig {
        OutboxConfig {
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            backoff_jitter: jitter,
            max_attempts: max,
            ..OutboxConfig::default()
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_only_shortens() {
        let c = config(0.0, MaxAttempts::Limit(10));
        let secs: Vec<u64> = (1..=9).map(|n| backoff(n, &c, 0.5).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX, &c, 0.5), Duration::from_secs(60));
        let j = config(0.5, MaxAttempts::Limit(10));
        assert_eq!(backoff(3, &j, 0.0), Duration::from_secs(4));
        assert_eq!(backoff(3, &j, 0.999_999).as_millis(), 2000);
        assert_eq!(backoff(20, &j, 0.0), Duration::from_secs(60), "the cap");
    }

    #[test]
    fn statuses_map_to_the_documented_decisions() {
        let c = config(0.0, MaxAttempts::Limit(3));
        let d = |r: AttemptResult, n| decide(&r, n, &c, 0.0);
        assert_eq!(
            d(AttemptResult::Status(204), 1),
            (Decision::Delivered, DeliveryOutcome::Delivered)
        );
        assert_eq!(
            d(AttemptResult::Status(410), 1),
            (Decision::DeadLetter, DeliveryOutcome::DeadLettered)
        );
        assert_eq!(
            d(AttemptResult::Status(400), 2),
            (
                Decision::Retry(Duration::from_secs(2)),
                DeliveryOutcome::PermanentStatus
            )
        );
        assert_eq!(
            d(AttemptResult::Status(422), 3),
            (Decision::DeadLetter, DeliveryOutcome::DeadLettered)
        );
        for transient in [500, 503, 408, 429, 302] {
            assert_eq!(
                d(AttemptResult::Status(transient), 99).1,
                DeliveryOutcome::RetryableStatus,
                "{transient}"
            );
        }
        assert_eq!(
            d(AttemptResult::Timeout, 99),
            (
                Decision::Retry(Duration::from_secs(60)),
                DeliveryOutcome::Timeout
            )
        );
        assert_eq!(
            d(AttemptResult::Connection("refused".into()), 99).1,
            DeliveryOutcome::ConnectionError
        );
        let forever = config(0.0, MaxAttempts::Forever);
        assert_eq!(
            decide(&AttemptResult::Status(400), 1_000, &forever, 0.0).1,
            DeliveryOutcome::PermanentStatus
        );
        assert_eq!(
            decide(&AttemptResult::Status(410), 1, &forever, 0.0).0,
            Decision::DeadLetter
        );
    }

    #[test]
    fn every_label_is_listed() {
        for o in [
            DeliveryOutcome::Delivered,
            DeliveryOutcome::RetryableStatus,
            DeliveryOutcome::PermanentStatus,
            DeliveryOutcome::DeadLettered,
            DeliveryOutcome::Timeout,
            DeliveryOutcome::ConnectionError,
            DeliveryOutcome::Abandoned,
        ] {
            assert!(DELIVERY_OUTCOMES.contains(&o.label()));
        }
    }
}
