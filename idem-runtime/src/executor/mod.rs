//! Run: the write executor (claim → run → classify → settle) and the read executor.

mod attempt;
mod evidence;
mod retry;

pub use retry::RetryPolicy;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use crate::call::{CallError, ToolCall};
use crate::escalation::{Escalation, EscalationSink};
use crate::identity::{CanonicalJson, IdemKey, KeyMaterial, Scope};
use crate::outcome::{Outcome, OutcomeClass};
use crate::store::{
    AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore, Operation, Record,
    RecordState, Settlement, StoreError, Timestamp,
};
use crate::tool::erased::{Ctx, Decoded, RawArgs};
use crate::tool::{Downstream, DynTool, ReadCtx, ToolError, WriteCtx};
use attempt::{AttemptEnd, CaughtFuture, Lease};

/// A claim the caller holds, and what to run under it.
pub(crate) struct ClaimedRun<'a> {
    pub(crate) scope: &'a Scope,
    pub(crate) call_id: Option<&'a str>,
    pub(crate) args: RawArgs<'a>,
    pub(crate) key: IdemKey,
    pub(crate) token: ClaimToken,
    /// When the operation was first claimed: the safe retry window counts from here.
    pub(crate) first_claimed_at: Timestamp,
    /// An earlier attempt of this operation ended *unknown* (a reconciler's retry): a
    /// "rejected" now cannot prove that nothing happened.
    pub(crate) prior_unknown: bool,
}

/// How the evidence of an attempt that hit its timeout begins: its handler may still be
/// running and report a late result.
pub(crate) const TIMED_OUT: &str = "timed out after";

/// True for the evidence of an attempt that hit its timeout.
pub(crate) fn timed_out(attempt: &AttemptRecord) -> bool {
    attempt
        .message
        .as_deref()
        .is_some_and(|m| m.starts_with(TIMED_OUT))
}

/// A timed-out attempt whose handler keeps running in the background.
struct LateAttempt {
    key: IdemKey,
    token: ClaimToken,
    attempt: u32,
    started_at: Timestamp,
    /// Drop the handler this long after its timeout (the tool's in-flight bound).
    abandon_after: Option<Duration>,
    /// The tool's lease, for taking over a record that moved on meanwhile.
    lease: Duration,
}

/// What the executor needs besides the tool: the store, the clock, and its policies.
#[derive(Clone, Debug)]
pub(crate) struct Executor {
    pub(crate) store: Arc<dyn IdemStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retry: RetryPolicy,
    pub(crate) in_flight_wait: Duration,
    pub(crate) sink: Arc<dyn EscalationSink>,
}

/// The executor's account of a call, before it becomes a `ToolResult`.
pub(crate) struct Executed {
    pub(crate) key: Option<IdemKey>,
    pub(crate) result: Result<Outcome, CallError>,
    pub(crate) replayed: bool,
    pub(crate) attempts: u32,
}

impl Executed {
    fn refused(key: Option<IdemKey>, e: CallError) -> Self {
        Executed {
            key,
            result: Err(e),
            replayed: false,
            attempts: 0,
        }
    }
}

/// The outcome a saved record replays as (the record is consumed: its payload moves).
pub(crate) fn replay(record: Record) -> Outcome {
    let message = record.message.unwrap_or_default();
    match record.state {
        RecordState::Completed if record.result_expired => Outcome::ResultExpired {
            was: OutcomeClass::Completed,
        },
        RecordState::Failed if record.result_expired => Outcome::ResultExpired {
            was: OutcomeClass::Failed,
        },
        RecordState::Completed => Outcome::Completed {
            output: record.payload.unwrap_or(Value::Null),
        },
        RecordState::Failed => Outcome::Failed {
            message,
            downstream_ref: record.downstream_ref,
        },
        RecordState::Pending => Outcome::Pending {
            downstream_ref: record.downstream_ref.unwrap_or_default(),
            detail: record.payload,
        },
        RecordState::Unknown => Outcome::Unknown { reason: message },
        RecordState::Escalated => Outcome::Escalated { reason: message },
        // Only reached if a store reports a running record as settled; report honestly.
        RecordState::Running => Outcome::Unknown {
            reason: "still running in another call".to_owned(),
        },
    }
}

