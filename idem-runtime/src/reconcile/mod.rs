//! Reconcile and escalate: settle what is unsettled, and hand the rest to a person.
//!
//! The model never reconciles: it is told "unknown, not sent again" and moves on. The
//! [`Reconciler`] (a background task, or [`Reconciler::run_once`] from a cron or the CLI)
//! takes each *unknown* and *pending* record and decides, recording every decision with its
//! evidence. The first row that matches decides; the rows after *read back* need the tool's
//! read-back, run once per record per pass (a tool without one answers "unsupported"):
//!
//! | record | tool declares / read-back finds | decision |
//! |---|---|---|
//! | any | tool not registered here as a write tool | skip: another reconciler's to decide |
//! | any | no operation saved, or the saved arguments no longer decode | escalate |
//! | unknown | keyed downstream, inside the safe window and the [`Reconciler::patience`], fewer than [`Reconciler::max_retries`] + 1 sends made (no count by default), the next retry due (growing backoff) | retry with the **same** key |
//! | unknown | the last timed-out attempt ended less than the in-flight bound ago | wait: it may still report its late result |
//! | | *read back* | |
//! | unknown | keyed, inside the patience, the next retry not due: not found, partial, failing or no read-back | wait (noted) for the next retry; never release |
//! | unknown | keyed, inside the window, its patience (or count) used up: no read-back, or the read-back fails or finds nothing | escalate (with the read-back), `patience_exhausted`: the downstream keeps answering unknown |
//! | unknown, pending | no read-back | escalate: no key contract (or window passed) and no read-back |
//! | unknown, pending | the read-back fails, the [`Reconciler::max_failed_read_backs`]th time in a row (default 10) | escalate, with the failures |
//! | unknown, pending | the read-back fails | wait, the error noted |
//! | unknown | found completed, failed or pending | settle as found |
//! | pending | found completed or failed | settle as found |
//! | pending | found pending | wait: polled again next pass (noted only after failures, to end their run) |
//! | any | found more than one effect | escalate |
//! | unknown, pending | found part of a batch done ([`ReadBack::Partial`]) | escalate, `partial_effects`, with what landed |
//! | pending | not found | escalate: its downstream ref is gone |
//! | unknown | not found, before last send + timeout + 2 × in-flight bound | wait, the read-back noted |
//! | unknown | not found, after that, the bound declared (tool or registry) | release: the intent may run again |
//! | unknown | not found, after that, only the built-in default bound | escalate |
//!
//! Every escalation carries a [`ReasonKind`] beside its text, and the escalated record
//! keeps it ([`EscalationDetail`]).
//!
//! The *in-flight bound* is the tool's effective one
//! ([`ToolSpec::effective_in_flight_bound`](crate::tool::ToolSpec::effective_in_flight_bound)): the
//! declared `in_flight`, else the registry's
//! [`default_in_flight_bound`](crate::registry::RegistryBuilder::default_in_flight_bound), else
//! [`default_in_flight_bound`](crate::tool::default_in_flight_bound) of the timeout (4 × the
//! timeout, between 2 and 30 minutes). The executor drops a timed-out handler at the same
//! bound, so "may still report" and "can no longer commit" mean the same time in both.
//!
//! The decision itself is a pure function of the record, what the tool declares, the time
//! and the read-back's answer (`plan.rs`, where a unit test walks every row of this table);
//! [`Reconciler`] only carries it out. "Noted" appends the read-back to the record's
//! evidence, which the store caps (the first and last
//! [`EVIDENCE_KEPT`](crate::store::rules::EVIDENCE_KEPT) read-backs); failures are counted
//! in a row from that evidence, so the count survives restarts and is shared by every
//! reconciler on the store.
//!
//! A pass looks at a bounded batch per state and the next pass resumes after it
//! ([`crate::store::IdemStore::list_after`]), so records that stay unknown or pending for
//! long cannot keep newer ones from ever being looked at.
//!
//! Each pass also reads back the operations whose keys the executor freed after every
//! attempt was refused "unavailable, not executed" (a copy of the request may have reached
//! the downstream another way and run): see [`Reconciler::watch_released_for`], and
//! `released.rs` for its decision table.

mod observe;
mod plan;
mod released;
mod resolve;

pub use resolve::{releasable_at, resolve, resolve_as, resolve_in, Resolution, ResolveError};

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::escalation::{Escalation, EscalationDetail, EscalationSink, ReasonKind};
use crate::executor::{restore, ClaimedRun, Restored};
use crate::identity::{ArgsIdentity, IdemKey};
use crate::outcome::OutcomeClass;
use crate::registry::Registry;
use crate::store::{
    ClaimToken, IdemStore, ListCursor, ReadBackRecord, Record, RecordState, ReleaseRecord,
    Settlement, StoreError, Timestamp,
};
use crate::tool::{DynTool, ToolKind};
use crate::tool::{ReadBack, ReadBackCtx};
use plan::{evidence_of, plan, Facts, Limits, Plan};
use released::{watch, Watch};

