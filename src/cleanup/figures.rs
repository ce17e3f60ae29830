//! What a run did, in numbers: [`RunFigures`], one record whatever it counts — a batch, a wait,
//! a worker, a whole run — added up with `+=`; and [`FiguresCell`], where a run's figures stand
//! while it runs. Every engine of a run (its own, each worker's) adds what it does to the run's
//! cell as it happens, so the cell is at every moment what committed so far: what the report is
//! made of at the end, what the history records of a run that failed half way, and what anyone
//! watching the run can read ([`FiguresCell::get`]).

use std::ops::AddAssign;
use std::sync::Mutex;
use std::time::Duration;

/// A run's figures, or a part of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFigures {
    /// Records turned into tombstones.
    pub rows_tombstoned: u64,
    /// Committed tombstoning batches that found rows (a pass's final, empty probe is not one).
    pub tombstone_batches: u64,
    /// Tombstones deleted by the retention purge.
    pub tombstones_purged: u64,
    /// Committed purge batches that found rows.
    pub purge_batches: u64,
    /// Delivered outbox events deleted by retention.
    pub outbox_events_deleted: u64,
    /// Committed outbox retention batches that found events.
    pub outbox_batches: u64,
    /// Batches (of any phase) rolled back because a row lock wait exceeded
    /// `cleanup.lock_timeout`.
    pub lock_timeouts: u64,
    /// Due rows left for a later run because another session held them.
    pub rows_skipped: u64,
    /// Batches retried after a deadlock or serialization failure.
    pub retries: u64,
    /// The run's time waiting for the standbys (`cleanup.max_replica_lag`). Workers waiting side
    /// by side count each their share, so the sum is the run's waiting time (as
    /// `tombstoned_cleanup_throttled_seconds_total` counts it).
    pub throttled_replica_lag: Duration,
    /// The run's time waiting for the rate cap (`cleanup.max_rows_per_second`), counted alike.
    pub throttled_rate: Duration,
    /// Every batch transaction's duration (BEGIN to COMMIT or ROLLBACK), committed or not.
    pub batch_durations: Vec<Duration>,
}

impl RunFigures {
    /// Committed batches of every phase that found rows.
    pub fn batches(&self) -> u64 {
        self.tombstone_batches + self.purge_batches + self.outbox_batches
    }

    /// Rows every phase changed: what `cleanup.max_rows_per_second` paces.
    pub fn rows_changed(&self) -> u64 {
        self.rows_tombstoned + self.tombstones_purged + self.outbox_events_deleted
    }
}

impl AddAssign for RunFigures {
    fn add_assign(&mut self, other: RunFigures) {
        let RunFigures {
            rows_tombstoned,
            tombstone_batches,
            tombstones_purged,
            purge_batches,
            outbox_events_deleted,
            outbox_batches,
            lock_timeouts,
            rows_skipped,
            retries,
            throttled_replica_lag,
            throttled_rate,
            batch_durations,
        } = other;
        self.rows_tombstoned += rows_tombstoned;
        self.tombstone_batches += tombstone_batches;
        self.tombstones_purged += tombstones_purged;
        self.purge_batches += purge_batches;
        self.outbox_events_deleted += outbox_events_deleted;
        self.outbox_batches += outbox_batches;
        self.lock_timeouts += lock_timeouts;
        self.rows_skipped += rows_skipped;
        self.retries += retries;
        self.throttled_replica_lag += throttled_replica_lag;
        self.throttled_rate += throttled_rate;
        self.batch_durations.extend(batch_durations);
    }
}

/// A run's [`RunFigures`] so far, shared by its engines (the run future must be `Send`, hence a
/// mutex; it is taken for an addition or a copy, never across an await).
#[derive(Debug, Default)]
pub struct FiguresCell(Mutex<RunFigures>);

impl FiguresCell {
    /// Adds `figures` to the run's.
    pub fn add(&self, figures: RunFigures) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) += figures;
    }

    /// The run's figures as they stand now.
    pub fn get(&self) -> RunFigures {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_add_up_field_by_field() {
        let ms = Duration::from_millis;
        let mut run = RunFigures {
            rows_tombstoned: 10,
            tombstone_batches: 1,
            throttled_rate: ms(5),
            batch_durations: vec![ms(3)],
            ..RunFigures::default()
        };
        run += RunFigures {
            rows_tombstoned: 5,
            tombstone_batches: 1,
            tombstones_purged: 2,
            purge_batches: 1,
            lock_timeouts: 1,
            throttled_rate: ms(7),
            batch_durations: vec![ms(4), ms(1)],
            ..RunFigures::default()
        };
        assert_eq!(run.rows_tombstoned, 15);
        assert_eq!(run.batches(), 3);
        assert_eq!(run.rows_changed(), 17);
        assert_eq!(run.lock_timeouts, 1);
        assert_eq!(run.throttled_rate, ms(12));
        assert_eq!(run.batch_durations, [ms(3), ms(4), ms(1)]);
    }

    #[test]
    fn the_cell_is_what_was_added_so_far() {
        let cell = FiguresCell::default();
        cell.add(RunFigures {
            retries: 1,
            ..RunFigures::default()
        });
        cell.add(RunFigures {
            retries: 2,
            rows_skipped: 4,
            ..RunFigures::default()
        });
        let now = cell.get();
        assert_eq!((now.retries, now.rows_skipped), (3, 4));
    }
}
