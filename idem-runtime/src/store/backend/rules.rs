//! The store contract's state transitions as pure functions on [`Record`].
//!
//! Backends that read, modify and write a record under a lock or a transaction (memory,
//! SQLite, Postgres) call these so the rules live in one place. A backend that cannot (Redis,
//! in a Lua script) must implement the same rules; the conformance suite holds both to them.

use std::sync::Arc;
use std::time::Duration;

use super::{ClaimOutcome, ClaimRequest, Settlement};
use crate::identity::IdemKey;
use crate::outcome::OutcomeClass;
use crate::store::{
    ClaimToken, OperationDraft, ReadBackRecord, Record, RecordState, ReleaseNote, ReleaseRecord,
    Retention, StoreError, Timestamp,
};

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
                // The lapsed lease stays: its holder may have sent until it ran out, and no
                // attempt of that run was recorded (the reconciler's `settled_by`).
                record.state = RecordState::Unknown;
                record.message = Some(format!(
                    "lease expired at {until} with the handler unsettled; it may have committed"
                ));
                record.updated_at = now;
                Aged::Changed
            }
            _ => Aged::Unchanged,
        },
        RecordState::Completed | RecordState::Failed => {
            if tombstone_lapse(record.updated_at, retention) <= now {
                Aged::Gone
            } else if !record.result_expired && record.updated_at.plus(retention.results) <= now {
                expire_result(record);
                Aged::Changed
            } else {
                Aged::Unchanged
            }
        }
        RecordState::Pending | RecordState::Unknown | RecordState::Escalated => Aged::Unchanged,
    }
}

/// When time alone deletes `record` ([`age`] answers [`Aged::Gone`] from then on): its
/// tombstone's lapse, for a completed or failed record. `None` for a record in any other
/// state: only a settlement makes it terminal, and its lapse is counted from then.
pub fn lapses_at(record: &Record, retention: &Retention) -> Option<Timestamp> {
    matches!(record.state, RecordState::Completed | RecordState::Failed)
        .then(|| tombstone_lapse(record.updated_at, retention))
}

/// The end of the tombstone window of a record settled, or a release made, at `at`.
pub fn tombstone_lapse(at: Timestamp, retention: &Retention) -> Timestamp {
    // Normalized again here: a custom store may pass its retention through as given.
    at.plus(retention.normalized().tombstones)
}

/// [`age`] for a record held shared, as [`ClaimOutcome`] hands records out: the record is
/// copied ([`Arc::make_mut`]) only when time changes it while someone still reads the old
/// one.
pub fn age_shared(record: &mut Arc<Record>, now: Timestamp, retention: &Retention) -> Aged {
    if !due(record, now, retention) {
        return Aged::Unchanged;
    }
    age(Arc::make_mut(record), now, retention)
}

/// True exactly when [`age`] would change or drop `record` as of `now`.
pub fn due(record: &Record, now: Timestamp, retention: &Retention) -> bool {
    match record.state {
        RecordState::Running => record.lease_until.is_some_and(|until| until <= now),
        RecordState::Completed | RecordState::Failed => {
            tombstone_lapse(record.updated_at, retention) <= now
                || (!record.result_expired && record.updated_at.plus(retention.results) <= now)
        }
        RecordState::Pending | RecordState::Unknown | RecordState::Escalated => false,
    }
}

/// Turns a completed or failed record into its tombstone: what the call was asked and what
/// it returned are dropped, what identifies it stays.
///
/// Kept: key, fingerprint (so a repeat with other arguments is still refused), tool, state,
/// token, times, the downstream reference (the downstream's id for the effect, which a
/// person needs to find it) and each attempt's number, times, kind and class. Dropped: the
/// payload (the output), the message (a failure reason may quote the output), the saved
/// operation (scope, intent id and arguments), each attempt's message and every read-back.
pub fn expire_result(record: &mut Record) {
    record.result_expired = true;
    record.payload = None;
    record.message = None;
    record.operation = None;
    for attempt in &mut record.attempts {
        attempt.message = None;
    }
    record.read_backs.clear();
}

/// How many entries of each kind of evidence (attempts, read-backs) a record keeps at each
/// end: the first `EVIDENCE_KEPT` and the last `EVIDENCE_KEPT`. What falls between is
/// dropped and counted in one marker read-back (see [`EVIDENCE_MARKER`]).
///
/// An unknown record whose read-back keeps failing gains an entry on every reconciler pass;
/// without a cap it would grow for as long as nobody settles it. The first entries say how
/// it started, the last ones what is happening now.
pub const EVIDENCE_KEPT: usize = 16;

/// The start of the read-back that counts dropped evidence:
/// `idem evidence cap: A attempts and R read-backs dropped`. It stands where the dropped
/// entries were (after the first [`EVIDENCE_KEPT`] read-backs, or at the end while there are
/// fewer), and there is at most one per record.
pub const EVIDENCE_MARKER: &str = "idem evidence cap: ";