/// What one reconciliation pass decided, per record.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Decision {
    /// The record's key.
    pub key: crate::identity::IdemKey,
    /// The tool.
    pub tool: String,
    /// The state before.
    pub from: RecordState,
    /// What was done.
    pub action: Action,
    /// Why, in words.
    pub detail: String,
    /// Why, as a kind a program counts: set when the record was escalated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_kind: Option<ReasonKind>,
}

impl Decision {
    fn on(record: &Record, action: Action, detail: impl Into<String>) -> Decision {
        Decision {
            key: record.key.clone(),
            tool: record.tool.to_string(),
            from: record.state,
            action,
            detail: detail.into(),
            reason_kind: None,
        }
    }

    fn escalated(record: &Record, detail: impl Into<String>, kind: ReasonKind) -> Decision {
        Decision {
            reason_kind: Some(kind),
            ..Decision::on(record, Action::Escalated, detail)
        }
    }
}

/// What the reconciler did with one record.
///
/// ```
/// use idem_runtime::{reconcile::{Action, Reconciler}, registry::Registry};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let registry = Registry::builder().build()?;
/// let decisions = Reconciler::new(&registry).run_all().await?;
/// let escalated = decisions.iter().filter(|d| d.action == Action::Escalated).count();
/// assert_eq!(escalated, 0); // nothing unsettled in an empty store
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// Retried with the same key; the record now holds the retry's outcome.
    Retried,
    /// A read-back settled the record.
    Settled,
    /// A read-back proved the effect never happened; the key was freed.
    Released,
    /// Nothing decided yet (still in flight, still pending, read-back failed); looked again later.
    Waiting,
    /// Handed to a person.
    Escalated,
    /// Not this reconciler's to decide (tool not registered here).
    Skipped,
}

/// Settles unknown and pending records; escalates what it cannot settle.
///
/// Each pass looks at up to [`Reconciler::batch`] records per state, resuming where the
/// previous pass of this reconciler stopped and starting over from the oldest once it has
/// been through them all: records that stay unsettled for days (a pending transfer polled
/// until it clears) cannot hide newer ones behind them. A clone continues from where the
/// original was, then keeps its own place.
#[derive(Clone, Debug)]
pub struct Reconciler {
    registry: Registry,
    sink: Arc<dyn EscalationSink>,
    max_retries: u32,
    patience: Duration,
    max_failed_read_backs: u32,
    batch: usize,
    walk: Walk,
    watch_released_for: Duration,
    watched: Watched,
}

/// Default of [`Reconciler::patience`]: 15 minutes.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(15 * 60);

pub use plan::{RETRY_BACKOFF_FIRST, RETRY_BACKOFF_MAX};

/// Default of [`Reconciler::watch_released_for`]: a day.
pub const DEFAULT_WATCH_RELEASED_FOR: Duration = Duration::from_secs(24 * 3600);

/// Who the store's release trace names when the reconciler frees a key
/// ([`crate::store::ReleaseRecord::by`]).
pub const RECONCILER: &str = "idem reconciler";

/// Default of [`Reconciler::max_failed_read_backs`]: a record whose read-back fails 10
/// times in a row is escalated. At one pass a minute, a person hears of it after about ten
/// minutes of failures; a read-back that recovers within that settles the record itself.
pub const DEFAULT_MAX_FAILED_READ_BACKS: u32 = 10;

/// [`Reconciler::max_failed_read_backs`] kept countable on a capped record.
fn clamp_failed_read_backs(n: u32) -> u32 {
    let kept = u32::try_from(crate::store::rules::EVIDENCE_KEPT).unwrap_or(u32::MAX);
    n.clamp(1, kept)
}

/// The states a pass walks, in the order it walks them.
const WALKED: [RecordState; 2] = [RecordState::Unknown, RecordState::Pending];

/// Where the next pass resumes in each walked state: after this cursor, or from the oldest
/// record when `None`. Behind a lock because `run_once` takes `&self` (a reconciler is
/// shared with its spawned task); held only to read or write a cursor, never across an
/// `.await`.
#[derive(Debug, Default)]
struct Walk(Mutex<[Option<ListCursor>; WALKED.len()]>);

impl Walk {
    fn cursors(&self) -> MutexGuard<'_, [Option<ListCursor>; WALKED.len()]> {
        // A cursor is replaced whole or not at all: a panic elsewhere cannot leave one
        // half-written, so a poisoned lock still holds usable positions.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, i: usize) -> Option<ListCursor> {
        self.cursors().get(i).cloned().flatten()
    }

    fn set(&self, i: usize, cursor: Option<ListCursor>) {
        if let Some(slot) = self.cursors().get_mut(i) {
            *slot = cursor;
        }
    }
}

impl Clone for Walk {
    fn clone(&self) -> Self {
        Walk(Mutex::new(self.cursors().clone()))
    }
}

/// How far [`Reconciler::run_once`] has watched the executor's releases. Same locking
/// rules as [`Walk`].
#[derive(Debug, Default)]
struct Watched(Mutex<WatchPlace>);

