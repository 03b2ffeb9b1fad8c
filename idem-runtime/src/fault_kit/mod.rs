//! The fault kit (feature `testing`): runs *your* write tool, against your own fake
//! downstream or sandbox, under every fault of the retry matrix, and judges each run on
//! *your* ledger. The facade documents it, with the test a user writes, as `idem::fault_kit`.
//!
//! For each [`Fault`], the kit asks you for a fresh [`Subject`] (your tool and a ledger: a
//! closure that counts the effects your downstream holds for an operation's key, or the
//! tool's own read-back), registers
//! the tool behind an injector under its own name (so its keys are the keys it always has),
//! drives the registry through the fault as a model and a harness would, waits until
//! everything still in flight has landed or been dropped, runs a [`Reconciler`] pass, calls
//! once more as the model would, and counts the ledger. A [`FaultReport`] holds a [`Row`]
//! per fault; it prints as a table.
//!
//! # Where the faults are injected
//!
//! The kit cannot reach into your downstream, so it breaks things at the handler boundary:
//! it runs your handler and drops its answer (lost ack), starts it past the timeout (late
//! commit, late tail), runs it twice with the same context (redelivery), answers for it
//! before or after it ran (timeouts, 5xx, 503), drops its future mid-way (a crash), and
//! drives the registry the way a model and a harness would (a re-issued call, concurrent
//! copies, changed arguments). Each [`Fault`] variant says what it does.
//!
//! # Judgement
//!
//! [`Verdict::Pass`] is exactly one effect in your ledger, with nothing the model was told
//! contradicting it: never "failed" or "rejected" (a timeout is *unknown*), never
//! "completed" before anything happened, never "nothing was done" after something did. The
//! unknowns are settled by the reconciler before the kit judges, so what the last call is
//! told is what a model would be told once everything settled. Two verdicts are not
//! failures: [`Verdict::Escalated`] (nobody could tell whether the effect happened, so a
//! person decides; a read-back lets the reconciler decide instead) and
//! [`Verdict::NotPreventable`] (a redelivered request reached a downstream without a key
//! contract twice: no client can tell the copies apart, only the downstream could).
//!
//! # Time
//!
//! Every wait the kit makes is on tokio's clock, sized from the tool's own spec (its
//! timeout, in-flight bound and lease): a late commit starts half a timeout after the
//! timeout, a crashed worker restarts once its lease has lapsed, and the kit waits twice the
//! in-flight bound past the timeout before it reconciles. For an in-process test double,
//! run the kit under tokio's paused clock (`#[tokio::test(start_paused = true)]`): those
//! waits (minutes, with the default 30 s timeout) cost no real time, and every run is the
//! same. Against a sandbox on the network, run it in real time and give the tool a short
//! timeout, in-flight bound and lease of its own (`timeout = "500ms"`, `in_flight = "1s"`,
//! `lease = "2s"`; the default lease is the timeout plus 30 s): the waits scale with them.

mod fault;
mod inject;
mod report;

pub use fault::Fault;
pub use report::{Answer, FaultReport, Row, Turn, Verdict};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use self::inject::Injector;
use self::report::class_of;
use crate::call::{CallError, ToolCall};
use crate::identity::{IdemKey, KeyMaterial, Scope};
use crate::outcome::OutcomeClass;
use crate::reconcile::Reconciler;
use crate::registry::{BuildError, Registry, RetryPolicy};
use crate::store::{Clock, MemoryStore, SystemClock, TokioClock};
use crate::tool::{
    Downstream, DynTool, IntoDynTool, ReadBack, ReadBackCtx, ToolError, ToolKind, Toolbox,
};

/// The intent every call of a fault's run carries: one operation per run, whatever the
/// arguments, so a call with changed arguments is the same operation asked differently.
const INTENT: &str = "fault-kit";

/// How the kit counts the effects of an operation.
enum Ledger {
    /// Your closure, given the operation's key.
    Count(Arc<dyn Fn(&IdemKey) -> usize + Send + Sync>),
    /// The tool's own read-back.
    ReadBack,
}

/// What the kit tests under one fault: your write tool, and the ledger that counts its
/// effects. The kit asks for a fresh one per fault ([`FaultKit::new`]).
pub struct Subject {
    tool: Result<DynTool, FaultKitError>,
    ledger: Ledger,
}

