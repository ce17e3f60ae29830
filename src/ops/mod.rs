//! Operations: what the service manager, load balancers and Prometheus talk to.
//!
//! * [`listener`] — the metrics and health listener (`/metrics`, `/healthz`, `/readyz`);
//! * [`readiness`] — is the database reachable and the schema current;
//! * [`systemd`] — sd_notify: readiness, status, reload, stopping and the watchdog.

pub mod listener;
pub mod readiness;
pub mod systemd;
