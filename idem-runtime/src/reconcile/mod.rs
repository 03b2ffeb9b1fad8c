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
//! | unknown | keyed downstream, inside the safe window, [`Reconciler::max_retries`] + 1 sends made | escalate: the downstream keeps answering unknown |
//! | unknown | keyed downstream, inside the safe window | retry with the **same** key |
//! | unknown | the last timed-out attempt ended less than the in-flight bound ago (one timeout, if none declared) | wait: it may still report its late result |
//! | | *read back* | |
//! | unknown, pending | no read-back | escalate: no key contract (or window passed) and no read-back |
//! | any | the read-back fails | wait, the error noted |
//! | unknown | found completed, failed or pending | settle as found |
//! | pending | found completed or failed | settle as found |
//! | pending | found pending | wait: polled again next pass |
//! | any | found more than one effect | escalate |
//! | pending | not found | escalate: its downstream ref is gone |
//! | unknown | not found, no in-flight bound declared | escalate: the original may still land |
//! | unknown | not found, before last send + timeout + 2 × in-flight bound | wait, the read-back noted |
//! | unknown | not found, after that | release: the intent may run again |
//!
//! The decision itself is a pure function of the record, what the tool declares, the time
//! and the read-back's answer (`plan.rs`, where a unit test walks every row of this table);
//! [`Reconciler`] only carries it out. "Noted" appends the read-back to an unknown record's
//! evidence; a pending record keeps only the latest poll, in the log.
//!
//! A pass looks at a bounded batch per state and the next pass resumes after it
//! ([`crate::store::IdemStore::list_after`]), so records that stay unknown or pending for
//! long cannot keep newer ones from ever being looked at.

mod observe;
mod plan;
mod resolve;

// Escalations and read-backs are what the reconciler produces and consumes; they live in
// lower layers (the executor escalates too, tools declare read-backs) and are re-exported
// here where a reader of this module looks for them.
pub use crate::escalation::{CallbackSink, Escalation, EscalationSink, JsonLinesSink, LogSink};
pub use crate::tool::{ReadBack, ReadBackCtx};
pub use resolve::{resolve, Resolution, ResolveError};

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::executor::ClaimedRun;
use crate::outcome::OutcomeClass;
use crate::registry::Registry;
use crate::store::{
    ClaimToken, IdemStore, ListCursor, ReadBackRecord, Record, RecordState, Settlement, StoreError,
    Timestamp,
};
use crate::tool::{DynTool, ToolKind};
use plan::{evidence_of, plan, Facts, Plan};

/// What one reconciliation pass decided, per record.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Decision {
    /// The record's key.
    pub key: crate::IdemKey,
    /// The tool.
    pub tool: String,
    /// The state before.
    pub from: RecordState,
    /// What was done.
    pub action: Action,
    /// Why, in words.
    pub detail: String,
}

impl Decision {
    fn on(record: &Record, action: Action, detail: impl Into<String>) -> Decision {
        Decision {
            key: record.key.clone(),
            tool: record.tool.clone(),
            from: record.state,
            action,
            detail: detail.into(),
        }
    }
}

/// What the reconciler did with one record.
///
/// ```
/// use idem_runtime::{Action, Reconciler, Registry};
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
    batch: usize,
    walk: Walk,
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

impl Reconciler {
    /// A reconciler for the tools and store of `registry`, escalating to its sink.
    pub fn new(registry: &Registry) -> Self {
        Reconciler {
            registry: registry.clone(),
            sink: registry.escalation_sink().clone(),
            max_retries: 3,
            batch: 500,
            walk: Walk::default(),
        }
    }

    /// Where escalations go (default: the registry's sink).
    pub fn sink(mut self, sink: Arc<dyn EscalationSink>) -> Self {
        self.sink = sink;
        self
    }