impl Subject {
    /// A `#[tool(write)]` (or any [`WriteTool`](crate::tool::WriteTool), or a
    /// [`DynTool`]), and `ledger`: the number of effects your downstream holds for the
    /// operation with this key. In a fresh test double per fault, count them all; in a
    /// shared sandbox, count those made under the key (each fault's run has a key of its
    /// own).
    pub fn new<M>(
        tool: impl IntoDynTool<M>,
        ledger: impl Fn(&IdemKey) -> usize + Send + Sync + 'static,
    ) -> Self {
        Subject {
            tool: Ok(tool.into_dyn_tool()),
            ledger: Ledger::Count(Arc::new(ledger)),
        }
    }

    /// A write tool counted by its own read-back (`reconcile = …`), called with the
    /// operation's key and the kit's arguments: nothing found is no effect, one effect found
    /// (completed, pending or failed) is one, an ambiguous answer is as many as the effects
    /// it names, a partial batch is one. A read-back sees only what it can name: a counting
    /// closure ([`Subject::new`]) catches duplicates a read-back by key cannot tell apart.
    /// A tool without a read-back is an error of [`FaultKit::run`].
    pub fn counted_by_read_back<M>(tool: impl IntoDynTool<M>) -> Self {
        Subject {
            tool: Ok(tool.into_dyn_tool()),
            ledger: Ledger::ReadBack,
        }
    }

    /// The write tool named `name` of a `#[toolbox]`, with its `ledger` (as in
    /// [`Subject::new`]).
    pub fn toolbox<B: Toolbox>(
        toolbox: Arc<B>,
        name: &str,
        ledger: impl Fn(&IdemKey) -> usize + Send + Sync + 'static,
    ) -> Self {
        let tool = toolbox
            .tools()
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| FaultKitError::NoSuchTool(name.to_owned()));
        Subject {
            tool,
            ledger: Ledger::Count(Arc::new(ledger)),
        }
    }
}

/// Why the kit could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum FaultKitError {
    /// The toolbox has no tool of that name.
    NoSuchTool(String),
    /// The kit tests write tools; a read tool has no effect to count.
    NotAWriteTool(String),
    /// The registry refused the tool.
    Build(BuildError),
    /// The ledger is the tool's read-back ([`Subject::counted_by_read_back`]), and the tool
    /// declares none.
    NoReadBack(String),
    /// The tool's read-back failed while the kit counted effects with it.
    ReadBackFailed {
        /// The tool.
        tool: String,
        /// What the read-back said.
        error: ToolError,
    },
}

impl std::fmt::Display for FaultKitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultKitError::NoSuchTool(tool) => {
                write!(f, "the toolbox has no tool named `{tool}`")
            }
            FaultKitError::NotAWriteTool(tool) => {
                write!(
                    f,
                    "`{tool}` is a read tool; the fault kit tests write tools"
                )
            }
            FaultKitError::Build(e) => write!(f, "the registry refused the tool: {e}"),
            FaultKitError::NoReadBack(tool) => {
                write!(f, "`{tool}` has no read-back to count its effects with")
            }
            FaultKitError::ReadBackFailed { tool, error } => {
                write!(f, "the read-back of `{tool}` failed: {error}")
            }
        }
    }
}

impl std::error::Error for FaultKitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FaultKitError::Build(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BuildError> for FaultKitError {
    fn from(e: BuildError) -> Self {
        FaultKitError::Build(e)
    }
}

/// The times a fault's run waits, all from the tool's spec and the kit's settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// How long the handler's own client waits in [`Fault::TimeoutAfterEffect`].
    client_timeout: Duration,
    /// When the first attempt starts under [`Fault::LateCommit`].
    late_commit: Duration,
    /// When the first attempt starts under [`Fault::LateTail`].
    late_tail: Duration,
    /// The `Retry-After` of the injected 503s.
    retry_after: Duration,
    /// How long the outage lasts, from the first call.
    outage: Duration,
    /// How long after its first turn the model calls again under [`Fault::Outage`].
    later_call: Duration,
    /// How long a crashed worker stays down: past the lease.
    restart_after: Duration,
    /// How long the kit waits after the last call before it reconciles.
    settle: Duration,
}

/// Runs a write tool under every [`Fault`] and judges it on your ledger. See the module
/// docs.
pub struct FaultKit {
    args: Value,
    changed_args: Option<Value>,
    make: Box<dyn Fn() -> Subject + Send + Sync>,
    faults: Vec<Fault>,
    retry: RetryPolicy,
    retry_after: Duration,
    outage: Option<Duration>,
    later_call: Option<Duration>,
    run_id: String,
}

