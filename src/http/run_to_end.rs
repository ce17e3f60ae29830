//! A claim that runs to its end even when the request that started it is abandoned: polled
//! inline by the request's own task (no task of its own, no wake-ups between tasks), and handed
//! to the API's task tracker only if the request's future is dropped first (the client went
//! away, or the connection was aborted at the end of a drain), so the transaction still commits
//! or rolls back and stays replayable, and shutdown still waits for it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::task::TaskTracker;

/// A future polled where it is awaited, finished by a tracked task if dropped before its end.
pub(crate) struct RunToEnd<T: Send + 'static> {
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    tasks: TaskTracker,
}

impl<T: Send + 'static> RunToEnd<T> {
    /// `future`, to be awaited; `tasks` takes it over if it is dropped unfinished.
    pub(crate) fn new(
        tasks: &TaskTracker,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Self {
        RunToEnd {
            future: Some(Box::pin(future)),
            tasks: tasks.clone(),
        }
    }
}

impl<T: Send + 'static> Future for RunToEnd<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(future) = self.future.as_mut() else {
            // Polled after it completed: a caller bug; never completes again.
            return Poll::Pending;
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for RunToEnd<T> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        // Dropped unfinished: the rest runs as a task of its own. Outside a runtime (the
        // runtime itself is being torn down) nothing can run it any more.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.tasks.spawn_on(
                async move {
                    future.await;
                },
                &runtime,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn runs_inline_and_returns_its_output() {
        let tasks = TaskTracker::new();
        assert_eq!(RunToEnd::new(&tasks, async { 7 }).await, 7);
        assert!(tasks.is_empty());
    }

    #[tokio::test]
    async fn an_abandoned_future_is_finished_by_the_tracker() {
        let tasks = TaskTracker::new();
        let finished = Arc::new(AtomicBool::new(false));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let flag = Arc::clone(&finished);
        let run = RunToEnd::new(&tasks, async move {
            let _ = released.await;
            flag.store(true, Ordering::SeqCst);
        });
        // Polled once (started, waiting), then abandoned.
        assert!(futures::FutureExt::now_or_never(run).is_none());
        assert_eq!(tasks.len(), 1, "taken over by the tracker");
        release.send(()).unwrap();
        tasks.close();
        tasks.wait().await;
        assert!(finished.load(Ordering::SeqCst));
    }
}
