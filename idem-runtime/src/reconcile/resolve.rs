//! A person's decision on an escalated (or unknown, or pending) operation.

use std::time::Duration;

use serde_json::Value;

use crate::identity::IdemKey;
use crate::store::{IdemStore, Record, RecordState, ReleaseNote, Settlement, StoreError};

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
    /// The effect did not happen: free the key so the intent may run again. The store keeps
    /// a trace of the release (who, when, the note and the record as it was; see
    /// [`IdemStore::releases`]).
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
///
/// The same as [`resolve_as`] by `"a person"`: say who with that function.
pub async fn resolve(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    note: &str,
) -> Result<Option<Record>, ResolveError> {
    resolve_as(store, key, resolution, "a person", note).await
}

/// Settles an unknown, pending or escalated record as `operator` decided, for the reason
/// `note`. Returns the record as it is afterwards (`None` after a release).
///
/// Completed and failed records keep `resolved by OPERATOR: NOTE` as their message. A
/// release frees the key and keeps a trace in the store, with the operator, the note, the
/// time and the record as it was ([`IdemStore::release_unsettled`]), in one atomic step: a
/// record that changed since it was read (a reconciler settled it meanwhile) is refused
/// with [`StoreError::StaleToken`] and nothing is freed.
pub async fn resolve_as(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    operator: &str,
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
    let by = if note.is_empty() {
        format!("resolved by {operator}")
    } else {
        format!("resolved by {operator}: {note}")
    };
    let settlement = match resolution {
        Resolution::Release => {
            // One atomic step: no takeover first, so the trace holds the record exactly as
            // the person saw it, and a record that moved on since is refused, not freed.
            store
                .release_unsettled(key, record.token, &ReleaseNote::new(operator, note))
                .await?;
            tracing::info!(key = %key, tool = %record.tool,
                operator = %crate::observe::field(&operator), note = %crate::observe::field(&note),
                "released by a person; the intent may run again (the store keeps the release)");
            return Ok(None);
        }
        Resolution::Completed {
            downstream_ref,
            output,
        } => {
            let output =
                output.unwrap_or_else(|| serde_json::json!({ "downstream_ref": downstream_ref }));
            Settlement::new(RecordState::Completed)
                .payload(output)
                .downstream_ref(downstream_ref)
                .message(by)
        }
        Resolution::Failed { reason } => {
            Settlement::new(RecordState::Failed).message(format!("{reason} ({by})"))
        }
    };
    let token = store
        .reclaim(key, record.token, Duration::from_secs(60))
        .await?;
    store.settle(key, token, settlement).await?;
    Ok(store.get(key).await?)
}