impl fmt::Debug for FaultKit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultKit")
            .field("args", &self.args)
            .field("changed_args", &self.changed_args)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl FaultKit {
    /// A kit that calls the tool with `args` (arguments it accepts and succeeds with) and
    /// calls `subject` once per fault for a fresh tool and ledger.
    pub fn new(args: Value, subject: impl Fn() -> Subject + Send + Sync + 'static) -> Self {
        FaultKit {
            args,
            changed_args: None,
            make: Box::new(subject),
            faults: Fault::ALL.to_vec(),
            retry: RetryPolicy::default(),
            retry_after: Duration::from_secs(2),
            outage: None,
            later_call: None,
            run_id: "fault-kit".to_owned(),
        }
    }

    /// Other arguments for the same operation, for [`Fault::ChangedParams`] (without them
    /// that fault is [skipped](Verdict::Skipped)).
    pub fn changed_args(mut self, args: Value) -> Self {
        self.changed_args = Some(args);
        self
    }

    /// Runs only these faults, in this order (default: [`Fault::ALL`]).
    pub fn faults(mut self, faults: impl IntoIterator<Item = Fault>) -> Self {
        self.faults = faults.into_iter().collect();
        self
    }

    /// The registry's retry policy (default: [`RetryPolicy::default`]), as in production.
    pub fn retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The `Retry-After` of the injected 503s (default 2 s).
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// How long [`Fault::Outage`] answers 503, from the first call (default: the retry
    /// budget plus the `Retry-After`, so the executor gives up first).
    pub fn outage(mut self, lasts: Duration) -> Self {
        self.outage = Some(lasts);
        self
    }

    /// How long after its first turn the model calls again under [`Fault::Outage`]
    /// (default: the outage's length).
    pub fn later_call(mut self, after: Duration) -> Self {
        self.later_call = Some(after);
        self
    }

    /// The prefix of each fault's run id (default `fault-kit`); a fault's run is
    /// `{prefix}-{fault}`, so its key differs from every other fault's, and from a previous
    /// run's when you change it (for a sandbox that keeps keys between test runs).
    pub fn run_id(mut self, prefix: impl Into<String>) -> Self {
        self.run_id = prefix.into();
        self
    }

    /// Runs every fault and reports. An error when the tool cannot be registered; a fault
    /// that goes wrong is a row of the report, never an error.
    pub async fn run(&self) -> Result<FaultReport, FaultKitError> {
        let mut rows = Vec::with_capacity(self.faults.len());
        let mut tool = String::new();
        for &fault in &self.faults {
            let subject = (self.make)();
            let base = subject.tool?;
            if base.kind() != ToolKind::Write {
                return Err(FaultKitError::NotAWriteTool(base.name().to_owned()));
            }
            tool = base.name().to_owned();
            rows.push(self.run_fault(fault, base, subject.ledger).await?);
        }
        Ok(FaultReport { tool, rows })
    }

    fn timing(&self, tool: &DynTool) -> Timing {
        let spec = tool.spec();
        let timeout = spec.timeout_duration();
        let bound = spec.effective_in_flight_bound(None);
        let lease = spec.lease_duration();
        let outage = self
            .outage
            .unwrap_or_else(|| self.retry.budget.saturating_add(self.retry_after));
        // Saturating: a tool may declare any duration, and the kit must not panic on one.
        Timing {
            client_timeout: timeout / 2,
            late_commit: timeout.saturating_add((timeout / 2).min(bound / 2)),
            late_tail: timeout.saturating_add(bound.saturating_sub(bound / 8)),
            retry_after: self.retry_after,
            outage,
            later_call: self.later_call.unwrap_or(outage),
            restart_after: lease.saturating_add(lease / 2),
            settle: timeout
                .saturating_add(bound)
                .saturating_mul(2)
                .saturating_add(lease),
        }
    }

    async fn run_fault(
        &self,
        fault: Fault,
        base: DynTool,
        ledger: Ledger,
    ) -> Result<Row, FaultKitError> {
        let name = base.name().to_owned();
        let downstream = base.spec().downstream_kind();
        let run_id = format!("{}-{}", self.run_id, fault.name());
        let key = IdemKey::derive(
            &Scope::run(run_id.clone()),
            &name,
            KeyMaterial::Intent(INTENT),
        );
        let changed = match (fault, &self.changed_args) {
            (Fault::ChangedParams, None) => {
                return Ok(Row {
                    fault,
                    turns: Vec::new(),
                    decisions: Vec::new(),
                    asked_again: None,
                    effects: 0,
                    verdict: Verdict::Skipped,
                    reason: "no changed arguments given (FaultKit::changed_args)".to_owned(),
                })
            }
            (_, changed) => changed.clone(),
        };

        let timing = self.timing(&base);
        let began = Instant::now();
        let injector = Injector::new(fault, timing, began);
        let tool = base
            .intercepted(injector.clone())
            .ok_or_else(|| FaultKitError::NotAWriteTool(name.clone()))?;
        // Store and executor on tokio's clock, like the waits: a lease lapses when the
        // (paused) clock says so.
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(SystemClock.now()));
        let registry = Registry::builder()
            .store(MemoryStore::with_clock(clock.clone()))
            .clock(clock)
            .retry_policy(self.retry)
            .tool(tool)
            .build()?;

        let call = |call_id: &str, args: &Value| {
            ToolCall::new(run_id.clone(), name.clone(), args.clone())
                .call_id(call_id)
                .intent(INTENT)
        };
        let counter = Counter {
            ledger: &ledger,
            tool: &base,
            key: &key,
            scope: Scope::run(run_id.clone()),
            args: &self.args,
            began,
        };
        let first = || call("call-1", &self.args);
        let mut turns = Vec::new();
        match fault {
            Fault::Concurrent => {
                let (a, b) = tokio::join!(registry.call(first()), registry.call(first()));
                turns.push(counter.turn(Answer::Returned(a)).await?);
                turns.push(counter.turn(Answer::Returned(b)).await?);
            }
            Fault::Reissue => {
                turns.push(
                    counter
                        .turn(Answer::Returned(registry.call(first()).await))
                        .await?,
                );
                let again = registry.call(call("call-2", &self.args)).await;
                turns.push(counter.turn(Answer::Returned(again)).await?);
            }
            Fault::Outage => {
                turns.push(
                    counter
                        .turn(Answer::Returned(registry.call(first()).await))
                        .await?,
                );
                tokio::time::sleep(timing.later_call).await;
                let again = registry.call(call("call-2", &self.args)).await;
                turns.push(counter.turn(Answer::Returned(again)).await?);
            }
            Fault::ChangedParams => {
                let args = changed.unwrap_or_else(|| self.args.clone());
                turns.push(
                    counter
                        .turn(Answer::Returned(registry.call(first()).await))
                        .await?,
                );
                let again = registry.call(call("call-2", &args)).await;
                turns.push(counter.turn(Answer::Returned(again)).await?);
            }
            Fault::Crash => {
                let worker = {
                    let (registry, call) = (registry.clone(), first());
                    tokio::spawn(async move { registry.call(call).await })
                };
                // Dropping the call's future mid-way drops the handler's, as a dying process
                // would; if the call ended first (the handler never ran), there is nothing
                // to crash.
                let crashed = tokio::select! {
                    () = injector.effect_done() => true,
                    _ = tokio::time::sleep(timing.settle) => false,
                };
                worker.abort();
                match worker.await {
                    Ok(result) if !crashed => {
                        turns.push(counter.turn(Answer::Returned(result)).await?)
                    }
                    _ => turns.push(counter.turn(Answer::Crashed).await?),
                }
                tokio::time::sleep(timing.restart_after).await;
                turns.push(
                    counter
                        .turn(Answer::Returned(registry.call(first()).await))
                        .await?,
                );
            }
            _ => turns.push(
                counter
                    .turn(Answer::Returned(registry.call(first()).await))
                    .await?,
            ),
        }

        // Everything in flight lands (or is dropped by the executor) before the reconciler
        // looks, and a read-back's "not found" counts by then.
        tokio::time::sleep(timing.settle).await;
        let decisions = Reconciler::new(&registry)
            .run_all()
            .await
            .unwrap_or_default();
        let asked_again = counter
            .turn(Answer::Returned(
                registry.call(call("call-after", &self.args)).await,
            ))
            .await?;
        let effects = counter.effects().await?;
        let (verdict, reason) = judge(fault, downstream, &turns, &asked_again, effects);
        Ok(Row {
            fault,
            turns,
            decisions,
            asked_again: Some(asked_again),
            effects,
            verdict,
            reason,
        })
    }
}

