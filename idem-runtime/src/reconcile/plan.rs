//! What the reconciler decides for one record, as data: [`plan`] reads the record, what its
//! tool declares, the time and (once asked for) a read-back's answer, and says what to do.
//! It does no I/O, so every row of the decision table in the module docs is a plain unit
//! test; [`super::Reconciler`] carries the plan out (takeover, settle, release, escalate).

use std::time::Duration;

use crate::escalation::ReasonKind;
use crate::store::{AttemptKind, Record, RecordState, Settlement, Timestamp};
use crate::tool::{Downstream, ReadBack, ToolError, ToolSpec};

/// What the reconciler knows besides the record: what the record's tool declares, whether
/// the record's saved arguments still decode into the tool's arguments, and the
/// reconciler's limits.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Facts {
    /// The downstream deduplicates on the key ([`Downstream::Keyed`]): re-sending is safe
    /// inside the window.
    pub(crate) keyed: bool,
    /// How long after the first claim the downstream keeps deduplicating on the key.
    pub(crate) window: Duration,
    /// How long one attempt may run.
    pub(crate) timeout: Duration,
    /// How long after its timeout an attempt may still commit downstream: the effective
    /// bound ([`ToolSpec::effective_in_flight_bound`]), the one the executor drops a
    /// timed-out handler at.
    pub(crate) in_flight_bound: Duration,
    /// Someone said how late the downstream can commit: the tool (`in_flight`) or the
    /// registry ([`crate::registry::RegistryBuilder::default_in_flight_bound`]). The built-in default
    /// bounds how long a stuck handler is kept, but it is a guess about the downstream, and a
    /// guess never frees a key: a "not found" under it goes to a person.
    pub(crate) bound_declared: bool,
    /// The reconciler's limits.
    pub(crate) limits: Limits,
    /// Why the saved arguments no longer decode, when they do not.
    pub(crate) undecodable: Option<String>,
}

/// What a reconciler allows before it hands a record to a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Sends (the executor's included) after which a keyed operation still unsettled is
    /// escalated, minus one: [`super::Reconciler::max_retries`].
    pub(crate) max_retries: u32,
    /// How long after the first claim a keyed operation is retried with the same key:
    /// [`super::Reconciler::patience`] (never past the tool's window).
    pub(crate) patience: Duration,
    /// Read-backs failing in a row (this pass's included) after which the record is
    /// escalated: [`super::Reconciler::max_failed_read_backs`].
    pub(crate) max_failed_read_backs: u32,
}

impl Facts {
    /// The facts of a tool declared by `spec`, in a registry whose default in-flight bound
    /// is `default_bound`, for a reconciler with `limits`.
    pub(crate) fn of(
        spec: &ToolSpec,
        default_bound: Option<Duration>,
        limits: Limits,
        undecodable: Option<String>,
    ) -> Facts {
        Facts {
            keyed: spec.downstream_kind() == Downstream::Keyed,
            window: spec.window_duration(),
            timeout: spec.timeout_duration(),
            in_flight_bound: spec.effective_in_flight_bound(default_bound),
            bound_declared: spec.in_flight_bound_duration().is_some() || default_bound.is_some(),
            limits,
            undecodable,
        }
    }
}

/// What to do with one record.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Plan {
    /// Not this reconciler's record: its tool is not registered here as a write tool.
    Skip {
        /// Why, for the decision.
        why: String,
    },
    /// Send again with the same key, through the executor.
    Retry,
    /// Leave the record as it is; a later pass looks again.
    Wait {
        /// Why, for the decision.
        why: String,
    },
    /// Leave the record as it is, but first append the read-back to its evidence (an
    /// unknown record; a pending one keeps only its latest poll, in the log).
    NoteAndWait {
        /// Why, for the decision.
        why: String,
    },
    /// Run the tool's read-back, then plan again with its answer.
    ReadBack,
    /// Take the record over and settle it as the read-back found it, with the read-back as
    /// evidence.
    Settle {
        /// The settlement, without the read-back's evidence (the executor adds it, timed).
        settlement: Settlement,
        /// What the read-back found, for the decision.
        summary: String,
    },
    /// Free the key: the effect provably never happened.
    Release {
        /// Why, for the decision.
        why: String,
    },
    /// Take the record over, settle it as escalated and hand it to a person.
    Escalate {
        /// Why, for the record, the person and the decision.
        reason: String,
        /// Why, as a kind a program counts.
        kind: ReasonKind,
        /// What the read-back found landed of a partial batch.
        landed: Vec<String>,
        /// Whether the read-back's evidence goes on the record with it.
        with_read_back: bool,
    },
}

/// The wait before the second same-key send after the first one failed to settle (the
/// first retry after a single send goes out at once: [`super::Reconciler::patience`]);
/// each next one waits twice as long, up to [`RETRY_BACKOFF_MAX`].
pub const RETRY_BACKOFF_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between two same-key retries: over a 15-minute patience the retries
/// go out at once, then about 1, 2, 4, … 64 s apart and then every 2 minutes, some 14 in
/// all.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(120);

/// How long after its `sent`th send a keyed operation is sent again: at once after none or
/// one, then [`RETRY_BACKOFF_FIRST`] doubling per send, at most [`RETRY_BACKOFF_MAX`].
pub(crate) fn backoff(sent: u32) -> Duration {
    if sent <= 1 {
        return Duration::ZERO;
    }
    let doublings = (sent - 2).min(16);
    RETRY_BACKOFF_FIRST
        .saturating_mul(1u32 << doublings)
        .min(RETRY_BACKOFF_MAX)
}

/// When a keyed operation with `sent` sends is due for its next same-key retry: the
/// [`backoff`] after its last send ended (after the claim, when nothing was sent).
fn retry_due(record: &Record, sent: u32) -> Timestamp {
    let last = sends(record)
        .map(|a| a.finished_at.max(a.started_at))
        .max()
        .unwrap_or(record.created_at);
    last.plus(backoff(sent))
}

