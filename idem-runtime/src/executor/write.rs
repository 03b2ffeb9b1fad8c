//! The write path: claim → run under the claim → settle (or release).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use super::attempt::{self, AttemptEnd, Lease};
use super::classify::{class_of_result, outcome_of, replay, settlement_but_output};
use super::late::LateAttempt;
use super::{evidence, Executed, Executor};
use crate::call::{CallError, ToolCall};
use crate::escalation::{Escalation, EscalationDetail, ReasonKind};
use crate::identity::{IdemKey, KeyFormat, Scope};
use crate::outcome::{Outcome, OutcomeClass};
use crate::store::{
    rules, AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, OperationDraft,
    Record, RecordState, ReleaseNote, Settlement, StoreError, Timestamp,
};
use crate::tool::erased::{Ctx, Decoded, RawArgs};
use crate::tool::{Downstream, DynTool, ReadCtx, ToolError, WriteCtx};

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
    /// A clock reading taken just before, for the first attempt's start (one reading less
    /// per call); `None` reads the clock.
    pub(crate) now: Option<Timestamp>,
}

impl Executor {
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
        let claim_format = self.key_migration.claim_format();
        let intent = call.intent.as_deref();
        let derive = |format: KeyFormat| {
            format.identify(&call.scope, spec.key_name_text(), intent, &identity)
        };
        let Some((key, fingerprint)) = derive(claim_format) else {
            // Not reachable with the formats of this build (each derives from the canonical
            // arguments); refused rather than trusted to stay so.
            return Executed::refused(
                None,
                CallError::InvalidCall {
                    message: format!("key format {claim_format} cannot derive this call's key"),
                },
            );
        };
        // The same operation as another key format names it: a claim found there counts.
        let honoured = self.key_migration.honoured_format().and_then(derive);
        // The call's span (`idem.call`) is at INFO: below that level nothing records it, and
        // finding the current span costs more than this check.
        if tracing::level_enabled!(tracing::Level::INFO) {
            tracing::Span::current().record("key", key.as_str());
        }
        let req = ClaimRequest {
            key: key.clone(),
            fingerprint,
            tool: tool.shared_name().clone(),
            lease: spec.lease_duration(),
            // The bytes the fingerprint was taken of, moved (no second serialization); the
            // store turns them into the saved operation only if the claim is won.
            operation: Some(OperationDraft::from_canonical_bytes(
                call.scope.clone(),
                call.intent.clone(),
                identity.canonical,
            )),
        };
        let honoured = honoured.map(|(key, fingerprint)| ClaimRequest {
            key,
            fingerprint,
            tool: req.tool.clone(),
            lease: req.lease,
            operation: None,
        });
        let (token, claimed_at) = match self.claim(spec.name(), &req, honoured.as_ref()).await {
            Ok(won) => won,
            Err(done) => return done,
        };
        // One clock reading: the claim's time (the store's, if it read this clock), and the
        // first attempt's start.
        let now = claimed_at.unwrap_or_else(|| self.clock.now());
        let run = ClaimedRun {
            scope: &call.scope,
            call_id: call.call_id.as_deref(),
            args,
            key,
            token,
            first_claimed_at: now,
            prior_unknown: false,
            now: Some(now),
        };
        // Boxed: the running path's state (attempt, timers, lease renewal) is large, and
        // keeping it out of the call future keeps replays, the common repeat, from moving it.
        Box::pin(self.run_claimed(tool, run, typed)).await
    }

    /// Claims `req`'s key, or answers the call from the record that already claims it. A
    /// won claim comes with its time when the store took it from the executor's clock.
    ///
    /// `honoured` is the same operation under another key format during a migration: a
    /// record found under it is this operation's claim. It is looked up before the claim and
    /// again after a won claim, since a worker claiming under that format may have slipped in
    /// between; the claim just won is then released (nothing ran under it) and the other
    /// record answers. Two workers that each find the other's claim both stand back, wait
    /// for the other's (now released) claim and try again; the race can cost a wait, or an
    /// "in flight" answer if it repeats, but never a second execution. A claim that cannot
    /// be released is parked as escalated.
    async fn claim(
        &self,
        tool: &str,
        req: &ClaimRequest,
        honoured: Option<&ClaimRequest>,
    ) -> Result<(ClaimToken, Option<Timestamp>), Executed> {
        let refused = |key: &IdemKey, e: StoreError| {
            Executed::refused(Some(key.clone()), CallError::Store(e))
        };
        let mut waited = false;
        loop {
            let found = match honoured {
                Some(other) => self.find(other).await.map_err(|e| refused(&other.key, e))?,
                None => None,
            };
            let (outcome, under) = match found {
                Some(outcome) => outcome,
                None => match self.claim_key(req).await {
                    (Err(e), _) => return Err(refused(&req.key, e)),
                    (Ok(ClaimOutcome::Claimed(token)), at) => {
                        let Some(other) = honoured else {
                            return Ok((token, at));
                        };
                        let found = match self.find(other).await {
                            Ok(found) => found,
                            Err(e) => {
                                Box::pin(self.stand_back(req, token, &other.key)).await;
                                return Err(refused(&other.key, e));
                            }
                        };
                        match found {
                            None => return Ok((token, at)),
                            Some(outcome) => {
                                Box::pin(self.stand_back(req, token, &other.key)).await;
                                outcome
                            }
                        }
                    }
                    (Ok(outcome), _) => (outcome, req),
                },
            };
            let key = &under.key;
            match outcome {
                ClaimOutcome::Claimed(_) => unreachable!("`find` never claims"),
                ClaimOutcome::Mismatch(record) => {
                    // Boxed, like the other paths off the common one: their state would
                    // otherwise sit in every call's future.
                    Box::pin(self.refuse_changed_params(
                        tool,
                        key,
                        &record,
                        req.operation.as_ref(),
                    ))
                    .await;
                    return Err(Executed::refused(
                        Some(key.clone()),
                        CallError::ChangedParams {
                            key: record.key.clone(),
                        },
                    ));
                }
                ClaimOutcome::Existing(record) if record.state == RecordState::Running => {
                    if waited {
                        return Err(Executed::refused(
                            Some(key.clone()),
                            CallError::InFlight { key: key.clone() },
                        ));
                    }
                    waited = true;
                    if let Err(e) = self.store().wait_settled(key, self.in_flight_wait).await {
                        return Err(refused(key, e));
                    }
                    // Look again: the record may now be settled (replay), released (ours to
                    // run), or still running (in flight).
                }
                ClaimOutcome::Existing(record) => {
                    return Err(Executed {
                        key: Some(key.clone()),
                        result: Ok(replay(&record)),
                        replayed: true,
                        attempts: 0,
                    });
                }
            }
        }
    }

    /// What claiming `req` would find, without claiming: the record under its key judged
    /// by the claim rules (same operation, or same key with changed parameters).
    async fn find<'r>(
        &self,
        req: &'r ClaimRequest,
    ) -> Result<Option<(ClaimOutcome, &'r ClaimRequest)>, StoreError> {
        let record = self.store().get(&req.key).await?.map(Arc::new);
        Ok(rules::claim_against_shared(record.as_ref(), req).map(|outcome| (outcome, req)))
    }

    /// Gives up a claim won under one key format because the operation is claimed under
    /// the other (`other`): nothing ran under it.
    async fn stand_back(&self, req: &ClaimRequest, token: ClaimToken, other: &IdemKey) {
        let mut failure = None;
        for _ in 0..3 {
            match self.store().release(&req.key, token).await {
                Ok(()) => return,
                Err(e) => failure = Some(e),
            }
        }
        // Left running, the claim would lapse to unknown, and a reconciler could send it
        // again under this key while the operation lives under the other one. (A reconciler
        // looks under the other format's key before it sends again or frees a key, so this
        // is the second line.) Park it where only a person acts.
        let why = format!(
            "claimed under two key formats: this claim stood back for the one under {other} \
             and could not be released ({}); nothing ran under this key",
            failure.map_or_else(String::new, |e| e.to_string())
        );
        let parked = Settlement::new(RecordState::Escalated)
            .message(why)
            .payload(EscalationDetail::new(ReasonKind::ClaimedTwice, Vec::new()).to_payload());
        if let Err(e) = self.store().settle(&req.key, token, parked).await {
            tracing::error!(key = %req.key, other = %crate::observe::field(&other), error = %crate::observe::field(&e),
                "could not release or park a claim shadowed by another key format's claim");
        }
    }

    /// Tells a person (once per key per window) that a repeat changed its parameters.
    async fn refuse_changed_params(
        &self,
        tool: &str,
        key: &IdemKey,
        record: &Record,
        refused: Option<&OperationDraft>,
    ) {
        tracing::warn!(key = %key, tool, state = %record.state,
            "same key, changed parameters: refused");
        // A person should know: either the caller reuses an intent id for another action,
        // or the model changed its mind about an action already sent. Once per key per
        // window: a model looping on the refusal must not flood the sink.
        let now = self.clock.now();
        let Some(held_back) = self.notices.admit(key, now) else {
            return;
        };
        let mut reason =
            "same key, changed parameters: a repeat with other arguments was refused".to_owned();
        if held_back > 0 {
            reason.push_str(&format!(
                " ({held_back} more refused since the last notice)"
            ));
        }
        let mut notice = Escalation::from_record(record, reason, now);
        notice.refused_args = refused.map(|op| op.to_operation().args.value().clone());
        notice.kind = ReasonKind::ChangedParams;
        if let Err(e) = self.sink.deliver(&notice).await {
            tracing::error!(key = %key, error = %crate::observe::field(&e), "escalation sink failed");
        }
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
            now,
        } = run;
        let mut now = now;
        let spec = tool.spec();
        let keyed = spec.downstream_kind() == Downstream::Keyed;
        let max_attempts = if keyed {
            self.retry.max_attempts.max(1)
        } else {
            1
        };
        let mut typed = Some(typed);
        // Room for one attempt, most calls' only one: the store keeps this vector as the
        // record's evidence, and a first push into an empty one would make room for four.
        let mut evidence = Vec::with_capacity(1);
        // The call's retry budget counts from its first attempt.
        let began = tokio::time::Instant::now();
        let mut attempt = 1;
        loop {
            let args_for_attempt = match attempt::args_for(tool, args, &mut typed) {
                Ok(t) => t,
                // The earlier attempt stays unknown: that must not become "rejected".
                Err(e) => {
                    return self
                        .settle(key, token, Err(e), evidence, attempt - 1, None)
                        .await
                }
            };
            let started_at = now.take().unwrap_or_else(|| self.clock.now());
            // The first attempt starts when the call's budget does: one monotonic reading.
            let attempt_began = if attempt == 1 {
                began
            } else {
                tokio::time::Instant::now()
            };
            let deadline = crate::store::instant_after(attempt_began, spec.timeout_duration());
            let ctx = WriteCtx::new(
                ReadCtx::new(
                    scope.clone(),
                    call_id.map(str::to_owned),
                    tool.shared_name().clone(),
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
            let attempt_run = attempt::run(fut, deadline, spec.timeout_duration(), Some(lease));
            // Unobserved (no subscriber wants the span): no span wrapper to poll through.
            let end = if span.is_disabled() {
                attempt_run.await
            } else {
                attempt_run.instrument(span.clone()).await
            };
            let finished_at = self.clock.now();
            let (result, kind, message) = match end {
                AttemptEnd::Returned(r) => {
                    let msg = r.as_ref().err().map(ToString::to_string);
                    (Some(r), AttemptKind::Returned, msg)
                }
                AttemptEnd::Panicked(p) => (
                    None,
                    AttemptKind::Panicked,
                    Some(format!("handler panicked: {p}")),
                ),
                AttemptEnd::TimedOut(fut) => {
                    let bound = spec.effective_in_flight_bound(self.default_in_flight_bound);
                    let late = LateAttempt {
                        key: key.clone(),
                        token,
                        attempt,
                        started_at,
                        abandon_after: bound,
                        abandon_at: crate::store::instant_after(deadline, bound),
                        lease: spec.lease_duration(),
                    };
                    Box::pin(self.watch_late_result(fut, late)).await;
                    (
                        None,
                        AttemptKind::TimedOut,
                        Some(format!("timed out after {:?}", spec.timeout_duration())),
                    )
                }
            };
            let class = result
                .as_ref()
                .map_or(OutcomeClass::Unknown, class_of_result);
            span.record("class", class.as_str());
            evidence.push(AttemptRecord::new(
                attempt,
                started_at,
                finished_at,
                kind,
                class,
                message.clone(),
            ));

            // A panic is a defect in the handler, not a transient fault: sending again would
            // most likely panic again. It stays unknown for the reconciler (see RetryPolicy).
            let retryable = class == OutcomeClass::Unknown && kind != AttemptKind::Panicked;
            // The retry goes out after the backoff: that send, not this attempt's end (its
            // "now", one clock reading less), must fall inside the window, or the downstream
            // may have forgotten the key and charge again.
            let sent_in_window = |pause: &Duration| {
                claimed_at.plus(spec.window_duration()) > finished_at.plus(*pause)
            };
            let keyed_pause = (retryable && keyed && attempt < max_attempts)
                .then(|| self.retry.backoff(attempt))
                .filter(sent_in_window);
            let pause = if keyed_pause.is_some() {
                keyed_pause
            } else if let Some(Err(ToolError::Unavailable { retry_after, .. })) = &result {
                // Nothing ran, so asking again is harmless, keyed downstream or not; but only
                // within the call's budget, and never sooner than the downstream asked. After
                // an attempt whose outcome is unknown, though, the next send is a retry of an
                // effect that may have landed: only to a keyed downstream, inside its window.
                let after_unknown =
                    prior_unknown || evidence.iter().any(|a| a.class == OutcomeClass::Unknown);
                self.retry
                    .unavailable_pause(attempt, *retry_after, began.elapsed())
                    .filter(|pause| !after_unknown || (keyed && sent_in_window(pause)))
            } else {
                None
            };
            if let Some(backoff) = pause {
                match Box::pin(self.hold_claim(&key, token, spec.lease_duration(), backoff)).await {
                    Ok(()) => {}
                    // Someone took the record over (its lease passed while the store was out
                    // of reach and a reconciler or a person acted): sending again would race
                    // them. What was sent so far still belongs in the record.
                    Err(e @ StoreError::StaleToken { .. }) => {
                        tracing::warn!(key = %key, error = %crate::observe::field(&e), attempts = %crate::observe::debug_field(&evidence),
                            "claim lost before a retry; not sending again");
                        let kept = Box::pin(evidence::keep(
                            self.store(),
                            &key,
                            token,
                            None,
                            evidence.clone(),
                            spec.lease_duration(),
                        ))
                        .await;
                        if !matches!(kept, Ok(Some(_))) {
                            tracing::error!(key = %key, result = %crate::observe::debug_field(&kept), attempts = %crate::observe::debug_field(&evidence),
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
                        tracing::warn!(key = %key, error = %crate::observe::field(&e), "lease renewal before retry failed")
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
            if earlier_unknown {
                let refused_now = match &result {
                    Err(ToolError::Rejected { message }) => {
                        Some(format!("rejected now ({message})"))
                    }
                    Err(ToolError::Unavailable { message, .. }) => {
                        Some(format!("unavailable now ({message})"))
                    }
                    _ => None,
                };
                if let Some(now) = refused_now {
                    result = Err(ToolError::unknown(format!(
                        "{now}, but an earlier attempt's outcome is unknown"
                    )));
                }
            }
            return self
                .settle(key, token, result, evidence, attempt, Some(finished_at))
                .await;
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
                    tracing::warn!(key = %key, error = %crate::observe::field(&e), "lease renewal during a retry backoff failed")
                }
            }
            if next >= end {
                return Ok(());
            }
        }
    }

    /// Frees the key of an operation the downstream refused "unavailable, not executed" at
    /// every attempt, keeping a release trace ([`IdemStore::release_traced`], by
    /// [`ReleaseNote::EXECUTOR`]) with the attempts and the arguments.
    ///
    /// "Not executed" is the downstream's word for the copies of the request it answered.
    /// A copy that reached it another way (a proxy's or load balancer's redelivery) may
    /// still have run, and the caller is about to be told nothing was done. The trace is
    /// what lets the reconciler read the operation back for a while and put a record back
    /// if the effect is there ([`crate::reconcile::Reconciler::watch_released_for`]); a plain release
    /// would leave such an effect with no record at all.
    ///
    /// The record is settled unknown (with the attempts) and released with its trace in one
    /// atomic step, so a duplicate waiting on the claim wakes to a free key, never to an
    /// unknown record about to vanish. If that fails, the key is released plainly (no
    /// trace); if that fails too, the record turns unknown when its lease passes and waits
    /// for the reconciler, the safe side.
    ///
    /// [`IdemStore::release_traced`]: crate::store::IdemStore::release_traced
    async fn release_unavailable(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        evidence: Vec<AttemptRecord>,
    ) {
        let attempts = evidence.len();
        let parked = Settlement::new(RecordState::Unknown)
            .message("every attempt was refused as unavailable, not executed; released")
            .attempts(evidence);
        let note = ReleaseNote::new(
            ReleaseNote::EXECUTOR,
            format!(
                "unavailable, not executed ({attempts} attempt(s)); released so the intent \
                 may run again later, traced so a copy that ran anyway is found"
            ),
        );
        let released = match self.store().release_traced(key, token, parked, &note).await {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(key = %key, error = %crate::observe::field(&e),
                    "could not keep the attempts of an unavailable operation; releasing without a trace");
                self.store().release(key, token).await
            }
        };
        if let Err(e) = released {
            tracing::error!(key = %key, error = %crate::observe::field(&e),
                "could not release an operation refused as unavailable; it stays unknown for the reconciler");
        }
    }

    /// Settles (or releases) the claim with the last attempt's result. `now`: when that
    /// attempt ended, a reading of the executor's clock (`None` reads the store's).
    async fn settle(
        &self,
        key: IdemKey,
        token: ClaimToken,
        result: Result<Value, ToolError>,
        evidence: Vec<AttemptRecord>,
        attempts: u32,
        now: Option<Timestamp>,
    ) -> Executed {
        let done = |result| Executed {
            key: Some(key.clone()),
            result: Ok(result),
            replayed: false,
            attempts,
        };
        let Some(settlement) = settlement_but_output(&result) else {
            if matches!(result, Err(ToolError::Unavailable { .. })) {
                Box::pin(self.release_unavailable(&key, token, evidence)).await;
                return done(outcome_of(result));
            }
            // Rejected before execution: free the key so the same intent may run again.
            if let Err(e) = self.store().release(&key, token).await {
                tracing::error!(key = %key, error = %crate::observe::field(&e),
                    "could not release a rejected claim; it will turn unknown when its lease passes");
            }
            return done(outcome_of(result));
        };
        match self
            .settle_key(
                &key,
                token,
                settlement.attempts(evidence),
                result.as_ref().ok(),
                now,
            )
            .await
        {
            Ok(()) => done(outcome_of(result)),
            Err((e, evidence)) => {
                // The handler ran; its result could not be recorded. The record will read as
                // unknown (lease expiry), so that is what the caller is told. Keep the
                // evidence where a person will find it.
                // The output is not logged (it may hold what the user asked to keep out of
                // logs), and the store's own words (a raw reply, a host name) stay out of
                // what the model reads.
                tracing::error!(key = %key, error = %crate::observe::field(&e), class = %class_of_result(&result),
                    attempts = %crate::observe::debug_field(&evidence), "handler finished but its result could not be saved");
                done(Outcome::Unknown {
                    reason: "the result could not be saved: the idempotency store failed"
                        .to_owned(),
                })
            }
        }
    }
}
