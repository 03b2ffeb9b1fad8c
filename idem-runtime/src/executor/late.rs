//! Late results: a handler that hit its timeout keeps running, and what it reports is kept.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::attempt::CaughtFuture;
use super::classify::{class_of_result, settlement_of};
use super::{evidence, Executor};
use crate::escalation::{Escalation, ReasonKind};
use crate::identity::IdemKey;
use crate::outcome::OutcomeClass;
use crate::store::{
    AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, IdemStore, OperationDraft,
    Record, RecordState, Settlement, StoreError, Timestamp,
};

/// A timed-out attempt whose handler keeps running in the background.
pub(super) struct LateAttempt {
    pub(super) key: IdemKey,
    pub(super) token: ClaimToken,
    pub(super) attempt: u32,
    pub(super) started_at: Timestamp,
    /// The tool's effective in-flight bound
    /// ([`crate::tool::ToolSpec::effective_in_flight_bound`]).
    pub(super) abandon_after: Duration,
    /// When the handler is dropped: the attempt's deadline plus `abandon_after`, fixed when
    /// the attempt began, so nothing that happens after the timeout (a slow store read, a
    /// stalled worker) can stretch the bound the reconciler relies on.
    pub(super) abandon_at: tokio::time::Instant,
    /// The tool's lease, for taking over a record that moved on meanwhile.
    pub(super) lease: Duration,
}

impl Executor {
    /// Keeps a timed-out handler running; when it ends, its result settles the record it
    /// left *unknown*, or, if a reconciler or a person has moved the record on meanwhile, is
    /// added to it as evidence (see [`evidence::keep`]); a person looking at an escalation
    /// is told through the sink. The handler is dropped once the tool's effective in-flight
    /// bound has passed after the timeout (an [`AttemptKind::Abandoned`] attempt records it;
    /// the record stays unknown), so the bound the reconciler relies on holds in this
    /// process too.
    pub(super) async fn watch_late_result(&self, fut: CaughtFuture, late: LateAttempt) {
        // What was claimed, read now, while the record is still this attempt's: if a person
        // releases the key before the late result arrives, the result needs it to stand in
        // the store again. (Rare path: only a timed-out attempt pays this read.)
        let claimed = self.store().get(&late.key).await.ok().flatten();
        let store = self.store.clone();
        let clock = self.clock.clone();
        let sink = self.sink.clone();
        let LateAttempt {
            key,
            token,
            attempt,
            started_at,
            abandon_after,
            abandon_at,
            lease,
        } = late;
        tokio::spawn(
            async move {
                // Past the bound the handler is dropped here: awaiting it longer would hold its
                // task and memory for a result the reconciler no longer waits for.
                // The deadline is checked before the handler is polled (`biased`): a worker
                // that wakes past it must not let the handler take one more step, which could
                // be the send.
                let outcome = tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(abandon_at) => None,
                    result = fut => Some(result),
                };
                let (settlement, kind, class, message) = match &outcome {
                    Some(Ok(r)) => (
                        settlement_of(r),
                        AttemptKind::Late,
                        class_of_result(r),
                        format!(
                            "late result after timeout: {}",
                            r.as_ref()
                                .err()
                                .map_or_else(|| class_of_result(r).to_string(), ToString::to_string)
                        ),
                    ),
                    Some(Err(p)) => (
                        None,
                        AttemptKind::Late,
                        OutcomeClass::Unknown,
                        format!("late result after timeout: handler panicked: {p}"),
                    ),
                    None => (
                        None,
                        AttemptKind::Abandoned,
                        OutcomeClass::Unknown,
                        format!(
                            "abandoned: still running {abandon_after:?} after its timeout (its \
                             in-flight bound), so it was dropped; what it sent may still land"
                        ),
                    ),
                };
                let evidence = AttemptRecord::new(
                    attempt,
                    started_at,
                    clock.now(),
                    kind,
                    class,
                    Some(message),
                );
                // The executor may still be retrying under this claim; wait for it to settle
                // (however long its attempts take) before adding to what it left.
                loop {
                    match store.wait_settled(&key, Duration::from_secs(60)).await {
                        Ok(Some(r)) if r.token == token && r.state == RecordState::Running => continue,
                        _ => break,
                    }
                }
                // A late "rejected" or panic is only evidence: the record stays unknown.
                let settlement = settlement.filter(|s| s.state != RecordState::Unknown);
                let kept = evidence::keep(
                    &*store,
                    &key,
                    token,
                    settlement.clone(),
                    vec![evidence.clone()],
                    lease,
                )
                .await;
                match kept {
                    Ok(Some(record)) => {
                        tracing::info!(key = %key, class = %class, state = %record.state,
                            "late result recorded");
                        if record.state == RecordState::Escalated {
                            let reason = if kind == AttemptKind::Abandoned {
                                "a timed-out attempt was still running at its in-flight bound, after escalation, and was dropped".to_owned()
                            } else {
                                format!("a timed-out attempt reported late, after escalation: {class}")
                            };
                            let mut notice = Escalation::from_record(&record, reason, clock.now());
                            notice.kind = ReasonKind::LateResult;
                            if let Err(e) = sink.deliver(&notice).await {
                                tracing::error!(key = %key, error = %crate::observe::field(&e), "escalation sink failed");
                            }
                        }
                    }
                    Ok(None) => match (settlement, claimed, store.get(&key).await) {
                        // The effect happened, and the record that said "unknown" is gone
                        // (a person or a read-back released the key). Put it back as what
                        // happened, so a repeat replays instead of running again, and tell
                        // the person who released it.
                        (Some(settlement), Some(claimed), Ok(None)) => {
                            let restored = restore(&*store, &claimed, settlement, Some(evidence.clone()), lease).await;
                            let reason = match &restored {
                                Ok(Restored::Recorded(_)) => format!(
                                    "a timed-out attempt reported {class} after its key was released; recorded again, repeats now replay it"
                                ),
                                Ok(Restored::ClaimedAgain(_)) => format!(
                                    "a timed-out attempt reported {class} after its key was released and claimed again: the effect may have happened twice"
                                ),
                                Err(e) => format!(
                                    "a timed-out attempt reported {class} after its key was released, and could not be recorded ({e})"
                                ),
                            };
                            tracing::warn!(key = %key, class = %class, "{}", crate::observe::field(&reason));
                            let shown = match &restored {
                                Ok(Restored::Recorded(r) | Restored::ClaimedAgain(r)) => r,
                                Err(_) => &claimed,
                            };
                            let mut notice = Escalation::from_record(shown, reason, clock.now());
                            notice.kind = ReasonKind::LateResult;
                            if !notice.attempts.contains(&evidence) {
                                notice.attempts.push(evidence.clone());
                            }
                            if let Err(e) = sink.deliver(&notice).await {
                                tracing::error!(key = %key, error = %crate::observe::field(&e), "escalation sink failed");
                            }
                        }
                        _ => tracing::info!(key = %key, class = %class,
                            "late result of a timed-out attempt; the record has moved on"),
                    },
                    Err(e) => {
                        tracing::warn!(key = %key, error = %crate::observe::field(&e), class = %class, attempt = evidence.attempt,
                        "late result of a timed-out attempt could not be recorded")
                    }
                }
            }
            .in_current_span(),
        );
    }
}

