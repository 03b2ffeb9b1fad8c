//! # The main job: `retry_matrix`
//!
//! The seed experiment idem exists to beat, reproduced, and then beaten.
//!
//! A mock billing service ([`billing`]) commits charges to a ledger and honours idempotency
//! keys the Stripe way. A fault injector breaks the **first** request of every run
//! ([`faults`]). Five client strategies ([`strategies`]) try to charge customer `acme` 4900
//! cents exactly once (task `task-42`): up to 3 attempts, 1 s apart; then the clock advances
//! an hour so everything still in flight lands, and the ledger is counted. More than one
//! charge is a `DUPLICATE`.
//!
//! The seed block has the seed's three faults plus a no-fault baseline (`none`): its "16 runs"
//! are four faults times the four hand-rolled strategies, and its known result is 7
//! duplicates, every one of them reported "completed" to the agent. The fifth row, `idem`,
//! is the charge tool (`#[tool(write, downstream = "keyed")]`) called through a `Registry`:
//! the key comes from `WriteCtx` and goes to the service, and every run ends in exactly one
//! charge. That row runs through idem's fault kit (`idem::fault_kit`, the kit users run on
//! their own tools), so the main job and the kit cannot drift apart: the kit injects each
//! fault at the charge tool's handler (the network in front of the service breaks nothing in
//! idem's runs), settles the unknowns with a reconciler, asks again as the model would, and
//! judges the run on the service's ledger (`--json` prints its verdict). The extended block
//! adds ten
//! more faults, all five strategies each; the last two are a service that sheds load with
//! `503 Service Unavailable` and a `Retry-After`, without executing: briefly
//! (`unavailable-503`, idem waits it out and charges once) and past idem's retry budget
//! (`outage-503`, idem says "unavailable, not executed … nothing was done" and charges once
//! when the model calls again a minute later).
//!
//! Everything runs on tokio's paused clock, so the 30 s timeouts and the 2 h tails cost no
//! real time, and the output is the same on every run.
//!
//! ```sh
//! cargo run --example retry_matrix            # the table
//! cargo run --example retry_matrix -- --json  # one JSON object per run
//! ```

mod billing;
mod faults;
mod strategies;

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use billing::{Charge, ChargeRequest, ClientError};
use faults::Fault;
use idem::fault_kit::FaultKit;
use serde_json::json;
use strategies::{Belief, Strategy, Told, Turn, World, AMOUNT, CUSTOMER, RUN_ID};

/// The amount the changed-params retry sends instead of [`AMOUNT`].
const CHANGED_AMOUNT: u64 = 9900;

/// How long a crashed worker stays down: longer than the charge tool's lease, so idem sees
/// a dead worker's claim, not a live one.
const RESTART_AFTER: Duration = Duration::from_secs(120);

/// Which table a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// The seed's faults: its "16 runs", plus the idem row.
    Seed,
    /// The seed's closing check (key reuse with another amount); not one of the 16 runs.
    SeedCheck,
    /// The faults beyond the seed.
    Extended,
}

impl Block {
    fn name(self) -> &'static str {
        match self {
            Block::Seed => "seed",
            Block::SeedCheck => "seed-check",
            Block::Extended => "extended",
        }
    }
}

/// One strategy under one fault, and what it left behind.
struct Run {
    block: Block,
    fault: &'static str,
    strategy: Strategy,
    /// Every charge the service committed.
    ledger: Vec<Charge>,
    /// What the agent was told, turn by turn.
    told: Vec<Told>,
    /// How many charges the ledger held when each turn ended (for the two concurrent
    /// turns, when both had).
    charges_after_turn: Vec<usize>,
    /// idem only: what one reconciliation pass decided once everything had landed, and what
    /// the model was told when it asked again.
    reconciled: Option<String>,
    /// idem only: the fault kit's verdict on the run (`pass`, `escalated`, …).
    kit_verdict: Option<&'static str>,
}

impl Run {
    fn charges(&self) -> usize {
        self.ledger.len()
    }

    fn is_duplicate(&self) -> bool {
        self.charges() > 1
    }

    fn verdict(&self) -> &'static str {
        match self.charges() {
            0 => "NOT CHARGED",
            1 => "ok",
            _ => "DUPLICATE",
        }
    }

    fn report(&self) -> String {
        let texts: Vec<&str> = self.told.iter().map(|t| t.text.as_str()).collect();
        match &self.reconciled {
            Some(r) => format!("{} => {r}", texts.join(" | ")),
            None => texts.join(" | "),
        }
    }

    /// True when every answer the agent got said "completed": it has no reason to look.
    fn reported_completed(&self) -> bool {
        let answers = || self.told.iter().filter(|t| t.belief != Belief::Crashed);
        answers().next().is_some() && answers().all(|t| t.belief == Belief::Completed)
    }
}

