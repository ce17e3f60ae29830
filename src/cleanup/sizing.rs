//! How many rows the next batch takes: `cleanup.batch_size`, or, with `cleanup.batch_time`, as
//! many as the time per row measured on the run's committed batches says fit in that lock hold.
//! Pure arithmetic; the engine feeds it each committed batch.
//!
//! Fewer, larger batches spend less on what every batch pays once (its commit, its planning,
//! the lease renewal, a round trip), and hold their locks longer. The sizer trades the two on a
//! measurement instead of a guess: it is quick to shrink (a batch slower per row than the
//! estimate replaces it at once) and slow to grow (a faster one moves the estimate halfway, and a
//! batch is at most twice the last one's size), so a slow disk or a lock wait costs one long
//! batch, not a run of them.

use std::time::Duration;

use crate::config::MAX_BATCH_SIZE;

/// The next batch's size, and what it is worked out from.
#[derive(Debug, Clone)]
pub(super) struct BatchSizer {
    /// `cleanup.batch_size`: every batch's size without a target, the first one's with it.
    start: u32,
    /// `cleanup.batch_time`.
    target: Option<Duration>,
    next: u32,
    /// Seconds per row, over the committed batches so far (`None` before the first).
    per_row: Option<f64>,
}

impl BatchSizer {
    pub(super) fn new(batch_size: u32, target: Option<Duration>) -> Self {
        let start = batch_size.clamp(1, MAX_BATCH_SIZE);
        Self {
            start,
            target,
            next: start,
            per_row: None,
        }
    }

    /// Rows the next batch takes.
    pub(super) fn next(&self) -> u32 {
        self.next
    }

    /// Starts over at `cleanup.batch_size`: a new phase walks another index with another cost
    /// per row.
    pub(super) fn restart(&mut self) {
        self.next = self.start;
        self.per_row = None;
    }

    /// A batch of `size` rows asked for committed after `took`, having picked `picked` of them.
    pub(super) fn committed(&mut self, size: u32, picked: u64, took: Duration) {
        let Some(target) = self.target else {
            return;
        };
        // A batch that found under half its rows ends its pass: its fixed cost, spread over few
        // rows, says nothing about the time per row of the next full one.
        if picked == 0 || picked.saturating_mul(2) < u64::from(size) {
            return;
        }
        let sample = took.as_secs_f64() / picked as f64;
        let per_row = match self.per_row {
            Some(estimate) if sample < estimate => (estimate + sample) / 2.0,
            _ => sample,
        };
        self.per_row = Some(per_row);
        let fits = if per_row > 0.0 {
            target.as_secs_f64() / per_row
        } else {
            f64::from(MAX_BATCH_SIZE)
        };
        let ceiling = size.saturating_mul(2).min(MAX_BATCH_SIZE);
        // `fits` is positive and finite here; the float-to-int cast saturates.
        self.next = (fits.floor() as u32).clamp(1, ceiling);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_a_target_every_batch_takes_batch_size() {
        let mut sizer = BatchSizer::new(1000, None);
        sizer.committed(1000, 1000, ms(5));
        sizer.committed(1000, 1000, ms(500));
        assert_eq!(sizer.next(), 1000);
    }

    #[test]
    fn fast_batches_grow_at_most_twofold_each_until_the_target_fits() {
        // 10 µs per row, a 50 ms target: 5,000 rows fit.
        let mut sizer = BatchSizer::new(1000, Some(ms(50)));
        let mut sizes = vec![sizer.next()];
        for _ in 0..5 {
            let size = sizer.next();
            sizer.committed(size, u64::from(size), Duration::from_micros(10) * size);
            sizes.push(sizer.next());
        }
        assert_eq!(sizes, [1000, 2000, 4000, 5000, 5000, 5000]);
    }

    #[test]
    fn a_slow_batch_shrinks_the_next_at_once_and_growth_resumes_gradually() {
        let mut sizer = BatchSizer::new(1000, Some(ms(50)));
        sizer.committed(1000, 1000, ms(10)); // 10 µs/row
        assert_eq!(sizer.next(), 2000);
        sizer.committed(2000, 2000, ms(200)); // 100 µs/row: replaces the estimate
        assert_eq!(sizer.next(), 500);
        sizer.committed(500, 500, ms(5)); // 10 µs/row: halfway, 55 µs/row
        assert_eq!(sizer.next(), 909);
    }

    #[test]
    fn a_mostly_empty_batch_ends_its_pass_and_teaches_nothing() {
        let mut sizer = BatchSizer::new(1000, Some(ms(50)));
        sizer.committed(1000, 400, ms(40));
        sizer.committed(1000, 0, ms(1));
        assert_eq!(sizer.next(), 1000);
    }

    #[test]
    fn sizes_stay_between_one_row_and_the_ceiling() {
        let mut sizer = BatchSizer::new(MAX_BATCH_SIZE, Some(ms(1)));
        sizer.committed(
            MAX_BATCH_SIZE,
            u64::from(MAX_BATCH_SIZE),
            Duration::from_secs(1000),
        );
        assert_eq!(sizer.next(), 1, "a batch never takes no rows");
        let mut sizer = BatchSizer::new(60_000, Some(Duration::from_secs(10)));
        sizer.committed(60_000, 60_000, Duration::ZERO);
        assert_eq!(sizer.next(), MAX_BATCH_SIZE);
    }

    #[test]
    fn a_new_phase_starts_again_from_batch_size() {
        let mut sizer = BatchSizer::new(1000, Some(ms(50)));
        sizer.committed(1000, 1000, ms(10));
        sizer.restart();
        assert_eq!(sizer.next(), 1000);
        sizer.committed(1000, 1000, ms(100));
        assert_eq!(sizer.next(), 500, "the earlier phase's estimate is gone");
    }
}
