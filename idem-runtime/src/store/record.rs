//! What a store keeps per key.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use super::Timestamp;
use crate::identity::{CanonicalJson, Fingerprint, IdemKey, Scope};
use crate::outcome::OutcomeClass;

/// The state of a record: the outcome classes that leave a record (every one but
/// *rejected*, which frees the key), plus `Running` for a live claim.
///
/// Deliberately not `#[non_exhaustive]`: every store matches on it, and a new state is a
/// store-format change that each backend must handle, not something to wildcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// Claimed; a handler is (or was) running under a lease.
    Running,
    /// Terminal success; the result is replayed to repeats.
    Completed,
    /// Terminal failure after execution; replayed to repeats.
    Failed,
    /// Recorded downstream, not terminal; a reconciler polls it.
    Pending,
    /// Nobody knows whether the effect happened. Never expires, never frees the key.
    Unknown,
    /// A person must decide.
    Escalated,
}

impl RecordState {
    /// All states, for listings.
    pub const ALL: [RecordState; 6] = [
        RecordState::Running,
        RecordState::Completed,
        RecordState::Failed,
        RecordState::Pending,
        RecordState::Unknown,
        RecordState::Escalated,
    ];

    /// The name used in storage, logs and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::Running => "running",
            RecordState::Completed => "completed",
            RecordState::Failed => "failed",
            RecordState::Pending => "pending",
            RecordState::Unknown => "unknown",
            RecordState::Escalated => "escalated",
        }
    }

    /// Parses [`RecordState::as_str`]'s names.
    pub fn parse(s: &str) -> Option<RecordState> {
        RecordState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Completed and failed are terminal: their results expire after the retention window
    /// (a tombstone stays). Everything else waits for someone to settle it.
    pub fn is_terminal(self) -> bool {
        matches!(self, RecordState::Completed | RecordState::Failed)
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fences writers: each claim (and each takeover) gets a fresh token, and only the holder of
/// the current token may settle. A worker whose lease expired cannot overwrite a newer
/// decision.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ClaimToken(pub u128);

impl ClaimToken {
    /// A token unique with overwhelming probability across processes and machines: a
    /// 64-bit prefix for each process, keyed by the operating system's random source, and a
    /// per-process counter (never repeated; not in claim order across threads).
    ///
    /// The prefix is drawn again in a forked child: it starts with a copy of its parent's
    /// memory, prefix and counter included, and would otherwise mint the very tokens its
    /// parent mints next.
    pub fn fresh() -> ClaimToken {
        static SEED: AtomicU64 = AtomicU64::new(0);
        static SEEDED_IN: AtomicU64 = AtomicU64::new(u64::MAX);
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        let process = fork::this_process();
        if SEEDED_IN.load(Ordering::Acquire) != process {
            // Threads racing here each draw a random prefix; whichever is stored last wins,
            // and tokens minted under the others are just as unique.
            SEED.store(process_seed(process), Ordering::Release);
            SEEDED_IN.store(process, Ordering::Release);
        }
        let seed = SEED.load(Ordering::Acquire);
        // Each thread takes counter values in blocks, so concurrent claims on different
        // threads do not bounce one cache line between cores on every claim.
        const BLOCK: u64 = 1024;
        thread_local! {
            static RANGE: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        let n = RANGE.with(|range| {
            let (mut next, mut end) = range.get();
            if next == end {
                next = COUNTER.fetch_add(BLOCK, Ordering::Relaxed);
                end = next + BLOCK;
            }
            range.set((next + 1, end));
            next
        });
        ClaimToken((u128::from(seed) << 64) | u128::from(n))
    }

    /// 32 hex digits.
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses [`ClaimToken::to_hex`].
    pub fn from_hex(s: &str) -> Option<ClaimToken> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(ClaimToken)
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClaimToken({})", self.to_hex())
    }
}

/// Telling a forked child from its parent without asking the kernel on every claim
/// (`getpid` is a system call since glibc 2.25: ~0.1 µs, a tenth of a whole fresh write).
#[cfg(unix)]
mod fork {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// Forks since the handler below was registered, as this process counts them: a child
    /// inherits the parent's count and the handler bumps its own copy.
    static FORKS: AtomicU64 = AtomicU64::new(0);

    /// Runs in the child, right after `fork`: one atomic add, async-signal-safe.
    extern "C" fn forked() {
        FORKS.fetch_add(1, Ordering::AcqRel);
    }

    /// A number that differs between a process and any child forked from it (after this
    /// was first called): the fork count, or the process id if the handler could not be
    /// registered.
    pub(super) fn this_process() -> u64 {
        static WATCHED: OnceLock<bool> = OnceLock::new();
        let watched = *WATCHED.get_or_init(|| {
            #[allow(unsafe_code)]
            // SAFETY: `pthread_atfork` only records the handler; `forked` is a plain
            // `extern "C" fn()` that lives as long as the program and does one atomic add,
            // which is allowed in a child between `fork` and `exec`. Registered once per
            // process (a child inherits it, and the `OnceLock` says so).
            let registered = unsafe { libc::pthread_atfork(None, None, Some(forked)) };
            registered == 0
        });
        if watched {
            FORKS.load(Ordering::Acquire)
        } else {
            // Counts and process ids never meet: this process stays on one of the two.
            u64::from(std::process::id()) | 1 << 63
        }
    }
}

/// No `fork` here: one process, one prefix.
#[cfg(not(unix))]
mod fork {
    pub(super) fn this_process() -> u64 {
        0
    }
}

/// 64 bits no other process draws: the standard library's randomly keyed hasher (its keys
/// come from the operating system's random source, drawn once per thread) over the process
/// id, its fork count and the time. A forked child starts with its parent's keys but not its
/// process id, so the two still draw different prefixes.
fn process_seed(process: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(process);
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    hasher.finish()
}

/// How an attempt ended, as the executor saw it. Decisions are taken on this, never on the
/// wording of [`AttemptRecord::message`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptKind {
    /// The handler returned; the attempt's class is its result's.
    Returned,
    /// The handler hit its timeout. It may still be running, and report a late result.
    TimedOut,
    /// The handler panicked: it may have done anything before that.
    Panicked,
    /// The late result (or late panic) of an attempt that had timed out.
    Late,
    /// A timed-out handler still running when its in-flight bound passed, dropped.
    Abandoned,
}

impl AttemptKind {
    /// The kind of an attempt recorded before kinds were kept (record format 1), read off
    /// the executor's wording of that version.
    fn of_legacy(message: Option<&str>) -> AttemptKind {
        let m = message.unwrap_or_default();
        if m.starts_with("timed out after") {
            AttemptKind::TimedOut
        } else if m.starts_with("handler panicked") {
            AttemptKind::Panicked
        } else if m.starts_with("late result after timeout") {
            AttemptKind::Late
        } else {
            AttemptKind::Returned
        }
    }
}

/// Evidence of one attempt: when it ran, how it ended and what was observed.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "AttemptRecordRepr")]
#[non_exhaustive]
pub struct AttemptRecord {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// When the handler was started.
    pub started_at: Timestamp,
    /// When the attempt ended (or was given up on).
    pub finished_at: Timestamp,
    /// How it ended.
    pub kind: AttemptKind,
    /// What the attempt ended as.
    pub class: OutcomeClass,
    /// What was observed (error text, "timed out after 30s", "handler panicked: …"), for a
    /// person to read.
    pub message: Option<String>,
}

impl AttemptRecord {
    /// Evidence of attempt number `attempt`, run from `started_at` to `finished_at`.
    pub fn new(
        attempt: u32,
        started_at: Timestamp,
        finished_at: Timestamp,
        kind: AttemptKind,
        class: OutcomeClass,
        message: Option<String>,
    ) -> Self {
        AttemptRecord {
            attempt,
            started_at,
            finished_at,
            kind,
            class,
            message,
        }
    }
}

/// An attempt as stored: records written before `kind` existed lack it, and get it from
/// their message (see [`AttemptKind::of_legacy`]), so old records read the same as new.
#[derive(serde::Deserialize)]
struct AttemptRecordRepr {
    attempt: u32,
    started_at: Timestamp,
    finished_at: Timestamp,
    #[serde(default)]
    kind: Option<AttemptKind>,
    class: OutcomeClass,
    message: Option<String>,
}

impl From<AttemptRecordRepr> for AttemptRecord {
    fn from(r: AttemptRecordRepr) -> Self {
        let kind = r
            .kind
            .unwrap_or_else(|| AttemptKind::of_legacy(r.message.as_deref()));
        AttemptRecord::new(
            r.attempt,
            r.started_at,
            r.finished_at,
            kind,
            r.class,
            r.message,
        )
    }
}

/// What was asked for: enough to retry the operation with the same key, to look it up
/// downstream, or to show a person what the intent was.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Operation {
    /// The scope the key was derived in.
    pub scope: Scope,
    /// The explicit intent id, when the caller gave one.
    pub intent: Option<String>,
    /// The typed arguments, re-serialized, as canonical JSON: exactly the bytes the
    /// fingerprint was taken of. Shared, not copied, between the claim, the store's record
    /// and what a claim reports back; derefs to the parsed [`Value`].
    pub args: CanonicalJson,
}

