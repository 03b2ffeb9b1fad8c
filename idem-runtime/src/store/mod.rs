//! Claim: the store contract ([`IdemStore`]) and its in-memory backend ([`MemoryStore`]).
//!
//! The contract, every backend alike (the conformance suite checks it):
//! - [`IdemStore::claim`] is atomic: of N concurrent claimers of one key exactly one gets a
//!   token; the others see the existing record (running = *in flight*).
//! - A running claim whose lease has passed becomes **unknown**, never free: its handler may
//!   have committed. Only a dead or stuck worker's lease passes; live ones are renewed.
//! - Settling needs the claim's token; a stale token is refused ([`StoreError::StaleToken`]).
//!   The original token may still settle an *unknown* record it left behind (a late result
//!   is the best evidence there is), but never one that someone has since taken over.
//! - Completed and failed results expire after the retention window, leaving a tombstone
//!   (key, fingerprint, tool, class, times, downstream reference; no arguments, output,
//!   messages or read-backs) that outlives them; unknown, pending and escalated records
//!   never expire. Retention is enforced whether or not anyone reads the record:
//!   [`IdemStore::sweep_expired`] applies it to every record at once, and the durable
//!   stores run it on a cadence of their own (a background task, `sweep_every` on their
//!   builders).
//! - Evidence is bounded: a record keeps the first and last
//!   [`rules::EVIDENCE_KEPT`] attempts and read-backs, and counts what it drops.
//! - A person's (or the reconciler's) release of an unknown, pending or escalated record
//!   ([`IdemStore::release_unsettled`]) frees the key and keeps a trace apart from it
//!   (who, when, why, the record as it was): the last [`rules::RELEASES_KEPT`] releases of a
//!   key, each for the tombstone window, whatever the key holds since
//!   ([`IdemStore::releases`]). The holder of a running claim can settle and release it the
//!   same way in one step ([`IdemStore::release_traced`]).
//! - Listings apply lease expiry first and are ordered by `(created_at, key)`;
//!   [`IdemStore::list_after`] resumes after a [`ListCursor`], so a walk page by page visits
//!   every record of a state once, however many there are.

mod async_trait_fns;
pub mod backend;
mod clock;
#[cfg(feature = "testing")]
pub mod conformance;
mod instrumented;
mod memory;
mod record;
mod transaction;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use async_trait_fns::async_trait_fns;
pub(crate) use backend::rules;
pub(crate) use backend::{ClaimOutcome, ClaimRequest, Settlement};
pub(crate) use clock::{deadline_after, instant_after};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp, TokioClock};
pub use instrumented::Instrumented;
pub(crate) use instrumented::{claim_span, settle_span, unobserved};
pub use memory::{MemoryStore, DEFAULT_CAPACITY};
pub use record::{
    AttemptKind, AttemptRecord, ClaimToken, Operation, OperationDraft, ReadBackRecord, Record,
    RecordState, ReleaseNote, ReleaseRecord,
};
pub use transaction::{HeldClaim, TxError};

use crate::identity::IdemKey;

/// How long settled records are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// How long a completed or failed result is replayed (default 24 h).
    pub results: Duration,
    /// How long the tombstone of an expired result refuses re-execution (default 30 days),
    /// counted like `results` from when the record was settled. Never shorter than
    /// `results`: stores raise a shorter value to it (see [`Retention::normalized`]).
    pub tombstones: Duration,
}

impl Retention {
    /// This retention with `tombstones` raised to at least `results`. A tombstone must
    /// outlive the result it stands for: were it shorter, a repeat arriving between the two
    /// would find no record at all and run a second time. Every store applies this to the
    /// retention it is given.
    pub fn normalized(self) -> Retention {
        Retention {
            results: self.results,
            tombstones: self.tombstones.max(self.results),
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            results: Duration::from_secs(24 * 3600),
            tombstones: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// What one [`IdemStore::sweep_expired`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Swept {
    /// Completed or failed results past [`Retention::results`] turned into tombstones
    /// (their arguments, output, messages and read-backs dropped).
    pub results: u64,
    /// Tombstones past [`Retention::tombstones`] deleted (and, on the stores that count
    /// them here, lapsed release traces).
    pub tombstones: u64,
}

impl Swept {
    /// A count of `results` turned into tombstones and `tombstones` deleted.
    pub fn new(results: u64, tombstones: u64) -> Swept {
        Swept {
            results,
            tombstones,
        }
    }
}

/// A position in a listing: the `(created_at, key)` of the last record seen (of the last
/// release seen, in [`IdemStore::list_releases`], where `created_at` is the release time).
///
/// Listings are ordered by claim time and, among records claimed in the same millisecond,
/// by key, so a cursor names one place in the order even when the record it was taken from
/// has since been settled or deleted: [`IdemStore::list_after`] resumes strictly after it.
/// A cursor is plain data (it serializes), so a walk can outlive the process that began it.
///
/// Ordering a cursor compares `created_at`, then the key, exactly as the stores do.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ListCursor {
    /// When the record was first claimed ([`Record::created_at`]).
    pub created_at: Timestamp,
    /// The record's key: the tiebreak among records claimed in the same millisecond.
    pub key: IdemKey,
}

impl ListCursor {
    /// The position of `record`: a listing resumed from here starts with the next one.
    pub fn of(record: &Record) -> ListCursor {
        ListCursor {
            created_at: record.created_at,
            key: record.key.clone(),
        }
    }