/// Where a result found after its key had been released went.
pub(crate) enum Restored {
    /// The key was free: claimed again and settled as the late result said.
    Recorded(Record),
    /// Someone had claimed the key since: their record, untouched.
    ClaimedAgain(Record),
}

/// Claims a released key again for the operation `claimed` describes and settles it as
/// found (a late result, or a read-back), with `claimed`'s attempts and `evidence`.
pub(crate) async fn restore(
    store: &dyn IdemStore,
    claimed: &Record,
    settlement: Settlement,
    evidence: Option<AttemptRecord>,
    lease: Duration,
) -> Result<Restored, StoreError> {
    let req = ClaimRequest {
        key: claimed.key.clone(),
        fingerprint: claimed.fingerprint,
        tool: claimed.tool.clone(),
        lease,
        operation: claimed.operation.as_ref().map(OperationDraft::from),
    };
    match store.claim(&req).await? {
        ClaimOutcome::Claimed(token) => {
            let mut attempts = claimed.attempts.clone();
            attempts.extend(evidence);
            store
                .settle(&req.key, token, settlement.attempts(attempts))
                .await?;
            let record = store.get(&req.key).await?;
            Ok(Restored::Recorded(
                record.unwrap_or_else(|| claimed.clone()),
            ))
        }
        ClaimOutcome::Existing(record) | ClaimOutcome::Mismatch(record) => {
            Ok(Restored::ClaimedAgain(Arc::unwrap_or_clone(record)))
        }
    }
}
