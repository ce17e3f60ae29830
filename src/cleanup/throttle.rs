//! The pace of a cleanup run: what the standbys' replay lag is ([`ReplicaLag`], read from
//! `pg_stat_replication` on the primary), when a run must wait for them
//! (`cleanup.max_replica_lag`), and how long it must wait to keep to `cleanup.max_rows_per_second`
//! ([`rate_wait`]). The waiting itself is the batch engine's (between batches, outside any
//! transaction, cut short by shutdown and by `cleanup.max_run_time`).
//!
//! Decisions (docs/cleanup.md, "Throttling"):
//! * A walsender whose `replay_lsn` is NULL has not reported a replay position yet (a standby
//!   starting up, a `pg_basebackup` stream, one with `wal_receiver_status_interval = 0`): it is
//!   shown, and not waited for — it may never report one, and waiting would stop cleanup for
//!   good.
//! * A standby that disconnected is no longer in `pg_stat_replication`; its replication slot
//!   (`pg_replication_slots`) still retains WAL for it. The cleaner does not wait for slots: a
//!   standby that is down may stay down for days, and bounding what a slot retains is
//!   `max_slot_wal_keep_size`'s job. The lag that matters here is that of standbys replaying now.
//! * Only a role that may read other sessions' statistics sees the positions
//!   (`pg_read_all_stats`, which `pg_monitor` includes, or a superuser); for any other role the
//!   columns read NULL, so the setting is refused rather than silently ignored.

use std::time::Duration;

use serde::Serialize;
use tokio_postgres::Row;

