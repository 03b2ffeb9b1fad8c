//! Escalations: what a person needs to decide an operation nobody else could settle.

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::identity::{Fingerprint, IdemKey};
use crate::store::{
    async_trait_fns, AttemptRecord, Operation, ReadBackRecord, Record, RecordState, Timestamp,
};

/// Why an operation went to a person, as a kind a program can count: each escalation
/// carries one beside its text ([`Escalation::kind`]), the escalated record keeps it
/// ([`EscalationDetail`]), and the metric `idem_escalations_total` is labelled with it
/// ([`ReasonKind::as_str`]).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReasonKind {
    /// A keyed operation's safe retry window passed before anything settled it, and no
    /// read-back can.
    WindowPassed,
    /// A keyed downstream kept answering *unknown* to same-key retries for the whole
    /// patience ([`crate::reconcile::Reconciler::patience`]), and the read-back (if any) did
    /// not settle it.
    PatienceExhausted,
    /// The read-back found part of a batch done and part not ([`crate::tool::ReadBack::Partial`]):
    /// the escalation lists what landed ([`Escalation::landed`]).
    PartialEffects,
    /// The evidence contradicts itself: more than one effect for one operation, or a pending
    /// record's downstream reference gone.
    ConflictingEvidence,
    /// The downstream has no key contract (or the record is pending) and the tool has no
    /// read-back: nothing can tell whether it happened.
    NoKeyNoReadBack,
    /// The read-back kept failing ([`crate::reconcile::Reconciler::max_failed_read_backs`]
    /// times in a row).
    ReadBackFailing,
    /// The read-back found nothing, but the tool declares no in-flight bound, so the
    /// original may still commit.
    NoInFlightBound,
    /// The record cannot be acted on: no operation saved, or its arguments no longer decode.
    Unreadable,
    /// The operation is claimed under two key formats during a key migration.
    ClaimedTwice,
    /// A repeat with the same key changed the parameters (a notice).
    ChangedParams,
    /// A result arrived after the record was settled otherwise (a notice).
    LateResult,
    /// Not said: an escalation or record written before reason kinds existed.
    #[default]
    Unspecified,
}

impl ReasonKind {
    /// Every kind, in declaration order.
    pub const ALL: [ReasonKind; 12] = [
        ReasonKind::WindowPassed,
        ReasonKind::PatienceExhausted,
        ReasonKind::PartialEffects,
        ReasonKind::ConflictingEvidence,
        ReasonKind::NoKeyNoReadBack,
        ReasonKind::ReadBackFailing,
        ReasonKind::NoInFlightBound,
        ReasonKind::Unreadable,
        ReasonKind::ClaimedTwice,
        ReasonKind::ChangedParams,
        ReasonKind::LateResult,
        ReasonKind::Unspecified,
    ];

    /// The kind's name: its serialized form and its metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::WindowPassed => "window_passed",
            ReasonKind::PatienceExhausted => "patience_exhausted",
            ReasonKind::PartialEffects => "partial_effects",
            ReasonKind::ConflictingEvidence => "conflicting_evidence",
            ReasonKind::NoKeyNoReadBack => "no_key_no_read_back",
            ReasonKind::ReadBackFailing => "read_back_failing",
            ReasonKind::NoInFlightBound => "no_in_flight_bound",
            ReasonKind::Unreadable => "unreadable",
            ReasonKind::ClaimedTwice => "claimed_twice",
            ReasonKind::ChangedParams => "changed_params",
            ReasonKind::LateResult => "late_result",
            ReasonKind::Unspecified => "unspecified",
        }
    }
}

impl std::fmt::Display for ReasonKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an escalated record keeps besides its reason's text, in its payload (the
/// `payload` an escalated record has no other use for, which every store already keeps
/// as JSON): the reason kind and, for a partial batch, what landed.
///
/// [`EscalationDetail::of`] reads it back; a record escalated before the detail existed
/// (no payload, or another shape) reads as [`ReasonKind::Unspecified`] with nothing landed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct EscalationDetail {
    /// Why it went to a person.
    #[serde(default)]
    pub reason_kind: ReasonKind,
    /// For a partial batch: the parts the read-back found done downstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landed: Vec<String>,
}