/// The counts of a marker read-back, if `result` is one.
fn marker_counts(result: &str) -> Option<(u64, u64)> {
    let rest = result.strip_prefix(EVIDENCE_MARKER)?;
    let mut words = rest.split_whitespace();
    let attempts = words.next()?.parse().ok()?;
    let read_backs = words.nth(2)?.parse().ok()?;
    Some((attempts, read_backs))
}

/// Applies [`EVIDENCE_KEPT`] to `record`: keeps the first and last entries of its attempts
/// and of its read-backs, and counts what it drops in the marker read-back (stamped `now`).
/// A record within the cap is left exactly as it is.
pub fn cap_evidence(record: &mut Record, now: Timestamp) {
    let limit = 2 * EVIDENCE_KEPT;
    let marker = record
        .read_backs
        .iter()
        .position(|rb| marker_counts(&rb.result).is_some());
    let read_backs = record.read_backs.len() - usize::from(marker.is_some());
    if record.attempts.len() <= limit && read_backs <= limit {
        return;
    }
    let (mut dropped_attempts, mut dropped_read_backs) = (0u64, 0u64);
    let mut at = now;
    if let Some(i) = marker {
        let old = record.read_backs.remove(i);
        (dropped_attempts, dropped_read_backs) = marker_counts(&old.result).unwrap_or((0, 0));
        at = old.at;
    }
    let over = record.attempts.len().saturating_sub(limit);
    if over > 0 {
        record.attempts.drain(EVIDENCE_KEPT..EVIDENCE_KEPT + over);
        dropped_attempts += over as u64;
    }
    let over = record.read_backs.len().saturating_sub(limit);
    if over > 0 {
        record.read_backs.drain(EVIDENCE_KEPT..EVIDENCE_KEPT + over);
        dropped_read_backs += over as u64;
    }
    let place = record.read_backs.len().min(EVIDENCE_KEPT);
    record.read_backs.insert(
        place,
        ReadBackRecord {
            at,
            result: format!(
                "{EVIDENCE_MARKER}{dropped_attempts} attempts and {dropped_read_backs} \
                 read-backs dropped"
            ),
        },
    );
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
        operation: req.operation.as_ref().map(OperationDraft::to_operation),
        read_backs: Vec::new(),
    }
}

/// Decides a claim against the (aged) existing record. `None` means the key is free.
pub fn claim_against(existing: Option<&Record>, req: &ClaimRequest) -> Option<ClaimOutcome> {
    existing.map(|record| judge(Arc::new(record.clone()), req))
}

/// [`claim_against`] for a record the store already holds shared: no copy is made.
pub fn claim_against_shared(
    existing: Option<&Arc<Record>>,
    req: &ClaimRequest,
) -> Option<ClaimOutcome> {
    existing.map(|record| judge(Arc::clone(record), req))
}

/// What a claim of `req` finds in `record`, which holds its key: the same operation, or
/// the same key with changed parameters.
pub fn judge(record: Arc<Record>, req: &ClaimRequest) -> ClaimOutcome {
    if record.fingerprint != req.fingerprint {
        ClaimOutcome::Mismatch(record)
    } else {
        ClaimOutcome::Existing(record)
    }
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
    may_settle(record, token, &s)?;
    apply_settlement(record, s, now);
    Ok(())
}

/// Whether [`settle`] would apply `s` to `record`, and if not, its error. Nothing is
/// changed or consumed: a store that must hand the settlement back on a refusal checks
/// with this, then applies it with [`apply_settlement`].
pub(crate) fn may_settle(
    record: &Record,
    token: ClaimToken,
    s: &Settlement,
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
        RecordState::Running | RecordState::Unknown => Ok(()),
        // The same holder settling to the same terminal state again: a retried settle whose
        // first try was applied, or a handler that settled inside its own transaction.
        state if state == s.state => Ok(()),
        _ => Err(stale(&record.key, Some(record))),
    }
}

/// [`settle`] once [`may_settle`] allowed it. False when the settlement only added
/// evidence to a record already settled so (its result stays).
pub(crate) fn apply_settlement(record: &mut Record, s: Settlement, now: Timestamp) -> bool {
    let adds_evidence_only = match record.state {
        RecordState::Running => false,
        // Unknown settled unknown again: more evidence. Any other settlement of an unknown
        // record settles it.
        RecordState::Unknown => s.state == RecordState::Unknown,
        // The same terminal state again (see `may_settle`).
        _ => true,
    };
    if adds_evidence_only {
        record.attempts.extend(s.attempts);
        record.read_backs.extend(s.read_backs);
        cap_evidence(record, now);
        record.updated_at = now;
        return false;
    }
    record.state = s.state;
    record.lease_until = None;
    record.payload = s.payload;
    record.message = s.message;
    if s.downstream_ref.is_some() {
        record.downstream_ref = s.downstream_ref;
    }
    append(&mut record.attempts, s.attempts);
    append(&mut record.read_backs, s.read_backs);
    cap_evidence(record, now);
    record.result_expired = false;
    record.updated_at = now;
    true
}

