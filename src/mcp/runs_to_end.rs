//! A future that is not cancelled by dropping it.
//!
//! A transport drops a request's future when its client goes away (rmcp cancels it on
//! `notifications/cancelled`, a closed connection drops it). A write that has claimed its key
//! must still run to its end and settle its record, or a retry finds it "unknown" until the
//! reconciler comes. Spawning every call on a task of its own gives that, but costs each call
//! a hand-off to another worker thread and back, a measurable share of a `tools/call` on
//! loopback. [`RunsToEnd`] polls the call in place and spawns only what is left of it, and
//! only when it is dropped before it ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls its future in place; dropped before the future ends, hands the rest of it to a task
/// on the Tokio runtime it was made on (made outside one, it has nowhere to hand it to, and
/// the rest is dropped).
pub(crate) struct RunsToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    runtime: Option<tokio::runtime::Handle>,
}

impl<F> RunsToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `future`, to be run to its end on the current runtime whatever happens to the caller.
    pub(crate) fn new(future: F) -> RunsToEnd<F> {
        RunsToEnd {
            future: Some(Box::pin(future)),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }
}

impl<F> Future for RunsToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Pin<Box<F>>` is `Unpin`, so this struct is too.
        let this = self.get_mut();
        let Some(future) = this.future.as_mut() else {
            // Polled after it returned its output: a future's caller never does.
            return Poll::Pending;
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        this.future = None;
        Poll::Ready(output)
    }
}

impl<F> Drop for RunsToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(rest), Some(runtime)) = (self.future.take(), &self.runtime) {
            // Detached: nobody waits for the output; the record the call settles is what a
            // retry reads.
            drop(runtime.spawn(rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::RunsToEnd;

    #[tokio::test(start_paused = true)]
    async fn a_dropped_call_still_runs_to_its_end() {
        let finished = Arc::new(AtomicBool::new(false));
        let seen = finished.clone();
        let call = RunsToEnd::new(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            seen.store(true, Ordering::SeqCst);
        });
        // The caller gives up after a second: the call's future is dropped half-way.
        assert!(tokio::time::timeout(Duration::from_secs(1), call)
            .await
            .is_err());
        assert!(!finished.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_call_awaited_to_its_end_gives_its_output() {
        let call = RunsToEnd::new(async { 7 });
        assert_eq!(call.await, 7);
    }
}