/// What a claim saves of its operation, held until the claim is won: the store makes the
/// [`Operation`] it keeps with [`OperationDraft::to_operation`], only when it creates a
/// record. A repeat, which finds the key already claimed, builds nothing.
///
/// Serializes exactly as the [`Operation`] it stands for.
#[derive(Clone, Debug)]
pub struct OperationDraft {
    scope: Scope,
    intent: Option<String>,
    args: DraftArgs,
}

#[derive(Clone, Debug)]
enum DraftArgs {
    /// Arguments already shared: the operation clones the handle.
    Shared(CanonicalJson),
    /// Bytes of this crate's canonical writers, as the call's identity was taken of them:
    /// the operation copies them, so a repeat never allocates for them.
    Canonical(Vec<u8>),
}

impl OperationDraft {
    /// The draft of an operation asked for in `scope`, with the caller's intent id (if
    /// any) and the canonical arguments.
    pub fn new(scope: Scope, intent: Option<String>, args: CanonicalJson) -> Self {
        OperationDraft {
            scope,
            intent,
            args: DraftArgs::Shared(args),
        }
    }

    /// A draft over the bytes a call's identity was taken of (written by this crate's
    /// canonical writers).
    pub(crate) fn from_canonical_bytes(
        scope: Scope,
        intent: Option<String>,
        canonical: Vec<u8>,
    ) -> Self {
        OperationDraft {
            scope,
            intent,
            args: DraftArgs::Canonical(canonical),
        }
    }

