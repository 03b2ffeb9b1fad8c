//! A seeded deterministic simulation of idem under faults.
//!
//! Many workers (each a [`idem::Registry`]; over SQLite each with its own connection to one
//! file) serve a stream of intents from a simulated model, against a simulated payments
//! downstream that keeps a ledger of every effect. Faults are injected at every boundary —
//! the downstream, the store, the workers, the model — each switchable, mixed at random per
//! seed. Time is tokio's paused clock, so leases, timeouts, retention and the downstream's
//! delays all move together and a seed replays the same run. At the end of every seed the
//! system heals, the [`idem::Reconciler`] settles what it can with read-backs, and the
//! invariants are checked on the ledger and the store (see [`check`]).
//!
//! Over Redis and PostgreSQL (features `redis`, `postgres`) every store operation runs on a
//! separate real-time runtime while the simulation waits, so virtual time holds there too
//! (see `src/net.rs`).
//!
//! `cargo run -p idem-sim --release -- --calls 1000000 --store memory --seed 1`
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod check;
pub mod downstream;
pub mod faults;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod net;
pub mod report;
pub mod rng;
pub mod sim;
pub mod store;
pub mod tools;
pub mod world;

pub use faults::{Fault, FaultSet};
pub use report::{SeedReport, Totals};
pub use sim::{run_seed, Config, StoreKind};

/// How many seeds [`run_many`] runs.
#[derive(Clone, Copy, Debug)]
pub enum Budget {
    /// Seeds until at least this many calls were made (the seeds run stay contiguous from
    /// the first; [`Totals::seeds`] says how many, for an exact rerun with `Seeds`).
    Calls(u64),
    /// Exactly this many seeds.
    Seeds(u64),
}

/// Runs seeds `first`, `first + 1`, … within `budget`, on `jobs` threads (each seed on its
/// own single-threaded runtime); `each` sees every seed's report as it finishes (in no
/// particular order when `jobs > 1`).
pub fn run_many(
    template: &Config,
    first: u64,
    budget: Budget,
    jobs: usize,
    each: &(dyn Fn(&SeedReport) + Sync),
) -> Totals {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    let totals = Mutex::new(Totals::default());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let seed = match budget {
                    Budget::Calls(calls) => {
                        if done.load(Ordering::Relaxed) >= calls {
                            break;
                        }
                        next.fetch_add(1, Ordering::Relaxed)
                    }
                    Budget::Seeds(n) => {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= first.saturating_add(n) {
                            break;
                        }
                        seed
                    }
                };
                let mut cfg = template.clone();
                cfg.seed = seed;
                let report = run_seed(&cfg);
                done.fetch_add(report.calls, Ordering::Relaxed);
                each(&report);
                world::lock(&totals).add(&report);
            });
        }
    });
    totals.into_inner().unwrap_or_else(|p| p.into_inner())
}
