//! Why a call could not be carried out at all.

use crate::identity::IdemKey;
use crate::store::StoreError;

/// Why a call was refused or could not be carried out. In every case the handler did not
/// run. Every variant but [`CallError::Store`] also leaves nothing behind in the store; after
/// a store error the claim may have been applied with its reply lost, and such a record turns
/// *unknown* when its lease passes, for the reconciler to settle (nothing was sent).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No tool of that name is registered.
    #[error("unknown tool `{name}`")]
    UnknownTool {
        /// The name that was asked for (cut to 64 bytes and `…` when longer: no tool name
        /// is).
        name: String,
    },
    /// The arguments were not valid JSON.
    #[error("arguments are not valid JSON: {message}")]
    MalformedJson {
        /// The parser's message.
        message: String,
    },
    /// The arguments did not match the tool's argument type.
    #[error("invalid arguments for `{tool}`: {message}")]
    InvalidArgs {
        /// The tool.
        tool: String,
        /// What did not match.
        message: String,
    },
    /// The arguments exceed the registry's size limit.
    #[error("arguments of {size} bytes exceed the limit of {limit} bytes")]
    ArgsTooLarge {
        /// Their size in bytes (JSON text).
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The call itself is malformed (e.g. an empty run id or intent id).
    #[error("invalid call: {message}")]
    InvalidCall {
        /// What is wrong.
        message: String,
    },
    /// The key already belongs to an operation with other arguments. Refused; nothing ran.
    #[error("idempotency key {key} was already used with different parameters")]
    ChangedParams {
        /// The key.
        key: IdemKey,
    },
    /// Another call holds the key and did not finish within the wait.
    #[error("operation {key} is in flight in another call")]
    InFlight {
        /// The key.
        key: IdemKey,
    },
    /// The store failed before the handler ran: nothing ran, but a claim whose reply was lost
    /// may be left running until its lease passes (see the type's docs).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CallError {
    /// The text the model gets.
    pub fn model_text(&self) -> String {
        match self {
            CallError::ChangedParams { .. } => "refused: this action was already requested with different parameters; nothing was done. Do not retry; ask the user.".to_owned(),
            CallError::InFlight { .. } => "this action is already in progress in another call; not sent again. Check again later.".to_owned(),
            CallError::Store(_) => "the idempotency store is unavailable; nothing was done. Try again later.".to_owned(),
            other => format!(
                "error: {}; nothing was done",
                crate::outcome::bounded(&other.to_string())
            ),
        }
    }
}