    /// Total attempts (the executor's included) after which a keyed operation whose downstream
    /// keeps answering *unknown* is escalated (default 3 reconciler retries on top).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Records looked at per state per pass (default 500). A larger backlog is walked over
    /// successive passes, `n` at a time, so every record of a backlog that stays unsettled
    /// is looked at within ⌈backlog / `n`⌉ passes.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
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
        Ok(decisions)
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
                    Err(e) => tracing::warn!(error = %e, "reconciliation pass failed"),
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    /// Plans what to do with `record` (reading back first when the plan asks for it) and
    /// does it.
    async fn decide(&self, record: Record) -> Decision {
        let tool = self
            .registry
            .get(&record.tool)
            .filter(|t| t.kind() == ToolKind::Write)
            .cloned();
        let decoded = match (&tool, &record.operation) {
            (Some(tool), Some(operation)) => Some(tool.decode(&operation.args)),
            _ => None,
        };
        let undecodable = match &decoded {
            Some(Err(e)) => Some(format!("{e:?}")),
            _ => None,
        };
        let mut typed = decoded.and_then(|d| d.ok()).map(|d| d.typed);
        let facts = tool
            .as_ref()
            .map(|t| Facts::of(t.spec(), self.max_retries, undecodable));
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
                with_read_back,
            } => {
                let read_backs = if with_read_back {
                    evidence.into_iter().collect()
                } else {
                    Vec::new()
                };
                self.escalate(&record, &reason, read_backs)
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
        };
        let executed = self.registry.executor().run_claimed(tool, run, typed).await;
        let detail = match &executed.result {
            Ok(o) => format!("retried with the same key: {}", o.class()),
            Err(e) => format!("retried with the same key: {e}"),
        };
        Decision::on(record, Action::Retried, detail)
    }

    /// Frees a key whose effect provably never happened.
    async fn release(&self, record: &Record, detail: String) -> Decision {
        let result = async {
            let token = self
                .store()
                .reclaim(&record.key, record.token, Duration::from_secs(60))
                .await?;
            self.store().release(&record.key, token).await
        }
        .await;
        let action = match result {
            Ok(()) => {
                tracing::info!(key = %record.key, tool = %record.tool, evidence = ?record.attempts, "{detail}");
                Action::Released
            }
            Err(_) => Action::Waiting,
        };
        Decision::on(record, action, detail)
    }

    /// Appends read-back evidence to an unknown record (pending records keep only the latest
    /// poll result in the log, so a long poll does not grow the record without bound).
    async fn note(&self, record: &Record, evidence: ReadBackRecord) {
        if record.state == RecordState::Unknown {
            let s = Settlement::new(RecordState::Unknown).read_backs(vec![evidence]);
            if let Err(e) = self.store().settle(&record.key, record.token, s).await {
                tracing::debug!(key = %record.key, error = %e, "read-back evidence not recorded");
            }
        } else {
            tracing::debug!(key = %record.key, result = %evidence.result, "pending poll");
        }
    }

    async fn takeover(&self, record: &Record) -> Result<ClaimToken, Decision> {
        let lease = self
            .registry
            .get(&record.tool)
            .map_or(Duration::from_secs(60), |t| t.spec().lease_duration());
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

    async fn escalate(
        &self,
        record: &Record,
        reason: &str,
        read_backs: Vec<ReadBackRecord>,
    ) -> Result<Decision, Decision> {
        let token = self.takeover(record).await?;
        let s = Settlement::new(RecordState::Escalated)
            .message(reason)
            .read_backs(read_backs);
        let settled = self.store().settle(&record.key, token, s).await;
        let now = self.now();
        let read = self.store().get(&record.key).await;
        if let Err(e) = settled {
            // A settle whose reply was lost may still have landed, and an escalated record
            // is never walked again: unless the sink hears of it now, no person ever does.
            // Only a record still running under this token (it turns unknown and is walked
            // again) or settled otherwise shows the escalation did not land or is moot; a
            // record taken over by someone else (the late-result watcher puts an escalated
            // record back as it was) or one that cannot be read is delivered: a person may
            // be told twice, never not at all.
            let landed = match &read {
                Err(_) => true,
                Ok(Some(r)) => {
                    r.state == RecordState::Escalated
                        || (r.state == RecordState::Running && r.token != token)
                }
                Ok(None) => false,
            };
            if !landed {
                return Err(Decision::on(
                    record,
                    Action::Waiting,
                    format!("could not escalate: {e}"),
                ));
            }
        }
        let escalated = read.ok().flatten();
        let escalation = Escalation::from_record(escalated.as_ref().unwrap_or(record), reason, now);
        if let Err(e) = self.sink.deliver(&escalation).await {
            tracing::error!(key = %record.key, error = %e, "escalation sink failed; the record stays escalated");
        }
        Ok(Decision::on(record, Action::Escalated, reason.to_owned()))
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