    /// The scope the key was derived in.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The explicit intent id, when the caller gave one.
    pub fn intent(&self) -> Option<&str> {
        self.intent.as_deref()
    }

    /// The operation a store saves with the record a won claim creates.
    pub fn to_operation(&self) -> Operation {
        let args = match &self.args {
            DraftArgs::Shared(args) => args.clone(),
            DraftArgs::Canonical(bytes) => CanonicalJson::from_canonical_bytes(bytes.clone()),
        };
        Operation {
            scope: self.scope.clone(),
            intent: self.intent.clone(),
            args,
        }
    }
}

impl From<Operation> for OperationDraft {
    fn from(op: Operation) -> Self {
        OperationDraft::new(op.scope, op.intent, op.args)
    }
}

impl From<&Operation> for OperationDraft {
    fn from(op: &Operation) -> Self {
        OperationDraft::from(op.clone())
    }
}

impl PartialEq<Operation> for OperationDraft {
    fn eq(&self, other: &Operation) -> bool {
        self.to_operation() == *other
    }
}

impl serde::Serialize for OperationDraft {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_operation().serialize(s)
    }
}

/// A reconciler's look at the downstream: when, and what it found.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReadBackRecord {
    /// When the read-back ran.
    pub at: Timestamp,
    /// What it found (`found completed ch_123`, `not found`, `error: …`).
    pub result: String,
}

/// One key's record.
///
/// Deliberately not `#[non_exhaustive]`: a store outside this crate builds records from its
/// own rows, so it needs every field. A new field is a record-format change, made
/// deliberately (with `#[serde(default)]` so records written before it still read).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The operation's key.
    pub key: IdemKey,
    /// Fingerprint of the arguments it was claimed with.
    pub fingerprint: Fingerprint,
    /// The tool's name (shared with the claim that made the record).
    pub tool: Arc<str>,
    /// Current state.
    pub state: RecordState,
    /// Token of the current claim (the only one that may settle).
    pub token: ClaimToken,
    /// End of the lease of a running claim; on a record its lapse turned *unknown*, when
    /// that lease ran out (the holder may have sent until then: the reconciler counts a
    /// send that can still land from it). `None` once settled.
    pub lease_until: Option<Timestamp>,
    /// When the key was first claimed.
    pub created_at: Timestamp,
    /// When the record last changed.
    pub updated_at: Timestamp,
    /// The saved result: the output of a completed call, the detail of a pending one.
    pub payload: Option<Value>,
    /// The failure, unknown or escalation reason.
    pub message: Option<String>,
    /// The downstream's id for the effect, when known.
    pub downstream_ref: Option<String>,
    /// Set once a terminal record's result has passed the retention window: only the
    /// tombstone is left (key, fingerprint, tool, class, times, downstream reference, and
    /// the attempts without their messages); payload, message, operation and read-backs are
    /// dropped (see [`rules::expire_result`](super::rules::expire_result)).
    pub result_expired: bool,
    /// The attempts, in order: the first and last
    /// [`EVIDENCE_KEPT`](super::rules::EVIDENCE_KEPT) when there were more (a marker
    /// read-back counts the dropped ones).
    pub attempts: Vec<AttemptRecord>,
    /// What was asked for (absent only in records written without it).
    #[serde(default)]
    pub operation: Option<Operation>,
    /// The read-backs of the downstream, in order: the first and last
    /// [`EVIDENCE_KEPT`](super::rules::EVIDENCE_KEPT) when there were more, with one marker
    /// read-back ([`EVIDENCE_MARKER`](super::rules::EVIDENCE_MARKER)) where the dropped ones
    /// were.
    #[serde(default)]
    pub read_backs: Vec<ReadBackRecord>,
}

