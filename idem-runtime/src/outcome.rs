//! Settle: the outcome classes every write ends in, and what the model is told about each.

use std::fmt;

use serde_json::Value;

/// The outcome classes: every write ends in exactly one (see the outcome table in
/// docs/ARCHITECTURE.md). New classes may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutcomeClass {
    /// The downstream provably did not start; the claim was released.
    Rejected,
    /// The downstream was unavailable (503, 429, overload) and provably did not start, every
    /// time the call's retry budget allowed asking; the claim was released.
    Unavailable,
    /// Terminal success.
    Completed,
    /// Terminal failure after the effect started.
    Failed,
    /// Recorded downstream, not terminal.
    Pending,
    /// Nobody knows whether the effect happened.
    Unknown,
    /// A person must decide.
    Escalated,
}

impl OutcomeClass {
    /// The class's name.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeClass::Rejected => "rejected",
            OutcomeClass::Unavailable => "unavailable",
            OutcomeClass::Completed => "completed",
            OutcomeClass::Failed => "failed",
            OutcomeClass::Pending => "pending",
            OutcomeClass::Unknown => "unknown",
            OutcomeClass::Escalated => "escalated",
        }
    }
}

impl fmt::Display for OutcomeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a call ended.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "class", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// Rejected before execution: nothing happened, the same intent may run again.
    Rejected {
        /// What the downstream said.
        message: String,
    },
    /// Unavailable, not executed: nothing happened, the same intent may run again later.
    Unavailable {
        /// What the downstream said last.
        message: String,
        /// How long it asked to wait, when it said.
        retry_after: Option<std::time::Duration>,
    },
    /// Terminal success with the (saved) output.
    Completed {
        /// The handler's output.
        output: Value,
    },
    /// Completed or failed earlier, but the saved result has passed its retention window:
    /// "already done; result no longer kept". Never executed again.
    ResultExpired {
        /// What the tombstone says the call ended as (completed or failed).
        was: OutcomeClass,
    },
    /// Terminal failure after execution.
    Failed {
        /// What the downstream said.
        message: String,
        /// The downstream's id for it.
        downstream_ref: Option<String>,
    },
    /// Recorded downstream, not terminal.
    Pending {
        /// The downstream's id to poll.
        downstream_ref: String,
        /// What the downstream returned so far.
        detail: Option<Value>,
    },
    /// Outcome unknown; sends are blocked until it is settled.
    Unknown {
        /// What was observed.
        reason: String,
    },
    /// A person must decide.
    Escalated {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// The outcome's class ([`Outcome::ResultExpired`] reports the class it was).
    pub fn class(&self) -> OutcomeClass {
        match self {
            Outcome::Rejected { .. } => OutcomeClass::Rejected,
            Outcome::Unavailable { .. } => OutcomeClass::Unavailable,
            Outcome::Completed { .. } => OutcomeClass::Completed,
            Outcome::ResultExpired { was } => *was,
            Outcome::Failed { .. } => OutcomeClass::Failed,
            Outcome::Pending { .. } => OutcomeClass::Pending,
            Outcome::Unknown { .. } => OutcomeClass::Unknown,
            Outcome::Escalated { .. } => OutcomeClass::Escalated,
        }
    }

    /// The short text the model gets. `replayed` is true when this call did not execute the
    /// handler but returned what an earlier call recorded.
    ///
    /// A completed output that is a JSON string reaches the model as its text (`charged 4900
    /// cents`, not `"charged 4900 cents"`); any other output as its JSON.
    pub fn model_text(&self, replayed: bool) -> String {
        match self {
            Outcome::Completed { output } => {
                let out = match output {
                    serde_json::Value::String(text) => text.clone(),
                    other => serde_json::to_string(other).unwrap_or_else(|_| "null".into()),
                };
                if replayed {
                    format!("already completed earlier; not sent again. result: {out}")
                } else {
                    out
                }
            }
            Outcome::ResultExpired { was } => format!(
                "already done ({was}) earlier; result no longer kept; not sent again"
            ),
            Outcome::Rejected { message } => format!(
                "rejected before execution: {}; nothing was done, you may correct the arguments and call again",
                bounded(message)
            ),
            Outcome::Unavailable {
                message,
                retry_after,
            } => {
                let message = bounded(message);
                let when = match retry_after {
                    // Rounded up: "in 1s" for a Retry-After of 1.5 s would be too early.
                    Some(d) => format!(
                        "in {}s or later",
                        d.as_secs()
                            .saturating_add(u64::from(d.subsec_nanos() > 0))
                            .max(1)
                    ),
                    None => "later".to_owned(),
                };
                format!(
                    "unavailable, not executed ({message}); nothing was done. You may call again {when}."
                )
            }
            Outcome::Failed { message, .. } => {
                let when = if replayed { "failed earlier" } else { "failed" };
                format!("{when} after execution: {}; not retried", bounded(message))
            }
            Outcome::Pending { downstream_ref, .. } => format!(
                "accepted downstream as {}, not final yet; pending, not sent again; reconciliation will settle it",
                bounded(downstream_ref)
            ),
            Outcome::Unknown { reason } => format!(
                "outcome unknown ({}); not sent again; reconciliation pending. Do not retry this action.",
                bounded(reason)
            ),
            Outcome::Escalated { reason } => format!(
                "escalated to a person ({}); not sent again. Do not retry this action.",
                bounded(reason)
            ),
        }
    }
}

/// The most bytes of a message (an error's text, a reason, a reference) that the model is
/// shown. A downstream's error can quote the whole request back (serde quotes a 900 KB string
/// sent for a number): the model needs the gist, and the full text stays in the record and
/// the trace.
pub const MAX_MODEL_DETAIL: usize = 1024;

/// `text` cut to [`MAX_MODEL_DETAIL`] bytes at a character boundary, saying how much was cut.
pub(crate) fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_MODEL_DETAIL {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = MAX_MODEL_DETAIL;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… ({} more bytes not shown)",
        &text[..end],
        text.len() - end
    ))
}
