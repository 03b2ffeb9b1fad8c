//! A call that finishes even when whoever awaits it goes away.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future polled where it is awaited, which, dropped before it ends, is handed to the
/// runtime to finish on a task of its own.
///
/// A `tools/call` is polled on the transport's request task, with no hop to another task on
/// the way (a spawn per call costs a wake-up of another worker, more than the rest of what
/// idem adds to a call). But a transport may drop that future when its client goes away
/// (a closed connection, a cancelled request, a host's own timeout), and a write that has
/// claimed its key must still run to its end and settle its record, so that a retry finds
/// what it did rather than a claim left running until its lease lapses. Dropped early, the
/// rest of the call goes on as if it had been spawned from the start: its output is
/// saved in the store for the retry, and nobody awaits it here.
pub(crate) struct RunToEnd<T: Send + 'static> {
    /// `None` once the future has ended (or was handed on).
    future: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    /// The runtime the future was made on, which finishes it if it is dropped early.
    runtime: Option<tokio::runtime::Handle>,
}

impl<T: Send + 'static> RunToEnd<T> {
    /// `future`, to be awaited; finished on the current runtime if dropped before it ends.
    pub(crate) fn new(future: impl Future<Output = T> + Send + 'static) -> RunToEnd<T> {
        RunToEnd {
            future: Some(Box::pin(future)),
            // Outside a runtime nothing could finish the rest; it is dropped with this.
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

impl<T: Send + 'static> Future for RunToEnd<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // `RunToEnd` is `Unpin`: the future it holds is pinned in its box.
        let this = self.get_mut();
        let Some(future) = this.future.as_mut() else {
            panic!("RunToEnd polled after it completed");
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        this.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for RunToEnd<T> {
    fn drop(&mut self) {
        if let (Some(future), Some(runtime)) = (self.future.take(), &self.runtime) {
            // A runtime shutting down drops the task instead of running it: then the
            // process is ending, and the record's lease and the reconciler take over.
            drop(runtime.spawn(future));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::RunToEnd;

    #[tokio::test]
    async fn awaited_to_its_end_it_gives_the_output_and_runs_once() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let output = RunToEnd::new(async move {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            7
        })
        .await;
        assert_eq!(output, 7);
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn dropped_midway_it_finishes_on_its_own() {
        let (go, wait) = oneshot::channel::<()>();
        let (done, finished) = oneshot::channel::<&str>();
        let mut call = RunToEnd::new(async move {
            // Blocked until the test lets it go, after the awaiting side has given up.
            let _ = wait.await;
            let _ = done.send("settled");
        });
        // Polled once, as a transport would before its client goes away.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut call)
                .await
                .is_err(),
            "it cannot end before it is let go"
        );
        drop(call);
        go.send(()).unwrap();
        let finished = tokio::time::timeout(Duration::from_secs(5), finished).await;
        assert_eq!(finished.unwrap().unwrap(), "settled");
    }
}
