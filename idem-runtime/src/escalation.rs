//! Escalations: what a person needs to decide an operation nobody else could settle.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::identity::IdemKey;
use crate::store::{AttemptRecord, Operation, ReadBackRecord, Record, RecordState, Timestamp};

/// Everything known about an operation a person must decide: the intent, key, tool and
/// arguments, every attempt with its times and errors, every read-back, downstream refs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Escalation {
    /// The operation's key.
    pub key: IdemKey,
    /// The tool.
    pub tool: String,
    /// Why it was escalated.
    pub reason: String,
    /// The record's state after escalating (`escalated`, or unchanged for a notice such as
    /// "same key, changed parameters", which leaves the original record as it was).
    pub state: RecordState,
    /// Scope, intent id and arguments.
    pub operation: Option<Operation>,
    /// Arguments of a refused repeat (same key, changed parameters), when that is the reason.
    pub refused_args: Option<serde_json::Value>,
    /// Every attempt.
    pub attempts: Vec<AttemptRecord>,
    /// Every read-back.
    pub read_backs: Vec<ReadBackRecord>,
    /// The downstream's id for the effect, when known.
    pub downstream_ref: Option<String>,
    /// When the operation was first claimed.
    pub created_at: Timestamp,
    /// When it was escalated.
    pub escalated_at: Timestamp,
}

impl Escalation {
    /// An escalation describing `record`, for `reason`.
    pub fn from_record(record: &Record, reason: impl Into<String>, at: Timestamp) -> Self {
        Escalation {
            key: record.key.clone(),
            tool: record.tool.clone(),
            reason: reason.into(),
            state: record.state,
            operation: record.operation.clone(),
            refused_args: None,
            attempts: record.attempts.clone(),
            read_backs: record.read_backs.clone(),
            downstream_ref: record.downstream_ref.clone(),
            created_at: record.created_at,
            escalated_at: at,
        }
    }
}

/// Where escalations go: a log, a file a person watches, a pager, a ticket queue.
#[async_trait::async_trait]
pub trait EscalationSink: Send + Sync + std::fmt::Debug + 'static {
    /// Delivers one escalation. Errors are logged; the record stays escalated either way.
    async fn deliver(&self, escalation: &Escalation) -> Result<(), String>;
}

/// Logs escalations at `error` level through `tracing` (the default sink).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogSink;

#[async_trait::async_trait]
impl EscalationSink for LogSink {
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        let json = serde_json::to_string(e).map_err(|err| err.to_string())?;
        tracing::error!(key = %e.key, tool = %e.tool, reason = %e.reason, escalation = %json,
            "escalated to a person");
        Ok(())
    }
}

/// Appends each escalation as one JSON line to a file (flushed and synced per line).
#[derive(Debug)]
pub struct JsonLinesSink {
    path: PathBuf,
    lock: Mutex<()>,
}

impl JsonLinesSink {
    /// A sink appending to `path` (created if absent).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        JsonLinesSink {
            path: path.into(),
            lock: Mutex::new(()),
        }
    }
}

#[async_trait::async_trait]
impl EscalationSink for JsonLinesSink {
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        let mut line = serde_json::to_vec(e).map_err(|err| err.to_string())?;
        line.push(b'\n');
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|err| format!("{}: {err}", self.path.display()))?;
        f.write_all(&line).map_err(|err| err.to_string())?;
        f.sync_data().map_err(|err| err.to_string())
    }
}

/// Calls a function with each escalation.
pub struct CallbackSink<F>(pub F);

impl<F> std::fmt::Debug for CallbackSink<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackSink")
    }
}

#[async_trait::async_trait]
impl<F> EscalationSink for CallbackSink<F>
where
    F: Fn(&Escalation) + Send + Sync + 'static,
{
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        (self.0)(e);
        Ok(())
    }
}
