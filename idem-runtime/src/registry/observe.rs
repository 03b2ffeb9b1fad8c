//! Call metrics (feature `metrics`): what [`Registry::call`](super::Registry::call) counts
//! once a call is answered. Names and labels: [`crate::observe`].

use crate::executor::Executed;
use crate::observe::Timer;

/// Records a finished call: its class, replay, unknown outcome or refusal, and duration.
/// `tool` is the name the call asked for; it becomes a label only when a registered tool
/// answered to it (every answer but "unknown tool").
#[cfg(feature = "metrics")]
pub(super) fn call_finished(tool: &str, executed: &Executed, timer: Timer) {
    use crate::call::CallError;
    use crate::observe::{
        count, observe, Label, CALLS, CALL_DURATION, CHANGED_PARAMS, REFUSALS, REPLAYS,
        UNKNOWN_OUTCOMES, UNREGISTERED_TOOL,
    };
    use crate::outcome::OutcomeClass;

    let tool: Label = match &executed.result {
        Err(CallError::UnknownTool { .. }) => UNREGISTERED_TOOL.into(),
        _ => tool.to_owned().into(),
    };
    let class = match &executed.result {
        Ok(outcome) => outcome.class().as_str(),
        Err(_) => "refused",
    };
    let labels = [("tool", tool.clone()), ("class", class.into())];
    count(CALLS, &labels, 1);
    observe(CALL_DURATION, &labels, timer.seconds());
    match &executed.result {
        Ok(_) if executed.replayed => count(REPLAYS, &labels, 1),
        Ok(outcome) if outcome.class() == OutcomeClass::Unknown => {
            count(UNKNOWN_OUTCOMES, &[("tool", tool)], 1)
        }
        Ok(_) => {}
        Err(e) => {
            let reason = refusal_reason(e);
            if matches!(e, CallError::ChangedParams { .. }) {
                count(CHANGED_PARAMS, &[("tool", tool.clone())], 1);
            }
            count(REFUSALS, &[("tool", tool), ("reason", reason.into())], 1);
        }
    }
}

#[cfg(not(feature = "metrics"))]
pub(super) fn call_finished(_tool: &str, _executed: &Executed, _timer: Timer) {}

/// The `reason` label of a refused call.
#[cfg(feature = "metrics")]
fn refusal_reason(e: &crate::call::CallError) -> &'static str {
    use crate::call::CallError;
    match e {
        CallError::UnknownTool { .. } => "unknown_tool",
        CallError::MalformedJson { .. } => "malformed_json",
        CallError::InvalidArgs { .. } => "invalid_args",
        CallError::ArgsTooLarge { .. } => "args_too_large",
        CallError::InvalidCall { .. } => "invalid_call",
        CallError::ChangedParams { .. } => "changed_params",
        CallError::InFlight { .. } => "in_flight",
        CallError::Store(_) => "store",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}
