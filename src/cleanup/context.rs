//! One run's context: what every engine of the run works with (its own and, with
//! `cleanup.workers > 1`, each worker's) — the settings, the caller's limits, the stop, the
//! metrics, the run's clock — and what they share while they work: its figures so far
//! ([`FiguresCell`]) and its [`Pace`] (the first stop, the batches and rows that count toward
//! `--max-batches` and the rate cap). One value per run, made by the caller ([`RunContext::new`])
//! and borrowed by everything below it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::figures::{FiguresCell, RunFigures};
use super::meter::Meter;
use super::report::StopReason;
use super::throttle::ThrottleReason;
use crate::config::{CleanupConfig, DatabaseConfig, RetentionConfig};
use crate::metrics::Metrics;

/// Limits a caller puts on one run, on top of the configuration's `cleanup.max_run_time`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLimits {
    /// Stop after this many committed batches (`tombstoned cleanup --max-batches`).
    pub max_batches: Option<u64>,
}

/// Everything one run works with, and what its engines share.
#[derive(Debug)]
pub struct RunContext<'a> {
    pub(super) db: &'a DatabaseConfig,
    pub(super) cleanup: &'a CleanupConfig,
    pub(super) retention: &'a RetentionConfig,
    pub(super) limits: RunLimits,
    /// Checked between batches and during waits, never inside a batch.
    pub(super) shutdown: &'a CancellationToken,
    pub(super) meter: Meter<'a>,
    /// When the run began (connecting included): `cleanup.max_run_time` counts from here.
    pub(super) started: Instant,
    /// What the run did so far, every engine's.
    pub(super) figures: FiguresCell,
    pub(super) pace: Pace,
}

impl<'a> RunContext<'a> {
    /// The context of a run beginning now: `db`'s cleanup with `cleanup` and `retention`,
    /// within `limits`, stopped by `shutdown`, counted in `metrics` when given.
    pub fn new(
        db: &'a DatabaseConfig,
        cleanup: &'a CleanupConfig,
        retention: &'a RetentionConfig,
        limits: RunLimits,
        shutdown: &'a CancellationToken,
        metrics: Option<&'a Metrics>,
    ) -> RunContext<'a> {
        RunContext {
            db,
            cleanup,
            retention,
            limits,
            shutdown,
            meter: Meter::new(metrics),
            started: Instant::now(),
            figures: FiguresCell::default(),
            pace: Pace::default(),
        }
    }

    /// What the run has done so far (every batch that committed or rolled back, every wait).
    pub fn figures(&self) -> RunFigures {
        self.figures.get()
    }
}

/// What the engines of one run share so that its limits hold for the run as a whole: the first
/// reason that stops any engine stops all, `--max-batches` and the rate cap count every engine's
/// batches and rows, and the rate cap's clock starts with the run's first batch.
#[derive(Debug, Default)]
pub(super) struct Pace {
    stopped: Mutex<Option<StopReason>>,
    /// What the run was waiting for when it was stopped, if an engine was stopped in a wait.
    waiting_when_stopped: Mutex<Option<ThrottleReason>>,
    /// Committed batch transactions, a pass's final empty probe included.
    committed_batches: AtomicU64,
    rows_changed: AtomicU64,
    first_batch: OnceLock<Instant>,
}

impl Pace {
    /// Records `reason` unless an engine stopped first; returns the reason that stops the run
    /// (the first one).
    pub(super) fn stop(&self, reason: StopReason) -> StopReason {
        *self
            .stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(reason)
    }

    /// The reason that stopped the run, once an engine stopped.
    pub(super) fn stopped(&self) -> Option<StopReason> {
        *self
            .stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An engine was stopped while it waited for `reason` (the first one is kept).
    pub(super) fn stopped_while_waiting_for(&self, reason: ThrottleReason) {
        self.waiting_when_stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(reason);
    }

    /// What the run was waiting for when it was stopped (`None`: it was not stopped in a wait).
    pub(super) fn waiting_when_stopped(&self) -> Option<ThrottleReason> {
        *self
            .waiting_when_stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A batch transaction committed, having changed `rows`.
    pub(super) fn committed(&self, rows: u64) {
        self.committed_batches.fetch_add(1, Ordering::Relaxed);
        self.rows_changed.fetch_add(rows, Ordering::Relaxed);
    }

    pub(super) fn committed_batches(&self) -> u64 {
        self.committed_batches.load(Ordering::Relaxed)
    }

    pub(super) fn rows_changed(&self) -> u64 {
        self.rows_changed.load(Ordering::Relaxed)
    }

    /// A batch is about to begin: the first one starts the rate cap's clock.
    pub(super) fn batch_begins(&self) {
        self.first_batch.get_or_init(Instant::now);
    }

    /// When the run's first batch began.
    pub(super) fn first_batch(&self) -> Option<Instant> {
        self.first_batch.get().copied()
    }
}
