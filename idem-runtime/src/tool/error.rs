//! What a handler returns when it cannot report plain success.

use serde_json::Value;

use crate::store::TxError;

/// A handler's account of an attempt that did not simply succeed.
///
/// Each variant is one class of the outcome table (docs/ARCHITECTURE.md); pick the one that
/// is *provably* true. When in doubt, [`ToolError::Unknown`]: it blocks further sends until
/// someone settles the record, which costs a delay, while a wrong "rejected" costs a
/// duplicate effect.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolError {
    /// The downstream provably did not start (validation error, a 4xx that guarantees nothing
    /// was executed). The claim is released: the same intent may run again.
    Rejected {
        /// What the downstream said.
        message: String,
    },
    /// The downstream refused the request in a way that guarantees nothing ran, and said to
    /// come back later: a 503, a 429, an overload shed before any work. The executor tries
    /// again after a pause (at least `retry_after` when the downstream gave one), keyed
    /// downstream or not, within the call's retry budget ([`crate::registry::RetryPolicy`]); when the
    /// budget is spent it releases the claim and tells the model nothing was done and it may
    /// try again later. Only for refusals that are *provably* not executed: a 5xx after which
    /// the effect may have happened is [`ToolError::Unknown`].
    Unavailable {
        /// What the downstream said.
        message: String,
        /// How long the downstream asked to wait (`Retry-After`), when it said.
        #[serde(default)]
        retry_after: Option<std::time::Duration>,
    },
    /// Terminal failure after the effect started (a declined charge). Saved and replayed.
    Failed {
        /// What the downstream said.
        message: String,
        /// The downstream's id for the failed operation, when it has one.
        downstream_ref: Option<String>,
    },
    /// Recorded downstream but not terminal (an asynchronous refund). Saved; never sent again;
    /// a reconciler polls it to a terminal state.
    Pending {
        /// The downstream's id to poll.
        downstream_ref: String,
        /// What the downstream returned so far.
        detail: Option<Value>,
    },
    /// Nobody knows whether the effect happened (timeout, connection reset, 5xx). Never
    /// treated as failed; never re-sent to an unkeyed downstream.
    Unknown {
        /// What was observed.
        message: String,
    },
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolError::Rejected { message } => write!(f, "rejected before execution: {message}"),
            ToolError::Unavailable { message, .. } => {
                write!(f, "unavailable, not executed: {message}")
            }
            ToolError::Failed { message, .. } => write!(f, "failed after execution: {message}"),
            ToolError::Pending { downstream_ref, .. } => {
                write!(f, "pending downstream as {downstream_ref}")
            }
            ToolError::Unknown { message } => write!(f, "outcome unknown: {message}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl ToolError {
    /// The downstream provably did not start.
    pub fn rejected(message: impl std::fmt::Display) -> Self {
        ToolError::Rejected {
            message: message.to_string(),
        }
    }

    /// The downstream is unavailable and provably did not start (503, 429, overload).
    pub fn unavailable(message: impl std::fmt::Display) -> Self {
        ToolError::Unavailable {
            message: message.to_string(),
            retry_after: None,
        }
    }

    /// The downstream is unavailable, did not start, and asked to wait `retry_after` (its
    /// `Retry-After`).
    pub fn unavailable_for(
        message: impl std::fmt::Display,
        retry_after: std::time::Duration,
    ) -> Self {
        ToolError::Unavailable {
            message: message.to_string(),
            retry_after: Some(retry_after),
        }
    }

    /// Terminal failure after the effect started.
    pub fn failed(message: impl std::fmt::Display) -> Self {
        ToolError::Failed {
            message: message.to_string(),
            downstream_ref: None,
        }
    }

    /// Terminal failure after the effect started, with the downstream's id for it.
    pub fn failed_with_ref(
        message: impl std::fmt::Display,
        downstream_ref: impl Into<String>,
    ) -> Self {
        ToolError::Failed {
            message: message.to_string(),
            downstream_ref: Some(downstream_ref.into()),
        }
    }

    /// Recorded downstream, not terminal yet.
    pub fn pending(downstream_ref: impl Into<String>) -> Self {
        ToolError::Pending {
            downstream_ref: downstream_ref.into(),
            detail: None,
        }
    }

    /// Recorded downstream, not terminal yet, with what the downstream returned so far.
    pub fn pending_with(downstream_ref: impl Into<String>, detail: Value) -> Self {
        ToolError::Pending {
            downstream_ref: downstream_ref.into(),
            detail: Some(detail),
        }
    }

    /// Outcome unknown.
    pub fn unknown(message: impl std::fmt::Display) -> Self {
        ToolError::Unknown {
            message: message.to_string(),
        }
    }
}

/// A transactional effect's store-side failure: nothing executed is a rejection (the key is
/// freed for another try), an undetermined commit is unknown (the key stays blocked).
impl From<TxError> for ToolError {
    fn from(e: TxError) -> Self {
        match e {
            TxError::NotExecuted(_) => ToolError::rejected(e),
            TxError::Unknown(message) => ToolError::Unknown { message },
        }
    }
}
