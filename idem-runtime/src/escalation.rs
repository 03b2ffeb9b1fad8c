//! Escalations: what a person needs to decide an operation nobody else could settle.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
///
/// The file is written on tokio's blocking pool, never on a runtime worker: a slow disk
/// (or a fsync that takes a second) must not stall the calls sharing that worker. It is
/// created readable by its owner only (mode 0600 on Unix), since escalations hold the
/// operation's arguments, and a path that is a symbolic link is refused rather than
/// followed, so nobody can point the sink at a file they want overwritten.
#[derive(Debug)]
pub struct JsonLinesSink {
    path: Arc<PathBuf>,
    lock: Arc<Mutex<()>>,
}

impl JsonLinesSink {
    /// A sink appending to `path` (created if absent).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        JsonLinesSink {
            path: Arc::new(path.into()),
            lock: Arc::new(Mutex::new(())),
        }
    }

    /// Appends `line` under the lock (so lines from concurrent deliveries never interleave)
    /// and syncs it to disk. Blocking: runs on the blocking pool.
    fn append(path: &Path, lock: &Mutex<()>, line: &[u8]) -> Result<(), String> {
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
        }
        #[cfg(not(unix))]
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "{}: is a symbolic link; not followed",
                path.display()
            ));
        }
        let mut f = options
            .open(path)
            .map_err(|err| format!("{}: {err}", path.display()))?;
        f.write_all(line).map_err(|err| err.to_string())?;
        f.sync_data().map_err(|err| err.to_string())
    }
}

#[async_trait::async_trait]
impl EscalationSink for JsonLinesSink {
    async fn deliver(&self, e: &Escalation) -> Result<(), String> {
        let mut line = serde_json::to_vec(e).map_err(|err| err.to_string())?;
        line.push(b'\n');
        let (path, lock) = (self.path.clone(), self.lock.clone());
        tokio::task::spawn_blocking(move || JsonLinesSink::append(&path, &lock, &line))
            .await
            .map_err(|err| format!("{}: the write did not finish: {err}", self.path.display()))?
    }
}

/// Calls a function with each escalation: a pager, a ticket queue, a channel to a task.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{CallbackSink, Registry};
///
/// let sink = CallbackSink(|e: &idem_runtime::Escalation| {
///     eprintln!("page the on-call: {} ({}): {}", e.tool, e.key, e.reason);
/// });
/// let registry = Registry::builder().escalation_sink(Arc::new(sink)).build()?;
/// # Ok::<(), idem_runtime::BuildError>(())
/// ```
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