/// The JSON shape of a run (`--json`).
#[derive(serde::Serialize)]
struct RunJson<'a> {
    block: &'a str,
    fault: &'a str,
    strategy: &'a str,
    charges: usize,
    verdict: &'a str,
    report: String,
    reported_completed: bool,
    charges_after_turn: &'a [usize],
    ledger: &'a [Charge],
    #[serde(skip_serializing_if = "Option::is_none")]
    kit_verdict: Option<&'a str>,
}

impl<'a> From<&'a Run> for RunJson<'a> {
    fn from(run: &'a Run) -> Self {
        RunJson {
            block: run.block.name(),
            fault: run.fault,
            strategy: run.strategy.name(),
            charges: run.charges(),
            verdict: run.verdict(),
            report: run.report(),
            reported_completed: run.reported_completed(),
            charges_after_turn: &run.charges_after_turn,
            ledger: &run.ledger,
            kit_verdict: run.kit_verdict,
        }
    }
}

#[tokio::main(flavor = "current_thread", start_paused = true)]
async fn main() -> ExitCode {
    let json = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--json") => true,
        Some("-h" | "--help") => {
            println!("usage: retry_matrix [--json]");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("retry_matrix: unknown argument `{other}`\nusage: retry_matrix [--json]");
            return ExitCode::from(2);
        }
    };

    let out = render(json).await;
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        // `retry_matrix | head` is not an error.
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("retry_matrix: cannot write the output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Every run, seed block then extended block, rendered as the tables or (`json`) one JSON
/// object per line. `tests/retry_matrix.rs` asserts on the JSON, so a regression cannot
/// print a worse table and still pass. Call it on tokio's paused clock.
pub(crate) async fn render(json: bool) -> String {
    let mut runs = Vec::new();
    for fault in Fault::SEED {
        for strategy in Strategy::ALL {
            runs.push(run(Block::Seed, fault, strategy).await);
        }
    }
    let key_reuse = key_reuse_check().await;
    for fault in Fault::EXTENDED {
        for strategy in Strategy::ALL {
            runs.push(run(Block::Extended, fault, strategy).await);
        }
    }

    let mut out = String::new();
    if json {
        for r in runs.iter().chain([&key_reuse]) {
            let line = serde_json::to_string(&RunJson::from(r)).expect("a run serializes");
            out.push_str(&line);
            out.push('\n');
        }
    } else {
        write_tables(&mut out, &runs, &key_reuse).expect("writing to a String cannot fail");
    }
    out
}

/// Runs `strategy` under `fault` in a fresh world and counts the ledger.
async fn run(block: Block, fault: Fault, strategy: Strategy) -> Run {
    if strategy == Strategy::Idem {
        return idem_run(block, fault).await;
    }
    let world = World::new(fault.contract(), fault.glitch(strategy));
    let mut turns = Turns::new(&world, fault.stamps_turns());
    let first = Turn::first();
    match fault {
        Fault::Concurrent => {
            let (a, b) = tokio::join!(strategy.run(&world, &first), strategy.run(&world, &first));
            turns.ended(a);
            turns.ended(b);
        }
        Fault::Reissue => {
            turns.ended(strategy.run(&world, &first).await);
            turns.ended(strategy.run(&world, &first.reissued()).await);
        }
        Fault::Crash => {
            let worker = {
                let (world, turn) = (world.clone(), first.clone());
                tokio::spawn(async move { strategy.run(&world, &turn).await })
            };
            // The charge has committed and the worker is waiting for its response: kill it.
            // Aborting drops its future mid-call, as a dying process would.
            world.service.first_commit().await;
            worker.abort();
            let _ = worker.await;
            turns.ended(Told::crashed());
            tokio::time::sleep(RESTART_AFTER).await;
            turns.ended(strategy.run(&world, &first).await);
        }
        Fault::ChangedParams => {
            let turn = first.with_amounts([AMOUNT, CHANGED_AMOUNT, CHANGED_AMOUNT]);
            turns.ended(strategy.run(&world, &turn).await);
        }
        _ => {
            turns.ended(strategy.run(&world, &first).await);
            // Told to try later (or that it failed), the model calls again in a later turn.
            if let Some(later) = fault.later_call() {
                tokio::time::sleep(later).await;
                turns.ended(strategy.run(&world, &first.reissued()).await);
            }
        }
    }
    let Turns {
        told,
        charges_after_turn,
        ..
    } = turns;
    tokio::time::sleep(fault.settle_time()).await;
    Run {
        block,
        fault: fault.name(),
        strategy,
        // Counted after the reconciler too: settling must not charge again.
        ledger: world.service.ledger_snapshot(),
        told,
        charges_after_turn,
        reconciled: None,
        kit_verdict: None,
    }
}

/// idem under `fault`: the charge tool in a fresh world, through idem's fault kit (the kit
/// users run on their own tools), which injects the fault at the tool's handler, waits until
/// everything in flight has landed, reconciles, and asks once more as the model would. The
/// world's network breaks nothing: the kit does.
async fn idem_run(block: Block, fault: Fault) -> Run {
    let world = World::new(fault.contract(), None);
    let subject_world = world.clone();
    let kit = FaultKit::new(
        json!({ "customer": CUSTOMER, "amount": AMOUNT }),
        move || subject_world.subject(),
    )
    .changed_args(json!({ "customer": CUSTOMER, "amount": CHANGED_AMOUNT }))
    .faults([fault.kit_fault()])
    .retry_policy(strategies::retry_policy())
    .run_id(RUN_ID);
    let report = fault
        .tune(kit)
        .run()
        .await
        .expect("the charge tool registers");
    let mut told = Vec::new();
    let mut charges_after_turn = Vec::new();
    let mut reconciled = None;
    let mut kit_verdict = None;
    if let Some(row) = report.rows().first() {
        kit_verdict = Some(row.verdict().as_str());
        for turn in row.turns() {
            let mut t = strategies::told_of(&turn.answer);
            if fault.stamps_turns() {
                let at = turn.ended_after.as_secs_f64();
                t.text = format!("{} [t+{at:.1}s, charges={}]", t.text, turn.effects);
            }
            told.push(t);
            charges_after_turn.push(turn.effects);
        }
        let decided: Vec<&str> = row.decisions().iter().map(|d| d.detail.as_str()).collect();
        if let (false, Some(last)) = (decided.is_empty(), row.asked_again()) {
            reconciled = Some(format!(
                "reconciler: {}; asked again: {}",
                decided.join(", "),
                strategies::told_of(&last.answer).text
            ));
        }
    }
    Run {
        block,
        fault: fault.name(),
        strategy: Strategy::Idem,
        // Counted after the kit's reconciler and last call: settling must not charge again.
        ledger: world.service.ledger_snapshot(),
        told,
        charges_after_turn,
        reconciled,
        kit_verdict,
    }
}

/// The turns of one run as they end: what the agent was told, and the ledger's size then.
struct Turns<'w> {
    world: &'w World,
    began: tokio::time::Instant,
    /// Append the simulated time and the ledger's size to each turn's text.
    stamp: bool,
    told: Vec<Told>,
    charges_after_turn: Vec<usize>,
}

