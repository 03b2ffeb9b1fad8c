//! The store contract's state transitions as pure functions on [`Record`].
//!
//! Backends that read, modify and write a record under a lock or a transaction (memory,
//! SQLite, Postgres) call these so the rules live in one place. A backend that cannot (Redis,
//! in a Lua script) must implement the same rules; the conformance suite holds both to them.

use std::time::Duration;

use super::{
    ClaimOutcome, ClaimRequest, ClaimToken, Record, RecordState, Retention, Settlement, StoreError,
    Timestamp,
};
use crate::identity::IdemKey;
use crate::outcome::OutcomeClass;

/// What time did to a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aged {
    /// Nothing changed.
    Unchanged,
    /// The record changed (lease expired → unknown, or result expired → tombstone): write it.
    Changed,
    /// The tombstone outlived its retention too: delete the record.
    Gone,
}

/// Applies lease expiry and retention to `record` as of `now`.
pub fn age(record: &mut Record, now: Timestamp, retention: &Retention) -> Aged {
    match record.state {
        RecordState::Running => match record.lease_until {
            Some(until) if until <= now => {
                record.state = RecordState::Unknown;
                record.lease_until = None;
                record.message = Some(format!(
                    "lease expired at {until} with the handler unsettled; it may have committed"
                ));
                record.updated_at = now;
                Aged::Changed
            }
            _ => Aged::Unchanged,
        },
        RecordState::Completed | RecordState::Failed => {
            // Normalized again here: a custom store may pass its retention through as given.
            if record.updated_at.plus(retention.normalized().tombstones) <= now {
                Aged::Gone
            } else if !record.result_expired && record.updated_at.plus(retention.results) <= now {
                record.result_expired = true;
                record.payload = None;
                Aged::Changed
            } else {
                Aged::Unchanged
            }
        }
        RecordState::Pending | RecordState::Unknown | RecordState::Escalated => Aged::Unchanged,
    }
}

/// A new running record for a granted claim.
pub fn new_claim(req: &ClaimRequest, token: ClaimToken, now: Timestamp) -> Record {
    Record {
        key: req.key.clone(),
        fingerprint: req.fingerprint,
        tool: req.tool.clone(),
        state: RecordState::Running,
        token,
        lease_until: Some(now.plus(req.lease)),
        created_at: now,
        updated_at: now,
        payload: None,
        message: None,
        downstream_ref: None,
        result_expired: false,
        attempts: Vec::new(),
        operation: req.operation.clone(),
        read_backs: Vec::new(),
    }
}

/// Decides a claim against the (aged) existing record. `None` means the key is free.
pub fn claim_against(existing: Option<&Record>, req: &ClaimRequest) -> Option<ClaimOutcome> {
    let record = existing?;
    Some(if record.fingerprint != req.fingerprint {
        ClaimOutcome::Mismatch(record.clone())
    } else {
        ClaimOutcome::Existing(record.clone())
    })
}

fn stale(key: &IdemKey, record: Option<&Record>) -> StoreError {
    StoreError::StaleToken {
        key: key.clone(),
        state: record.map_or("absent", |r| r.state.as_str()).to_owned(),
    }
}

/// Checks that `token` may renew `record`.
pub fn renew(
    record: &mut Record,
    token: ClaimToken,
    lease: Duration,
    now: Timestamp,
) -> Result<(), StoreError> {
    if record.state != RecordState::Running || record.token != token {
        return Err(stale(&record.key, Some(record)));
    }
    record.lease_until = Some(now.plus(lease));
    record.updated_at = now;
    Ok(())
}

/// Applies a settlement by the holder of `token`.
///
/// Allowed: the running claim's own token; or the same token on an *unknown* record it left
/// behind (a late result: it settles the record if it is terminal or pending, else only adds
/// its evidence). Everything else is stale.
pub fn settle(
    record: &mut Record,
    token: ClaimToken,
    s: Settlement,
    now: Timestamp,
) -> Result<(), StoreError> {
    // Refused whatever the record holds, before the token is looked at: every backend
    // answers this the same way (Redis and Postgres check it before touching the record).
    if s.state == RecordState::Running {
        return Err(StoreError::Backend(
            "a settlement cannot return a record to running".into(),
        ));
    }
    if record.token != token {
        return Err(stale(&record.key, Some(record)));
    }
    match record.state {
        RecordState::Running => {}
        // The same holder settling to the same terminal state again: a retried settle whose
        // first try was applied, or a handler that settled inside its own transaction.
        state if state == s.state && state != RecordState::Unknown => {
            record.attempts.extend(s.attempts);
            record.read_backs.extend(s.read_backs);
            record.updated_at = now;
            return Ok(());
        }
        RecordState::Unknown => {
            if s.state == RecordState::Unknown {
                record.attempts.extend(s.attempts);
                record.read_backs.extend(s.read_backs);
                record.updated_at = now;
                return Ok(());
            }
        }
        _ => return Err(stale(&record.key, Some(record))),
    }
    record.state = s.state;
    record.lease_until = None;
    record.payload = s.payload;
    record.message = s.message;
    if s.downstream_ref.is_some() {
        record.downstream_ref = s.downstream_ref;
    }
    record.attempts.extend(s.attempts);
    record.read_backs.extend(s.read_backs);
    record.result_expired = false;
    record.updated_at = now;
    Ok(())
}

/// Checks that `token` may release `record` (only a running claim, only its holder).
pub fn release(record: &Record, token: ClaimToken) -> Result<(), StoreError> {
    if record.state != RecordState::Running || record.token != token {
        return Err(stale(&record.key, Some(record)));
    }
    Ok(())
}

/// Takes over a pending, unknown or escalated record with a fresh token.
pub fn reclaim(
    record: &mut Record,
    expected: ClaimToken,
    fresh: ClaimToken,
    lease: Duration,
    now: Timestamp,
) -> Result<(), StoreError> {
    let takeable = matches!(
        record.state,
        RecordState::Pending | RecordState::Unknown | RecordState::Escalated
    );
    if !takeable || record.token != expected {
        return Err(stale(&record.key, Some(record)));
    }
    record.state = RecordState::Running;
    record.token = fresh;
    record.lease_until = Some(now.plus(lease));
    record.updated_at = now;
    Ok(())
}

/// The stale-token error for a key with no record.
pub fn stale_absent(key: &IdemKey) -> StoreError {
    stale(key, None)
}

/// The outcome class a settled state corresponds to.
pub fn class_of(state: RecordState) -> Option<OutcomeClass> {
    Some(match state {
        RecordState::Running => return None,
        RecordState::Completed => OutcomeClass::Completed,
        RecordState::Failed => OutcomeClass::Failed,
        RecordState::Pending => OutcomeClass::Pending,
        RecordState::Unknown => OutcomeClass::Unknown,
        RecordState::Escalated => OutcomeClass::Escalated,
    })
}