/// What the holder of a claim reports when it settles. Built with [`Settlement::new`] and
/// the setters; stores read its fields.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Settlement {
    /// The new state (anything but `Running`).
    pub state: RecordState,
    /// Output (completed) or detail (pending).
    pub payload: Option<Value>,
    /// Reason (failed, unknown, escalated).
    pub message: Option<String>,
    /// The downstream's id for the effect.
    pub downstream_ref: Option<String>,
    /// Attempts to append to the record's evidence.
    pub attempts: Vec<AttemptRecord>,
    /// Read-backs to append to the record's evidence.
    pub read_backs: Vec<ReadBackRecord>,
}

impl Settlement {
    /// A settlement to `state` with nothing else filled in.
    pub fn new(state: RecordState) -> Self {
        Settlement {
            state,
            payload: None,
            message: None,
            downstream_ref: None,
            attempts: Vec::new(),
            read_backs: Vec::new(),
        }
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }

    /// Sets the message.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets the downstream reference.
    pub fn downstream_ref(mut self, r: impl Into<String>) -> Self {
        self.downstream_ref = Some(r.into());
        self
    }

    /// Sets the read-backs to append.
    pub fn read_backs(mut self, read_backs: Vec<ReadBackRecord>) -> Self {
        self.read_backs = read_backs;
        self
    }

    /// Sets the attempts to append.
    pub fn attempts(mut self, attempts: Vec<AttemptRecord>) -> Self {
        self.attempts = attempts;
        self
    }
}

/// Who frees an unsettled record, and why: what [`IdemStore::release_unsettled`] keeps of
/// the decision.
///
/// [`IdemStore::release_unsettled`]: super::IdemStore::release_unsettled
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseNote {
    /// Who released it: an operator's name, or `idem reconciler`.
    pub by: String,
    /// Why: the operator's note, or the reconciler's reason.
    pub note: String,
}

impl ReleaseNote {
    /// Who [`ReleaseRecord::by`] names when the executor frees a key because every attempt
    /// was refused "unavailable, not executed": the releases the reconciler watches for a
    /// copy of the request that ran anyway.
    pub const EXECUTOR: &'static str = "idem executor";

    /// A release by `by`, for the reason `note`.
    pub fn new(by: impl Into<String>, note: impl Into<String>) -> Self {
        ReleaseNote {
            by: by.into(),
            note: note.into(),
        }
    }
    /// What [`ReleaseRecord::note`] starts with for a release forced inside the in-flight
    /// bound ([`ReleaseNote::forced`]).
    pub const FORCED: &'static str = "forced inside the in-flight bound";

    /// A release by `by` forced while a send of the record may still land (until `until`),
    /// because `reason`; `note` is the operator's note. The trace's note reads
    /// `forced inside the in-flight bound (a send may land until UNTIL): REASON; note: NOTE`.
    pub fn forced(by: impl Into<String>, note: &str, reason: &str, until: Timestamp) -> Self {
        let mut text = format!("{} (a send may land until {until}): {reason}", Self::FORCED);
        if !note.is_empty() {
            text.push_str("; note: ");
            text.push_str(note);
        }
        ReleaseNote {
            by: by.into(),
            note: text,
        }
    }

    /// Whether a release trace's note says it was forced inside the in-flight bound.
    pub fn is_forced(note: &str) -> bool {
        note.starts_with(Self::FORCED)
    }
}

/// The trace a release leaves in the store: a key whose record was unknown, pending or
/// escalated was freed (the intent may run again), by whom, when, why, and the record as
/// it stood just before, with all its evidence.
///
/// Kept per key, separately from the key's record, so it survives the key being claimed
/// again: the last [`RELEASES_KEPT`](super::rules::RELEASES_KEPT) releases of a key, each
/// for the tombstone window ([`Retention::tombstones`](super::Retention::tombstones)) from
/// its release. Read them with [`IdemStore::releases`](super::IdemStore::releases).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReleaseRecord {
    /// When the key was released.
    pub at: Timestamp,
    /// Who released it ([`ReleaseNote::by`]).
    pub by: String,
    /// Why ([`ReleaseNote::note`]).
    pub note: String,
    /// The record as it stood when it was released: its state (unknown, pending or
    /// escalated), message, operation, attempts, read-backs and downstream reference.
    pub record: Record,
}