impl EscalationDetail {
    /// A detail of `kind` with `landed`.
    pub fn new(reason_kind: ReasonKind, landed: Vec<String>) -> Self {
        EscalationDetail {
            reason_kind,
            landed,
        }
    }

    /// The detail an escalated `record` keeps; the default for any other record, or one
    /// escalated without it.
    pub fn of(record: &Record) -> EscalationDetail {
        match (&record.state, &record.payload) {
            (RecordState::Escalated, Some(p)) => {
                serde_json::from_value(p.clone()).unwrap_or_default()
            }
            _ => EscalationDetail::default(),
        }
    }

    /// The detail as the escalated record's payload.
    pub fn to_payload(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

/// Everything known about an operation a person must decide: the intent, key, tool and
/// arguments, every attempt with its times and errors, every read-back, downstream refs.
///
/// Delivery is **at least once**: the [`crate::reconcile::Reconciler`] hands an escalation to its sink
/// before it records the operation as escalated, so a reconciler that dies in between
/// delivers it again on its next pass. Both deliveries carry the same [`Escalation::id`]; a
/// sink that must page only once de-duplicates on it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Escalation {
    /// Identifies this escalation: the same on every delivery of it, different for every
    /// other escalation or notice. A record escalated by the reconciler gets
    /// `KEY/CREATED/escalated` (one per record: it is never escalated twice); a notice
    /// (same key with changed parameters, a late result) gets one that also names when it was
    /// raised and why. Empty in escalations written before it existed.
    #[serde(default)]
    pub id: String,
    /// The operation's key.
    pub key: IdemKey,
    /// The tool.
    pub tool: String,
    /// Why it was escalated.
    pub reason: String,
    /// Why, as a kind a program can count ([`ReasonKind::Unspecified`] in escalations
    /// written before it existed).
    #[serde(default)]
    pub kind: ReasonKind,
    /// For a partial batch, the parts the read-back found done downstream: what is left to
    /// decide is the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landed: Vec<String>,
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
    /// An escalation describing `record`, for `reason`: a notice raised at `at`, its
    /// [`Escalation::id`] naming the record, `at` and `reason`. Its [`Escalation::kind`] is
    /// [`ReasonKind::Unspecified`] until [`Escalation::kind`] is set.
    pub fn from_record(record: &Record, reason: impl Into<String>, at: Timestamp) -> Self {
        let reason = reason.into();
        let why = Fingerprint::of_canonical(reason.as_bytes()).to_hex();
        let id = format!(
            "{}/{}/notice/{}/{}",
            record.key,
            record.created_at.as_millis(),
            at.as_millis(),
            &why[..why.len().min(16)]
        );
        Escalation {
            id,
            ..Escalation::escalating(record, reason, at)
        }
    }

    /// The escalation of `record` itself (the reconciler hands it to a person): its id
    /// names only the record, so delivering it again after a crash repeats the same id.
    pub(crate) fn escalating(record: &Record, reason: impl Into<String>, at: Timestamp) -> Self {
        Escalation {
            id: format!("{}/{}/escalated", record.key, record.created_at.as_millis()),
            key: record.key.clone(),
            tool: record.tool.to_string(),
            reason: reason.into(),
            kind: ReasonKind::Unspecified,
            landed: Vec::new(),
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

/// What [`EscalationSink::deliver`] returns: the boxed future `#[async_trait]` makes of an
/// `async fn deliver`. Private, so the public API gains no name: rustdoc shows the trait's
/// signature with the type spelled out.
type Delivery<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Where escalations go: a log, a file a person watches, a pager, a ticket queue.
///
/// `deliver`'s signature is the one `#[async_trait]` generates, written out (the sink is
/// used as `dyn EscalationSink`): implement it with `#[async_trait::async_trait]` on the
/// `impl` block and an `async fn deliver`, or return `Box::pin(async move { … })`.
pub trait EscalationSink: Send + Sync + std::fmt::Debug + 'static {
    async_trait_fns! {
        /// Delivers one escalation. Called at least once per escalated record (see
        /// [`Escalation`]): de-duplicate on [`Escalation::id`] if a repeat matters. An error from
        /// the reconciler's delivery leaves the record as it was (unknown or pending), logged, and
        /// the next pass escalates it again; an error delivering a notice (changed parameters, a
        /// late result) is logged and the notice is not sent again.
        fn deliver<'life1>(&self, escalation: &'life1 Escalation) -> Delivery<'async_trait>;
    }
}

/// Logs escalations at `error` level through `tracing` (the default sink): the key, tool,
/// state, reason, downstream ref and how much evidence there is — never the arguments,
/// which may hold what a log must not (card numbers, addresses, a tenant's names). A person
/// finds them in the store (`idem show KEY`); a sink that should carry them is a choice to
/// make ([`JsonLinesSink`], [`CallbackSink`]), with [`crate::registry::RegistryBuilder::redact`] to
/// mask what they must not.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogSink;

impl EscalationSink for LogSink {
    async_trait_fns! {
        fn deliver<'life1>(&self, e: &'life1 Escalation) -> Delivery<'async_trait> {
            Box::pin(async move {
                tracing::error!(id = %e.id, key = %e.key, tool = %e.tool, state = %e.state, reason = %crate::observe::field(&e.reason),
                    downstream_ref = %crate::observe::field(&e.downstream_ref.as_deref().unwrap_or("")),
                    attempts = e.attempts.len(), read_backs = e.read_backs.len(),
                    "escalated to a person");
                Ok(())
            })
        }
    }
}