/// Appends `more` to `evidence`; into an empty list (a first settle's attempts) it moves
/// the vector instead of copying it into a new one.
fn append<T>(evidence: &mut Vec<T>, mut more: Vec<T>) {
    if evidence.is_empty() {
        std::mem::swap(evidence, &mut more);
    } else {
        evidence.append(&mut more);
    }
}

/// Checks that `token` may release `record` (only a running claim, only its holder).
pub fn release(record: &Record, token: ClaimToken) -> Result<(), StoreError> {
    if record.state != RecordState::Running || record.token != token {
        return Err(stale(&record.key, Some(record)));
    }
    Ok(())
}

/// How many releases of one key its trace keeps: the last `RELEASES_KEPT`. A key released
/// again and again (each time claimed, left unknown and freed) keeps the latest ones.
pub const RELEASES_KEPT: usize = 8;

/// Checks that the unknown, pending or escalated `record` whose token is `expected` may be
/// released, and returns the trace the release leaves: `note`, `now` and the record as it
/// stands. The same precondition as [`reclaim`]: a stale token (someone took the record over
/// or settled it since it was read) is refused.
pub fn release_unsettled(
    record: &Record,
    expected: ClaimToken,
    note: &ReleaseNote,
    now: Timestamp,
) -> Result<ReleaseRecord, StoreError> {
    check_releasable(record, expected)?;
    Ok(trace_of(record.clone(), note, now))
}

fn check_releasable(record: &Record, expected: ClaimToken) -> Result<(), StoreError> {
    let releasable = matches!(
        record.state,
        RecordState::Pending | RecordState::Unknown | RecordState::Escalated
    );
    if !releasable || record.token != expected {
        return Err(stale(&record.key, Some(record)));
    }
    Ok(())
}

fn trace_of(record: Record, note: &ReleaseNote, now: Timestamp) -> ReleaseRecord {
    ReleaseRecord {
        at: now,
        by: note.by.clone(),
        note: note.note.clone(),
        record,
    }
}

/// Refuses a settlement that [`IdemStore::release_traced`](crate::store::IdemStore::release_traced)
/// cannot apply: only an unsettled state can be released (a terminal result is saved and
/// replayed, never freed). Checked before the record is looked at, as [`settle`] checks a
/// return to running, so every backend answers it the same way.
pub fn releasable_settlement(key: &IdemKey, s: &Settlement) -> Result<(), StoreError> {
    match s.state {
        RecordState::Unknown | RecordState::Pending | RecordState::Escalated => Ok(()),
        state => Err(StoreError::Backend(format!(
            "a traced release of `{key}` needs an unknown, pending or escalated settlement, \
             not {state}: a terminal result is saved, not released"
        ))),
    }
}

/// The holder of `token` settles `record` with `s` and releases it
/// ([`IdemStore::release_traced`](crate::store::IdemStore::release_traced)): the trace to keep, the
/// record as settled. `record` is left as it was when anything is refused.
pub fn release_traced(
    record: &Record,
    token: ClaimToken,
    s: Settlement,
    note: &ReleaseNote,
    now: Timestamp,
) -> Result<ReleaseRecord, StoreError> {
    releasable_settlement(&record.key, &s)?;
    // Checked on the record as it is, so a refusal copies nothing.
    may_settle(record, token, &s)?;
    let mut settled = record.clone();
    apply_settlement(&mut settled, s, now);
    check_releasable(&settled, token)?;
    Ok(trace_of(settled, note, now))
}

/// True when `release` is past the tombstone window: it is dropped from its key's trace.
pub fn release_lapsed(release: &ReleaseRecord, now: Timestamp, retention: &Retention) -> bool {
    release_lapses_at(release, retention) <= now
}

/// When `release` lapses ([`release_lapsed`] from then on).
pub fn release_lapses_at(release: &ReleaseRecord, retention: &Retention) -> Timestamp {
    tombstone_lapse(release.at, retention)
}

/// Bounds a key's release trace (oldest first): drops the lapsed releases, then keeps the
/// last [`RELEASES_KEPT`].
pub fn keep_releases(trace: &mut Vec<ReleaseRecord>, now: Timestamp, retention: &Retention) {
    trace.retain(|r| !release_lapsed(r, now, retention));
    let over = trace.len().saturating_sub(RELEASES_KEPT);
    trace.drain(..over);
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
