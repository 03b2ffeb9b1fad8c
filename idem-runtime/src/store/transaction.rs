//! What a store needs from a handler that commits its effect and its record together
//! (`PostgresStore::transact`), without knowing about tools.

use super::ClaimToken;
use crate::identity::IdemKey;

/// A claim its holder is running under: the key and the token that fences it.
///
/// A store uses it to settle the record in the same transaction as the effect, and only if
/// the token still holds the record. `WriteCtx` implements it, so a tool passes its context.
pub trait HeldClaim {
    /// The operation's key.
    fn key(&self) -> &IdemKey;
    /// The token of the claim the holder runs under.
    fn claim_token(&self) -> ClaimToken;
}

/// Why a transactional effect did not commit, as far as the store can tell.
///
/// `ToolError` converts it (`NotExecuted` → rejected, `Unknown` → unknown), so a handler's
/// `?` carries it to the executor, which then frees the key or blocks it accordingly.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxError {
    /// The transaction never began, was rolled back, or was refused at commit: nothing the
    /// handler wrote was kept, so the same intent may run again.
    NotExecuted(String),
    /// The connection broke during `COMMIT` and the record could not be read back: the
    /// effect may or may not have committed.
    Unknown(String),
}

impl std::fmt::Display for TxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxError::NotExecuted(message) => write!(f, "{message}; nothing was executed"),
            TxError::Unknown(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for TxError {}