/// How often a waiting run reads the lag again: often enough that a standby that caught up is
/// noticed promptly, each poll one short statement that reads no table.
pub(super) const LAG_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What a run waited for (`tombstoned_cleanup_throttled_seconds_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleReason {
    /// A standby replayed more than `cleanup.max_replica_lag` bytes behind.
    ReplicaLag,
    /// `cleanup.max_rows_per_second`.
    Rate,
}

impl ThrottleReason {
    /// Every reason, for the metric's label set.
    pub const ALL: [ThrottleReason; 2] = [ThrottleReason::ReplicaLag, ThrottleReason::Rate];

    /// The metric label and the name in logs and JSON.
    pub fn label(self) -> &'static str {
        match self {
            ThrottleReason::ReplicaLag => "replica_lag",
            ThrottleReason::Rate => "rate",
        }
    }
}

/// One walsender of `pg_stat_replication` (a physical standby, a logical subscriber, a base
/// backup in progress).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StandbyLag {
    /// Its `application_name` (`""` when it set none).
    pub application_name: String,
    /// `startup`, `catchup`, `streaming`, `backup`, `stopping`.
    pub state: Option<String>,
    /// Bytes of WAL between the primary's current position and the standby's replay position;
    /// `None` when it has not reported a replay position (or the role cannot see it).
    pub lag_bytes: Option<u64>,
}

/// The standbys as the primary sees them, and whether this role may see their positions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaLag {
    /// Whether the role sees the replay positions (superuser, or member of
    /// `pg_read_all_stats`, e.g. through `pg_monitor`).
    pub visible: bool,
    /// The role the cleaner connects as, for the message that asks for the grant.
    pub role: String,
    /// Every walsender, ordered by `application_name`.
    pub standbys: Vec<StandbyLag>,
}

impl ReplicaLag {
    /// Reads [`super::sql::REPLICA_LAG`]'s rows (one with NULL standby columns when there is
    /// none).
    pub(super) fn from_rows(rows: &[Row]) -> Result<ReplicaLag, tokio_postgres::Error> {
        let mut lag = ReplicaLag {
            visible: false,
            role: String::new(),
            standbys: Vec::new(),
        };
        for row in rows {
            lag.visible = row.try_get(0)?;
            lag.role = row.try_get(1)?;
            let present: bool = row.try_get(2)?;
            if present {
                let bytes: Option<i64> = row.try_get(5)?;
                lag.standbys.push(StandbyLag {
                    application_name: row.try_get(3)?,
                    state: row.try_get(4)?,
                    // A standby ahead of the primary's insert position cannot be; a negative
                    // difference would only be a standby replaying a newer timeline: no lag.
                    lag_bytes: bytes.map(|b| u64::try_from(b).unwrap_or(0)),
                });
            }
        }
        Ok(lag)
    }

    /// The standby furthest behind, among those that reported a replay position.
    pub fn furthest_behind(&self) -> Option<(&StandbyLag, u64)> {
        self.standbys
            .iter()
            .filter_map(|s| s.lag_bytes.map(|b| (s, b)))
            .max_by_key(|(_, b)| *b)
    }

    /// The standby a run must wait for: the one furthest behind, if more than `limit` bytes.
    pub fn over(&self, limit: u64) -> Option<(&StandbyLag, u64)> {
        self.furthest_behind().filter(|(_, bytes)| *bytes > limit)
    }
}

/// How long a run that has changed `rows` rows in `elapsed` since its first batch began must
/// wait before its next batch so as not to exceed `per_second` rows per second: the rows are
/// "paid for" at the cap's pace, so a run of N rows takes at least N / `per_second` seconds
/// (its last, empty batch waits too), and the waits fall between batches.
pub fn rate_wait(rows: u64, per_second: u32, elapsed: Duration) -> Duration {
    if per_second == 0 {
        return Duration::ZERO;
    }
    let owed = Duration::from_secs_f64(rows as f64 / f64::from(per_second));
    owed.saturating_sub(elapsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standby(name: &str, lag: Option<u64>) -> StandbyLag {
        StandbyLag {
            application_name: name.into(),
            state: Some("streaming".into()),
            lag_bytes: lag,
        }
    }

    #[test]
    fn the_rate_is_paid_between_batches() {
        // 1000 rows at 100 rows/s are owed 10 s; a batch that took 2 s leaves 8 s to wait.
        assert_eq!(
            rate_wait(1000, 100, Duration::from_secs(2)),
            Duration::from_secs(8)
        );
        // Slower than the cap: no wait.
        assert_eq!(
            rate_wait(1000, 100, Duration::from_secs(11)),
            Duration::ZERO
        );
        // Nothing done yet: no wait.
        assert_eq!(rate_wait(0, 100, Duration::ZERO), Duration::ZERO);
        // Spread: ten batches of 50 at 100 rows/s reach the 5 s the 500 rows owe, whatever
        // the batches took.
        let mut clock = Duration::ZERO;
        for batch in 1..=10u64 {
            clock += Duration::from_millis(30); // the batch itself
            clock += rate_wait(batch * 50, 100, clock);
        }
        assert_eq!(clock, Duration::from_secs(5));
    }

    #[test]
    fn a_run_waits_only_for_a_standby_that_reported_a_position_beyond_the_limit() {
        let lag = ReplicaLag {
            visible: true,
            role: "app".into(),
            standbys: vec![
                standby("a", Some(10)),
                standby("starting", None),
                standby("b", Some(5_000)),
            ],
        };
        let (worst, bytes) = lag.furthest_behind().unwrap();
        assert_eq!((worst.application_name.as_str(), bytes), ("b", 5_000));
        assert_eq!(
            lag.over(4_999).map(|(s, _)| s.application_name.as_str()),
            Some("b")
        );
        assert!(lag.over(5_000).is_none(), "at the limit is not over it");
        let only_unknown = ReplicaLag {
            standbys: vec![standby("starting", None)],
            ..lag.clone()
        };
        assert!(only_unknown.over(0).is_none());
        let none = ReplicaLag {
            standbys: vec![],
            ..lag
        };
        assert!(none.furthest_behind().is_none());
    }

    #[test]
    fn labels_are_the_metric_contract() {
        let labels: Vec<_> = ThrottleReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels, ["replica_lag", "rate"]);
    }
}
