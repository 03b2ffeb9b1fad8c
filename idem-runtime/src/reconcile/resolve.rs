//! A person's decision on an escalated (or unknown, or pending) operation.

use std::time::Duration;

use serde_json::Value;

use crate::identity::IdemKey;
use crate::store::{IdemStore, Record, RecordState, Settlement, StoreError};

/// What a person decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// The effect happened: settle as completed. Repeats replay `output`.
    Completed {
        /// The downstream's id for the effect.
        downstream_ref: String,
        /// The result repeats get (default: `{"downstream_ref": …}`).
        output: Option<Value>,
    },
    /// The effect failed terminally: settle as failed.
    Failed {
        /// Why.
        reason: String,
    },
    /// The effect did not happen: free the key so the intent may run again.
    Release,
}

/// Why a resolution was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No record for the key.
    #[error("no record for {0}")]
    NotFound(IdemKey),
    /// The record is running, completed or failed: nothing for a person to decide.
    #[error("{key} is {state}; only unknown, pending or escalated records can be resolved")]
    NotResolvable {
        /// The key.
        key: IdemKey,
        /// Its state.
        state: RecordState,
    },
    /// The store failed, or the record changed under us (try again).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Settles an unknown, pending or escalated record as a person decided. Returns the record
/// as it is afterwards (`None` after a release).
pub async fn resolve(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    note: &str,
) -> Result<Option<Record>, ResolveError> {
    let record = store
        .get(key)
        .await?
        .ok_or_else(|| ResolveError::NotFound(key.clone()))?;
    if !matches!(
        record.state,
        RecordState::Unknown | RecordState::Pending | RecordState::Escalated
    ) {
        return Err(ResolveError::NotResolvable {
            key: key.clone(),
            state: record.state,
        });
    }
    let token = store
        .reclaim(key, record.token, Duration::from_secs(60))
        .await?;
    let by = if note.is_empty() {
        "resolved by a person".to_owned()
    } else {
        format!("resolved by a person: {note}")
    };
    match resolution {
        Resolution::Release => {
            store.release(key, token).await?;
            tracing::info!(key = %key, note, "released by a person; the intent may run again");
            return Ok(None);
        }
        Resolution::Completed {
            downstream_ref,
            output,
        } => {
            let output =
                output.unwrap_or_else(|| serde_json::json!({ "downstream_ref": downstream_ref }));
            let s = Settlement::new(RecordState::Completed)
                .payload(output)
                .downstream_ref(downstream_ref)
                .message(by);
            store.settle(key, token, s).await?;
        }
        Resolution::Failed { reason } => {
            let s = Settlement::new(RecordState::Failed).message(format!("{reason} ({by})"));
            store.settle(key, token, s).await?;
        }
    }
    Ok(store.get(key).await?)
}
