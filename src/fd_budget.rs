//! The file-descriptor budget of `serve`: the process's `RLIMIT_NOFILE` must hold the API
//! listener's connections, the metrics listener's, the database pool and a reserve for
//! everything else (listeners, the cleaner's sessions, the readiness probe, files read on reload,
//! the runtime's own descriptors). When the configured connection caps would not fit, the API's
//! cap is lowered first (the metrics listener's only if even that is not enough), so that one
//! client holding idle API connections can never take the descriptors the database and `/readyz`
//! need ("accept error: Too many open files" with the API and the probes timing out).

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors kept back besides the pool and the two listeners' connections: stdio, the
/// runtime's epoll and wakers, the listening sockets, the start-up, readiness and cleanup-run
/// sessions (the latter briefly two, recording a run whose connection was lost), configuration and tokens files read on SIGHUP, `/proc` reads of the
/// process collector, the notify socket, DNS lookups — with room to spare.
pub const RESERVED_FDS: u64 = 64;

/// What the budget allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdPlan {
    /// The soft `RLIMIT_NOFILE` in force.
    pub limit: u64,
    /// The soft limit before this process raised it towards the hard limit, if it did.
    pub raised_from: Option<u64>,
    /// The API listener's connection cap.
    pub api_connections: usize,
    /// The metrics listener's connection cap.
    pub metrics_connections: usize,
    /// Kept for the pool and [`RESERVED_FDS`].
    pub reserved: u64,
}

impl FdPlan {
    /// Whether a cap had to be lowered below the configuration.
    pub fn lowered(&self, api_wanted: usize, metrics_wanted: usize) -> bool {
        self.api_connections < api_wanted || self.metrics_connections < metrics_wanted
    }
}

/// The limit cannot hold even one connection per listener next to the reserve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "RLIMIT_NOFILE is {limit}, but the database pool and the reserve alone need {reserved} file \
     descriptors; raise LimitNOFILE= (or ulimit -n)"
)]
pub struct FdBudgetError {
    /// The soft limit.
    pub limit: u64,
    /// Pool plus reserve.
    pub reserved: u64,
}

/// Splits `limit` descriptors: the reserve and the pool first, then the metrics listener's cap
/// (as configured, or at most a quarter of what is left), then the API's (what remains, up to
/// its configuration). Pure: [`apply`] reads and raises the real limit.
pub fn plan(
    limit: u64,
    api_wanted: usize,
    metrics_wanted: usize,
    pool_size: usize,
) -> Result<FdPlan, FdBudgetError> {
    let reserved = RESERVED_FDS.saturating_add(as_u64(pool_size));
    let available = limit.saturating_sub(reserved);
    if available < 2 {
        return Err(FdBudgetError { limit, reserved });
    }
    let wanted = as_u64(api_wanted).saturating_add(as_u64(metrics_wanted));
    let (api, metrics) = if wanted <= available {
        (as_u64(api_wanted), as_u64(metrics_wanted))
    } else {
        let metrics = as_u64(metrics_wanted).min((available / 4).max(1));
        (as_u64(api_wanted).min(available - metrics), metrics)
    };
    Ok(FdPlan {
        limit,
        raised_from: None,
        api_connections: as_usize(api.max(1)),
        metrics_connections: as_usize(metrics.max(1)),
        reserved,
    })
}

/// Reads `RLIMIT_NOFILE`, raises the soft limit towards the hard one when the configuration needs
/// more (outside systemd; the shipped unit sets both with `LimitNOFILE=` and forbids changing
/// them), and plans within what is in force. `api_wanted` is 0 when the API is disabled.
pub fn apply(
    api_wanted: usize,
    metrics_wanted: usize,
    pool_size: usize,
) -> Result<FdPlan, FdBudgetError> {
    let needed = RESERVED_FDS
        .saturating_add(as_u64(pool_size))
        .saturating_add(as_u64(api_wanted))
        .saturating_add(as_u64(metrics_wanted));
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            // Not expected on Linux; plan as if the limit were exactly what is needed.
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE");
            (needed, needed)
        }
    };
    let mut limit = soft;
    let mut raised_from = None;
    if soft != RLIM_INFINITY && soft < needed {
        let target = if hard == RLIM_INFINITY {
            needed
        } else {
            needed.min(hard)
        };
        if target > soft {
            match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
                Ok(()) => {
                    limit = target;
                    raised_from = Some(soft);
                }
                Err(e) => tracing::debug!(error = %e, "cannot raise the soft RLIMIT_NOFILE"),
            }
        }
    }
    let mut plan = plan(limit, api_wanted, metrics_wanted, pool_size)?;
    plan.raised_from = raised_from;
    Ok(plan)
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_caps_are_kept_when_they_fit() {
        let p = plan(8192, 1024, 64, 16).unwrap();
        assert_eq!((p.api_connections, p.metrics_connections), (1024, 64));
        assert_eq!(p.reserved, RESERVED_FDS + 16);
        assert!(!p.lowered(1024, 64));
    }

    #[test]
    fn under_systemds_default_1024_the_api_cap_gives_way_first() {
        // 1024 - (64 + 16) = 944 for both listeners; metrics keeps its 64.
        let p = plan(1024, 1024, 64, 16).unwrap();
        assert_eq!((p.api_connections, p.metrics_connections), (880, 64));
        assert!(p.lowered(1024, 64));
        let total = p.api_connections + p.metrics_connections + 16 + RESERVED_FDS as usize;
        assert!(total as u64 <= 1024);
    }

    #[test]
    fn a_tiny_limit_still_leaves_the_metrics_listener_some_room_or_fails_clearly() {
        let p = plan(120, 1024, 64, 16).unwrap();
        // 40 left: a quarter (10) for metrics, 30 for the API.
        assert_eq!((p.api_connections, p.metrics_connections), (30, 10));
        assert_eq!(
            plan(81, 1024, 64, 16),
            Err(FdBudgetError {
                limit: 81,
                reserved: 80
            })
        );
        // The API disabled: nothing is wanted there, metrics keeps its cap.
        let p = plan(1024, 0, 64, 16).unwrap();
        assert_eq!(p.metrics_connections, 64);
    }

    #[test]
    fn apply_reads_the_real_limit() {
        let p = apply(16, 8, 4).unwrap();
        assert!(p.limit >= p.reserved + 24, "{p:?}");
        assert_eq!((p.api_connections, p.metrics_connections), (16, 8));
    }
}
