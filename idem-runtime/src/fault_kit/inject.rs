//! The injector: what the kit puts between the executor and the user's handler.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Fault, Timing};
use crate::tool::erased::{Attempt, BoxFuture, Intercept};
use crate::tool::ToolError;

/// Breaks the attempts of one fault's run; every attempt it does not break runs the
/// handler as it is.
pub(super) struct Injector {
    fault: Fault,
    timing: Timing,
    /// Attempts seen so far, across every call of the run.
    attempts: AtomicU32,
    /// Until then, every attempt is answered `503` ([`Fault::Outage`]).
    outage_until: Option<Instant>,
    /// Set once a handler the kit is about to crash has returned ([`Fault::Crash`]).
    effect_done: watch::Sender<bool>,
}

impl Injector {
    /// The injector of `fault`'s run, which began at `began`.
    pub(super) fn new(fault: Fault, timing: Timing, began: Instant) -> Arc<Self> {
        Arc::new(Injector {
            fault,
            timing,
            attempts: AtomicU32::new(0),
            outage_until: (fault == Fault::Outage).then(|| {
                // An outage too long for the clock lasts as good as forever.
                (began.checked_add(timing.outage))
                    .unwrap_or_else(|| began + Duration::from_secs(30 * 365 * 24 * 3600))
            }),
            effect_done: watch::Sender::new(false),
        })
    }

    /// Resolves once the handler of the attempt to be crashed has returned.
    pub(super) async fn effect_done(&self) {
        let mut done = self.effect_done.subscribe();
        // The sender lives in `self`: the channel cannot close while this waits.
        let _ = done.wait_for(|d| *d).await;
    }
}

fn server_error(when: &str) -> ToolError {
    ToolError::unknown(format!("500 Internal Server Error (fault kit: {when})"))
}

fn unavailable(retry_after: Option<Duration>) -> ToolError {
    let said = "503 Service Unavailable (fault kit: nothing ran)";
    match retry_after {
        Some(wait) => ToolError::unavailable_for(said, wait),
        None => ToolError::unavailable(said),
    }
}

impl Intercept for Injector {
    fn attempt(self: Arc<Self>, attempt: Attempt) -> BoxFuture<'static, Result<Value, ToolError>> {
        let n = self.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        let t = self.timing;
        Box::pin(async move {
            if self
                .outage_until
                .is_some_and(|until| Instant::now() < until)
            {
                return Err(unavailable(Some(t.retry_after)));
            }
            let first = n == 1;
            match self.fault {
                Fault::LostAck if first => {
                    let _ = attempt.run().await;
                    std::future::pending().await
                }
                Fault::LateCommit if first => {
                    tokio::time::sleep(t.late_commit).await;
                    attempt.run().await
                }
                Fault::LateTail if first => {
                    tokio::time::sleep(t.late_tail).await;
                    attempt.run().await
                }
                Fault::Redelivery if first => {
                    let (delivered, redelivered) = attempt.run_twice();
                    let answer = delivered.await;
                    let _ = redelivered.await;
                    answer
                }
                Fault::TimeoutBeforeEffect if first => std::future::pending().await,
                Fault::TimeoutAfterEffect if first => {
                    let _ = attempt.run().await;
                    tokio::time::sleep(t.client_timeout).await;
                    Err(ToolError::unknown(
                        "the client timed out waiting for the answer (fault kit)",
                    ))
                }
                Fault::ServerErrorBeforeEffect if first => {
                    Err(server_error("before the handler ran"))
                }
                Fault::ServerErrorAfterEffect if first => {
                    let _ = attempt.run().await;
                    Err(server_error("after the handler ran"))
                }
                Fault::Unavailable if first => Err(unavailable(None)),
                Fault::UnavailableRetryAfter if n <= 2 => Err(unavailable(Some(t.retry_after))),
                Fault::Crash if first => {
                    let _ = attempt.run().await;
                    self.effect_done.send_replace(true);
                    // The kit drops this future (and the call that runs it) from here.
                    std::future::pending().await
                }
                _ => attempt.run().await,
            }
        })
    }
}