/// Every release at or before `place` has been looked at for good (`released::settled`),
/// and so has every release in `done`: those after `place`, behind one that is still read
/// back on every pass. Without `done`, each pass would read them back again until the one
/// in front settles.
#[derive(Clone, Debug, Default)]
struct WatchPlace {
    place: Option<ListCursor>,
    done: BTreeSet<ListCursor>,
}

impl WatchPlace {
    /// Records that the release at `cursor` was looked at for good; `contiguous` when
    /// every release before it in this pass was too (the place moves over it).
    fn settled(&mut self, cursor: ListCursor, contiguous: bool) {
        if contiguous {
            self.done = self.done.split_off(&cursor);
            self.done.remove(&cursor);
            self.place = Some(cursor);
        } else {
            self.done.insert(cursor);
        }
    }
}

impl Watched {
    fn get(&self) -> WatchPlace {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, place: &WatchPlace) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone_from(place);
    }
}

impl Clone for Watched {
    fn clone(&self) -> Self {
        Watched(Mutex::new(self.get()))
    }
}

impl Reconciler {
    /// A reconciler for the tools and store of `registry`, escalating to its sink.
    pub fn new(registry: &Registry) -> Self {
        Reconciler {
            registry: registry.clone(),
            sink: registry.escalation_sink().clone(),
            max_retries: u32::MAX,
            patience: DEFAULT_PATIENCE,
            max_failed_read_backs: DEFAULT_MAX_FAILED_READ_BACKS,
            batch: 500,
            walk: Walk::default(),
            watch_released_for: DEFAULT_WATCH_RELEASED_FOR,
            watched: Watched::default(),
        }
    }

    /// Where escalations go (default: the registry's sink). Redacted by the registry's
    /// [`redact`](crate::registry::RegistryBuilder::redact) hook like the registry's own
    /// sink: no sink gets what the hook masks, however it is attached.
    pub fn sink(mut self, sink: Arc<dyn EscalationSink>) -> Self {
        self.sink = self.registry.redacted(sink);
        self
    }

    /// How long after its first claim a keyed operation whose downstream keeps answering
    /// *unknown* is sent again with the same key before it goes to a person (default
    /// [`DEFAULT_PATIENCE`], 15 minutes; never past the tool's safe window, which caps it).
    ///
    /// A keyed downstream deduplicates on the key for its whole window, so a same-key retry
    /// is safe and settles the operation as soon as the original commits: it is answered
    /// with what landed. The first retry after a single send goes out at once; the next
    /// waits [`RETRY_BACKOFF_FIRST`] after the last send, then twice as long each time, up
    /// to [`RETRY_BACKOFF_MAX`]; between them the tool's
    /// read-back (if it has one) may settle the record, and nothing it finds frees the key.
    /// The model is told "unknown, reconciliation pending" meanwhile. Once the patience runs
    /// out the read-back has a last chance (an effect it finds settles the record); if it
    /// finds nothing, only part of a batch, or fails, the record is escalated
    /// ([`ReasonKind::PatienceExhausted`], [`ReasonKind::PartialEffects`]). Nothing is sent
    /// after the window.
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// At most this many same-key retries (on top of the first send) within the
    /// [`Reconciler::patience`]: with the sends used up, a keyed operation is escalated as
    /// when the patience runs out. By default there is no count: the patience decides.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Read-backs failing in a row (an error, not "not found") after which an unknown or
    /// pending record is escalated, with the failures as evidence (default
    /// [`DEFAULT_MAX_FAILED_READ_BACKS`], 10).
    ///
    /// Counted in a row, on the record: each failure is appended to the record's read-backs,
    /// and a read-back that answers (whatever it finds) ends the run, so a downstream that
    /// fails now and then is not escalated for it, while one that keeps failing reaches a
    /// person after `n` passes instead of never. Kept between 1 and
    /// [`EVIDENCE_KEPT`](crate::store::rules::EVIDENCE_KEPT) (16): a record keeps its last
    /// 16 read-backs, so a longer run could not be counted.
    pub fn max_failed_read_backs(mut self, n: u32) -> Self {
        self.max_failed_read_backs = clamp_failed_read_backs(n);
        self
    }

    /// Records looked at per state per pass (default 500). A larger backlog is walked over
    /// successive passes, `n` at a time, so every record of a backlog that stays unsettled
    /// is looked at within ⌈backlog / `n`⌉ passes.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How far back a reconciler that has just started looks for keys the executor freed
    /// after "unavailable, not executed" (default [`DEFAULT_WATCH_RELEASED_FOR`], a day;
    /// zero turns the watch off).
    ///
    /// A downstream's 503 or 429 speaks for the copy of the request it answered; a copy
    /// that reached it another way (a proxy's redelivery) may have run all the same. The
    /// executor frees such keys with a release trace ([`ReleaseNote::EXECUTOR`](crate::store::ReleaseNote::EXECUTOR)),
    /// and every pass reads each traced operation back until no copy can land any more
    /// (last send + timeout + 2 × in-flight bound): an effect found is recorded again, as
    /// found, and a person is told; more than one effect is escalated. A key claimed again
    /// since is left to its new record. A running reconciler keeps its place, so each
    /// release is read back while a copy may still land and once after that; a reconciler
    /// that starts (or [`Reconciler::run_all`]) looks back this far. Releases whose
    /// read-back keeps failing are looked at again on every pass until they fall out of
    /// this window.
    pub fn watch_released_for(mut self, d: Duration) -> Self {
        self.watch_released_for = d;
        self
    }

