//! `idem-sim`: runs the simulation and prints the figures per fault mode.
//!
//! ```text
//! idem-sim [--store memory|sqlite|redis|postgres] [--seed N] [--calls N | --seeds N] [--intents N]
//!          [--workers N] [--faults all|none|name,name…] [--jobs N]
//! ```
//!
//! With `--seed` alone it runs that one seed (a replay); with `--calls` or `--seeds` it
//! runs consecutive seeds from `--seed` (default 1). Exits 1 if any seed broke an
//! invariant, after printing each failing seed's replay command.
//!
//! `--store redis` and `--store postgres` need the `redis` / `postgres` features and a
//! server in `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` (each seed uses its own key prefix or
//! schema and removes it when it ends).

use std::process::ExitCode;
use std::time::Instant;

use idem_sim::{run_many, Budget, Config, FaultSet, StoreKind};

const USAGE: &str =
    "usage: idem-sim [--store memory|sqlite|redis|postgres] [--seed N] [--calls N | --seeds N] \
[--intents N] [--workers N] [--faults all|none|name,…] [--jobs N]";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idem-sim: {e}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<ExitCode, String> {
    let mut args = std::env::args().skip(1);
    let mut store = StoreKind::Memory;
    let mut seed = 1u64;
    let mut budget = Budget::Seeds(1);
    let mut intents = None;
    let mut workers = None;
    let mut faults = None;
    let mut jobs = 1usize;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.replace('_', "")
                .parse::<u64>()
                .map_err(|e| format!("{flag}: {e}"))
        };
        match flag.as_str() {
            "--store" => store = StoreKind::parse(&value()?)?,
            "--seed" => seed = number(value()?)?,
            "--calls" => budget = Budget::Calls(number(value()?)?),
            "--seeds" => budget = Budget::Seeds(number(value()?)?),
            "--intents" => intents = Some(number(value()?)? as usize),
            "--workers" => workers = Some(number(value()?)?.max(1) as usize),
            "--faults" => faults = Some(FaultSet::parse(&value()?)?),
            "--jobs" => jobs = number(value()?)?.max(1) as usize,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let mut template = Config::new(seed, store);
    if let Some(n) = intents {
        template.intents = n;
    }
    if let Some(n) = workers {
        template.workers = n;
    }
    template.faults = faults;

    let started = Instant::now();
    let single = matches!(budget, Budget::Seeds(1));
    let totals = run_many(&template, seed, budget, jobs, &|report| {
        if let Some(f) = report.failure() {
            eprintln!("{f}");
        } else if single {
            eprintln!(
                "seed {} ({} store, faults: {}): {} calls, every invariant held",
                report.config.seed,
                report.config.store.name(),
                report.faults,
                report.calls
            );
        }
    });
    let took = started.elapsed();
    println!(
        "store {}, seeds {}..={}, {} intents and {} workers per seed, faults {}",
        store.name(),
        seed,
        seed + totals.seeds.saturating_sub(1),
        template.intents,
        template.workers,
        faults.map_or("random per seed".to_owned(), |f| f.to_string()),
    );
    println!("{}", totals.summary());
    println!(
        "wall time {:.1} s ({:.0} calls/s)",
        took.as_secs_f64(),
        totals.calls as f64 / took.as_secs_f64().max(1e-9)
    );
    println!();
    println!("{}", totals.table());
    println!("Escalations by reason kind:");
    println!();
    println!("{}", totals.reasons_table());
    Ok(if totals.failed_seeds.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