impl<'w> Turns<'w> {
    fn new(world: &'w World, stamp: bool) -> Self {
        Turns {
            world,
            began: tokio::time::Instant::now(),
            stamp,
            told: Vec::new(),
            charges_after_turn: Vec::new(),
        }
    }

    /// A turn ended with the agent told `told`.
    fn ended(&mut self, mut told: Told) {
        let charges = self.world.service.ledger_snapshot().len();
        if self.stamp {
            let at = self.began.elapsed().as_secs_f64();
            told.text = format!("{} [t+{at:.1}s, charges={charges}]", told.text);
        }
        self.told.push(told);
        self.charges_after_turn.push(charges);
    }
}

/// The seed's last check: the pinned key sent again with a different amount is refused.
async fn key_reuse_check() -> Run {
    let world = World::new(billing::KeyContract::Honoured, None);
    let send = |amount| {
        world.client().create_charge(ChargeRequest {
            customer: CUSTOMER.into(),
            amount,
            idempotency_key: Some("task-42-charge".into()),
        })
    };
    let first = send(AMOUNT).await;
    let after_first = world.service.ledger_snapshot().len();
    let reused = send(CHANGED_AMOUNT).await;
    let after_reuse = world.service.ledger_snapshot().len();
    let told = |r: Result<Charge, ClientError>| match r {
        Ok(c) => Told::new(Belief::Completed, format!("completed {}", c.id)),
        Err(ClientError::Api(e)) if e.status == 400 => {
            Told::new(Belief::Refused, format!("refused: {e}"))
        }
        Err(e) => Told::new(Belief::Failed, format!("error {e}")),
    };
    Run {
        block: Block::SeedCheck,
        fault: "key-reuse",
        strategy: Strategy::PinnedKey,
        ledger: world.service.ledger_snapshot(),
        told: vec![told(first), told(reused)],
        charges_after_turn: vec![after_first, after_reuse],
        reconciled: None,
        kit_verdict: None,
    }
}