/// Counts the effects of one fault's operation, and stamps each call's end with them.
struct Counter<'a> {
    ledger: &'a Ledger,
    tool: &'a DynTool,
    key: &'a IdemKey,
    scope: Scope,
    args: &'a Value,
    began: Instant,
}

impl Counter<'_> {
    async fn effects(&self) -> Result<usize, FaultKitError> {
        let read_back = match self.ledger {
            Ledger::Count(count) => return Ok(count(self.key)),
            Ledger::ReadBack => {
                let failed = |error: ToolError| FaultKitError::ReadBackFailed {
                    tool: self.tool.name().to_owned(),
                    error,
                };
                let args = self
                    .tool
                    .decode(self.args)
                    .map_err(|e| failed(ToolError::rejected(format!("{e:?}"))))?;
                let ctx = ReadBackCtx {
                    key: self.key.clone(),
                    scope: self.scope.clone(),
                    downstream_ref: None,
                };
                self.tool.read_back(ctx, args.typed).await.map_err(failed)?
            }
        };
        match read_back {
            ReadBack::Unsupported => Err(FaultKitError::NoReadBack(self.tool.name().to_owned())),
            ReadBack::NotFound => Ok(0),
            ReadBack::Ambiguous { downstream_refs } => Ok(downstream_refs.len()),
            _ => Ok(1),
        }
    }

    async fn turn(&self, answer: Answer) -> Result<Turn, FaultKitError> {
        Ok(Turn {
            answer,
            ended_after: self.began.elapsed(),
            effects: self.effects().await?,
        })
    }
}

