//! Per-seed results and the figures over many seeds: per fault mode, the duplicate
//! side-effect rate and the exactly-once success rate, for each kind of downstream.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use idem::escalation::ReasonKind;

use crate::faults::{Fault, FaultSet};
use crate::sim::Config;

/// How an intent ended, after reconciliation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Final {
    /// Completed.
    Completed,
    /// Failed after execution.
    Failed,
    /// Escalated to a person (with evidence).
    Escalated,
    /// No record: never executed, or released as provably not executed.
    NotExecuted,
    /// Still running, unknown or pending: a violation after reconciliation.
    Unsettled,
}

/// One intent's result.
#[derive(Clone, Debug)]
pub struct IntentReport {
    /// Keyed downstream.
    pub keyed: bool,
    /// The faults that fired on it.
    pub fired: FaultSet,
    /// More than one effect for it in the ledger.
    pub duplicate: bool,
    /// Ended completed (or failed) with exactly one effect.
    pub exactly_once: bool,
    /// Effects in the ledger for it.
    pub effects: usize,
    /// How it ended.
    pub fin: Final,
    /// Why it was escalated, when it was.
    pub reason: Option<ReasonKind>,
}

/// One seed's result.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// What ran.
    pub config: Config,
    /// The fault modes that were on.
    pub faults: FaultSet,
    /// Calls the model made.
    pub calls: u64,
    /// Per intent.
    pub intents: Vec<IntentReport>,
    /// Broken invariants, one sentence each.
    pub violations: Vec<String>,
}

impl SeedReport {
    /// A seed that could not run at all.
    pub fn broken(cfg: &Config, why: String) -> Self {
        SeedReport {
            config: cfg.clone(),
            faults: FaultSet::NONE,
            calls: 0,
            intents: Vec::new(),
            violations: vec![why],
        }
    }

    /// The failure message: what broke and the command that replays it.
    pub fn failure(&self) -> Option<String> {
        if self.violations.is_empty() {
            return None;
        }
        let mut s = format!(
            "seed {} ({} store, faults: {}) broke {} invariant(s):\n",
            self.config.seed,
            self.config.store.name(),
            self.faults,
            self.violations.len()
        );
        for v in self.violations.iter().take(20) {
            let _ = writeln!(s, "  - {v}");
        }
        if self.violations.len() > 20 {
            let _ = writeln!(s, "  - … and {} more", self.violations.len() - 20);
        }
        let _ = write!(s, "replay: {}", self.config.replay_command());
        Some(s)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Row {
    intents: u64,
    duplicates: u64,
    exactly_once: u64,
    escalated: u64,
    not_executed: u64,
    freed_with_effect: u64,
}

impl Row {
    fn add(&mut self, r: &IntentReport) {
        self.intents += 1;
        self.duplicates += u64::from(r.duplicate);
        self.exactly_once += u64::from(r.exactly_once);
        self.escalated += u64::from(r.fin == Final::Escalated);
        self.not_executed += u64::from(r.fin == Final::NotExecuted && r.effects == 0);
        self.freed_with_effect += u64::from(r.fin == Final::NotExecuted && r.effects > 0);
    }
}

/// Figures over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    /// Seeds run.
    pub seeds: u64,
    /// Calls the model made.
    pub calls: u64,
    /// Intents run.
    pub intents: u64,
    /// Seeds that broke an invariant.
    pub failed_seeds: Vec<u64>,
    /// Violations in all.
    pub violations: u64,
    // [keyed, unkeyed] × (no fault fired, then one row per fault mode).
    rows: [[Row; Fault::ALL.len() + 1]; 2],
    all: [Row; 2],
    // Escalated intents by (fault mode row as in `rows`, or `Fault::ALL.len() + 1` for all
    // intents; keyed or not; reason kind).
    reasons: BTreeMap<(usize, usize, ReasonKind), u64>,
}

impl Totals {
    /// Adds one seed.
    pub fn add(&mut self, s: &SeedReport) {
        self.seeds += 1;
        self.calls += s.calls;
        self.intents += s.intents.len() as u64;
        if !s.violations.is_empty() {
            self.failed_seeds.push(s.config.seed);
            self.violations += s.violations.len() as u64;
        }
        for r in &s.intents {
            let k = usize::from(!r.keyed);
            self.all[k].add(r);
            if let Some(reason) = r.reason {
                let mut count = |row: usize| {
                    *self.reasons.entry((row, k, reason)).or_default() += 1;
                };
                count(Fault::ALL.len() + 1);
                if r.fired.is_empty() {
                    count(0);
                }
                for (j, f) in Fault::ALL.iter().enumerate() {
                    if r.fired.has(*f) {
                        count(j + 1);
                    }
                }
            }
            if r.fired.is_empty() {
                self.rows[k][0].add(r);
            }
            for (j, f) in Fault::ALL.iter().enumerate() {
                if r.fired.has(*f) {
                    self.rows[k][j + 1].add(r);
                }
            }
        }
    }