/// A hook that masks what escalations must not carry before any sink sees them.
pub type Redactor = dyn Fn(&mut Escalation) + Send + Sync;

/// Applies a [`Redactor`] to every escalation, then hands it to the inner sink.
pub(crate) struct RedactingSink {
    pub(crate) inner: Arc<dyn EscalationSink>,
    pub(crate) redact: Arc<Redactor>,
}

impl std::fmt::Debug for RedactingSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedactingSink")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl RedactingSink {
    /// `inner`, redacted by `redact` when there is one.
    pub(crate) fn wrap(
        inner: Arc<dyn EscalationSink>,
        redact: Option<&Arc<Redactor>>,
    ) -> Arc<dyn EscalationSink> {
        match redact {
            Some(redact) => Arc::new(RedactingSink {
                inner,
                redact: Arc::clone(redact),
            }),
            None => inner,
        }
    }
}

impl EscalationSink for RedactingSink {
    async_trait_fns! {
        fn deliver<'life1>(&self, e: &'life1 Escalation) -> Delivery<'async_trait> {
            Box::pin(async move {
                let mut e = e.clone();
                (self.redact)(&mut e);
                self.inner.deliver(&e).await
            })
        }
    }
}

/// Appends each escalation as one JSON line to a file (flushed and synced per line).
///
/// The file is written on tokio's blocking pool, never on a runtime worker: a slow disk
/// (or a fsync that takes a second) must not stall the calls sharing that worker. It is
/// created readable by its owner only (mode 0600 on Unix), since escalations hold the
/// operation's arguments; an existing file open to its group or others is set to 0600
/// before the first line is written, with a warning (refused, nothing written, when its
/// mode cannot be changed). A path that is a symbolic link is refused rather than
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
        #[cfg(unix)]
        Self::owner_only(path, &f)?;
        f.write_all(line).map_err(|err| err.to_string())?;
        f.sync_data().map_err(|err| err.to_string())
    }
}

