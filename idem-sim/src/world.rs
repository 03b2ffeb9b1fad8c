//! What every part of one simulated run shares: the seeded generator, the fault modes this
//! seed turned on, whether faults are being injected right now, and which faults fired on
//! which intent (for the per-mode figures).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use idem::IdemKey;

use crate::faults::{Fault, FaultSet};
use crate::rng::SplitMix64;

/// The handler's timeout.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// The claim's lease (renewed every third of it while the handler runs).
pub const LEASE: Duration = Duration::from_secs(3);
/// The in-flight bound the tools declare: how long after its timeout a request can land.
pub const IN_FLIGHT_BOUND: Duration = Duration::from_secs(4);
/// How long the keyed downstream keeps an idempotency key.
pub const KEY_RETENTION: Duration = Duration::from_secs(3600);
/// The keyed tool's safe retry window: the key retention minus a margin.
pub const WINDOW: Duration = Duration::from_secs(3000);

/// State shared by the downstream, the stores, the tools and the model of one run.
#[derive(Debug)]
pub struct World {
    rng: Mutex<SplitMix64>,
    faults: FaultSet,
    active: AtomicBool,
    fired: Mutex<Vec<FaultSet>>,
    owners: Mutex<BTreeMap<IdemKey, usize>>,
    escalated: Mutex<BTreeSet<IdemKey>>,
}

impl World {
    /// A world for `intents` intents, with `rng` and the fault modes `faults`.
    pub fn new(rng: SplitMix64, faults: FaultSet, intents: usize) -> Self {
        World {
            rng: Mutex::new(rng),
            faults,
            active: AtomicBool::new(true),
            fired: Mutex::new(vec![FaultSet::NONE; intents]),
            owners: Mutex::new(BTreeMap::new()),
            escalated: Mutex::new(BTreeSet::new()),
        }
    }

    /// The seeded generator.
    pub fn rng(&self) -> MutexGuard<'_, SplitMix64> {
        lock(&self.rng)
    }

    /// The fault modes this run has on.
    pub fn faults(&self) -> FaultSet {
        self.faults
    }

    /// Whether `f` is on and faults are being injected now.
    pub fn on(&self, f: Fault) -> bool {
        self.faults.has(f) && self.active.load(Ordering::Relaxed)
    }

    /// With probability `p`, when `f` is on: the fault fires.
    pub fn roll(&self, f: Fault, p: f64) -> bool {
        self.on(f) && self.rng().chance(p)
    }

    /// Stops injecting faults (the outage is over; reconciliation runs on a healthy system).
    pub fn heal(&self) {
        self.active.store(false, Ordering::Relaxed);
    }

    /// Notes that `f` fired on `intent`.
    pub fn fired(&self, intent: usize, f: Fault) {
        if let Some(s) = lock(&self.fired).get_mut(intent) {
            s.insert(f);
        }
    }

    /// Notes that `f` fired on the intent `key` belongs to, if known.
    pub fn fired_on_key(&self, key: &IdemKey, f: Fault) {
        let owner = lock(&self.owners).get(key).copied();
        if let Some(i) = owner {
            self.fired(i, f);
        }
    }

    /// The faults that fired on each intent.
    pub fn fired_per_intent(&self) -> Vec<FaultSet> {
        lock(&self.fired).clone()
    }

    /// Remembers that `key` belongs to `intent`.
    pub fn own(&self, key: &IdemKey, intent: usize) {
        lock(&self.owners).insert(key.clone(), intent);
    }

    /// The intent `key` belongs to.
    pub fn owner(&self, key: &IdemKey) -> Option<usize> {
        lock(&self.owners).get(key).copied()
    }

    /// Every key seen, with its intent.
    pub fn keys(&self) -> BTreeMap<IdemKey, usize> {
        lock(&self.owners).clone()
    }

    /// Notes an escalation delivered to the sink.
    pub fn escalation(&self, key: &IdemKey) {
        lock(&self.escalated).insert(key.clone());
    }

    /// Whether an escalation for `key` reached the sink.
    pub fn was_escalated(&self, key: &IdemKey) -> bool {
        lock(&self.escalated).contains(key)
    }
}

/// Locks, ignoring poison: a panic elsewhere already fails the run.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
