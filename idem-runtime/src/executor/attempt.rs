//! One attempt: the handler under a timeout, with panics caught and the lease renewed.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::Value;

use crate::identity::IdemKey;
use crate::store::{ClaimToken, IdemStore};
use crate::tool::erased::{BoxFuture, RawArgs};
use crate::tool::{DynTool, ToolError};

/// How an attempt ended, as the executor saw it.
pub(crate) enum AttemptEnd {
    /// The handler returned.
    Returned(Result<Value, ToolError>),
    /// The handler panicked (message).
    Panicked(String),
    /// The timeout passed; the handler may still be running (returned so the caller can
    /// keep it as a late-result watcher).
    TimedOut(CaughtFuture),
}

/// The handler's (boxed) future with its panics caught: a panic in a step of the handler
/// ends it with the panic's message. A named type, not a second box.
pub(crate) struct CaughtFuture(BoxFuture<'static, Result<Value, ToolError>>);

impl Future for CaughtFuture {
    type Output = Result<Result<Value, ToolError>, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A handler that panicked is not polled again: its attempt is over, and the executor
        // drops the future once it has ended.
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(returned)) => Poll::Ready(Ok(returned)),
            Err(payload) => Poll::Ready(Err(panic_message(payload))),
        }
    }
}

pub(crate) use crate::store::deadline_after;

/// Wraps a handler future so a panic becomes a value.
pub(crate) fn catch(fut: BoxFuture<'static, Result<Value, ToolError>>) -> CaughtFuture {
    CaughtFuture(fut)
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// Who to renew the lease with, while the handler runs.
pub(crate) struct Lease<'a> {
    pub(crate) store: &'a Arc<dyn IdemStore>,
    pub(crate) key: &'a IdemKey,
    pub(crate) token: ClaimToken,
    pub(crate) lease: Duration,
}

/// How often a running claim's lease is renewed: every third of it, so two renewals can be
/// late or lost before it lapses. (The registry refuses leases too short for this.)
pub(crate) fn renewal_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Runs `fut` until it ends or `deadline` (`timeout` after the attempt began) passes,
/// renewing `lease` (if any) at a third of its length so only a dead or stuck worker's
/// claim ever expires.
pub(crate) async fn run(
    mut fut: CaughtFuture,
    deadline: tokio::time::Instant,
    timeout: Duration,
    lease: Option<Lease<'_>>,
) -> AttemptEnd {
    // The first step comes before any timer is armed, as tokio's own `timeout` does it: the
    // deadline was set just now, so it cannot have passed (unless the timeout is zero), and
    // a handler that finishes in its first step never registers a timer or renews a lease.
    if !timeout.is_zero() {
        let first = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut fut).poll(cx))).await;
        if let Poll::Ready(out) = first {
            return match out {
                Ok(r) => AttemptEnd::Returned(r),
                Err(msg) => AttemptEnd::Panicked(msg),
            };
        }
    }
    // A lease that outlasts the deadline needs no renewal during this attempt.
    let renew_every = lease
        .as_ref()
        .map(|l| renewal_interval(l.lease))
        .filter(|every| *every < timeout);
    loop {
        let next_renewal = renew_every.map(deadline_after);
        let wake = match next_renewal {
            Some(r) if r < deadline => r,
            _ => deadline,
        };
        // The timer is checked before the handler is polled (`biased`, timer first): a worker
        // that wakes past the deadline (a stalled process, a slow renewal) must not give the
        // handler another step, which could be the send, once the attempt is over.
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(wake) => {
                if tokio::time::Instant::now() >= deadline {
                    return AttemptEnd::TimedOut(fut);
                }
                if let Some(l) = &lease {
                    // Bounded by the attempt's deadline: a hanging store must not hold the
                    // timeout back.
                    let renewal = tokio::time::timeout_at(deadline, l.store.renew(l.key, l.token, l.lease));
                    if let Ok(Err(e)) = renewal.await {
                        // The handler keeps running: stopping it now would not undo an effect.
                        // Settling later will be refused if someone took over; that is logged.
                        tracing::warn!(key = %l.key, error = %crate::observe::field(&e), "could not renew the claim's lease");
                    }
                }
            }
            out = &mut fut => {
                return match out {
                    Ok(r) => AttemptEnd::Returned(r),
                    Err(msg) => AttemptEnd::Panicked(msg),
                };
            }
        }
    }
}

/// The typed arguments for the next attempt: the ones decoded for the call the first time,
/// decoded again after that (deserialization is deterministic, and `Args` need not be
/// `Clone`). A failure means a custom `Deserialize` disagrees with itself; the attempt
/// cannot run, and what came before stays unknown.
pub(crate) fn args_for(
    tool: &DynTool,
    args: RawArgs<'_>,
    first: &mut Option<Box<dyn std::any::Any + Send>>,
) -> Result<Box<dyn std::any::Any + Send>, ToolError> {
    match first.take() {
        Some(typed) => Ok(typed),
        None => tool.decode(args).map(|d| d.typed).map_err(|e| {
            ToolError::unknown(format!("arguments no longer decode for a retry: {e:?}"))
        }),
    }
}
