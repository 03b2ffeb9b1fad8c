//! Late results: a handler that hit its timeout keeps running, and what it reports is kept.

use std::time::Duration;

use tracing::Instrument;

use super::attempt::CaughtFuture;
use super::classify::{class_of_result, settlement_of};
use super::{evidence, Executor};
use crate::escalation::Escalation;
use crate::identity::IdemKey;
use crate::outcome::OutcomeClass;
use crate::store::{AttemptKind, AttemptRecord, ClaimToken, RecordState, Timestamp};

/// A timed-out attempt whose handler keeps running in the background.
pub(super) struct LateAttempt {
    pub(super) key: IdemKey,
    pub(super) token: ClaimToken,
    pub(super) attempt: u32,
    pub(super) started_at: Timestamp,
    /// Drop the handler this long after its timeout (the tool's in-flight bound).
    pub(super) abandon_after: Option<Duration>,
    /// The tool's lease, for taking over a record that moved on meanwhile.
    pub(super) lease: Duration,
}

impl Executor {
    /// Keeps a timed-out handler running; when it ends, its result settles the record it
    /// left *unknown*, or, if a reconciler or a person has moved the record on meanwhile, is
    /// added to it as evidence (see [`evidence::keep`]); a person looking at an escalation
    /// is told through the sink. A tool that declares an in-flight bound has its handler
    /// dropped once that bound has passed after the timeout, so the bound the reconciler
    /// relies on holds in this process too.
    pub(super) fn watch_late_result(&self, fut: CaughtFuture, late: LateAttempt) {
        let store = self.store.clone();
        let clock = self.clock.clone();
        let sink = self.sink.clone();
        let LateAttempt {
            key,
            token,
            attempt,
            started_at,
            abandon_after,
            lease,
        } = late;
        tokio::spawn(
            async move {
                let outcome = match abandon_after {
                    Some(bound) => tokio::time::timeout(bound, fut).await.ok(),
                    None => Some(fut.await),
                };
                let (settlement, kind, class, message) = match &outcome {
                    Some(Ok(r)) => (
                        settlement_of(r),
                        AttemptKind::Late,
                        class_of_result(r),
                        r.as_ref().err().map(ToString::to_string),
                    ),
                    Some(Err(p)) => (
                        None,
                        AttemptKind::Late,
                        OutcomeClass::Unknown,
                        Some(format!("handler panicked: {p}")),
                    ),
                    None => (
                        None,
                        AttemptKind::Abandoned,
                        OutcomeClass::Unknown,
                        Some("still running at its in-flight bound; dropped".to_owned()),
                    ),
                };
                let evidence = AttemptRecord::new(
                    attempt,
                    started_at,
                    clock.now(),
                    kind,
                    class,
                    Some(format!(
                        "late result after timeout: {}",
                        message.as_deref().unwrap_or(class.as_str())
                    )),
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
                    settlement,
                    vec![evidence.clone()],
                    lease,
                )
                .await;
                match kept {
                    Ok(Some(record)) => {
                        tracing::info!(key = %key, class = %class, state = %record.state,
                            "late result recorded");
                        if record.state == RecordState::Escalated {
                            let notice = Escalation::from_record(
                                &record,
                                format!("a timed-out attempt reported late, after escalation: {class}"),
                                clock.now(),
                            );
                            if let Err(e) = sink.deliver(&notice).await {
                                tracing::error!(key = %key, error = %e, "escalation sink failed");
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::info!(key = %key, late = ?outcome, evidence = ?evidence,
                            "late result of a timed-out attempt; the record has moved on")
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, late = ?outcome, evidence = ?evidence,
                        "late result of a timed-out attempt could not be recorded")
                    }
                }
            }
            .in_current_span(),
        );
    }
}