    /// Intents on which `f` fired (keyed and unkeyed).
    pub fn intents_with(&self, f: Fault) -> u64 {
        let j = Fault::ALL.iter().position(|x| *x == f).map_or(0, |j| j + 1);
        self.rows[0][j].intents + self.rows[1][j].intents
    }

    /// Duplicate effects over all unkeyed intents (each in a mode no client can prevent,
    /// or the seed reported a violation).
    pub fn unkeyed_duplicates(&self) -> u64 {
        self.all[1].duplicates
    }

    /// Duplicate effects over all keyed intents.
    pub fn keyed_duplicates(&self) -> u64 {
        self.all[0].duplicates
    }

    /// The per-mode table, in Markdown.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "| fault fired on the intent | keyed: intents | duplicate | exactly-once | escalated | not run | unkeyed: intents | duplicate | exactly-once | escalated | not run | key freed, effect landed |"
        );
        let _ = writeln!(
            s,
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let mut line = |name: &str, k: &Row, u: &Row| {
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                k.intents,
                pct(k.duplicates, k.intents),
                pct(k.exactly_once, k.intents),
                pct(k.escalated, k.intents),
                pct(k.not_executed + k.freed_with_effect, k.intents),
                u.intents,
                pct(u.duplicates, u.intents),
                pct(u.exactly_once, u.intents),
                pct(u.escalated, u.intents),
                pct(u.not_executed, u.intents),
                pct(u.freed_with_effect, u.intents),
            );
        };
        line("(none)", &self.rows[0][0], &self.rows[1][0]);
        for (j, f) in Fault::ALL.iter().enumerate() {
            line(f.name(), &self.rows[0][j + 1], &self.rows[1][j + 1]);
        }
        line("**all intents**", &self.all[0], &self.all[1]);
        s
    }

    /// Escalated intents by reason kind, per fault mode fired on them, in Markdown: each
    /// cell is keyed / unkeyed intents escalated for that reason; kinds nothing was escalated
    /// for are left out, and so are modes with no escalation.
    pub fn reasons_table(&self) -> String {
        let kinds: Vec<ReasonKind> = ReasonKind::ALL
            .iter()
            .copied()
            .filter(|kind| self.reasons.keys().any(|(_, _, k)| k == kind))
            .collect();
        let mut s = String::new();
        if kinds.is_empty() {
            let _ = writeln!(s, "(nothing escalated)");
            return s;
        }
        let _ = write!(
            s,
            "| fault fired on the intent (keyed / unkeyed escalated) |"
        );
        for k in &kinds {
            let _ = write!(s, " {k} |");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "|---|{}", "---:|".repeat(kinds.len()));
        let names = std::iter::once("(none)")
            .chain(Fault::ALL.iter().map(|f| f.name()))
            .chain(std::iter::once("**all intents**"));
        for (row, name) in names.enumerate() {
            let cell = |k: usize, kind: ReasonKind| {
                self.reasons.get(&(row, k, kind)).copied().unwrap_or(0)
            };
            if kinds
                .iter()
                .all(|kind| cell(0, *kind) + cell(1, *kind) == 0)
            {
                continue;
            }
            let _ = write!(s, "| {name} |");
            for kind in &kinds {
                let _ = write!(s, " {} / {} |", cell(0, *kind), cell(1, *kind));
            }
            let _ = writeln!(s);
        }
        s
    }

    /// A one-paragraph summary.
    pub fn summary(&self) -> String {
        format!(
            "{} seeds, {} calls, {} intents; keyed duplicates: {}; unkeyed duplicates: {} (all in modes no client can prevent, else they are violations); seeds with violations: {} ({} violations){}",
            self.seeds,
            self.calls,
            self.intents,
            self.all[0].duplicates,
            self.all[1].duplicates,
            self.failed_seeds.len(),
            self.violations,
            if self.failed_seeds.is_empty() {
                String::new()
            } else {
                format!(
                    "; failing seeds: {:?}",
                    &self.failed_seeds[..self.failed_seeds.len().min(20)]
                )
            }
        )
    }
}

fn pct(n: u64, d: u64) -> String {
    if d == 0 {
        "–".to_owned()
    } else if n == 0 {
        "0".to_owned()
    } else {
        format!("{:.3}%", 100.0 * n as f64 / d as f64)
    }
}