/// The verdict of one fault's run (see [`Verdict`]).
fn judge(
    fault: Fault,
    downstream: Downstream,
    turns: &[Turn],
    asked_again: &Turn,
    effects: usize,
) -> (Verdict, String) {
    let fail = |why: String| (Verdict::Fail, why);
    if effects > 1 {
        if fault == Fault::Redelivery && downstream == Downstream::Unkeyed {
            return (
                Verdict::NotPreventable,
                format!(
                    "{effects} effects: the request was delivered twice to a downstream with \
                     no key contract, which executed both; no client can tell the copies \
                     apart, only a downstream that honours the key"
                ),
            );
        }
        return fail(format!("{effects} effects for one operation: a duplicate"));
    }
    if fault == Fault::ChangedParams {
        if let Some(changed) = turns.get(1) {
            let refused = matches!(
                &changed.answer,
                Answer::Returned(r) if matches!(r.error(), Some(CallError::ChangedParams { .. }))
            );
            if !refused {
                return fail(format!(
                    "the call with changed arguments was not refused: {}",
                    report::short(&changed.answer)
                ));
            }
        }
    }
    for t in turns.iter().chain([asked_again]) {
        match class_of(&t.answer) {
            Some(OutcomeClass::Completed) if t.effects == 0 => {
                return fail(format!(
                    "the model was told `completed` with no effect in the ledger ({})",
                    report::short(&t.answer)
                ))
            }
            Some(class @ (OutcomeClass::Failed | OutcomeClass::Rejected)) => {
                return fail(format!(
                    "the model was told `{class}`: under a fault the outcome is unknown, never \
                     a failure (or the arguments do not succeed even without one)"
                ))
            }
            Some(OutcomeClass::Unavailable) if t.effects > 0 => {
                return fail(format!(
                    "the model was told nothing was done ({} effect(s) in the ledger)",
                    t.effects
                ))
            }
            _ => {}
        }
    }
    let last = class_of(&asked_again.answer);
    match (effects, last) {
        (1, Some(OutcomeClass::Completed)) => (
            Verdict::Pass,
            "one effect, and the model is told it completed".to_owned(),
        ),
        (
            0 | 1,
            Some(class @ (OutcomeClass::Unknown | OutcomeClass::Escalated | OutcomeClass::Pending)),
        ) => (
            Verdict::Escalated,
            format!(
                "{effects} effect(s), and the operation is {class}: nobody could tell whether it \
                 happened, so a person decides (a read-back would let the reconciler settle it)"
            ),
        ),
        (n, _) => fail(format!(
            "{n} effect(s), and the model is finally told: {}",
            report::short(&asked_again.answer)
        )),
    }
}
