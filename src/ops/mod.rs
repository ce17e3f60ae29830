//! Operations: what the service manager, load balancers and Prometheus talk to.
//!
//! * [`listener`] — the metrics and health listener (`/metrics`, `/healthz`, `/readyz`);
//! * [`readiness`] — is the database reachable, writable, not out of resources, the pool's
//!   connections answering and the schema current;
//! * [`request_health`] — what API requests experienced of the database (class 53);
//! * [`watchdog`] — when the daemon still vouches for itself to the watchdog;
//! * [`systemd`] — the sd_notify transport: readiness, status, reload, stopping, watchdog pings.

pub mod listener;
pub mod readiness;
pub mod request_health;
pub mod systemd;
pub mod watchdog;