    /// The position of `release` in [`IdemStore::list_releases`]: its time and key (the
    /// `created_at` field holds the release time).
    pub fn of_release(release: &ReleaseRecord) -> ListCursor {
        ListCursor {
            created_at: release.at,
            key: release.record.key.clone(),
        }
    }

    /// Orders two releases as [`IdemStore::list_releases`] does.
    pub fn cmp_releases(a: &ReleaseRecord, b: &ReleaseRecord) -> std::cmp::Ordering {
        (a.at, &a.record.key).cmp(&(b.at, &b.record.key))
    }

    /// True when `release` sorts strictly after this cursor.
    pub(crate) fn precedes_release(&self, release: &ReleaseRecord) -> bool {
        (release.at, &release.record.key) > (self.created_at, &self.key)
    }

    /// Orders two records as listings do, without building cursors.
    pub fn cmp_records(a: &Record, b: &Record) -> std::cmp::Ordering {
        (a.created_at, &a.key).cmp(&(b.created_at, &b.key))
    }

    /// True when `record` sorts strictly after this cursor.
    pub(crate) fn precedes(&self, record: &Record) -> bool {
        (record.created_at, &record.key) > (self.created_at, &self.key)
    }
}

/// Why a store operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The token is not the current claim's: someone took over, or the claim was settled.
    StaleToken {
        /// The key.
        key: IdemKey,
        /// The record's current state (`"absent"` when there is none).
        state: String,
    },
    /// No record for the key.
    NotFound(IdemKey),
    /// The backend could not be reached or did not answer.
    Unavailable(String),
    /// A stored record could not be read (corrupted or foreign data).
    Corrupt {
        /// The key (or the raw stored key when it did not parse).
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The store holds as many records as it may ([`MemoryStore::capacity`]) and none of
    /// them may be dropped: the claim was refused, nothing ran.
    Full(String),
    /// Any other backend error.
    Backend(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::StaleToken { key, state } => write!(
                f,
                "stale claim token for {key}: the record has moved on (now {state})"
            ),
            StoreError::NotFound(key) => write!(f, "no record for {key}"),
            StoreError::Unavailable(e) => write!(f, "store unavailable: {e}"),
            StoreError::Corrupt { key, detail } => write!(f, "corrupt record for {key}: {detail}"),
            StoreError::Full(e) => write!(f, "store full: {e}"),
            StoreError::Backend(e) => write!(f, "store error: {e}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Whether a store's records outlive the process that wrote them ([`IdemStore::durability`]).
///
/// A repeat is replayed only while its record is kept: a store of [`Durability::Process`]
/// forgets every claim and saved result when the process ends, so a call re-sent to a
/// restarted server runs again. Hosts read this before promising more (idem's MCP server
/// advertises `idempotentHint` only over a [`Durability::Durable`] store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// Records live in this process's memory and end with it.
    Process,
    /// Records live outside the process (a file, a database, a server) and survive it.
    Durable,
}

/// The future an [`IdemStore`] operation returns: boxed, `Send`, borrowing the store and the
/// operation's arguments for `'a`.
///
/// The type `#[async_trait]` gives an `async fn`, so a store may implement the trait with
/// `#[async_trait::async_trait]` on its `impl` block and `async fn`s, or write the
/// signatures out and return `Box::pin(async move { … })`.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The store contract. One atomic claim, a fenced settle, and listing for the reconciler.
///
/// Implementations must pass the conformance suite (`idem_runtime::store::conformance`, with
/// the `testing` feature).
///
/// Each operation returns a [`StoreFuture`]. The signatures are those `#[async_trait]`
/// generates, written out (the trait is used as `dyn IdemStore`): implement it with
/// `#[async_trait::async_trait] impl IdemStore for MyStore { async fn claim(…) … }`, or
/// with the signatures as they stand here.
pub trait IdemStore: Send + Sync + fmt::Debug + 'static {
    async_trait_fns! {
        /// Atomically claims `req.key`, or reports the record that holds it. A running record
        /// whose lease has passed is turned into *unknown* first (and reported as such).
        fn claim<'life1>(
            &self,
            req: &'life1 ClaimRequest,
        ) -> StoreFuture<'async_trait, ClaimOutcome>;

        /// Extends a running claim's lease to now + `lease`.
        fn renew<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ()>;

        /// Settles the claim held by `token` (see the module docs for the late-result rule).
        fn settle<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
        ) -> StoreFuture<'async_trait, ()>;

        /// Frees the key: the claim held by `token` was rejected before execution.
        fn release<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
        ) -> StoreFuture<'async_trait, ()>;