    fn store(&self) -> &Arc<dyn IdemStore> {
        self.registry.observed_store()
    }

    fn now(&self) -> Timestamp {
        self.registry.executor().clock.now()
    }

    /// Looks at every unknown and pending record once, oldest first, in pages of
    /// [`Reconciler::batch`]: for a one-shot run (a cron job, the CLI) that must not stop at
    /// the first `batch` records however many stay unsettled. Records created while it runs
    /// are included when the walk reaches them. Does not move [`Reconciler::run_once`]'s
    /// position.
    pub async fn run_all(&self) -> Result<Vec<Decision>, StoreError> {
        observe::pass(observe::Mode::All, self.walk_all()).await
    }

    async fn walk_all(&self) -> Result<Vec<Decision>, StoreError> {
        let mut decisions = Vec::new();
        for state in WALKED {
            let mut after: Option<ListCursor> = None;
            loop {
                let page = self
                    .store()
                    .list_after(state, after.as_ref(), self.batch)
                    .await?;
                let last_page = page.len() < self.batch;
                after = page.last().map(ListCursor::of).or(after);
                for record in page {
                    decisions.push(self.decide_observed(record).await);
                }
                if last_page {
                    break;
                }
            }
        }
        self.watch_released(None, &mut decisions).await?;
        Ok(decisions)
    }

    /// One pass over unknown and pending records: up to [`Reconciler::batch`] of each, from
    /// where this reconciler's previous pass stopped.
    pub async fn run_once(&self) -> Result<Vec<Decision>, StoreError> {
        observe::pass(observe::Mode::Once, self.walk_once()).await
    }

    async fn walk_once(&self) -> Result<Vec<Decision>, StoreError> {
        let mut decisions = Vec::new();
        for (i, state) in WALKED.into_iter().enumerate() {
            self.walk_state(i, state, &mut decisions).await?;
        }
        self.watch_released(Some(self.batch), &mut decisions)
            .await?;
        Ok(decisions)
    }

