//! The read path: no claim, no key; an unknown outcome is retried freely.

use tracing::Instrument;

use super::attempt::{self, AttemptEnd};
use super::classify::{class_of_result, outcome_of};
use super::{Executed, Executor};
use crate::call::ToolCall;
use crate::tool::erased::{Ctx, Decoded, RawArgs};
use crate::tool::{DynTool, ReadCtx, ToolError};

impl Executor {
    /// Runs a read: no claim, retried freely on an unknown outcome.
    pub(crate) async fn read(
        &self,
        tool: &DynTool,
        call: &ToolCall,
        args: RawArgs<'_>,
        decoded: Decoded,
    ) -> Executed {
        let spec = tool.spec();
        let mut typed = Some(decoded.typed);
        let began = tokio::time::Instant::now();
        let mut attempt = 1;
        loop {
            let args_for_attempt = match attempt::args_for(tool, args, &mut typed) {
                Ok(t) => t,
                Err(e) => {
                    return Executed {
                        key: None,
                        result: Ok(outcome_of(Err(e))),
                        replayed: false,
                        attempts: attempt - 1,
                    };
                }
            };
            let deadline = attempt::deadline_after(spec.timeout_duration());
            let ctx = ReadCtx::new(
                call.scope.clone(),
                call.call_id.clone(),
                tool.shared_name().clone(),
                deadline,
                attempt,
            );
            let fut = attempt::catch(tool.invoke(Ctx::Read(ctx), args_for_attempt));
            let span = tracing::info_span!("idem.attempt", attempt, class = tracing::field::Empty);
            let end = attempt::run(fut, deadline, spec.timeout_duration(), None)
                .instrument(span.clone())
                .await;
            let (result, retryable) = match end {
                AttemptEnd::Returned(r) => {
                    let unknown = matches!(r, Err(ToolError::Unknown { .. }));
                    (r, unknown)
                }
                AttemptEnd::Panicked(p) => (
                    Err(ToolError::unknown(format!("handler panicked: {p}"))),
                    false,
                ),
                AttemptEnd::TimedOut(_) => (
                    Err(ToolError::unknown(format!(
                        "timed out after {:?}",
                        spec.timeout_duration()
                    ))),
                    true,
                ),
            };
            span.record("class", class_of_result(&result).as_str());
            let pause = match &result {
                Err(ToolError::Unavailable { retry_after, .. }) => {
                    self.retry
                        .unavailable_pause(attempt, *retry_after, began.elapsed())
                }
                _ if retryable && attempt < self.retry.max_attempts => {
                    Some(self.retry.backoff(attempt))
                }
                _ => None,
            };
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
                attempt += 1;
                continue;
            }
            return Executed {
                key: None,
                result: Ok(outcome_of(result)),
                replayed: false,
                attempts: attempt,
            };
        }
    }
}