/// How the evidence of a read-back that failed begins (`error: …`). [`evidence_of`] writes
/// it and [`failed_read_backs_in_a_row`] counts it: no successful read-back's summary
/// begins with it (they begin `found`, `not found` or `no read-back`), and records written
/// before the count existed used the same form, so their failures count too.
const FAILED_READ_BACK: &str = "error: ";

/// The one-line evidence a read-back leaves on the record (`found completed ch_1`,
/// `not found`, `error: …`).
pub(crate) fn evidence_of(read_back: &Result<ReadBack, ToolError>) -> String {
    match read_back {
        Ok(rb) => rb.summary(),
        Err(e) => format!("{FAILED_READ_BACK}{e}"),
    }
}

/// How many of the record's latest read-backs failed, counting back from the newest to the
/// first that answered. The store keeps the last [`EVIDENCE_KEPT`] read-backs at least
/// (`rules::cap_evidence`), which is why [`super::Reconciler::max_failed_read_backs`] is
/// at most that.
///
/// [`EVIDENCE_KEPT`]: crate::store::rules::EVIDENCE_KEPT
fn failed_read_backs_in_a_row(record: &Record) -> u32 {
    let n = record
        .read_backs
        .iter()
        .rev()
        .take_while(|rb| rb.result.starts_with(FAILED_READ_BACK))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Decides what to do with `record` at `now`; `tool` is `None` when the record's tool is not
/// registered with this reconciler as a write tool.
///
/// `read_back` is `None` on the first call; when the plan is [`Plan::ReadBack`], the caller
/// runs the tool's read-back and calls again, with the same `now`, with its answer (a tool
/// without a read-back answers [`ReadBack::Unsupported`]). Given a read-back, the plan is
/// never [`Plan::ReadBack`].
pub(crate) fn plan(
    record: &Record,
    tool: Option<&Facts>,
    now: Timestamp,
    read_back: Option<&Result<ReadBack, ToolError>>,
) -> Plan {
    let Some(tool) = tool else {
        return Plan::Skip {
            why: format!(
                "tool `{}` is not registered with this reconciler",
                record.tool
            ),
        };
    };
    if record.operation.is_none() {
        return escalate(
            "the record does not say what was asked for (no operation saved)",
            ReasonKind::Unreadable,
            false,
        );
    }
    if let Some(e) = &tool.undecodable {
        return escalate(
            format!("the saved arguments no longer decode: {e}"),
            ReasonKind::Unreadable,
            false,
        );
    }
    let unknown = record.state == RecordState::Unknown;
    let in_window = record.created_at.plus(tool.window) > now;

    // A keyed operation is settled by the downstream's own deduplication: sent again with
    // the same key, each retry waiting twice as long as the one before, while the patience
    // (never past the window) lasts; between retries, the read-back may settle it, and
    // nothing it finds frees the key. Once the patience (or the count, when one is set) is
    // spent, the read-back still gets its chance to settle it (found completed, failed or
    // pending); anything else is escalated (below, `exhausted`).
    let mut exhausted = None;
    let mut next_retry = None;
    if unknown && tool.keyed && in_window {
        let sent = sends(record).count() as u32;
        let patience = tool.limits.patience.min(tool.window);
        let patience_ends = record.created_at.plus(patience);
        if sent >= tool.limits.max_retries.saturating_add(1) {
            exhausted = Some(format!(
                "keyed downstream still unsettled after {sent} attempts with the same key"
            ));
        } else if now >= patience_ends {
            exhausted = Some(format!(
                "keyed downstream still unsettled after {sent} attempts with the same key over \
                 the reconciler's patience ({}s)",
                patience.as_secs()
            ));
        } else {
            let due = retry_due(record, sent);
            if now >= due {
                return Plan::Retry;
            }
            next_retry = Some(due);
        }
    }

    // An attempt that timed out may still be running (in this process or another) and
    // report its late result; give it that chance before reading back or escalating. Its
    // handler is dropped the in-flight bound after the timeout, so that is how long it may
    // still report. A handler that itself returned "unknown" has nothing more to say.
    if unknown {
        let grace = tool.in_flight_bound;
        let last_timeout = record
            .attempts
            .iter()
            .filter(|a| a.kind == AttemptKind::TimedOut)
            .map(|a| a.finished_at)
            .max();
        if let Some(end) = last_timeout.filter(|end| now < end.plus(grace)) {
            return Plan::Wait {
                why: format!(
                    "the last attempt may still report a late result until {}",
                    end.plus(grace)
                ),
            };
        }
    }

    // Read-back: the only way to settle without sending again.
    let Some(read_back) = read_back else {
        return Plan::ReadBack;
    };
    let found = match read_back {
        Ok(found) => found,
        Err(e) => {
            if let Some(reason) = exhausted {
                return escalate(
                    format!("{reason}, and its read-back failed: {e}"),
                    ReasonKind::PatienceExhausted,
                    true,
                );
            }
            let failures = failed_read_backs_in_a_row(record).saturating_add(1);
            if let Some(due) = next_retry {
                // The retries settle it; the failures are counted once they are spent.
                return Plan::NoteAndWait {
                    why: format!(
                        "read-back failed ({failures} in a row): {e}; sent again with the same \
                         key at {due}"
                    ),
                };
            }
            let limit = tool.limits.max_failed_read_backs;
            if failures >= limit {
                return escalate(
                    format!("read-back failed {failures} times in a row; last: {e}"),
                    ReasonKind::ReadBackFailing,
                    true,
                );
            }
            return Plan::NoteAndWait {
                why: format!("read-back failed ({failures} in a row, escalated at {limit}): {e}"),
            };
        }
    };
    let summary = found.summary();
    let settlement = match found {
        ReadBack::Unsupported => {
            if let Some(due) = next_retry {
                return Plan::Wait {
                    why: format!(
                        "keyed downstream unsettled; sent again with the same key at {due}"
                    ),
                };
            }
            // Only an unknown record can have used up its sends.
            let (reason, kind) = match (exhausted, record.state, tool.keyed) {
                (_, RecordState::Pending, _) => (
                    "pending, and the tool has no read-back to poll it with".to_owned(),
                    ReasonKind::NoKeyNoReadBack,
                ),
                (Some(reason), _, _) => (reason, ReasonKind::PatienceExhausted),
                (None, _, true) => (
                    "safe retry window passed and the tool has no read-back".to_owned(),
                    ReasonKind::WindowPassed,
                ),
                (None, _, false) => (
                    "downstream has no key contract and the tool has no read-back".to_owned(),
                    ReasonKind::NoKeyNoReadBack,
                ),
            };
            return escalate(reason, kind, false);
        }
        ReadBack::Pending { .. } if record.state == RecordState::Pending => {
            // Still pending: nothing new to keep, unless this answer ends a run of failed
            // read-backs (kept, so the run's count starts over).
            return if failed_read_backs_in_a_row(record) > 0 {
                Plan::NoteAndWait { why: summary }
            } else {
                Plan::Wait { why: summary }
            };
        }
        ReadBack::Completed { .. } | ReadBack::Failed { .. } | ReadBack::Pending { .. } => {
            match settlement_found(found) {
                Some(s) => s,
                None => {
                    return escalate(
                        format!("read-back {summary}"),
                        ReasonKind::ConflictingEvidence,
                        true,
                    )
                }
            }
        }
        ReadBack::Ambiguous { .. } => {
            return escalate(
                format!("read-back {summary}"),
                ReasonKind::ConflictingEvidence,
                true,
            )
        }
        // Part of a batch landed: while same-key retries go on, the batch may still finish
        // (a downstream committing item by item); after that, a person decides the rest.
        ReadBack::Partial { landed, .. } => {
            if let Some(due) = next_retry {
                return Plan::NoteAndWait {
                    why: format!("{summary}; sent again with the same key at {due}"),
                };
            }
            let reason = match exhausted {
                Some(reason) => format!("{reason}, and its read-back {summary}"),
                None => format!("read-back {summary}"),
            };
            return Plan::Escalate {
                reason,
                kind: ReasonKind::PartialEffects,
                landed: landed.clone(),
                with_read_back: true,
            };
        }
        // With its sends used up inside the window, nothing is released: a send still on its
        // way (which the keyed downstream may be holding as in progress) could land after
        // the key was freed, and the record of it would be gone. A person decides. While
        // the retries go on, the next one settles it.
        ReadBack::NotFound => {
            if let Some(due) = next_retry {
                return Plan::NoteAndWait {
                    why: format!("not found yet; sent again with the same key at {due}"),
                };
            }
            if let Some(reason) = exhausted {
                return escalate(
                    format!("{reason}, and its read-back found nothing"),
                    ReasonKind::PatienceExhausted,
                    true,
                );
            }
            return not_found(record, tool, now, &summary);
        }
    };
    Plan::Settle {
        settlement,
        summary,
    }
}

/// The settlement of an effect a read-back found: completed, failed or pending, with its
/// downstream reference. `None` for every other answer.
pub(crate) fn settlement_found(found: &ReadBack) -> Option<Settlement> {
    let (settlement, downstream_ref) = match found {
        ReadBack::Completed {
            downstream_ref,
            output,
        } => {
            // What the read-back found landed; an output too deep to keep does not change
            // that (the executor keeps a handler's the same way).
            let output = crate::identity::output_to_keep(output.clone(), "read-back");
            (
                Settlement::new(RecordState::Completed).payload(output),
                downstream_ref.as_ref(),
            )
        }
        ReadBack::Failed {
            downstream_ref,
            message,
        } => (
            Settlement::new(RecordState::Failed).message(message.clone()),
            downstream_ref.as_ref(),
        ),
        ReadBack::Pending { downstream_ref } => {
            (Settlement::new(RecordState::Pending), Some(downstream_ref))
        }
        _ => return None,
    };
    Some(match downstream_ref {
        Some(r) => settlement.downstream_ref(r.clone()),
        None => settlement,
    })
}

/// When no send of `record`'s can land any more: the last send may have left its handler
/// as late as its timeout plus the in-flight bound (the executor drops it then), and the
/// downstream may commit up to the bound after that. A read-back that finds nothing after
/// this finds nothing for good.
///
/// The last send is the latest recorded attempt's start, or, for a record whose lease
/// lapsed, when that lease ran out if later: a holder that died records none of its
/// attempts, and it may have sent (a retry after a refusal, a handler that sends late in
/// its run) until its lease stopped being renewed. Counting from the claim would free the
/// key while such a send can still land.
pub(crate) fn settled_by(record: &Record, tool: &Facts) -> Timestamp {
    let bound = tool.in_flight_bound;
    let lapsed = match record.state {
        RecordState::Unknown => record.lease_until,
        _ => None,
    };
    let last_send = sends(record)
        .map(|a| a.started_at)
        .chain(lapsed)
        .max()
        .unwrap_or(record.created_at);
    last_send.plus(tool.timeout).plus(bound).plus(bound)
}

/// A read-back found nothing: release only once the original can no longer land.
fn not_found(record: &Record, tool: &Facts, now: Timestamp, summary: &str) -> Plan {
    if record.state == RecordState::Pending {
        let reason = format!(
            "pending record's downstream ref {} not found downstream",
            record.downstream_ref.as_deref().unwrap_or("(none)")
        );
        return escalate(reason, ReasonKind::ConflictingEvidence, true);
    }
    let settled_by = settled_by(record, tool);
    if now < settled_by {
        return Plan::NoteAndWait {
            why: format!("not found yet; the original may land until {settled_by}"),
        };
    }
    if !tool.bound_declared {
        // Freeing the key on a guess would let a late commit of an unkeyed send become a
        // second effect; the guess only decides when to ask a person.
        return escalate(
            format!(
                "read-back found nothing ({summary}), but the tool declares no in-flight bound, \
                 so the original may still commit; declare `in_flight` to let the reconciler \
                 release such records"
            ),
            ReasonKind::NoInFlightBound,
            true,
        );
    }
    Plan::Release {
        why: format!(
            "read-back found nothing after the in-flight bound ({summary}); released, the intent may run again"
        ),
    }
}

/// The attempts that sent the operation downstream.
fn sends(record: &Record) -> impl Iterator<Item = &crate::store::AttemptRecord> {
    record.attempts.iter().filter(|a| a.attempt > 0)
}

fn escalate(reason: impl Into<String>, kind: ReasonKind, with_read_back: bool) -> Plan {
    Plan::Escalate {
        reason: reason.into(),
        kind,
        landed: Vec::new(),
        with_read_back,
    }
}

/// One row per row of the decision table in the module docs, plus the edges the table
/// folds into a phrase (budgets, boundaries, the order rows are tried in). Times are seconds
/// after the record was created, at the epoch.
#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
    use crate::outcome::OutcomeClass;
    use crate::store::{AttemptRecord, ClaimToken, Operation, ReadBackRecord};

    fn at(secs: u64) -> Timestamp {
        Timestamp(secs * 1000)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A record of tool `charge` in `state`, created at 0, with its operation saved.
    fn record(state: RecordState) -> Record {
        let args = json!({"cents": 4900});
        let scope = Scope::run("run-1");
        Record {
            key: IdemKey::derive(&scope, "charge", KeyMaterial::Intent("order-1")),
            fingerprint: Fingerprint::of_canonical(b"{\"cents\":4900}"),
            tool: "charge".into(),
            state,
            token: ClaimToken(7),
            lease_until: None,
            created_at: at(0),
            updated_at: at(0),
            payload: None,
            message: None,
            downstream_ref: None,
            result_expired: false,
            attempts: Vec::new(),
            operation: Some(Operation {
                scope,
                intent: Some("order-1".to_owned()),
                args: args.into(),
            }),
            read_backs: Vec::new(),
        }
    }

    fn with_attempts(mut r: Record, attempts: Vec<AttemptRecord>) -> Record {
        r.attempts = attempts;
        r
    }

    /// Attempt `n`, sent at `started` and ended at `finished` as `kind`, with an unknown
    /// outcome.
    fn attempt(n: u32, started: u64, finished: u64, kind: AttemptKind) -> AttemptRecord {
        AttemptRecord::new(
            n,
            at(started),
            at(finished),
            kind,
            OutcomeClass::Unknown,
            Some("connection reset".to_owned()),
        )
    }

    /// The reconciler's limits: at most 3 retries, a patience of 40 s, escalated at the 10th
    /// failed read-back in a row.
    fn limits() -> Limits {
        Limits {
            max_retries: 3,
            patience: secs(40),
            max_failed_read_backs: 10,
        }
    }

    /// An unkeyed tool: timeout 10 s, in-flight bound 5 s, window 60 s, 3 retries.
    fn unkeyed() -> Facts {
        Facts {
            keyed: false,
            window: secs(60),
            timeout: secs(10),
            in_flight_bound: secs(5),
            bound_declared: true,
            limits: limits(),
            undecodable: None,
        }
    }

    fn keyed() -> Facts {
        Facts {
            keyed: true,
            ..unkeyed()
        }
    }

    /// A keyed tool with no retry count and a patience of 15 minutes in a window of an hour.
    fn patient() -> Facts {
        Facts {
            window: secs(3600),
            limits: Limits {
                max_retries: u32::MAX,
                patience: secs(900),
                ..limits()
            },
            ..keyed()
        }
    }

    /// The spec behind [`unkeyed`], without its declared bound.
    fn undeclared_spec() -> ToolSpec {
        ToolSpec::new("charge").timeout(secs(10)).window(secs(60))
    }

    /// An unkeyed tool that declares no in-flight bound, in a registry that sets no default:
    /// the effective bound is the default's floor (4 × 10 s is under 2 min).
    fn undeclared() -> Facts {
        Facts::of(&undeclared_spec(), None, limits(), None)
    }

    /// The same tool in a registry whose default bound is 7 s.
    fn registry_default() -> Facts {
        Facts::of(&undeclared_spec(), Some(secs(7)), limits(), None)
    }

    /// The tool declaring 5 s, in a registry whose default is 7 s: the declared one wins.
    fn declared_over_default() -> Facts {
        Facts::of(
            &undeclared_spec().in_flight_bound(secs(5)),
            Some(secs(7)),
            limits(),
            None,
        )
    }

    /// `n` read-backs that failed, at 1 s, 2 s, …
    fn failures(n: u64) -> Vec<ReadBackRecord> {
        (1..=n)
            .map(|i| ReadBackRecord {
                at: at(i),
                result: evidence_of(&Err(ToolError::unknown("503"))),
            })
            .collect()
    }

    fn with_read_backs(mut r: Record, read_backs: Vec<ReadBackRecord>) -> Record {
        r.read_backs = read_backs;
        r
    }

    fn answered(result: &str) -> ReadBackRecord {
        ReadBackRecord {
            at: at(20),
            result: result.into(),
        }
    }

    fn reset() -> Option<Result<ReadBack, ToolError>> {
        Some(Err(ToolError::unknown("connection reset")))
    }

    fn wait(why: &str) -> Plan {
        Plan::Wait { why: why.into() }
    }

    fn note(why: &str) -> Plan {
        Plan::NoteAndWait { why: why.into() }
    }

    fn escalated(reason: &str, kind: ReasonKind, with_read_back: bool) -> Plan {
        Plan::Escalate {
            reason: reason.into(),
            kind,
            landed: Vec::new(),
            with_read_back,
        }
    }

    fn settled(settlement: Settlement, summary: &str) -> Plan {
        Plan::Settle {
            settlement,
            summary: summary.into(),
        }
    }

    fn completed() -> ReadBack {
        ReadBack::Completed {
            downstream_ref: Some("ch_1".into()),
            output: json!({"id": "ch_1"}),
        }
    }

    fn completed_settlement() -> Settlement {
        Settlement::new(RecordState::Completed)
            .payload(json!({"id": "ch_1"}))
            .downstream_ref("ch_1")
    }

    fn failed() -> ReadBack {
        ReadBack::Failed {
            downstream_ref: Some("ch_2".into()),
            message: "card declined".into(),
        }
    }

    fn failed_settlement() -> Settlement {
        Settlement::new(RecordState::Failed)
            .message("card declined")
            .downstream_ref("ch_2")
    }

    fn pending() -> ReadBack {
        ReadBack::Pending {
            downstream_ref: "re_1".into(),
        }
    }

    fn partial() -> ReadBack {
        ReadBack::Partial {
            landed: vec!["ch_1".into()],
            left: vec!["item 2".into()],
        }
    }

    fn ambiguous() -> ReadBack {
        ReadBack::Ambiguous {
            downstream_refs: vec!["ch_1".into(), "ch_2".into()],
        }
    }

    struct Row {
        name: &'static str,
        record: Record,
        tool: Option<Facts>,
        now: Timestamp,
        /// What the read-back answers, when the row gets that far.
        read_back: Option<Result<ReadBack, ToolError>>,
        expect: Plan,
    }

    fn row(
        name: &'static str,
        record: Record,
        tool: Option<Facts>,
        now: u64,
        read_back: Option<Result<ReadBack, ToolError>>,
        expect: Plan,
    ) -> Row {
        Row {
            name,
            record,
            tool,
            now: at(now),
            read_back,
            expect,
        }
    }

    fn rows() -> Vec<Row> {
        use RecordState::{Pending, Unknown};
        let unknown = || record(Unknown);
        // One send, which answered "unknown" at once: no late result to wait for.
        let sent_once = || {
            with_attempts(
                record(Unknown),
                vec![attempt(1, 0, 1, AttemptKind::Returned)],
            )
        };
        let pending_ref = || {
            let mut r = record(Pending);
            r.downstream_ref = Some("re_1".into());
            r
        };
        let no_operation = || {
            let mut r = record(Unknown);
            r.operation = None;
            r
        };
        let undecodable = || Facts {
            undecodable: Some("Invalid(\"missing field `cents`\")".into()),
            ..keyed()
        };
        let sends = |n: u32| {
            let attempts = (1..=n)
                .map(|i| attempt(i, 0, 1, AttemptKind::Returned))
                .collect();
            with_attempts(record(Unknown), attempts)
        };
        vec![
            // | any | tool not registered here as a write tool | skip |
            row(
                "tool not registered here",
                unknown(),
                None,
                30,
                None,
                Plan::Skip {
                    why: "tool `charge` is not registered with this reconciler".into(),
                },
            ),
            // | any | no operation saved, or arguments no longer decode | escalate |
            row(
                "record without operation",
                no_operation(),
                Some(keyed()),
                30,
                None,
                escalated(
                    "the record does not say what was asked for (no operation saved)",
                    ReasonKind::Unreadable,
                    false,
                ),
            ),
            row(
                "saved arguments no longer decode",
                sent_once(),
                Some(undecodable()),
                30,
                None,
                escalated(
                    "the saved arguments no longer decode: Invalid(\"missing field `cents`\")",
                    ReasonKind::Unreadable,
                    false,
                ),
            ),
            // | unknown | keyed, inside the window, budget spent | read back; what it cannot
            // settle is escalated |
            row(
                "keyed retry budget exhausted, no read-back",
                sends(4),
                Some(keyed()),
                30,
                Some(Ok(ReadBack::Unsupported)),
                escalated(
                    "keyed downstream still unsettled after 4 attempts with the same key",
                    ReasonKind::PatienceExhausted,
                    false,
                ),
            ),
            row(
                "keyed retry budget exhausted, read-back finds completed",
                sends(4),
                Some(keyed()),
                30,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "keyed retry budget exhausted, read-back finds failed",
                sends(4),
                Some(keyed()),
                30,
                Some(Ok(failed())),
                settled(failed_settlement(), "found failed ch_2: card declined"),
            ),
            row(
                "keyed retry budget exhausted, read-back fails: escalated at once, with it",
                sends(4),
                Some(keyed()),
                30,
                reset(),
                escalated(
                    "keyed downstream still unsettled after 4 attempts with the same key, and its read-back failed: outcome unknown: connection reset",
                    ReasonKind::PatienceExhausted,
                    true,
                ),
            ),
            row(
                "keyed retry budget exhausted, ambiguous",
                sends(4),
                Some(keyed()),
                30,
                Some(Ok(ambiguous())),
                escalated("read-back found 2 effects: ch_1, ch_2", ReasonKind::ConflictingEvidence, true),
            ),
            row(
                "keyed retry budget exhausted, not found: escalated, never released",
                sends(4),
                Some(keyed()),
                20,
                Some(Ok(ReadBack::NotFound)),
                escalated(
                    "keyed downstream still unsettled after 4 attempts with the same key, and its read-back found nothing",
                    ReasonKind::PatienceExhausted,
                    true,
                ),
            ),
            row(
                "keyed retry budget exhausted, a timed-out attempt still inside its grace",
                with_attempts(
                    sends(3),
                    vec![
                        attempt(1, 0, 1, AttemptKind::Returned),
                        attempt(2, 0, 1, AttemptKind::Returned),
                        attempt(3, 0, 1, AttemptKind::Returned),
                        attempt(4, 10, 20, AttemptKind::TimedOut),
                    ],
                ),
                Some(keyed()),
                24,
                None,
                wait("the last attempt may still report a late result until 1970-01-01T00:00:25.000Z"),
            ),
            // | unknown | keyed, inside the window | retry with the same key |
            row("keyed inside the window", sent_once(), Some(keyed()), 30, None, Plan::Retry),
            row("keyed, last retry of the budget", sends(3), Some(keyed()), 30, None, Plan::Retry),
            row(
                "keyed retry comes before waiting for a timed-out attempt",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(keyed()),
                12,
                None,
                Plan::Retry,
            ),
            // | unknown | keyed, inside the patience, next retry not due yet | read back: settle
            // what it finds, else wait (noted), never release |
            row(
                "keyed, retry not due yet, not found: noted, never released",
                sends(3),
                Some(keyed()),
                2,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; sent again with the same key at 1970-01-01T00:00:03.000Z"),
            ),
            row(
                "keyed, retry not due yet, found completed: settled",
                sends(3),
                Some(keyed()),
                2,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "keyed, retry not due yet, read-back fails: noted, not escalated",
                with_read_backs(sends(3), failures(12)),
                Some(keyed()),
                2,
                reset(),
                note("read-back failed (13 in a row): outcome unknown: connection reset; sent again with the same key at 1970-01-01T00:00:03.000Z"),
            ),
            row(
                "keyed, retry not due yet, no read-back: wait",
                sends(3),
                Some(keyed()),
                2,
                Some(Ok(ReadBack::Unsupported)),
                wait("keyed downstream unsettled; sent again with the same key at 1970-01-01T00:00:03.000Z"),
            ),
            row(
                "keyed, retry not due yet, part of the batch landed: noted",
                sends(3),
                Some(keyed()),
                2,
                Some(Ok(partial())),
                note("found partial: 1 landed (ch_1), 1 left (item 2); sent again with the same key at 1970-01-01T00:00:03.000Z"),
            ),
            row(
                "keyed, retry not due yet, more than one effect: escalated at once",
                sends(3),
                Some(keyed()),
                2,
                Some(Ok(ambiguous())),
                escalated("read-back found 2 effects: ch_1, ch_2", ReasonKind::ConflictingEvidence, true),
            ),
            // | unknown | keyed, inside the patience, retry due | retry with the same key |
            row(
                "keyed backoff doubles: the 6th send waits 8 s",
                sends(5),
                Some(patient()),
                8,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; sent again with the same key at 1970-01-01T00:00:09.000Z"),
            ),
            row("keyed backoff doubles: due", sends(5), Some(patient()), 9, None, Plan::Retry),
            row(
                "keyed backoff capped at 2 minutes",
                sends(12),
                Some(patient()),
                120,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; sent again with the same key at 1970-01-01T00:02:01.000Z"),
            ),
            row("keyed backoff capped: due", sends(12), Some(patient()), 121, None, Plan::Retry),
            row(
                "keyed, no count set: retried past 3 retries while the patience lasts",
                sends(20),
                Some(patient()),
                899,
                None,
                Plan::Retry,
            ),
            // | unknown | keyed, the patience over inside the window | read back; what it
            // cannot settle is escalated |
            row(
                "keyed, patience over, not found: escalated, never released",
                sent_once(),
                Some(keyed()),
                40,
                Some(Ok(ReadBack::NotFound)),
                escalated(
                    "keyed downstream still unsettled after 1 attempts with the same key over the reconciler's patience (40s), and its read-back found nothing",
                    ReasonKind::PatienceExhausted,
                    true,
                ),
            ),
            row(
                "keyed, patience over, found completed: settled",
                sent_once(),
                Some(keyed()),
                40,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "keyed, patience over, part of the batch landed: escalated with what landed",
                sent_once(),
                Some(keyed()),
                40,
                Some(Ok(partial())),
                Plan::Escalate {
                    reason: "keyed downstream still unsettled after 1 attempts with the same key over the reconciler's patience (40s), and its read-back found partial: 1 landed (ch_1), 1 left (item 2)".into(),
                    kind: ReasonKind::PartialEffects,
                    landed: vec!["ch_1".into()],
                    with_read_back: true,
                },
            ),
            row(
                "keyed, patience past the window: the window caps it, nothing sent after",
                sent_once(),
                Some(Facts {
                    limits: Limits {
                        patience: secs(1000),
                        ..limits()
                    },
                    ..keyed()
                }),
                60,
                Some(Ok(ReadBack::Unsupported)),
                escalated(
                    "safe retry window passed and the tool has no read-back",
                    ReasonKind::WindowPassed,
                    false,
                ),
            ),
            row(
                "unkeyed, part of the batch landed: escalated with what landed",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(partial())),
                Plan::Escalate {
                    reason: "read-back found partial: 1 landed (ch_1), 1 left (item 2)".into(),
                    kind: ReasonKind::PartialEffects,
                    landed: vec!["ch_1".into()],
                    with_read_back: true,
                },
            ),
            row(
                "keyed, window over at exactly created + window: read back",
                sent_once(),
                Some(keyed()),
                60,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "pending keyed record is polled, not retried",
                pending_ref(),
                Some(keyed()),
                30,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            // | unknown | an attempt timed out less than the grace ago | wait |
            row(
                "timed-out attempt still inside its grace",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(unkeyed()),
                14,
                None,
                wait("the last attempt may still report a late result until 1970-01-01T00:00:15.000Z"),
            ),
            row(
                "timed-out attempt, no declared bound: the default bound's grace",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(undeclared()),
                129,
                None,
                wait("the last attempt may still report a late result until 1970-01-01T00:02:10.000Z"),
            ),
            row(
                "timed-out attempt, no declared bound: read back at the default bound",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(undeclared()),
                130,
                None,
                Plan::ReadBack,
            ),
            row(
                "timed-out attempt, no declared bound: the registry's default bound's grace",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(registry_default()),
                16,
                None,
                wait("the last attempt may still report a late result until 1970-01-01T00:00:17.000Z"),
            ),
            row(
                "timed-out attempt: a declared bound beats the registry's default",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(declared_over_default()),
                15,
                None,
                Plan::ReadBack,
            ),
            row(
                "an abandoned handler is not waited for past its bound",
                with_attempts(
                    unknown(),
                    vec![
                        attempt(1, 0, 10, AttemptKind::TimedOut),
                        attempt(1, 0, 15, AttemptKind::Abandoned),
                    ],
                ),
                Some(unkeyed()),
                15,
                None,
                Plan::ReadBack,
            ),
            row(
                "grace runs from the last timed-out attempt",
                with_attempts(
                    unknown(),
                    vec![
                        attempt(1, 0, 10, AttemptKind::TimedOut),
                        attempt(2, 20, 30, AttemptKind::TimedOut),
                    ],
                ),
                Some(unkeyed()),
                34,
                None,
                wait("the last attempt may still report a late result until 1970-01-01T00:00:35.000Z"),
            ),
            row(
                "grace over at exactly its end: read back",
                with_attempts(unknown(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(unkeyed()),
                15,
                None,
                Plan::ReadBack,
            ),
            row(
                "an attempt whose message says it timed out but whose kind does not: no grace",
                with_attempts(
                    unknown(),
                    vec![AttemptRecord::new(
                        1,
                        at(0),
                        at(10),
                        AttemptKind::Returned,
                        OutcomeClass::Unknown,
                        Some("timed out after 10s".into()),
                    )],
                ),
                Some(unkeyed()),
                12,
                None,
                Plan::ReadBack,
            ),
            row(
                "a pending record gets no grace",
                with_attempts(pending_ref(), vec![attempt(1, 0, 10, AttemptKind::TimedOut)]),
                Some(unkeyed()),
                12,
                Some(Ok(pending())),
                wait("found pending re_1"),
            ),
            // | unknown, pending | no read-back | escalate |
            row(
                "unkeyed without read-back",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(ReadBack::Unsupported)),
                escalated("downstream has no key contract and the tool has no read-back", ReasonKind::NoKeyNoReadBack, false),
            ),
            row(
                "keyed past its window without read-back",
                sent_once(),
                Some(keyed()),
                61,
                Some(Ok(ReadBack::Unsupported)),
                escalated("safe retry window passed and the tool has no read-back", ReasonKind::WindowPassed, false),
            ),
            row(
                "pending without read-back",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(ReadBack::Unsupported)),
                escalated("pending, and the tool has no read-back to poll it with", ReasonKind::NoKeyNoReadBack, false),
            ),
            // | unknown, pending | the read-back fails for the Nth time in a row | escalate |
            row(
                "read-back fails the 10th time in a row: escalated",
                with_read_backs(sent_once(), failures(9)),
                Some(unkeyed()),
                30,
                reset(),
                escalated(
                    "read-back failed 10 times in a row; last: outcome unknown: connection reset",
                    ReasonKind::ReadBackFailing,
                    true,
                ),
            ),
            row(
                "pending record's read-back fails the 10th time in a row: escalated",
                with_read_backs(pending_ref(), failures(9)),
                Some(unkeyed()),
                30,
                reset(),
                escalated(
                    "read-back failed 10 times in a row; last: outcome unknown: connection reset",
                    ReasonKind::ReadBackFailing,
                    true,
                ),
            ),
            row(
                "a lower limit escalates sooner",
                with_read_backs(sent_once(), failures(2)),
                Some(Facts {
                    limits: Limits {
                        max_failed_read_backs: 3,
                        ..limits()
                    },
                    ..unkeyed()
                }),
                30,
                reset(),
                escalated(
                    "read-back failed 3 times in a row; last: outcome unknown: connection reset",
                    ReasonKind::ReadBackFailing,
                    true,
                ),
            ),
            row(
                "failed read-backs past the evidence cap's marker are not counted",
                with_read_backs(
                    sent_once(),
                    failures(16)
                        .into_iter()
                        .chain([answered("idem evidence cap: 0 attempts and 40 read-backs dropped")])
                        .chain(failures(15))
                        .collect(),
                ),
                Some(Facts {
                    limits: Limits {
                        max_failed_read_backs: 17,
                        ..limits()
                    },
                    ..unkeyed()
                }),
                30,
                reset(),
                note("read-back failed (16 in a row, escalated at 17): outcome unknown: connection reset"),
            ),
            // | unknown, pending | the read-back fails | wait, noted |
            row(
                "read-back error",
                sent_once(),
                Some(unkeyed()),
                30,
                reset(),
                note("read-back failed (1 in a row, escalated at 10): outcome unknown: connection reset"),
            ),
            row(
                "read-back fails the 9th time in a row: noted",
                with_read_backs(sent_once(), failures(8)),
                Some(unkeyed()),
                30,
                reset(),
                note("read-back failed (9 in a row, escalated at 10): outcome unknown: connection reset"),
            ),
            row(
                "a read-back that answered ends the run",
                with_read_backs(
                    sent_once(),
                    failures(9).into_iter().chain([answered("not found")]).collect(),
                ),
                Some(unkeyed()),
                30,
                reset(),
                note("read-back failed (1 in a row, escalated at 10): outcome unknown: connection reset"),
            ),
            row(
                "read-back error on a pending record",
                pending_ref(),
                Some(unkeyed()),
                30,
                reset(),
                note("read-back failed (1 in a row, escalated at 10): outcome unknown: connection reset"),
            ),
            // | unknown | found completed, failed or pending | settle as found |
            row(
                "unknown, found completed",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "unknown, found completed without a ref",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(ReadBack::Completed {
                    downstream_ref: None,
                    output: json!(null),
                })),
                settled(
                    Settlement::new(RecordState::Completed).payload(json!(null)),
                    "found completed (no ref)",
                ),
            ),
            row(
                "unknown, found failed",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(failed())),
                settled(failed_settlement(), "found failed ch_2: card declined"),
            ),
            row(
                "unknown, found pending",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(pending())),
                settled(
                    Settlement::new(RecordState::Pending).downstream_ref("re_1"),
                    "found pending re_1",
                ),
            ),
            // | pending | found completed or failed | settle as found |
            row(
                "pending, found completed",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(completed())),
                settled(completed_settlement(), "found completed ch_1"),
            ),
            row(
                "pending, found failed",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(failed())),
                settled(failed_settlement(), "found failed ch_2: card declined"),
            ),
            // | pending | found pending | wait (noted only when it ends a run of failures) |
            row(
                "pending, read-back still pending",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(pending())),
                wait("found pending re_1"),
            ),
            row(
                "pending, still pending after failed read-backs: noted, ending the run",
                with_read_backs(pending_ref(), failures(3)),
                Some(unkeyed()),
                30,
                Some(Ok(pending())),
                note("found pending re_1"),
            ),
            // | any | more than one effect | escalate |
            row(
                "unknown, ambiguous",
                sent_once(),
                Some(unkeyed()),
                30,
                Some(Ok(ambiguous())),
                escalated("read-back found 2 effects: ch_1, ch_2", ReasonKind::ConflictingEvidence, true),
            ),
            row(
                "pending, ambiguous",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(ambiguous())),
                escalated("read-back found 2 effects: ch_1, ch_2", ReasonKind::ConflictingEvidence, true),
            ),
            // | pending | not found | escalate |
            row(
                "pending, not found",
                pending_ref(),
                Some(unkeyed()),
                30,
                Some(Ok(ReadBack::NotFound)),
                escalated("pending record's downstream ref re_1 not found downstream", ReasonKind::ConflictingEvidence, true),
            ),
            // | unknown | not found, no bound declared: the default bound applies |
            row(
                "not found, no declared bound: before twice the default bound",
                sent_once(),
                Some(undeclared()),
                249,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:04:10.000Z"),
            ),
            row(
                "not found, no declared bound: escalated (never released) at twice the default bound",
                sent_once(),
                Some(undeclared()),
                250,
                Some(Ok(ReadBack::NotFound)),
                escalated(
                    "read-back found nothing (not found), but the tool declares no in-flight \
                     bound, so the original may still commit; declare `in_flight` to let the \
                     reconciler release such records",
                    ReasonKind::NoInFlightBound,
                    true,
                ),
            ),
            row(
                "not found, no declared bound: the registry's default bound",
                sent_once(),
                Some(registry_default()),
                24,
                Some(Ok(ReadBack::NotFound)),
                Plan::Release {
                    why: "read-back found nothing after the in-flight bound (not found); released, the intent may run again".into(),
                },
            ),
            // | unknown | not found before last send + timeout + 2 × bound | wait, noted |
            row(
                "not found before settled_by",
                sent_once(),
                Some(unkeyed()),
                19,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:00:20.000Z"),
            ),
            row(
                "settled_by runs from the last send",
                with_attempts(
                    unknown(),
                    vec![
                        attempt(1, 0, 1, AttemptKind::Returned),
                        attempt(2, 30, 31, AttemptKind::Returned),
                    ],
                ),
                Some(unkeyed()),
                49,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:00:50.000Z"),
            ),
            row(
                "settled_by runs from the claim when nothing was sent",
                unknown(),
                Some(unkeyed()),
                19,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:00:20.000Z"),
            ),
            row(
                "settled_by runs from a lapsed lease when its holder recorded no attempt",
                Record {
                    lease_until: Some(at(25)),
                    ..unknown()
                },
                Some(unkeyed()),
                44,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:00:45.000Z"),
            ),
            row(
                "not found at exactly settled_by from a lapsed lease",
                Record {
                    lease_until: Some(at(25)),
                    ..unknown()
                },
                Some(unkeyed()),
                45,
                Some(Ok(ReadBack::NotFound)),
                Plan::Release {
                    why: "read-back found nothing after the in-flight bound (not found); released, the intent may run again".into(),
                },
            ),
            row(
                "settled_by runs from the later of the last send and a lapsed lease",
                Record {
                    lease_until: Some(at(25)),
                    ..with_attempts(unknown(), vec![attempt(1, 30, 31, AttemptKind::Returned)])
                },
                Some(unkeyed()),
                49,
                Some(Ok(ReadBack::NotFound)),
                note("not found yet; the original may land until 1970-01-01T00:00:50.000Z"),
            ),
            // | unknown | not found after that | release |
            row(
                "not found at exactly settled_by",
                sent_once(),
                Some(unkeyed()),
                20,
                Some(Ok(ReadBack::NotFound)),
                Plan::Release {
                    why: "read-back found nothing after the in-flight bound (not found); released, the intent may run again".into(),
                },
            ),
        ]
    }

    #[test]
    fn every_row_of_the_decision_table() {
        let rows = rows();
        for r in &rows {
            let tool = r.tool.as_ref();
            match &r.read_back {
                // The row is decided only once the downstream was asked: the first call
                // must ask for the read-back, the second decide with its answer.
                Some(found) => {
                    assert_eq!(
                        plan(&r.record, tool, r.now, None),
                        Plan::ReadBack,
                        "row `{}`: the first call asks for a read-back",
                        r.name
                    );
                    assert_eq!(
                        plan(&r.record, tool, r.now, Some(found)),
                        r.expect,
                        "row `{}`",
                        r.name
                    );
                }
                None => {
                    assert_eq!(
                        plan(&r.record, tool, r.now, None),
                        r.expect,
                        "row `{}`",
                        r.name
                    )
                }
            }
        }
        assert_eq!(
            rows.len(),
            73,
            "rows added or lost: update the count and the docs"
        );
    }

    #[test]
    fn names_of_rows_are_unique() {
        let rows = rows();
        let mut names: Vec<_> = rows.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), rows.len());
    }

    #[test]
    fn evidence_of_a_read_back_or_its_error() {
        assert_eq!(evidence_of(&Ok(ReadBack::NotFound)), "not found");
        assert_eq!(
            evidence_of(&Err(ToolError::unknown("503"))),
            "error: outcome unknown: 503"
        );
    }
}
