//! Evidence that arrives after the executor has let go of a claim: a timed-out handler's
//! late result, or the attempts of a call whose claim was taken over before a retry.
//!
//! It belongs in the record a person or the reconciler will read. Logging it is not enough:
//! an escalated record that shows one timed-out attempt, while the charge in fact landed
//! later, invites a person to release the key, and the next call charges again.

use std::time::Duration;

use crate::identity::IdemKey;
use crate::store::{AttemptRecord, ClaimToken, IdemStore, Record, RecordState, Settlement};
use crate::store::{StoreError, StoreError::StaleToken};

/// How often to look again when the record moves between reading it and writing to it.
const TRIES: usize = 3;

/// Adds `attempts` (made under the claim `token`) to the record of `key`.
///
/// - The record is still the *unknown* one this claim left: `late` (a late result that
///   settles, if any) settles it, else the evidence is added and it stays unknown.
/// - A reconciler or a person has moved it on since (a read-back under a new token, an
///   escalation): taken over with its current token (compare-and-swap, so a concurrent
///   decision wins) and written back as it was plus the evidence. An unknown record is
///   settled by `late` as above; an escalated one stays escalated: a person decides.
/// - Anything else (absent, running under someone's retry, pending, settled): nothing waits
///   on this attempt; the evidence is not written.
///
/// Returns the record as written, or `None` when nothing was written.
pub(crate) async fn keep(
    store: &dyn IdemStore,
    key: &IdemKey,
    token: ClaimToken,
    late: Option<Settlement>,
    attempts: Vec<AttemptRecord>,
    lease: Duration,
) -> Result<Option<Record>, StoreError> {
    for _ in 0..TRIES {
        let Some(record) = store.get(key).await? else {
            return Ok(None);
        };
        let (holder, settlement) = match record.state {
            RecordState::Unknown if record.token == token => (
                token,
                late.clone()
                    .unwrap_or_else(|| Settlement::new(RecordState::Unknown)),
            ),
            RecordState::Unknown | RecordState::Escalated => {
                let fresh = match store.reclaim(key, record.token, lease).await {
                    Ok(fresh) => fresh,
                    // Moved again meanwhile: look again.
                    Err(StaleToken { .. }) => continue,
                    Err(e) => return Err(e),
                };
                let settlement = match (&late, record.state) {
                    (Some(late), RecordState::Unknown) => late.clone(),
                    _ => as_it_was(&record),
                };
                (fresh, settlement)
            }
            _ => return Ok(None),
        };
        match store
            .settle(key, holder, settlement.attempts(attempts.clone()))
            .await
        {
            Ok(()) => return store.get(key).await,
            Err(StaleToken { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The settlement that puts a taken-over record back as it was (state, message, payload;
/// its downstream ref and evidence are kept by the store).
fn as_it_was(record: &Record) -> Settlement {
    let mut s = Settlement::new(record.state);
    if let Some(message) = &record.message {
        s = s.message(message.clone());
    }
    if let Some(payload) = &record.payload {
        s = s.payload(payload.clone());
    }
    s
}
