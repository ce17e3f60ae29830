//! The `[metrics]` section: the Prometheus and health listener; its file shape, defaults and
//! validation.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::settings::{duration_text, in_range, integer, socket_addr, timeout, Problems};

/// `[metrics]`: the Prometheus and health listener. Every key needs a restart: the listener is
/// bound and configured at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// Address serving `/metrics`, `/healthz` and `/readyz`.
    /// Default: `127.0.0.1:9187`. Reload: needs a restart.
    pub listen: SocketAddr,
    /// Open connections the metrics listener keeps at most. Default: 64. Reload: needs a
    /// restart.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers. Default: 10s. Reload: needs a
    /// restart.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open without a request. Default: 60s. Reload: needs a
    /// restart.
    pub idle_timeout: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9187)),
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: String,
    max_connections: i64,
    header_read_timeout: String,
    idle_timeout: String,
}

impl Default for RawMetrics {
    fn default() -> Self {
        let d = MetricsConfig::default();
        Self {
            listen: d.listen.to_string(),
            max_connections: integer(d.max_connections),
            header_read_timeout: duration_text(d.header_read_timeout),
            idle_timeout: duration_text(d.idle_timeout),
        }
    }
}

/// The section's validate step (see [`super::Config`]), and whether `metrics.listen` itself
/// was valid.
pub(super) fn validate(metrics: RawMetrics, p: &mut Problems) -> (MetricsConfig, bool) {
    let d = MetricsConfig::default();
    let before = p.count();
    let metrics_listen = p.take(socket_addr("metrics.listen", &metrics.listen), d.listen);
    let metrics_listen_ok = p.count() == before;
    let metrics = MetricsConfig {
        listen: metrics_listen,
        max_connections: p.take(
            in_range(
                "metrics.max_connections",
                metrics.max_connections,
                1,
                1_000_000,
            ),
            d.max_connections,
        ),
        header_read_timeout: p.take(
            timeout("metrics.header_read_timeout", &metrics.header_read_timeout),
            d.header_read_timeout,
        ),
        idle_timeout: p.take(
            timeout("metrics.idle_timeout", &metrics.idle_timeout),
            d.idle_timeout,
        ),
    };
    (metrics, metrics_listen_ok)
}