        /// Takes over a pending, unknown or escalated record whose current token is `expected`,
        /// turning it back into a running claim with a fresh token (for the reconciler, or a
        /// person resolving an escalation). The old token is fenced off.
        fn reclaim<'life1>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ClaimToken>;

        /// Frees an unknown, pending or escalated record whose current token is `expected`, in
        /// one atomic step, and keeps a trace of it: a [`ReleaseRecord`] with `note`, the time
        /// and the record as it stood. For a person (or the reconciler) who established that the
        /// effect never happened: the key is free, and the next claim of it wins and runs.
        ///
        /// The trace is kept apart from the key's record, so it outlives the record and the key
        /// being claimed again ([`IdemStore::releases`]); a key keeps its last
        /// [`rules::RELEASES_KEPT`] releases, each for the tombstone window. A stale `expected`
        /// (the record was taken over or settled since it was read) is
        /// [`StoreError::StaleToken`] and frees nothing; no record is [`StoreError::NotFound`].
        ///
        /// The conformance suite checks the trace.
        fn release_unsettled<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()>;

        /// The holder of a running claim gives it up and leaves a trace, in one atomic step: the
        /// record is settled with `settlement` (its evidence: attempts, message), then freed as
        /// [`IdemStore::release_unsettled`] frees it, keeping a [`ReleaseRecord`] with `note`.
        ///
        /// For an operation whose every attempt was refused as "unavailable, not executed": the
        /// key must be free for the intent to run again later, yet a copy of a request that
        /// reached the downstream another way may still land, so the attempts are kept where the
        /// reconciler looks for such copies. Done in one step, no one sees the record in between:
        /// a duplicate waiting on the claim is woken to a free key (and may run), never to an
        /// *unknown* record that is about to vanish.
        ///
        /// `settlement.state` must be unknown, pending or escalated (a terminal result is saved,
        /// not released; [`StoreError::Backend`] otherwise, nothing changed). `token` must hold
        /// the record: running, or *unknown* after its lease passed (as for
        /// [`IdemStore::settle`]); otherwise (no record included) [`StoreError::StaleToken`] and
        /// nothing changes.
        ///
        /// The conformance suite checks that a waiter never sees the record in between.
        fn release_traced<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()>;

        /// The releases of `key` still kept ([`IdemStore::release_unsettled`]), oldest first,
        /// whatever the key's record is now (absent, or a new claim).
        fn releases<'life1>(
            &self,
            key: &'life1 IdemKey,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>>;

        /// Up to `limit` of the releases still kept, every key's, that sort strictly after
        /// `after` in `(at, key)` order ([`ListCursor::of_release`]), in that order; from the
        /// oldest when `after` is `None`. What an operator reviews: every key a person or the
        /// reconciler freed in the tombstone window.
        ///
        /// Paging with the cursor of the last release of each page visits every kept release
        /// once (two releases of one key in the same millisecond share a cursor: a page that
        /// ends on the first skips the second).
        fn list_releases<'life1>(
            &self,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>>;