fn write_tables(out: &mut String, runs: &[Run], key_reuse: &Run) -> fmt::Result {
    writeln!(out, "retry_matrix: charge customer \"{CUSTOMER}\" {AMOUNT} cents exactly once (task \"task-42\")")?;
    writeln!(
        out,
        "every strategy: up to 3 attempts, 1 s apart, a 30 s client timeout; then the clock"
    )?;
    writeln!(out, "advances an hour (3 h for late-tail) so everything in flight lands, and the ledger is counted")?;

    let seed: Vec<&Run> = runs.iter().filter(|r| r.block == Block::Seed).collect();
    writeln!(out)?;
    writeln!(out, "== seed: the fault breaks the first call ==")?;
    write_rows(out, &seed)?;
    writeln!(out)?;
    write_seed_summary(out, &seed, key_reuse)?;

    let extended: Vec<&Run> = runs.iter().filter(|r| r.block == Block::Extended).collect();
    writeln!(out)?;
    writeln!(out, "== extended faults ==")?;
    let tails: Vec<String> = Strategy::SEED
        .iter()
        .map(|s| format!("{} +{}", s.name(), hms(faults::late_tail(*s))))
        .collect();
    writeln!(
        out,
        "(late-tail: the first request commits at {}; idem's, from the fault kit, starts just before the tool's in-flight bound)",
        tails.join(", ")
    )?;
    write_rows(out, &extended)?;
    writeln!(out)?;
    write_totals(out, runs)
}

fn write_rows(out: &mut String, runs: &[&Run]) -> fmt::Result {
    writeln!(
        out,
        "{:<15} {:<20} {:<10} {:<10} agent was told",
        "fault", "strategy", "charges", "verdict"
    )?;
    for r in runs {
        writeln!(
            out,
            "{:<15} {:<20} {:<10} {:<10} {}",
            r.fault,
            r.strategy.name(),
            format!("charges={}", r.charges()),
            r.verdict(),
            r.report()
        )?;
    }
    Ok(())
}

fn write_seed_summary(out: &mut String, seed: &[&Run], key_reuse: &Run) -> fmt::Result {
    let hand_rolled: Vec<&&Run> = seed
        .iter()
        .filter(|r| Strategy::SEED.contains(&r.strategy))
        .collect();
    let duplicates: Vec<&&&Run> = hand_rolled.iter().filter(|r| r.is_duplicate()).collect();
    let reported = duplicates.iter().filter(|r| r.reported_completed()).count();
    let per_strategy: Vec<String> = Strategy::SEED
        .iter()
        .map(|s| {
            let faults: Vec<&str> = duplicates
                .iter()
                .filter(|r| r.strategy == *s)
                .map(|r| r.fault)
                .collect();
            match faults.len() {
                0 => format!("{} 0", s.name()),
                n => format!("{} {n} ({})", s.name(), faults.join(", ")),
            }
        })
        .collect();
    writeln!(
        out,
        "seed: {} duplicates of {} runs: {}",
        duplicates.len(),
        hand_rolled.len(),
        per_strategy.join("; ")
    )?;
    writeln!(
        out,
        "seed: {reported} of {} duplicates reported \"completed\"",
        duplicates.len()
    )?;
    writeln!(out,
        "seed: key reuse with a different amount ({CHANGED_AMOUNT} instead of {AMOUNT}): {}; charges={}",
        key_reuse.told.last().map_or("", |t| t.text.as_str()),
        key_reuse.charges()
    )?;
    let idem: Vec<&&Run> = seed
        .iter()
        .filter(|r| r.strategy == Strategy::Idem)
        .collect();
    let single = idem.iter().filter(|r| r.charges() == 1).count();
    writeln!(
        out,
        "idem: exactly 1 charge in {single} of {} seed runs",
        idem.len()
    )
}

fn write_totals(out: &mut String, runs: &[Run]) -> fmt::Result {
    let faults = runs.iter().filter(|r| r.strategy == Strategy::Idem).count();
    writeln!(out, "== totals over all {faults} faults ==")?;
    writeln!(
        out,
        "{:<20} {:<12} reported completed",
        "strategy", "duplicates"
    )?;
    let mut all_duplicates = 0;
    let mut all_reported = 0;
    for s in Strategy::ALL {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.strategy == s).collect();
        let dups: Vec<&&Run> = mine.iter().filter(|r| r.is_duplicate()).collect();
        let reported = dups.iter().filter(|r| r.reported_completed()).count();
        all_duplicates += dups.len();
        all_reported += reported;
        writeln!(
            out,
            "{:<20} {:<12} {}",
            s.name(),
            format!("{} of {}", dups.len(), mine.len()),
            reported
        )?;
    }
    writeln!(
        out,
        "duplicates reported as completed: {all_reported} of {all_duplicates}"
    )?;
    let idem: Vec<&Run> = runs
        .iter()
        .filter(|r| r.strategy == Strategy::Idem)
        .collect();
    let single = idem.iter().filter(|r| r.charges() == 1).count();
    writeln!(
        out,
        "idem: exactly 1 charge in {single} of {} runs",
        idem.len()
    )
}

/// `1h02m13s`, `47m05s`, `58s`.
fn hms(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s / 60) % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}