    /// Reads back the operations of keys the executor freed after "unavailable, not
    /// executed" ([`Reconciler::watch_released_for`]), `budget` releases at most (`None`: a
    /// one-shot run, every release in the window, without moving this reconciler's place).
    async fn watch_released(
        &self,
        budget: Option<usize>,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        if self.watch_released_for.is_zero() {
            return Ok(());
        }
        let keep_place = budget.is_some();
        let mut budget = budget.unwrap_or(usize::MAX);
        let now = self.now();
        let window_start = ListCursor {
            created_at: Timestamp(now.as_millis().saturating_sub(
                u64::try_from(self.watch_released_for.as_millis()).unwrap_or(u64::MAX),
            )),
            key: IdemKey::lowest(),
        };
        // A one-shot run looks at every release in the window; a running reconciler resumes
        // at its place and skips what it has looked at for good.
        let mut watched = if keep_place {
            self.watched.get()
        } else {
            WatchPlace::default()
        };
        watched.done.retain(|c| *c > window_start);
        let mut after = match &watched.place {
            Some(place) if *place > window_start => place.clone(),
            _ => window_start,
        };
        // The place moves only over releases looked at for good, in order: one that is
        // looked at again next pass holds it; those after it that are done are remembered.
        let mut contiguous = true;
        'pages: loop {
            let page = self.store().list_releases(Some(&after), self.batch).await?;
            let at_end = page.len() < self.batch;
            for release in page {
                let cursor = ListCursor::of_release(&release);
                if watched.done.contains(&cursor) {
                    watched.settled(cursor.clone(), contiguous);
                } else {
                    if budget == 0 {
                        break 'pages;
                    }
                    budget -= 1;
                    let (settled, decision) = self.watch_observed(&release, now).await;
                    decisions.extend(decision);
                    if settled {
                        watched.settled(cursor.clone(), contiguous);
                    }
                    contiguous &= settled;
                }
                after = cursor;
            }
            // Kept page by page, so a listing that fails later loses nothing looked at.
            if keep_place {
                self.watched.set(&watched);
            }
            if at_end {
                break;
            }
        }
        if keep_place {
            self.watched.set(&watched);
        }
        Ok(())
    }

    /// Decides about one release trace and carries the decision out: whether it was
    /// looked at for good, and the decision to report, if any.
    async fn watch_one(&self, release: &ReleaseRecord, now: Timestamp) -> (bool, Option<Decision>) {
        let record = &release.record;
        let tool = self.write_tool(&record.tool);
        let facts = self.facts(tool.as_ref(), None);
        let decision = |action, detail: String| Some(Decision::on(record, action, detail));
        let mut next = watch(release, facts.as_ref(), false, now, None);
        if next != Watch::ReadBack {
            return (released::settled(&next), None);
        }
        // The key's record, if a repeat claimed it again, speaks for the operation; so
        // does a claim under the other key format during a migration.
        // `watch` asks for a read-back only with a tool and an operation to read back.
        let (Some(tool), Some(operation)) = (tool.as_ref(), record.operation.as_ref()) else {
            return (true, None);
        };
        let Ok(decoded) = tool.decode(&operation.args) else {
            // The saved arguments no longer decode: nothing to read back with.
            return (true, None);
        };
        let held = match self.store().get(&record.key).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                return (
                    false,
                    decision(Action::Waiting, format!("could not read the key: {e}")),
                )
            }
        };
        let held = held
            || match self
                .claimed_elsewhere(record, decoded.identity.as_ref())
                .await
            {
                Ok(other) => other.is_some(),
                Err(e) => {
                    return (
                        false,
                        decision(
                            Action::Waiting,
                            format!("could not look under the other key format: {e}"),
                        ),
                    )
                }
            };
        next = watch(release, facts.as_ref(), held, now, None);
        if next != Watch::ReadBack {
            return (released::settled(&next), None);
        }
        let ctx = ReadBackCtx {
            key: record.key.clone(),
            scope: operation.scope.clone(),
            downstream_ref: record.downstream_ref.clone(),
        };
        let found = tool.read_back(ctx, decoded.typed).await;
        let evidence = ReadBackRecord {
            at: self.now(),
            result: evidence_of(&found),
        };
        next = watch(release, facts.as_ref(), held, now, Some(&found));
        let settled = released::settled(&next);
        let lease = tool.spec().lease_duration();
        match next {
            Watch::Ignore | Watch::ReadBack => (settled, None),
            Watch::Done { why } => {
                tracing::debug!(key = %record.key, "released after unavailable: {}", crate::observe::field(&why));
                (settled, None)
            }
            Watch::Again { why } => (settled, decision(Action::Waiting, why)),
            Watch::Restore {
                settlement,
                summary,
            } => {
                let settlement = settlement.read_backs(vec![evidence]);
                match restore(&**self.store(), record, settlement, None, lease).await {
                    Ok(Restored::Recorded(restored)) => {
                        let reason = format!(
                            "the caller was told nothing was done (every attempt refused as \
                             unavailable), but the read-back {summary}: recorded again, repeats \
                             now replay it"
                        );
                        tracing::warn!(key = %record.key, tool = %record.tool, "{}", crate::observe::field(&reason));
                        let mut notice =
                            Escalation::from_record(&restored, reason.as_str(), self.now());
                        notice.kind = ReasonKind::LateResult;
                        if let Err(e) = self.sink.deliver(&notice).await {
                            tracing::error!(key = %record.key, error = %crate::observe::field(&e), "escalation sink failed");
                        }
                        (true, decision(Action::Settled, reason))
                    }
                    // A repeat claimed the key in between: its record speaks for it.
                    Ok(Restored::ClaimedAgain(_)) => (true, None),
                    Err(e) => (
                        false,
                        decision(
                            Action::Waiting,
                            format!("found ({summary}), but could not record it: {e}"),
                        ),
                    ),
                }
            }
            Watch::Escalate { reason } => {
                let detail = match &found {
                    Ok(ReadBack::Partial { landed, .. }) => {
                        EscalationDetail::new(ReasonKind::PartialEffects, landed.clone())
                    }
                    _ => EscalationDetail::new(ReasonKind::ConflictingEvidence, Vec::new()),
                };
                let parked = Settlement::new(RecordState::Unknown)
                    .message(reason.as_str())
                    .read_backs(vec![evidence]);
                match restore(&**self.store(), record, parked, None, lease).await {
                    Ok(Restored::Recorded(restored)) => {
                        // Delivered before it is recorded escalated; a sink that refuses
                        // leaves an unknown record, which the walk escalates again.
                        let d = self
                            .escalate(&restored, &reason, detail, Vec::new())
                            .await
                            .unwrap_or_else(|d| d);
                        (true, Some(d))
                    }
                    Ok(Restored::ClaimedAgain(_)) => (true, None),
                    Err(e) => (
                        false,
                        decision(
                            Action::Waiting,
                            format!("{reason}; could not record it: {e}"),
                        ),
                    ),
                }
            }
        }
    }

    /// Decides up to `batch` records of `state`, in listing order, from the saved cursor.
    ///
    /// Reaching the end of the state (a short page) wraps to the oldest record and goes on
    /// with what is left of the batch, stopping at the record the pass began after, so no
    /// record is decided twice in one pass. Records decided here that stay in the state
    /// (waiting, still pending) keep their place, so the next pass moves past them.
    async fn walk_state(
        &self,
        i: usize,
        state: RecordState,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        let began_after = self.walk.get(i);
        let mut after = began_after.clone();
        let mut budget = self.batch;
        let mut wrapped = false;
        while budget > 0 {
            let mut page = self
                .store()
                .list_after(state, after.as_ref(), budget)
                .await?;
            let at_end = page.len() < budget;
            let mut lapped = false;
            if wrapped {
                if let Some(start) = &began_after {
                    if let Some(n) = page.iter().position(|r| ListCursor::of(r) > *start) {
                        page.truncate(n);
                        lapped = true;
                    }
                }
            }
            budget -= page.len();
            if let Some(last) = page.last() {
                after = Some(ListCursor::of(last));
            }
            for record in page {
                decisions.push(self.decide_observed(record).await);
            }
            if lapped {
                break;
            }
            if at_end {
                after = None;
                if wrapped || began_after.is_none() {
                    break;
                }
                wrapped = true;
            }
            // Saved page by page, so a store error later in the pass does not send the next
            // pass back over what this one already decided.
            self.walk.set(i, after.clone());
        }
        self.walk.set(i, after);
        Ok(())
    }

    /// Runs [`Reconciler::run_once`] every `every` until the returned handle is aborted.
    pub fn spawn(self, every: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                match self.run_once().await {
                    Ok(d) if !d.is_empty() => {
                        tracing::info!(decisions = d.len(), "reconciliation pass")
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %crate::observe::field(&e), "reconciliation pass failed")
                    }
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    /// During a key-format migration ([`crate::registry::RegistryBuilder::key_migration`]), the key
    /// under the other format of `record`'s operation, if a record holds it: the operation
    /// was claimed twice (a worker stood back from a claim it could not release, or crashed
    /// between its claim and its look under the other key), and only one of the claims may
    /// ever be sent or freed. `None` without a migration, or when the other key is free.
    async fn claimed_elsewhere(
        &self,
        record: &Record,
        identity: Option<&ArgsIdentity>,
    ) -> Result<Option<IdemKey>, StoreError> {
        let migration = self.registry.executor().key_migration;
        let (Some(honoured), Some(operation), Some(identity)) =
            (migration.honoured_format(), &record.operation, identity)
        else {
            return Ok(None);
        };
        let tool = self.write_tool(&record.tool);
        let key_name = tool
            .as_ref()
            .map_or(record.tool.as_ref(), DynTool::key_name);
        for format in [migration.claim_format(), honoured] {
            let Some((key, _)) = format.identify(
                &operation.scope,
                key_name,
                operation.intent.as_deref(),
                identity,
            ) else {
                continue;
            };
            if key != record.key && self.store().get(&key).await?.is_some() {
                return Ok(Some(key));
            }
        }
        Ok(None)
    }

    /// The write tool registered here under `name`, if any: only those are this
    /// reconciler's to settle. A record of a tool since renamed names the old name, which
    /// the renamed tool keeps as its key name: that tool settles it.
    fn write_tool(&self, name: &str) -> Option<DynTool> {
        self.registry
            .get(name)
            .filter(|t| t.kind() == ToolKind::Write)
            .or_else(|| {
                self.registry
                    .tools()
                    .find(|t| t.kind() == ToolKind::Write && t.key_name() == name)
            })
            .cloned()
    }

    /// What the plans need to know of `tool` besides a record (`None` for no tool here).
    fn facts(&self, tool: Option<&DynTool>, undecodable: Option<String>) -> Option<Facts> {
        let limits = Limits {
            max_retries: self.max_retries,
            patience: self.patience,
            max_failed_read_backs: self.max_failed_read_backs,
        };
        let default_bound = self.registry.executor().default_in_flight_bound;
        tool.map(|t| Facts::of(t.spec(), default_bound, limits, undecodable))
    }

    /// Plans what to do with `record` (reading back first when the plan asks for it) and
    /// does it.
    async fn decide(&self, record: Record) -> Decision {
        let tool = self.write_tool(&record.tool);
        let decoded = match (&tool, &record.operation) {
            (Some(tool), Some(operation)) => Some(tool.decode(&operation.args)),
            _ => None,
        };
        let undecodable = match &decoded {
            Some(Err(e)) => Some(format!("{e:?}")),
            _ => None,
        };
        let (mut typed, identity) = match decoded.and_then(|d| d.ok()) {
            Some(d) => (Some(d.typed), d.identity),
            None => (None, None),
        };
        let facts = self.facts(tool.as_ref(), undecodable);
        let now = self.now();

        let mut evidence = None;
        let mut next = plan(&record, facts.as_ref(), now, None);
        if next == Plan::ReadBack {
            let (Some(tool), Some(operation), Some(typed)) =
                (&tool, &record.operation, typed.take())
            else {
                return self.cannot(&record, "read back");
            };
            let ctx = ReadBackCtx {
                key: record.key.clone(),
                scope: operation.scope.clone(),
                downstream_ref: record.downstream_ref.clone(),
            };
            let found = tool.read_back(ctx, typed).await;
            evidence = Some(ReadBackRecord {
                at: self.now(),
                result: evidence_of(&found),
            });
            next = plan(&record, facts.as_ref(), now, Some(&found));
        }

        let decision = |action, detail: String| Decision::on(&record, action, detail);
        if matches!(next, Plan::Retry | Plan::Release { .. }) {
            // Sending again or freeing the key is only safe if this key is the operation's
            // only claim; during a key-format migration it may hold another.
            match self.claimed_elsewhere(&record, identity.as_ref()).await {
                Ok(None) => {}
                Ok(Some(other)) => {
                    let reason = format!(
                        "the operation is also claimed under another key format's key {other}; \
                         not sent again and not released: a person decides"
                    );
                    return self
                        .escalate(
                            &record,
                            &reason,
                            EscalationDetail::new(ReasonKind::ClaimedTwice, Vec::new()),
                            evidence.into_iter().collect(),
                        )
                        .await
                        .unwrap_or_else(|d| d);
                }
                Err(e) => {
                    return decision(
                        Action::Waiting,
                        format!("could not look for a claim under the other key format: {e}"),
                    )
                }
            }
        }
        match next {
            Plan::Skip { why } => decision(Action::Skipped, why),
            Plan::Retry => {
                let (Some(tool), Some(operation), Some(typed)) =
                    (&tool, &record.operation, typed.take())
                else {
                    return self.cannot(&record, "retry");
                };
                self.retry(tool, &record, operation, typed).await
            }
            Plan::Wait { why } => decision(Action::Waiting, why),
            Plan::NoteAndWait { why } => {
                if let Some(evidence) = evidence {
                    self.note(&record, evidence).await;
                }
                decision(Action::Waiting, why)
            }
            // Given a read-back, a plan never asks for another.
            Plan::ReadBack => self.cannot(&record, "read back twice"),
            Plan::Settle {
                settlement,
                summary,
            } => match self.takeover(&record).await {
                Ok(token) => {
                    let s = settlement.read_backs(evidence.into_iter().collect());
                    match self.store().settle(&record.key, token, s).await {
                        Ok(()) => decision(Action::Settled, summary),
                        Err(e) => decision(Action::Waiting, format!("could not settle: {e}")),
                    }
                }
                Err(d) => d,
            },
            Plan::Release { why } => self.release(&record, why).await,
            Plan::Escalate {
                reason,
                kind,
                landed,
                with_read_back,
            } => {
                let read_backs = if with_read_back {
                    evidence.into_iter().collect()
                } else {
                    Vec::new()
                };
                let detail = EscalationDetail::new(kind, landed);
                self.escalate(&record, &reason, detail, read_backs)
                    .await
                    .unwrap_or_else(|d| d)
            }
        }
    }

    /// A plan asked for what the reconciler has not got (arguments to send or read back
    /// with): [`plan()`] never does, so this only guards against a future mismatch.
    fn cannot(&self, record: &Record, what: &str) -> Decision {
        Decision::on(
            record,
            Action::Waiting,
            format!("planned to {what}, but nothing to do it with"),
        )
    }

    /// Re-sends with the same key: the keyed downstream replays if the first send landed.
    async fn retry(
        &self,
        tool: &DynTool,
        record: &Record,
        operation: &crate::store::Operation,
        typed: Box<dyn std::any::Any + Send>,
    ) -> Decision {
        let token = match self.takeover(record).await {
            Ok(t) => t,
            Err(d) => return d,
        };
        let run = ClaimedRun {
            scope: &operation.scope,
            call_id: None,
            args: (&operation.args).into(),
            key: record.key.clone(),
            token,
            first_claimed_at: record.created_at,
            prior_unknown: record.state == RecordState::Unknown,
            now: None,
        };
        let executed = self.registry.executor().run_claimed(tool, run, typed).await;
        let detail = match &executed.result {
            Ok(o) => format!("retried with the same key: {}", o.class()),
            Err(e) => format!("retried with the same key: {e}"),
        };
        Decision::on(record, Action::Retried, detail)
    }

    /// Frees a key whose effect provably never happened, keeping a trace of the release
    /// (by `idem reconciler`, with `detail` as the note) in the store.
    async fn release(&self, record: &Record, detail: String) -> Decision {
        let result = self
            .store()
            .release_unsettled(
                &record.key,
                record.token,
                &crate::store::ReleaseNote::new(RECONCILER, detail.as_str()),
            )
            .await;
        let action = match result {
            Ok(()) => {
                tracing::info!(key = %record.key, tool = %record.tool, evidence = %crate::observe::debug_field(&record.attempts), "{}", crate::observe::field(&detail));
                Action::Released
            }
            Err(_) => Action::Waiting,
        };
        Decision::on(record, action, detail)
    }

    /// Appends read-back evidence to an unknown or pending record, under the token it was
    /// listed with (settling it to the state it is in only adds evidence). A pending
    /// record's polls that find it still pending are not kept (the plan waits without
    /// noting them), only its failed read-backs and the answer that ends a run of them;
    /// the store caps what a record keeps either way (`rules::cap_evidence`).
    async fn note(&self, record: &Record, evidence: ReadBackRecord) {
        let s = Settlement::new(record.state).read_backs(vec![evidence]);
        if let Err(e) = self.store().settle(&record.key, record.token, s).await {
            tracing::debug!(key = %record.key, error = %crate::observe::field(&e), "read-back evidence not recorded");
        }
    }

    /// How long a takeover holds a record: the lease of its tool.
    fn takeover_lease(&self, record: &Record) -> Duration {
        self.registry
            .get(&record.tool)
            .map_or(Duration::from_secs(60), |t| t.spec().lease_duration())
    }

    async fn takeover(&self, record: &Record) -> Result<ClaimToken, Decision> {
        let lease = self.takeover_lease(record);
        self.store()
            .reclaim(&record.key, record.token, lease)
            .await
            .map_err(|e| {
                Decision::on(
                    record,
                    Action::Waiting,
                    format!("someone else moved the record on: {e}"),
                )
            })
    }

    /// Hands `record` to a person: takes it over, delivers the escalation to the sink, and
    /// only then settles the record escalated (an escalated record is never walked again, so
    /// the order is what makes delivery at least once).
    ///
    /// A reconciler that dies, or whose store fails, between the delivery and the settle
    /// leaves the record running under its takeover: the lease lapses, the record reads
    /// unknown, and a later pass escalates it again. The person may be told twice, with the
    /// same [`Escalation::id`] both times; never not at all. A sink that refuses the escalation
    /// gets it again on the next pass: the record is put back as it was (unknown or pending).
    ///
    /// The escalated record keeps `detail` (its reason kind, and what landed of a partial
    /// batch) as its payload ([`EscalationDetail`]).
    async fn escalate(
        &self,
        record: &Record,
        reason: &str,
        detail: EscalationDetail,
        read_backs: Vec<ReadBackRecord>,
    ) -> Result<Decision, Decision> {
        let token = self.takeover(record).await?;
        // The record as it will read once settled escalated.
        let mut escalated = record.clone();
        escalated.state = RecordState::Escalated;
        escalated.token = token;
        escalated.message = Some(reason.to_owned());
        escalated.payload = Some(detail.to_payload());
        escalated.read_backs.extend(read_backs.iter().cloned());
        let mut escalation = Escalation::escalating(&escalated, reason, self.now());
        escalation.kind = detail.reason_kind;
        escalation.landed = detail.landed.clone();
        // The takeover is not renewed while the sink works: a sink slower than half its lease
        // counts as a refusal, before the takeover can lapse. (A lapsed takeover reads
        // unknown, and a pending record read as unknown could be sent again or released.)
        let patience = self.takeover_lease(record) / 2;
        let delivered = match tokio::time::timeout(patience, self.sink.deliver(&escalation)).await {
            Ok(delivered) => delivered,
            Err(_) => Err(format!("the sink did not answer within {patience:?}")),
        };
        if let Err(e) = delivered {
            tracing::error!(key = %record.key, id = %escalation.id, error = %crate::observe::field(&e),
                "escalation sink failed; the record is put back and escalated again next pass");
            let mut back = Settlement::new(record.state).read_backs(read_backs);
            back.payload = record.payload.clone();
            back.message = record.message.clone();
            if let Err(put) = self.store().settle(&record.key, token, back).await {
                tracing::warn!(key = %record.key, error = %put,
                    "could not put the record back; it reads unknown once the takeover's lease lapses");
            }
            return Err(Decision::on(
                record,
                Action::Waiting,
                format!("could not escalate: the escalation sink failed: {e}"),
            ));
        }
        let s = Settlement::new(RecordState::Escalated)
            .message(reason)
            .payload(detail.to_payload())
            .read_backs(read_backs);
        if let Err(e) = self.store().settle(&record.key, token, s).await {
            // The person has been told. If the settle did not land (its reply may be lost
            // after it did), the takeover lapses to unknown and a later pass escalates the
            // record again, under the same id.
            tracing::warn!(key = %record.key, id = %escalation.id, error = %crate::observe::field(&e),
                "escalation delivered, but recording it failed");
            return Ok(Decision::escalated(
                record,
                format!(
                    "{reason} (delivered; recording it failed, so it may be delivered again: {e})"
                ),
                detail.reason_kind,
            ));
        }
        Ok(Decision::escalated(record, reason, detail.reason_kind))
    }
}

/// The class a read-back settles a record as, for reports.
pub fn class_of(read_back: &ReadBack) -> Option<OutcomeClass> {
    Some(match read_back {
        ReadBack::Completed { .. } => OutcomeClass::Completed,
        ReadBack::Pending { .. } => OutcomeClass::Pending,
        ReadBack::Failed { .. } => OutcomeClass::Failed,
        _ => return None,
    })
}
