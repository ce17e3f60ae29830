//! The `[retention]` section: how long responses are replayable, and whether tombstones and
//! delivered outbox events ever go; its file shape, defaults and validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{duration_text, optional_duration_text, positive, ConfigError, Problems};

/// `[retention]`: how long responses are replayable, and whether tombstones ever go.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// A stored response is replayable this long after its claim.
    /// Default: 24h. Reload: applied (to claims made after it).
    pub replay_window: Duration,
    /// Delete tombstones this long after they expired, reopening their keys; `None` keeps them.
    /// Default: `off`. Reload: applied (next cleanup run).
    pub purge_tombstones_after: Option<Duration>,
    /// Delete delivered outbox events this long after their delivery; `None` keeps them.
    /// Default: `off`. Reload: applied (next cleanup run).
    pub outbox_keep_delivered: Option<Duration>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            replay_window: Duration::from_secs(24 * 3600),
            purge_tombstones_after: None,
            outbox_keep_delivered: None,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawRetention {
    replay_window: String,
    purge_tombstones_after: String,
    outbox_keep_delivered: String,
}

impl Default for RawRetention {
    fn default() -> Self {
        let d = RetentionConfig::default();
        Self {
            replay_window: duration_text(d.replay_window),
            purge_tombstones_after: optional_duration_text(d.purge_tombstones_after),
            outbox_keep_delivered: optional_duration_text(d.outbox_keep_delivered),
        }
    }
}

/// The longest `retention.replay_window` and `retention.purge_tombstones_after`: 5,000 years.
/// A replay deadline is `now()` plus the window and a purge bound `now()` minus the delay; both
/// must stay inside PostgreSQL's timestamps (4713 BC to 294276 AD; beyond, every claim fails with
/// 22008) and chrono's (up to 262143 AD, for reading them back). 5,000 years keeps both
/// directions inside until the year 6700, without a check that depends on today's date.
pub const MAX_RETENTION: Duration = Duration::from_secs(5_000 * 31_557_600);

/// A retention duration: positive and at most [`MAX_RETENTION`].
fn retention_duration(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = positive(key, text)?;
    if d > MAX_RETENTION {
        return Err(ConfigError::Invalid {
            key,
            reason: format!(
                "{text:?} is longer than {}: now() plus or minus it must stay inside \
                 PostgreSQL's timestamps (4713 BC to 294276 AD)",
                humantime::format_duration(MAX_RETENTION)
            ),
        });
    }
    Ok(d)
}

/// The section's validate step (see [`super::Config`]).
pub(super) fn validate(retention: RawRetention, p: &mut Problems) -> RetentionConfig {
    let d = RetentionConfig::default();
    let purge = retention.purge_tombstones_after.trim();
    let keep_delivered = retention.outbox_keep_delivered.trim();
    RetentionConfig {
        replay_window: p.take(
            retention_duration("retention.replay_window", &retention.replay_window),
            d.replay_window,
        ),
        purge_tombstones_after: if purge.eq_ignore_ascii_case("off") {
            None
        } else {
            p.take(
                retention_duration("retention.purge_tombstones_after", purge).map(Some),
                d.purge_tombstones_after,
            )
        },
        outbox_keep_delivered: if keep_delivered.eq_ignore_ascii_case("off") {
            None
        } else {
            p.take(
                positive("retention.outbox_keep_delivered", keep_delivered).map(Some),
                d.outbox_keep_delivered,
            )
        },
    }
}
