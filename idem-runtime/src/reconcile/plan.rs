//! What the reconciler decides for one record, as data: [`plan`] reads the record, what its
//! tool declares, the time and (once asked for) a read-back's answer, and says what to do.
//! It does no I/O, so every row of the decision table in the module docs is a plain unit
//! test; [`super::Reconciler`] carries the plan out (takeover, settle, release, escalate).

use std::time::Duration;

use crate::store::{AttemptKind, Record, RecordState, Settlement, Timestamp};
use crate::tool::{Downstream, ReadBack, ToolError, ToolSpec};

/// What the reconciler knows besides the record: what the record's tool declares, whether
/// the record's saved arguments still decode into the tool's arguments, and how many sends
/// the reconciler allows a keyed operation.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Facts {
    /// The downstream deduplicates on the key ([`Downstream::Keyed`]): re-sending is safe
    /// inside the window.
    pub(crate) keyed: bool,
    /// How long after the first claim the downstream keeps deduplicating on the key.
    pub(crate) window: Duration,
    /// How long one attempt may run.
    pub(crate) timeout: Duration,
    /// How long after its timeout an attempt may still commit downstream, when declared.
    pub(crate) in_flight_bound: Option<Duration>,
    /// Sends (the executor's included) after which a keyed operation still unsettled is
    /// escalated, minus one: [`super::Reconciler::max_retries`].
    pub(crate) max_retries: u32,
    /// Why the saved arguments no longer decode, when they do not.
    pub(crate) undecodable: Option<String>,
}

impl Facts {
    /// The facts of a tool declared by `spec`, for a reconciler allowing `max_retries`.
    pub(crate) fn of(spec: &ToolSpec, max_retries: u32, undecodable: Option<String>) -> Facts {
        Facts {
            keyed: spec.downstream_kind() == Downstream::Keyed,
            window: spec.window_duration(),
            timeout: spec.timeout_duration(),
            in_flight_bound: spec.in_flight_bound_duration(),
            max_retries,
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
        /// Whether the read-back's evidence goes on the record with it.
        with_read_back: bool,
    },
}

/// The one-line evidence a read-back leaves on the record (`found completed ch_1`,
/// `not found`, `error: …`).
pub(crate) fn evidence_of(read_back: &Result<ReadBack, ToolError>) -> String {
    match read_back {
        Ok(rb) => rb.summary(),
        Err(e) => format!("error: {e}"),
    }
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
            false,
        );
    }
    if let Some(e) = &tool.undecodable {
        return escalate(format!("the saved arguments no longer decode: {e}"), false);
    }
    let unknown = record.state == RecordState::Unknown;
    let in_window = record.created_at.plus(tool.window) > now;

    if unknown && tool.keyed && in_window {
        let sent = sends(record).count() as u32;
        if sent >= tool.max_retries.saturating_add(1) {
            return escalate(
                format!("keyed downstream still unsettled after {sent} attempts with the same key"),
                false,
            );
        }
        return Plan::Retry;
    }

    // An attempt that timed out may still be running (in this process or another) and
    // report its late result; give it that chance before reading back or escalating. Its
    // handler is dropped `in_flight` after the timeout (without a bound, allow it one more
    // timeout). A handler that itself returned "unknown" has nothing more to say.
    if unknown {
        let grace = tool.in_flight_bound.unwrap_or(tool.timeout);
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
            return Plan::NoteAndWait {
                why: format!("read-back failed: {e}"),
            }
        }
    };
    let summary = found.summary();
    let settlement = match found {
        ReadBack::Unsupported => {
            let reason = match (record.state, tool.keyed) {
                (RecordState::Pending, _) => {
                    "pending, and the tool has no read-back to poll it with"
                }
                (_, true) => "safe retry window passed and the tool has no read-back",
                _ => "downstream has no key contract and the tool has no read-back",
            };
            return escalate(reason, false);
        }
        ReadBack::Completed {
            downstream_ref,
            output,
        } => {
            let s = Settlement::new(RecordState::Completed).payload(output.clone());
            match downstream_ref {
                Some(r) => s.downstream_ref(r.clone()),
                None => s,
            }
        }
        ReadBack::Failed {
            downstream_ref,
            message,
        } => {
            let s = Settlement::new(RecordState::Failed).message(message.clone());
            match downstream_ref {
                Some(r) => s.downstream_ref(r.clone()),
                None => s,
            }
        }
        ReadBack::Pending { downstream_ref } => {
            if record.state == RecordState::Pending {
                return Plan::NoteAndWait { why: summary };
            }
            Settlement::new(RecordState::Pending).downstream_ref(downstream_ref.clone())
        }
        ReadBack::Ambiguous { .. } => return escalate(format!("read-back {summary}"), true),
        ReadBack::NotFound => return not_found(record, tool, now, &summary),
    };
    Plan::Settle {
        settlement,
        summary,
    }
}

/// A read-back found nothing: release only once the original can no longer land.
fn not_found(record: &Record, tool: &Facts, now: Timestamp, summary: &str) -> Plan {
    if record.state == RecordState::Pending {
        let reason = format!(
            "pending record's downstream ref {} not found downstream",
            record.downstream_ref.as_deref().unwrap_or("(none)")
        );
        return escalate(reason, true);
    }
    let Some(bound) = tool.in_flight_bound else {
        return escalate(
            "read-back found nothing, but the tool declares no in-flight bound, so the original may still land",
            true,
        );
    };
    // The last send may have left its handler as late as its timeout plus the bound (the
    // executor drops it then), and the downstream may commit up to the bound after that.
    let last_send = sends(record)
        .map(|a| a.started_at)
        .max()
        .unwrap_or(record.created_at);
    let settled_by = last_send.plus(tool.timeout).plus(bound).plus(bound);
    if now < settled_by {
        return Plan::NoteAndWait {
            why: format!("not found yet; the original may land until {settled_by}"),
        };
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

fn escalate(reason: impl Into<String>, with_read_back: bool) -> Plan {
    Plan::Escalate {
        reason: reason.into(),
        with_read_back,
    }
}
