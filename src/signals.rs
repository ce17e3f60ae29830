//! SIGTERM and SIGINT as a graceful stop, the same for every command: the first signal asks the
//! work to stop (it cancels a [`CancellationToken`]: `serve` drains, `cleanup` ends after its
//! current batch, the demo tears down), a second one ends the process at once with status 130 —
//! the database rolls back whatever transaction was open.

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::exit::Exit;

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install a handler for {signal}")]
pub struct SignalError {
    /// `SIGTERM` or `SIGINT`.
    pub signal: &'static str,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// SIGTERM and SIGINT, handled from [`GracefulStop::install`] on (they no longer kill the
/// process by themselves).
#[derive(Debug)]
pub struct GracefulStop {
    term: Signal,
    int: Signal,
}

impl GracefulStop {
    /// Installs the handlers now. Needs a Tokio runtime.
    pub fn install() -> Result<Self, SignalError> {
        let install = |kind, name| {
            signal(kind).map_err(|source| SignalError {
                signal: name,
                source,
            })
        };
        Ok(GracefulStop {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// Spawns the task that acts on the signals: the first logs `first` (at info, when given)
    /// and cancels `stop`; the second logs `second` (at warn) and exits with status 130.
    pub fn spawn(
        mut self,
        stop: CancellationToken,
        first: Option<&'static str>,
        second: &'static str,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            self.recv().await;
            if let Some(message) = first {
                tracing::info!("{message}");
            }
            stop.cancel();
            self.recv().await;
            tracing::warn!("{second}");
            std::process::exit(Exit::Interrupted.code());
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
