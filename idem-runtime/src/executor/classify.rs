//! What a handler's result, or a saved record, becomes: a settlement for the store and an
//! outcome for the caller.

use serde_json::Value;

use crate::outcome::{Outcome, OutcomeClass};
use crate::store::{Record, RecordState, Settlement};
use crate::tool::ToolError;

/// The outcome a saved record replays as. The record is the store's, shared: only what the
/// outcome carries (the saved result, a message) is copied out of it.
pub(crate) fn replay(record: &Record) -> Outcome {
    let message = || record.message.clone().unwrap_or_default();
    match record.state {
        RecordState::Completed if record.result_expired => Outcome::ResultExpired {
            was: OutcomeClass::Completed,
        },
        RecordState::Failed if record.result_expired => Outcome::ResultExpired {
            was: OutcomeClass::Failed,
        },
        RecordState::Completed => Outcome::Completed {
            output: record.payload.clone().unwrap_or(Value::Null),
        },
        RecordState::Failed => Outcome::Failed {
            message: message(),
            downstream_ref: record.downstream_ref.clone(),
        },
        RecordState::Pending => Outcome::Pending {
            downstream_ref: record.downstream_ref.clone().unwrap_or_default(),
            detail: record.payload.clone(),
        },
        RecordState::Unknown => Outcome::Unknown { reason: message() },
        RecordState::Escalated => Outcome::Escalated { reason: message() },
        // Only reached if a store reports a running record as settled; report honestly.
        RecordState::Running => Outcome::Unknown {
            reason: "still running in another call".to_owned(),
        },
    }
}

/// The settlement a handler's (or a late handler's) result becomes. `None` for "rejected
/// before execution", which releases instead of settling.
pub(super) fn settlement_of(result: &Result<Value, ToolError>) -> Option<Settlement> {
    let settlement = settlement_but_output(result)?;
    Some(match result {
        Ok(output) => settlement.payload(output.clone()),
        Err(_) => settlement,
    })
}

/// [`settlement_of`], without a completed call's output as its payload: for a caller that
/// hands the store the output by reference.
pub(super) fn settlement_but_output(result: &Result<Value, ToolError>) -> Option<Settlement> {
    Some(match result {
        Ok(_) => Settlement::new(RecordState::Completed),
        Err(ToolError::Rejected { .. } | ToolError::Unavailable { .. }) => return None,
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

pub(super) fn class_of_result(result: &Result<Value, ToolError>) -> OutcomeClass {
    match result {
        Ok(_) => OutcomeClass::Completed,
        Err(ToolError::Rejected { .. }) => OutcomeClass::Rejected,
        Err(ToolError::Unavailable { .. }) => OutcomeClass::Unavailable,
        Err(ToolError::Failed { .. }) => OutcomeClass::Failed,
        Err(ToolError::Pending { .. }) => OutcomeClass::Pending,
        Err(ToolError::Unknown { .. }) => OutcomeClass::Unknown,
    }
}

pub(super) fn outcome_of(result: Result<Value, ToolError>) -> Outcome {
    match result {
        Ok(output) => Outcome::Completed { output },
        Err(ToolError::Rejected { message }) => Outcome::Rejected { message },
        Err(ToolError::Unavailable {
            message,
            retry_after,
        }) => Outcome::Unavailable {
            message,
            retry_after,
        },
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