impl JsonLinesSink {
    /// An existing file that its group or others may read or write is set to 0600 (through
    /// the open handle, so it is the file written to), with a warning naming the old mode,
    /// before anything is written; a file whose mode cannot be changed (another owner's) is
    /// refused and nothing is written.
    #[cfg(unix)]
    fn owner_only(path: &Path, f: &std::fs::File) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let mode = f
            .metadata()
            .map_err(|err| format!("{}: {err}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 == 0 {
            return Ok(());
        }
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|err| {
                format!(
                    "{}: is open to its group or others (mode {:o}) and cannot be made \
                     owner-only ({err}); escalations hold arguments, nothing was written",
                    path.display(),
                    mode & 0o777
                )
            })?;
        tracing::warn!(
            path = %path.display(),
            "the escalation file was open to its group or others (mode {:o}); set to 600",
            mode & 0o777
        );
        Ok(())
    }
}

impl EscalationSink for JsonLinesSink {
    async_trait_fns! {
        fn deliver<'life1>(&self, e: &'life1 Escalation) -> Delivery<'async_trait> {
            Box::pin(async move {
                let mut line = serde_json::to_vec(e).map_err(|err| err.to_string())?;
                line.push(b'\n');
                let (path, lock) = (self.path.clone(), self.lock.clone());
                tokio::task::spawn_blocking(move || JsonLinesSink::append(&path, &lock, &line))
                    .await
                    .map_err(|err| {
                        format!("{}: the write did not finish: {err}", self.path.display())
                    })?
            })
        }
    }
}

/// Calls a function with each escalation: a pager, a ticket queue, a channel to a task.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{escalation::CallbackSink, registry::Registry};
///
/// let sink = CallbackSink(|e: &idem_runtime::escalation::Escalation| {
///     eprintln!("page the on-call: {} ({}): {}", e.tool, e.key, e.reason);
/// });
/// let registry = Registry::builder().escalation_sink(Arc::new(sink)).build()?;
/// # Ok::<(), idem_runtime::registry::BuildError>(())
/// ```
pub struct CallbackSink<F>(pub F);

impl<F> std::fmt::Debug for CallbackSink<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackSink")
    }
}

impl<F> EscalationSink for CallbackSink<F>
where
    F: Fn(&Escalation) + Send + Sync + 'static,
{
    async_trait_fns! {
        fn deliver<'life1>(&self, e: &'life1 Escalation) -> Delivery<'async_trait> {
            Box::pin(async move {
                (self.0)(e);
                Ok(())
            })
        }
    }
}

/// Lets through one notice per key per window and counts the rest, so a model stuck in a
/// loop of refused repeats (same key, changed parameters) pages a person once, not once per
/// turn. Per process: several workers each let one through.
#[derive(Debug)]
pub(crate) struct NoticeGate {
    window: Duration,
    /// Per key: when a notice last went out, and how many were held back since.
    seen: Mutex<HashMap<IdemKey, (Timestamp, u32)>>,
}

/// Keys the gate remembers before it forgets the ones whose window has passed.
const GATE_CAPACITY: usize = 10_000;

impl NoticeGate {
    /// A gate letting one notice per key through every `window`.
    pub(crate) fn new(window: Duration) -> Self {
        NoticeGate {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held back since the last one)` when a notice for `key` should go out now.
    pub(crate) fn admit(&self, key: &IdemKey, now: Timestamp) -> Option<u32> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((last, held)) = seen.get_mut(key) {
            if now < last.plus(self.window) {
                *held = held.saturating_add(1);
                return None;
            }
            let since = *held;
            *last = now;
            *held = 0;
            return Some(since);
        }
        if seen.len() >= GATE_CAPACITY {
            let window = self.window;
            seen.retain(|_, (last, _)| now < last.plus(window));
            if seen.len() >= GATE_CAPACITY {
                // Every remembered key is in its window: forgetting them costs at most one
                // extra notice each, never a lost one.
                seen.clear();
            }
        }
        seen.insert(key.clone(), (now, 0));
        Some(0)
    }
}
