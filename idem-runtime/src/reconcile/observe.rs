//! Spans and metrics of reconciliation: one `idem.reconcile.pass` span per pass, one
//! `idem.reconcile.decision` span per record decided, and (feature `metrics`) counters of
//! passes, decisions and escalations. Names, fields and labels: [`crate::observe`].

use std::future::Future;

use tracing::field::Empty;
use tracing::Instrument;

use super::{Action, Decision, Reconciler};
use crate::observe::Timer;
use crate::store::{Record, ReleaseRecord, StoreError, Timestamp};

/// Which entry point a pass came through: the `mode` field and label.
#[derive(Clone, Copy, Debug)]
pub(super) enum Mode {
    /// [`Reconciler::run_once`]: a batch from where the last pass stopped.
    Once,
    /// [`Reconciler::run_all`]: every unknown and pending record.
    All,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Once => "once",
            Mode::All => "all",
        }
    }
}

/// The `action` field and label of a decision.
fn action_name(action: Action) -> &'static str {
    match action {
        Action::Retried => "retried",
        Action::Settled => "settled",
        Action::Released => "released",
        Action::Waiting => "waiting",
        Action::Escalated => "escalated",
        Action::Skipped => "skipped",
    }
}

/// Runs one pass inside its span and records it.
pub(super) async fn pass(
    mode: Mode,
    walk: impl Future<Output = Result<Vec<Decision>, StoreError>>,
) -> Result<Vec<Decision>, StoreError> {
    let span = tracing::info_span!(
        "idem.reconcile.pass",
        mode = mode.as_str(),
        decisions = Empty,
        escalated = Empty,
        error = Empty
    );
    let timer = Timer::start();
    let result = walk.instrument(span.clone()).await;
    match &result {
        Ok(decisions) => {
            let escalated = decisions
                .iter()
                .filter(|d| d.action == Action::Escalated)
                .count();
            span.record("decisions", decisions.len());
            span.record("escalated", escalated);
        }
        Err(e) => {
            span.record("error", e.kind());
        }
    }
    record_pass(mode, result.is_ok(), timer);
    result
}

impl Reconciler {
    /// [`Reconciler::decide`] inside a decision span, counted.
    pub(super) async fn decide_observed(&self, record: Record) -> Decision {
        let span = tracing::info_span!(
            "idem.reconcile.decision",
            key = record.key.as_str(),
            tool = &*record.tool,
            from = record.state.as_str(),
            attempts = record.attempts.len(),
            action = Empty
        );
        let decision = self.decide(record).instrument(span.clone()).await;
        span.record("action", action_name(decision.action));
        self.record_decision(&decision);
        decision
    }

    /// [`Reconciler::watch_one`] in an `idem.reconcile.released` span, its decision (if
    /// any) counted like a record's.
    pub(super) async fn watch_observed(
        &self,
        release: &ReleaseRecord,
        now: Timestamp,
    ) -> (bool, Option<Decision>) {
        let span = tracing::info_span!(
            "idem.reconcile.released",
            key = release.record.key.as_str(),
            tool = &*release.record.tool,
            by = release.by.as_str(),
            action = Empty
        );
        let (settled, decision) = self.watch_one(release, now).instrument(span.clone()).await;
        if let Some(d) = &decision {
            span.record("action", action_name(d.action));
            self.record_decision(d);
        }
        (settled, decision)
    }

    #[cfg(feature = "metrics")]
    fn record_decision(&self, decision: &Decision) {
        use crate::observe::{count, Label, ESCALATIONS, RECONCILE_DECISIONS, UNREGISTERED_TOOL};
        // A record's tool name comes from the store: a label only when registered here.
        let tool: Label = match self.registry.get(&decision.tool) {
            Some(t) => t.spec().name().to_owned().into(),
            None => UNREGISTERED_TOOL.into(),
        };
        let action = action_name(decision.action);
        count(
            RECONCILE_DECISIONS,
            &[("tool", tool.clone()), ("action", action.into())],
            1,
        );
        if decision.action == Action::Escalated {
            let reason = decision.reason_kind.unwrap_or_default().as_str();
            count(ESCALATIONS, &[("tool", tool), ("reason", reason.into())], 1);
        }
    }

    #[cfg(not(feature = "metrics"))]
    fn record_decision(&self, _decision: &Decision) {}
}

#[cfg(feature = "metrics")]
fn record_pass(mode: Mode, ok: bool, timer: Timer) {
    use crate::observe::{count, observe, RECONCILE_PASSES, RECONCILE_PASS_DURATION};
    let result = if ok { "ok" } else { "error" };
    count(
        RECONCILE_PASSES,
        &[("mode", mode.as_str().into()), ("result", result.into())],
        1,
    );
    observe(
        RECONCILE_PASS_DURATION,
        &[("mode", mode.as_str().into())],
        timer.seconds(),
    );
}

#[cfg(not(feature = "metrics"))]
fn record_pass(_mode: Mode, _ok: bool, _timer: Timer) {}