/// The settlement a handler's (or a late handler's) result becomes. `None` for "rejected
/// before execution", which releases instead of settling.
fn settlement_of(result: &Result<Value, ToolError>) -> Option<Settlement> {
    Some(match result {
        Ok(output) => Settlement::new(RecordState::Completed).payload(output.clone()),
        Err(ToolError::Rejected { .. }) => return None,
        Err(ToolError::Failed {
            message,
            downstream_ref,
        }) => {
            let s = Settlement::new(RecordState::Failed).message(message.clone());
            match downstream_ref {
                Some(r) => s.downstream_ref(r.clone()),
                None => s,
            }
        }
        Err(ToolError::Pending {
            downstream_ref,
            detail,
        }) => {
            let s = Settlement::new(RecordState::Pending).downstream_ref(downstream_ref.clone());
            match detail {
                Some(d) => s.payload(d.clone()),
                None => s,
            }
        }
        Err(ToolError::Unknown { message }) => {
            Settlement::new(RecordState::Unknown).message(message.clone())
        }
    })
}

fn class_of_result(result: &Result<Value, ToolError>) -> OutcomeClass {
    match result {
        Ok(_) => OutcomeClass::Completed,
        Err(ToolError::Rejected { .. }) => OutcomeClass::Rejected,
        Err(ToolError::Failed { .. }) => OutcomeClass::Failed,
        Err(ToolError::Pending { .. }) => OutcomeClass::Pending,
        Err(ToolError::Unknown { .. }) => OutcomeClass::Unknown,
    }
}

fn outcome_of(result: Result<Value, ToolError>) -> Outcome {
    match result {
        Ok(output) => Outcome::Completed { output },
        Err(ToolError::Rejected { message }) => Outcome::Rejected { message },
        Err(ToolError::Failed {
            message,
            downstream_ref,
        }) => Outcome::Failed {
            message,
            downstream_ref,
        },
        Err(ToolError::Pending {
            downstream_ref,
            detail,
        }) => Outcome::Pending {
            downstream_ref,
            detail,
        },
        Err(ToolError::Unknown { message }) => Outcome::Unknown { reason: message },
    }
}

impl Executor {
    /// The store as a trait object: calling through the `Arc` would pick the blanket
    /// `impl IdemStore for Arc<S>` and box every store future twice.
    fn store(&self) -> &dyn IdemStore {
        &*self.store
    }

    /// Runs a write: derive key → claim → run under timeout → classify → settle.
    pub(crate) async fn write(
        &self,
        tool: &DynTool,
        call: &ToolCall,
        args: RawArgs<'_>,
        decoded: Decoded,
    ) -> Executed {
        let spec = tool.spec();
        let Decoded { identity, typed } = decoded;
        let Some(identity) = identity else {
            return Executed::refused(
                None,
                CallError::InvalidArgs {
                    tool: spec.name().to_owned(),
                    message: "arguments have no identity".to_owned(),
                },
            );
        };
        let material = match (&call.intent, &identity.key_fields) {
            (Some(intent), _) => KeyMaterial::Intent(intent),
            (None, Some(fields)) => KeyMaterial::Fields(fields),
            (None, None) => KeyMaterial::ArgsFingerprint(&identity.fingerprint),
        };
        let key = IdemKey::derive(&call.scope, spec.name(), material);
        tracing::Span::current().record("key", key.as_str());
        let req = ClaimRequest {
            key: key.clone(),
            fingerprint: identity.fingerprint,
            tool: spec.name().to_owned(),
            lease: spec.lease_duration(),
            operation: Some(Operation {
                scope: call.scope.clone(),
                intent: call.intent.clone(),
                // The bytes the fingerprint was taken of, moved: no second serialization.
                args: CanonicalJson::from_canonical_bytes(identity.canonical),
            }),
        };

        let mut waited = false;
        let token = loop {
            let claimed = match self.store().claim(&req).await {
                Ok(c) => c,
                Err(e) => return Executed::refused(Some(key), CallError::Store(e)),
            };
            match claimed {
                ClaimOutcome::Claimed(token) => break token,
                ClaimOutcome::Mismatch(record) => {
                    tracing::warn!(key = %key, tool = spec.name(), state = %record.state,
                        "same key, changed parameters: refused");
                    // A person should know: either the caller reuses an intent id for another
                    // action, or the model changed its mind about an action already sent.
                    let mut notice = Escalation::from_record(
                        &record,
                        "same key, changed parameters: a repeat with other arguments was refused",
                        self.clock.now(),
                    );
                    notice.refused_args = req.operation.as_ref().map(|op| op.args.value().clone());
                    if let Err(e) = self.sink.deliver(&notice).await {
                        tracing::error!(key = %key, error = %e, "escalation sink failed");
                    }
                    return Executed::refused(
                        Some(key),
                        CallError::ChangedParams { key: record.key },
                    );
                }
                ClaimOutcome::Existing(record) if record.state == RecordState::Running => {
                    if waited {
                        return Executed::refused(Some(key.clone()), CallError::InFlight { key });
                    }
                    waited = true;
                    if let Err(e) = self.store().wait_settled(&key, self.in_flight_wait).await {
                        return Executed::refused(Some(key), CallError::Store(e));
                    }
                    // Claim again: the record may now be settled (replay), released (ours to
                    // run), or still running (in flight).
                }
                ClaimOutcome::Existing(record) => {
                    return Executed {
                        key: Some(key),
                        result: Ok(replay(record)),
                        replayed: true,
                        attempts: 0,
                    };
                }
            }
        };
        let run = ClaimedRun {
            scope: &call.scope,
            call_id: call.call_id.as_deref(),
            args,
            key,
            token,
            first_claimed_at: self.clock.now(),
            prior_unknown: false,
        };
        // Boxed: the running path's state (attempt, timers, lease renewal) is large, and
        // keeping it out of the call future keeps replays, the common repeat, from moving it.
        Box::pin(self.run_claimed(tool, run, typed)).await
    }

