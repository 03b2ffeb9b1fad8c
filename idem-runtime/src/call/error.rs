//! Why a call could not be carried out at all.

use crate::identity::IdemKey;
use crate::store::StoreError;

/// Why a call was refused or could not be carried out. In every case the handler did not
/// run. Every variant but [`CallError::Store`] also leaves nothing behind in the store; after
/// a store error the claim may have been applied with its reply lost, and such a record turns
/// *unknown* when its lease passes, for the reconciler to settle (nothing was sent).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CallError {
    /// No tool of that name is registered.
    UnknownTool {
        /// The name that was asked for (cut to 64 bytes and `…` when longer: no tool name
        /// is).
        name: String,
    },
    /// The arguments were not valid JSON.
    MalformedJson {
        /// The parser's message.
        message: String,
    },
    /// The arguments did not match the tool's argument type.
    InvalidArgs {
        /// The tool.
        tool: String,
        /// What did not match.
        message: String,
    },
    /// The arguments exceed the registry's size limit.
    ArgsTooLarge {
        /// Their size in bytes (JSON text).
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The call itself is malformed (e.g. an empty run id or intent id).
    InvalidCall {
        /// What is wrong.
        message: String,
    },
    /// The key already belongs to an operation with other arguments. Refused; nothing ran.
    ChangedParams {
        /// The key.
        key: IdemKey,
    },
    /// Another call holds the key and did not finish within the wait.
    InFlight {
        /// The key.
        key: IdemKey,
    },
    /// The store failed before the handler ran: nothing ran, but a claim whose reply was lost
    /// may be left running until its lease passes (see the type's docs).
    Store(StoreError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::UnknownTool { name } => write!(f, "unknown tool `{name}`"),
            CallError::MalformedJson { message } => {
                write!(f, "arguments are not valid JSON: {message}")
            }
            CallError::InvalidArgs { tool, message } => {
                write!(f, "invalid arguments for `{tool}`: {message}")
            }
            CallError::ArgsTooLarge { size, limit } => write!(
                f,
                "arguments of {size} bytes exceed the limit of {limit} bytes"
            ),
            CallError::InvalidCall { message } => write!(f, "invalid call: {message}"),
            CallError::ChangedParams { key } => write!(
                f,
                "idempotency key {key} was already used with different parameters"
            ),
            CallError::InFlight { key } => {
                write!(f, "operation {key} is in flight in another call")
            }
            CallError::Store(e) => std::fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the store error's own source.
            CallError::Store(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl From<StoreError> for CallError {
    fn from(e: StoreError) -> Self {
        CallError::Store(e)
    }
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
