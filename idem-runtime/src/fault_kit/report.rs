//! What the kit found: a row per fault, a table, a verdict.

use std::fmt;
use std::time::Duration;

use super::Fault;
use crate::call::{CallError, ToolResult};
use crate::outcome::OutcomeClass;
use crate::reconcile::Decision;

/// The kit's judgement of one fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// Exactly one effect, and nothing the model was told contradicts the ledger.
    Pass,
    /// Not a failure: nobody could tell whether the effect happened, so the operation was
    /// left to a person (escalated, or still unknown) with the model told so, and no
    /// duplicate. Declare a read-back (`reconcile = …`) or a keyed downstream, and the
    /// reconciler can settle it itself.
    Escalated,
    /// Not a failure of the tool or of idem: a fault no client can prevent. A request the
    /// transport delivers twice reaches a downstream that has no key contract
    /// (`downstream = "unkeyed"`) twice, and it executes both: only the downstream could
    /// tell the copies apart. The report says so instead of failing, so a table of an
    /// unkeyed tool shows what its downstream's missing contract costs.
    NotPreventable,
    /// Not run: the kit lacked what the fault needs (changed arguments for
    /// [`Fault::ChangedParams`]).
    Skipped,
    /// A duplicate effect, a lost one, or the model told something the ledger contradicts.
    Fail,
}

impl Verdict {
    /// The verdict's word in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Escalated => "escalated",
            Verdict::NotPreventable => "not preventable",
            Verdict::Skipped => "skipped",
            Verdict::Fail => "FAIL",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one call of the run came back with.
#[derive(Clone, Debug)]
pub enum Answer {
    /// The registry answered (what the model reads is [`ToolResult::text`]).
    Returned(ToolResult),
    /// The worker crashed before it answered ([`Fault::Crash`]): nobody was told anything.
    Crashed,
}

/// One call of a fault's run: its answer, when it ended, and the ledger then.
#[derive(Clone, Debug)]
pub struct Turn {
    /// What the call came back with.
    pub answer: Answer,
    /// When the call ended, since the fault's run began (on tokio's clock).
    pub ended_after: Duration,
    /// The effects your ledger counted when the call ended.
    pub effects: usize,
}

/// One fault's run: the calls, the reconciler's pass, the ledger, the verdict.
#[derive(Clone, Debug)]
pub struct Row {
    pub(super) fault: Fault,
    pub(super) turns: Vec<Turn>,
    pub(super) decisions: Vec<Decision>,
    pub(super) asked_again: Option<Turn>,
    pub(super) effects: usize,
    pub(super) verdict: Verdict,
    pub(super) reason: String,
}

impl Row {
    /// The fault.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// The calls the kit made while the fault was on, in the order they ended.
    pub fn turns(&self) -> &[Turn] {
        &self.turns
    }

    /// What the reconciler decided once everything in flight had landed.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The model's call after the reconciler's pass (a new call id): what it is told once
    /// everything has settled. `None` when the fault was skipped.
    pub fn asked_again(&self) -> Option<&Turn> {
        self.asked_again.as_ref()
    }

    /// The effects your ledger counted at the end, after the reconciler and the last call.
    pub fn effects(&self) -> usize {
        self.effects
    }

    /// The verdict.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Why, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// What the model was told, call by call, then after the reconciler.
    pub fn told(&self) -> String {
        let mut told: Vec<String> = self.turns.iter().map(|t| short(&t.answer)).collect();
        if let Some(last) = &self.asked_again {
            let reconciled = match self.decisions.len() {
                0 => String::new(),
                n => format!("reconciler: {n} decided; "),
            };
            told.push(format!(
                "=> {reconciled}asked again: {}",
                short(&last.answer)
            ));
        }
        told.join(" | ")
    }
}

/// A short account of an answer, for the table.
pub(super) fn short(answer: &Answer) -> String {
    let result = match answer {
        Answer::Crashed => return "(worker crashed)".to_owned(),
        Answer::Returned(r) => r,
    };
    match result.as_result() {
        Ok(outcome) => {
            let class = outcome.class();
            let replayed = if result.replayed() { " (replayed)" } else { "" };
            match result.attempts() {
                n if n > 1 => format!("{class}{replayed} ({n} attempts)"),
                _ => format!("{class}{replayed}"),
            }
        }
        Err(CallError::ChangedParams { .. }) => "refused: changed params".to_owned(),
        Err(e) => format!("error: {e}"),
    }
}

/// The class of a returned answer, if it has one.
pub(super) fn class_of(answer: &Answer) -> Option<OutcomeClass> {
    match answer {
        Answer::Returned(r) => r.class(),
        Answer::Crashed => None,
    }
}

/// The kit's findings: a row per fault. `Display` prints the table.
#[derive(Clone, Debug)]
pub struct FaultReport {
    pub(super) tool: String,
    pub(super) rows: Vec<Row>,
}

impl FaultReport {
    /// The rows, in the order the faults ran.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The row of `fault`, when it ran.
    pub fn row(&self, fault: Fault) -> Option<&Row> {
        self.rows.iter().find(|r| r.fault == fault)
    }

    /// The rows judged [`Verdict::Fail`].
    pub fn failures(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.verdict == Verdict::Fail)
    }

    /// True when no row failed ([`Verdict::Escalated`], [`Verdict::NotPreventable`] and
    /// [`Verdict::Skipped`] are not failures; the table says why each is there).
    pub fn passed(&self) -> bool {
        self.failures().next().is_none()
    }

    /// Panics with the table unless [`FaultReport::passed`]: the one line a test needs.
    #[track_caller]
    pub fn assert_all_pass(&self) {
        if !self.passed() {
            let failed: Vec<&str> = self.failures().map(|r| r.fault.name()).collect();
            panic!(
                "the fault kit found {} failing fault(s) ({}):\n{self}",
                failed.len(),
                failed.join(", ")
            );
        }
    }
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault kit: `{}` under {} fault(s)",
            self.tool,
            self.rows.len()
        )?;
        writeln!(
            f,
            "{:<16} {:<8} {:<16} model was told",
            "fault", "effects", "verdict"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<16} {:<8} {:<16} {}",
                r.fault.name(),
                r.effects,
                r.verdict.as_str(),
                r.told()
            )?;
            if r.verdict != Verdict::Pass {
                writeln!(f, "{:<16} {:<8} {:<16} why: {}", "", "", "", r.reason)?;
            }
        }
        let count = |v: Verdict| self.rows.iter().filter(|r| r.verdict == v).count();
        write!(
            f,
            "{} pass, {} escalated, {} not preventable, {} skipped, {} failed",
            count(Verdict::Pass),
            count(Verdict::Escalated),
            count(Verdict::NotPreventable),
            count(Verdict::Skipped),
            count(Verdict::Fail)
        )
    }
}