    /// Runs the handler under a claim the caller holds, retrying keyed downstreams inside the
    /// safe window, and settles (or releases) the claim.
    pub(crate) async fn run_claimed(
        &self,
        tool: &DynTool,
        run: ClaimedRun<'_>,
        typed: Box<dyn std::any::Any + Send>,
    ) -> Executed {
        let ClaimedRun {
            scope,
            call_id,
            args,
            key,
            token,
            first_claimed_at: claimed_at,
            prior_unknown,
        } = run;
        let spec = tool.spec();
        let keyed = spec.downstream_kind() == Downstream::Keyed;
        let max_attempts = if keyed {
            self.retry.max_attempts.max(1)
        } else {
            1
        };
        let mut typed = Some(typed);
        let mut evidence = Vec::new();
        let mut attempt = 1;
        loop {
            let args_for_attempt = match typed.take() {
                Some(t) => t,
                // Attempts after the first decode again: deserialization is deterministic,
                // and `Args` need not be `Clone`.
                None => match tool.decode(args) {
                    Ok(d) => d.typed,
                    Err(e) => {
                        // Decoded a moment ago; a custom `Deserialize` disagrees with itself.
                        // The earlier attempt stays unknown: that must not become "rejected".
                        let result = Err(ToolError::unknown(format!(
                            "arguments no longer decode for a retry: {e:?}"
                        )));
                        return self.settle(key, token, result, evidence, attempt - 1).await;
                    }
                },
            };
            let started_at = self.clock.now();
            let deadline = attempt::deadline_after(spec.timeout_duration());
            let ctx = WriteCtx::new(
                ReadCtx::new(
                    scope.clone(),
                    call_id.map(str::to_owned),
                    spec.name().to_owned(),
                    deadline,
                    attempt,
                ),
                key.clone(),
                token,
            );
            let fut = attempt::catch(tool.invoke(Ctx::Write(ctx), args_for_attempt));
            let lease = Lease {
                store: &self.store,
                key: &key,
                token,
                lease: spec.lease_duration(),
            };
            let span = tracing::info_span!("idem.attempt", attempt, class = tracing::field::Empty);
            let end = attempt::run(fut, spec.timeout_duration(), Some(lease))
                .instrument(span.clone())
                .await;
            let finished_at = self.clock.now();
            let (result, message) = match end {
                AttemptEnd::Returned(r) => {
                    let msg = r.as_ref().err().map(ToString::to_string);
                    (Some(r), msg)
                }
                AttemptEnd::Panicked(p) => (None, Some(format!("handler panicked: {p}"))),
                AttemptEnd::TimedOut(fut) => {
                    let late = LateAttempt {
                        key: key.clone(),
                        token,
                        attempt,
                        started_at,
                        abandon_after: spec.in_flight_bound_duration(),
                        lease: spec.lease_duration(),
                    };
                    self.watch_late_result(fut, late);
                    (
                        None,
                        Some(format!("{TIMED_OUT} {:?}", spec.timeout_duration())),
                    )
                }
            };
            let class = result
                .as_ref()
                .map_or(OutcomeClass::Unknown, class_of_result);
            span.record("class", class.as_str());
            evidence.push(AttemptRecord {
                attempt,
                started_at,
                finished_at,
                class,
                message: message.clone(),
            });

            let retryable = class == OutcomeClass::Unknown
                && !matches!(&message, Some(m) if m.starts_with("handler panicked"));
            let in_window = claimed_at.plus(spec.window_duration()) > self.clock.now();
            if retryable && keyed && attempt < max_attempts && in_window {
                let backoff = self.retry.backoff(attempt);
                match self
                    .hold_claim(&key, token, spec.lease_duration(), backoff)
                    .await
                {
                    Ok(()) => {}
                    // Someone took the record over (its lease passed while the store was out
                    // of reach and a reconciler or a person acted): sending again would race
                    // them. What was sent so far still belongs in the record.
                    Err(e @ StoreError::StaleToken { .. }) => {
                        tracing::warn!(key = %key, error = %e, attempts = ?evidence,
                            "claim lost before a retry; not sending again");
                        let kept = evidence::keep(
                            self.store(),
                            &key,
                            token,
                            None,
                            evidence.clone(),
                            spec.lease_duration(),
                        )
                        .await;
                        if !matches!(kept, Ok(Some(_))) {
                            tracing::error!(key = %key, result = ?kept, attempts = ?evidence,
                                "the attempts could not be added to the record");
                        }
                        return Executed {
                            key: Some(key),
                            result: Ok(Outcome::Unknown {
                                reason: "the claim was taken over while waiting to retry"
                                    .to_owned(),
                            }),
                            replayed: false,
                            attempts: attempt,
                        };
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "lease renewal before retry failed")
                    }
                }
                attempt += 1;
                continue;
            }

            let mut result =
                result.unwrap_or_else(|| Err(ToolError::unknown(message.unwrap_or_default())));
            // A rejection proves nothing happened only for this attempt. If an earlier one
            // ended unknown, its effect may have landed: keep the record, say unknown.
            let earlier_unknown = prior_unknown
                || evidence[..evidence.len() - 1]
                    .iter()
                    .any(|a| a.class == OutcomeClass::Unknown);
            if let (true, Err(ToolError::Rejected { message })) = (earlier_unknown, &result) {
                result = Err(ToolError::unknown(format!(
                    "rejected now ({message}), but an earlier attempt's outcome is unknown"
                )));
            }
            return self.settle(key, token, result, evidence, attempt).await;
        }
    }

    /// Sleeps out a retry's backoff while keeping the claim: its lease is renewed as often as
    /// during an attempt, so a backoff longer than the lease never lets it lapse under a
    /// live worker. Fails only when the claim is no longer ours (`StaleToken`); other store
    /// errors are logged and the claim is renewed again at the next turn.
    async fn hold_claim(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
        pause: Duration,
    ) -> Result<(), StoreError> {
        let end = attempt::deadline_after(pause);
        let every = attempt::renewal_interval(lease);
        loop {
            let next = attempt::deadline_after(every).min(end);
            tokio::time::sleep_until(next).await;
            match self.store().renew(key, token, lease).await {
                Ok(()) => {}
                Err(e @ StoreError::StaleToken { .. }) => return Err(e),
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "lease renewal during a retry backoff failed")
                }
            }
            if next >= end {
                return Ok(());
            }
        }
    }

    async fn settle(
        &self,
        key: IdemKey,
        token: ClaimToken,
        result: Result<Value, ToolError>,
        evidence: Vec<AttemptRecord>,
        attempts: u32,
    ) -> Executed {
        let done = |result| Executed {
            key: Some(key.clone()),
            result: Ok(result),
            replayed: false,
            attempts,
        };
        let Some(settlement) = settlement_of(&result) else {
            // Rejected before execution: free the key so the same intent may run again.
            if let Err(e) = self.store().release(&key, token).await {
                tracing::error!(key = %key, error = %e,
                    "could not release a rejected claim; it will turn unknown when its lease passes");
            }
            return done(outcome_of(result));
        };
        match self
            .store()
            .settle(&key, token, settlement.attempts(evidence.clone()))
            .await
        {
            Ok(()) => done(outcome_of(result)),
            Err(e) => {
                // The handler ran; its result could not be recorded. The record will read as
                // unknown (lease expiry), so that is what the caller is told. Keep the
                // evidence where a person will find it.
                tracing::error!(key = %key, error = %e, result = ?result, attempts = ?evidence,
                    "handler finished but its result could not be saved");
                done(Outcome::Unknown {
                    reason: format!("the result could not be saved ({e})"),
                })
            }
        }
    }

    /// Keeps a timed-out handler running; when it ends, its result settles the record it
    /// left *unknown*, or, if a reconciler or a person has moved the record on meanwhile, is
    /// added to it as evidence (see [`evidence::keep`]); a person looking at an escalation
    /// is told through the sink. A tool that declares an in-flight bound has its handler
    /// dropped once that bound has passed after the timeout, so the bound the reconciler
    /// relies on holds in this process too.
    fn watch_late_result(&self, fut: CaughtFuture, late: LateAttempt) {
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
                let (settlement, class, message) = match &outcome {
                    Some(Ok(r)) => (
                        settlement_of(r),
                        class_of_result(r),
                        r.as_ref().err().map(ToString::to_string),
                    ),
                    Some(Err(p)) => (
                        None,
                        OutcomeClass::Unknown,
                        Some(format!("handler panicked: {p}")),
                    ),
                    None => (
                        None,
                        OutcomeClass::Unknown,
                        Some("still running at its in-flight bound; dropped".to_owned()),
                    ),
                };
                let evidence = AttemptRecord {
                    attempt,
                    started_at,
                    finished_at: clock.now(),
                    class,
                    message: Some(format!(
                        "late result after timeout: {}",
                        message.as_deref().unwrap_or(class.as_str())
                    )),
                };
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

    /// Runs a read: no claim, retried freely on an unknown outcome.
    pub(crate) async fn read(
        &self,
        tool: &DynTool,
        call: &ToolCall,
        args: RawArgs<'_>,
        decoded: Decoded,
    ) -> Executed {
        let spec = tool.spec();
        let mut typed = Some(decoded.typed);
        let mut attempt = 1;
        loop {
            let args_for_attempt = match typed.take() {
                Some(t) => t,
                None => match tool.decode(args) {
                    Ok(d) => d.typed,
                    Err(e) => {
                        let result = Err(ToolError::unknown(format!(
                            "arguments no longer decode for a retry: {e:?}"
                        )));
                        return Executed {
                            key: None,
                            result: Ok(outcome_of(result)),
                            replayed: false,
                            attempts: attempt - 1,
                        };
                    }
                },
            };
            let deadline = attempt::deadline_after(spec.timeout_duration());
            let ctx = ReadCtx::new(
                call.scope.clone(),
                call.call_id.clone(),
                spec.name().to_owned(),
                deadline,
                attempt,
            );
            let fut = attempt::catch(tool.invoke(Ctx::Read(ctx), args_for_attempt));
            let span = tracing::info_span!("idem.attempt", attempt, class = tracing::field::Empty);
            let end = attempt::run(fut, spec.timeout_duration(), None)
                .instrument(span.clone())
                .await;
            let (result, retryable) = match end {
                AttemptEnd::Returned(r) => {
                    let unknown = matches!(r, Err(ToolError::Unknown { .. }));
                    (r, unknown)
                }
                AttemptEnd::Panicked(p) => (
                    Err(ToolError::unknown(format!("handler panicked: {p}"))),
                    false,
                ),
                AttemptEnd::TimedOut(_) => (
                    Err(ToolError::unknown(format!(
                        "timed out after {:?}",
                        spec.timeout_duration()
                    ))),
                    true,
                ),
            };
            span.record("class", class_of_result(&result).as_str());
            if retryable && attempt < self.retry.max_attempts {
                tokio::time::sleep(self.retry.backoff(attempt)).await;
                attempt += 1;
                continue;
            }
            return Executed {
                key: None,
                result: Ok(outcome_of(result)),
                replayed: false,
                attempts: attempt,
            };
        }
    }
}