        /// Applies retention to every record now, without anyone reading them: completed and
        /// failed results past [`Retention::results`] become tombstones (arguments, output,
        /// messages and read-backs dropped from the stored record), tombstones past
        /// [`Retention::tombstones`] are deleted. Unknown, pending and escalated records are
        /// never touched; a store may also turn expired running claims into *unknown* on the
        /// way (what a listing does).
        ///
        /// The durable stores call this from a background task of their own (see their
        /// builders' `sweep_every`); a host may call it too (a cron, a reconciler pass). The
        /// default does nothing: a store that applies retention only when it reads a record
        /// (a custom one) reports nothing swept. The conformance suite checks that a sweep
        /// leaves nothing of an expired result in the stored record.
        fn sweep_expired(&self) -> StoreFuture<'async_trait, Swept> {
            Box::pin(async move { Ok(Swept::default()) })
        }

        /// The record of `key`, if any (lease expiry and retention applied).
        fn get<'life1>(&self, key: &'life1 IdemKey) -> StoreFuture<'async_trait, Option<Record>>;

        /// Up to `limit` records in `state`, oldest first (lease expiry applied first, so expired
        /// running claims are listed as unknown).
        ///
        /// The first page of [`IdemStore::list_after`]; to see past it, page with that.
        fn list(&self, state: RecordState, limit: usize) -> StoreFuture<'async_trait, Vec<Record>>;

        /// Up to `limit` records in `state` that sort strictly after `after` in
        /// [`ListCursor`] order (`created_at`, then key), in that order; from the oldest when
        /// `after` is `None`. Lease expiry is applied first, as in [`IdemStore::list`].
        ///
        /// Paging with the cursor of the last record of each page visits every record that stays
        /// in `state` exactly once, however many share a `created_at`, and a record that leaves
        /// the state between pages is not listed in its old state. A record that enters the
        /// state during a walk is listed if it sorts after the cursor (a new claim normally does;
        /// one behind a skewed clock may not, and the next walk from the start finds it). This
        /// is what lets the reconciler get past records that stay unsettled for days instead of
        /// listing the same oldest ones on every pass.
        ///
        /// The default lists the whole state with [`IdemStore::list`] and skips to the cursor:
        /// correct, but each page costs as much as listing everything. Backends override it with
        /// an indexed keyset query.
        fn list_after<'life1>(
            &self,
            state: RecordState,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<Record>> {
            Box::pin(async move {
                let Some(after) = after else {
                    return self.list(state, limit).await;
                };
                if limit == 0 {
                    return Ok(Vec::new());
                }
                let mut records = self.list(state, usize::MAX).await?;
                records.retain(|r| after.precedes(r));
                // `list` promises this order already; sorting again keeps the default correct for a
                // backend whose `list` orders by `created_at` alone.
                records.sort_by(ListCursor::cmp_records);
                records.truncate(limit);
                Ok(records)
            })
        }
    }

    /// The clock this store ages records by (leases, retention). A registry built over the
    /// store stamps attempts and measures retry windows by the same clock, so a store given
    /// a test clock needs no second one. The default is the system clock; a store that
    /// takes a clock must return it.
    fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SystemClock)
    }

    /// A short, fixed name for this kind of store (`memory`, `sqlite`, `redis`, `postgres`),
    /// recorded in spans and as the `backend` label of store metrics ([`crate::observe`]).
    /// It must be a constant per type, never derived from data (a URL, a prefix): label
    /// values must stay few. The default is `custom`.
    fn backend_name(&self) -> &'static str {
        "custom"
    }

    /// Whether this store's records outlive the process. The default is
    /// [`Durability::Process`], the claim that never over-promises; a store whose records
    /// survive a restart returns [`Durability::Durable`], and a store that wraps another
    /// returns the inner one's.
    fn durability(&self) -> Durability {
        Durability::Process
    }

    async_trait_fns! {
        /// Waits up to `timeout` for `key`'s record to leave `Running`; returns it as last seen.
        ///
        /// The default polls [`IdemStore::get`] with backoff; backends that can push a
        /// notification should override it.
        fn wait_settled<'life1>(
            &self,
            key: &'life1 IdemKey,
            timeout: Duration,
        ) -> StoreFuture<'async_trait, Option<Record>> {
            Box::pin(async move {
                let deadline = deadline_after(timeout);
                let mut pause = Duration::from_millis(2);
                loop {
                    let record = self.get(key).await?;
                    match &record {
                        Some(r) if r.state == RecordState::Running => {}
                        _ => return Ok(record),
                    }
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Ok(record);
                    }
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            })
        }
    }
}

impl<S: IdemStore + ?Sized> IdemStore for Arc<S> {
    fn clock(&self) -> Arc<dyn Clock> {
        (**self).clock()
    }
    fn backend_name(&self) -> &'static str {
        (**self).backend_name()
    }
    fn durability(&self) -> Durability {
        (**self).durability()
    }
    async_trait_fns! {
        forward to (**self);
        fn claim<'life1>(
            &self,
            req: &'life1 ClaimRequest,
        ) -> StoreFuture<'async_trait, ClaimOutcome>;
        fn renew<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ()>;
        fn settle<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
        ) -> StoreFuture<'async_trait, ()>;
        fn release<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
        ) -> StoreFuture<'async_trait, ()>;
        fn reclaim<'life1>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ClaimToken>;
        fn release_unsettled<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()>;
        fn release_traced<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()>;
        fn releases<'life1>(
            &self,
            key: &'life1 IdemKey,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>>;
        fn list_releases<'life1>(
            &self,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>>;
        fn sweep_expired(&self) -> StoreFuture<'async_trait, Swept>;
        fn get<'life1>(&self, key: &'life1 IdemKey) -> StoreFuture<'async_trait, Option<Record>>;
        fn list(&self, state: RecordState, limit: usize) -> StoreFuture<'async_trait, Vec<Record>>;
        fn list_after<'life1>(
            &self,
            state: RecordState,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<Record>>;
        fn wait_settled<'life1>(
            &self,
            key: &'life1 IdemKey,
            timeout: Duration,
        ) -> StoreFuture<'async_trait, Option<Record>>;
    }
}
