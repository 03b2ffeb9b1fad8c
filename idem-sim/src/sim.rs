//! One seeded run: workers, a downstream, a stream of intents from a simulated model, the
//! faults the seed turned on, then reconciliation on a healed system and the checks.

use std::sync::Arc;
use std::time::Duration;

use idem::{
    escalation::CallbackSink,
    reconcile::Action,
    registry::RetryPolicy,
    store::{Clock, Timestamp, TokioClock},
    CallError, IdemStore, MemoryStore, Outcome, Reconciler, Registry, ToolCall, ToolResult,
};
use serde_json::{json, Value};

use crate::check::{check, IntentPlan, Told};
use crate::downstream::Downstream;
use crate::faults::{Fault, FaultSet};
use crate::report::SeedReport;
use crate::rng::SplitMix64;
use crate::store::{Reopen, SimStore, SkewedClock};
use crate::tools::{ChargeTool, Worker, KEYED, UNKEYED};
use crate::world::{World, LEASE};

/// Which store the workers share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// One `MemoryStore` shared by every worker's registry.
    Memory,
    /// One SQLite file, opened by every worker separately.
    #[cfg(feature = "sqlite")]
    Sqlite,
    /// One Redis (`IDEM_REDIS_URL`), a key prefix per seed, each worker with its own
    /// connection.
    #[cfg(feature = "redis")]
    Redis,
    /// One PostgreSQL (`IDEM_POSTGRES_URL`), a schema per seed, each worker with its own
    /// connection pool.
    #[cfg(feature = "postgres")]
    Postgres,
}

impl StoreKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            #[cfg(feature = "sqlite")]
            StoreKind::Sqlite => "sqlite",
            #[cfg(feature = "redis")]
            StoreKind::Redis => "redis",
            #[cfg(feature = "postgres")]
            StoreKind::Postgres => "postgres",
        }
    }

    /// The cargo feature that builds it in, if it needs one beyond the defaults.
    pub fn feature(self) -> Option<&'static str> {
        match self {
            #[cfg(feature = "redis")]
            StoreKind::Redis => Some("redis"),
            #[cfg(feature = "postgres")]
            StoreKind::Postgres => Some("postgres"),
            _ => None,
        }
    }

    /// The networked store behind it, if it is one.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    fn backend(self) -> Option<crate::net::Backend> {
        match self {
            #[cfg(feature = "redis")]
            StoreKind::Redis => Some(crate::net::Backend::Redis),
            #[cfg(feature = "postgres")]
            StoreKind::Postgres => Some(crate::net::Backend::Postgres),
            _ => None,
        }
    }

    /// Parses [`StoreKind::name`].
    pub fn parse(s: &str) -> Result<StoreKind, String> {
        match s {
            "memory" => Ok(StoreKind::Memory),
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok(StoreKind::Sqlite),
            #[cfg(feature = "redis")]
            "redis" => Ok(StoreKind::Redis),
            #[cfg(feature = "postgres")]
            "postgres" => Ok(StoreKind::Postgres),
            other if ["sqlite", "redis", "postgres"].contains(&other) => Err(format!(
                "store `{s}` is not built in: build with `--features {s}`"
            )),
            _ => Err(format!(
                "unknown store `{s}` (memory, sqlite, redis or postgres)"
            )),
        }
    }
}

/// What one seed runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed: every random choice of the run comes from it.
    pub seed: u64,
    /// The store.
    pub store: StoreKind,
    /// How many intents the model runs.
    pub intents: usize,
    /// How many workers (registries) serve calls.
    pub workers: usize,
    /// The fault modes; `None`: a random set drawn from the seed.
    pub faults: Option<FaultSet>,
}

impl Config {
    /// A config with the simulation's defaults.
    pub fn new(seed: u64, store: StoreKind) -> Self {
        Config {
            seed,
            store,
            intents: 100,
            workers: 4,
            faults: None,
        }
    }

    /// The command that replays this seed (over Redis or PostgreSQL, with the server's URL
    /// in `IDEM_REDIS_URL` or `IDEM_POSTGRES_URL`).
    pub fn replay_command(&self) -> String {
        let features = self
            .store
            .feature()
            .map_or(String::new(), |f| format!(" --features {f}"));
        let mut cmd = format!(
            "cargo run -p idem-sim --release{features} -- --store {} --seed {} --intents {} --workers {}",
            self.store.name(),
            self.seed,
            self.intents,
            self.workers
        );
        if let Some(f) = self.faults {
            cmd.push_str(&format!(" --faults {f}"));
        }
        cmd
    }
}

/// Runs one seed on its own single-threaded runtime with a paused clock.
pub fn run_seed(cfg: &Config) -> SeedReport {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build();
    match rt {
        Ok(rt) => rt.block_on(simulate(cfg)),
        Err(e) => SeedReport::broken(cfg, format!("no runtime: {e}")),
    }
}

struct Sim {
    world: Arc<World>,
    registries: Vec<Registry>,
    skewed: Vec<bool>,
    calls: std::sync::atomic::AtomicU64,
}

async fn simulate(cfg: &Config) -> SeedReport {
    let mut rng = SplitMix64::new(cfg.seed);
    let faults = cfg
        .faults
        .unwrap_or_else(|| FaultSet::random(&mut rng, 0.3));
    let world = Arc::new(World::new(rng, faults, cfg.intents));
    let downstream = Downstream::new(Arc::clone(&world));
    let base: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let sqlite_path = sqlite_path(cfg);
    #[cfg(any(feature = "redis", feature = "postgres"))]
    let space = match cfg.store.backend() {
        Some(b) => match crate::net::Space::fresh(b, cfg.seed) {
            Ok(s) => Some(s),
            Err(e) => return SeedReport::broken(cfg, e),
        },
        None => None,
    };

    let shared: Arc<dyn IdemStore> = Arc::new(MemoryStore::with_clock(Arc::clone(&base)));
    let sink = {
        let world = Arc::clone(&world);
        Arc::new(CallbackSink(move |e: &idem::escalation::Escalation| {
            world.escalation(&e.key)
        }))
    };
    // Workers 0..n serve the model; the last one only reconciles (it never stalls or dies).
    let mut registries = Vec::new();
    let mut workers = Vec::new();
    let mut skewed = Vec::new();
    for id in 0..=cfg.workers {
        let skew = if id < cfg.workers && faults.has(Fault::ClockSkew) {
            world.rng().range(0, 501) as i64 - 250
        } else {
            0
        };
        skewed.push(skew != 0);
        let clock: Arc<dyn Clock> = Arc::new(SkewedClock::new(Arc::clone(&base), skew));
        let (inner, reopen) = match cfg.store {
            StoreKind::Memory => (Arc::clone(&shared), Reopen::Never),
            #[cfg(feature = "sqlite")]
            StoreKind::Sqlite => {
                let reopen = Reopen::Sqlite(sqlite_path.clone(), Arc::clone(&clock));
                match reopen.open().await {
                    Ok(Some(s)) => (s, reopen),
                    Ok(None) => unreachable!("a SQLite reopen opens a store"),
                    Err(e) => return SeedReport::broken(cfg, format!("cannot open SQLite: {e}")),
                }
            }
            #[cfg(any(feature = "redis", feature = "postgres"))]
            _ => {
                let Some(space) = &space else {
                    unreachable!("a networked store has its space")
                };
                let reopen = Reopen::Net(space.clone(), Arc::clone(&clock));
                match space.open(Arc::clone(&clock)) {
                    Ok(s) => (s, reopen),
                    Err(e) => {
                        let _ = space.remove();
                        return SeedReport::broken(
                            cfg,
                            format!("cannot open the {} store: {e}", cfg.store.name()),
                        );
                    }
                }
            }
        };
        let worker = Worker::new(id);
        let store = SimStore::new(
            Arc::clone(&world),
            Arc::clone(&worker),
            inner,
            Arc::clone(&clock),
            reopen,
        );
        let built = Registry::builder()
            .store(store)
            .clock(clock)
            .tool(ChargeTool::new(
                Arc::clone(&world),
                Arc::clone(&downstream),
                Arc::clone(&worker),
                true,
            ))
            .tool(ChargeTool::new(
                Arc::clone(&world),
                Arc::clone(&downstream),
                Arc::clone(&worker),
                false,
            ))
            // No jitter: its draw comes from the OS, and a seed must replay exactly.
            .retry_policy(RetryPolicy::default().jitter(0.0))
            .escalation_sink(sink.clone())
            .build();
        match built {
            Ok(r) => registries.push(r),
            Err(e) => return SeedReport::broken(cfg, format!("registry: {e}")),
        }
        workers.push(worker);
    }
    let reconciler_registry = registries.pop().expect("one reconciler registry");
    workers.pop();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let background = tokio::spawn(background_reconciler(
        Arc::clone(&world),
        Reconciler::new(&reconciler_registry),
        Arc::clone(&stop),
    ));

    let mut stalls = Vec::new();
    if faults.has(Fault::WorkerStall) {
        for worker in &workers {
            let world = Arc::clone(&world);
            let worker = Arc::clone(worker);
            stalls.push(tokio::spawn(async move {
                loop {
                    let pause = world
                        .rng()
                        .millis(Duration::from_secs(5), Duration::from_secs(60));
                    tokio::time::sleep(pause).await;
                    if world.roll(Fault::WorkerStall, 0.3) {
                        let d = world.rng().millis(LEASE * 3 / 2, LEASE * 5);
                        worker.freeze(tokio::time::Instant::now() + d);
                    }
                }
            }));
        }
    }

    let sim = Arc::new(Sim {
        world: Arc::clone(&world),
        registries,
        skewed,
        calls: std::sync::atomic::AtomicU64::new(0),
    });
    let plans: Vec<IntentPlan> = (0..cfg.intents)
        .map(|i| IntentPlan::draw(i, &mut world.rng(), faults))
        .collect();
    let tasks: Vec<_> = plans
        .iter()
        .cloned()
        .map(|plan| tokio::spawn(model(Arc::clone(&sim), plan)))
        .collect();
    let mut told = Vec::with_capacity(tasks.len());
    for t in tasks {
        told.push(t.await.unwrap_or_default());
    }

    // The outage ends: no more faults. Let everything in flight land or give up, then
    // reconcile until nothing is left to decide.
    world.heal();
    for s in stalls {
        s.abort();
    }
    // Stopped between passes: a reconciler killed mid-pass is its own fault mode.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = background.await;
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    let reconciler = Reconciler::new(&reconciler_registry);
    let mut reconcile_error = None;
    for _ in 0..8 {
        match reconciler.run_all().await {
            Ok(decisions) => {
                if decisions
                    .iter()
                    .all(|d| !matches!(d.action, Action::Waiting | Action::Retried))
                {
                    break;
                }
            }
            Err(e) => reconcile_error = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_secs(1800)).await;
    }

    let calls = sim.calls.load(std::sync::atomic::Ordering::Relaxed);
    let mut report = check(
        cfg,
        faults,
        calls,
        &plans,
        &told,
        &world,
        &downstream.ledger(),
        reconciler_registry.store().as_ref(),
    )
    .await;
    if let Some(e) = reconcile_error {
        report
            .violations
            .push(format!("the reconciler failed on a healed store: {e}"));
    }
    drop(sim);
    drop(reconciler_registry);
    remove_sqlite(&sqlite_path);
    #[cfg(any(feature = "redis", feature = "postgres"))]
    if let Some(space) = &space {
        if let Err(e) = space.remove() {
            eprintln!("idem-sim: seed {}: {e}", cfg.seed);
        }
    }
    report
}

/// The reconciler a deployment runs beside its workers: a pass every 5 s. With
/// `reconciler-kill` on, a pass is now and then dropped part-way (the process died) and the
/// next pass starts afresh.
async fn background_reconciler(
    world: Arc<World>,
    reconciler: Reconciler,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let pass = reconciler.run_once();
        if world.roll(Fault::ReconcilerKill, 0.2) {
            let after = world
                .rng()
                .millis(Duration::ZERO, Duration::from_millis(100));
            let _ = tokio::time::timeout(after, pass).await;
        } else {
            let _ = pass.await;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// The model's side of one intent: call, react to the answer as an agent would, and
/// misbehave as the plan says.
async fn model(sim: Arc<Sim>, plan: IntentPlan) -> Vec<Told> {
    let mut told = Vec::new();
    tokio::time::sleep(plan.start).await;
    let args = plan.args();
    let mut unknown_repeats = 0;
    let mut resumed = 0;
    let mut settled = false;
    for round in 0..10 {
        let copies = if round == 0 && plan.concurrent > 1 {
            sim.world.fired(plan.intent, Fault::ConcurrentDuplicates);
            plan.concurrent
        } else {
            1
        };
        let mut handles = Vec::new();
        for c in 0..copies {
            let call = plan.call(&args, round * 10 + c);
            handles.push(send(Arc::clone(&sim), plan.intent, call));
        }
        let mut answers = Vec::new();
        for h in handles {
            answers.push(h.await);
        }
        let mut again = false;
        for a in answers {
            match &a {
                Told::Killed => {
                    if plan.resume && resumed < 3 {
                        sim.world.fired(plan.intent, Fault::ResumeCrashed);
                        resumed += 1;
                        again = true;
                    }
                }
                Told::Answer { result, .. } => match result {
                    Ok(Outcome::Completed { .. } | Outcome::Failed { .. })
                    | Ok(Outcome::ResultExpired { .. }) => settled = true,
                    Ok(Outcome::Rejected { .. }) => again = true,
                    Ok(Outcome::Unknown { .. } | Outcome::Escalated { .. })
                    | Ok(Outcome::Pending { .. }) => {
                        if plan.after_unknown && unknown_repeats < 3 {
                            sim.world.fired(plan.intent, Fault::CallAfterUnknown);
                            unknown_repeats += 1;
                            again = true;
                        }
                    }
                    Err(CallError::InFlight { .. }) | Err(CallError::Store(_)) => again = true,
                    Err(_) => {}
                    Ok(_) => {}
                },
            }
            told.push(a);
        }
        if settled || !again {
            break;
        }
        let pause = sim
            .world
            .rng()
            .millis(Duration::from_secs(1), Duration::from_secs(20));
        tokio::time::sleep(pause).await;
    }
    if settled && plan.reissue {
        sim.world.fired(plan.intent, Fault::Reissue);
        told.push(send(Arc::clone(&sim), plan.intent, plan.call(&args, 900)).await);
    }
    if settled && plan.change_params {
        sim.world.fired(plan.intent, Fault::ChangedParams);
        let changed = plan.changed_args();
        told.push(send(Arc::clone(&sim), plan.intent, plan.call(&changed, 901)).await);
    }
    told
}

/// Sends one call to a worker the seed picks; the worker may die mid-call.
async fn send(sim: Arc<Sim>, intent: usize, call: (ToolCall, Value)) -> Told {
    let (call, args) = call;
    let w = sim.world.rng().range(0, sim.registries.len() as u64) as usize;
    if sim.skewed[w] {
        sim.world.fired(intent, Fault::ClockSkew);
    }
    let kill = sim.world.roll(Fault::WorkerKill, 0.06);
    let kill_after = sim
        .world
        .rng()
        .millis(Duration::ZERO, Duration::from_secs(3));
    sim.calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let worker = Arc::clone(&sim);
    let task = tokio::spawn(async move { worker.registries[w].call(call).await });
    let result: ToolResult = if kill {
        sim.world.fired(intent, Fault::WorkerKill);
        let abort = task.abort_handle();
        match tokio::time::timeout(kill_after, task).await {
            Ok(Ok(r)) => r,
            _ => {
                abort.abort();
                return Told::Killed;
            }
        }
    } else {
        match task.await {
            Ok(r) => r,
            Err(_) => return Told::Killed,
        }
    };
    Told::Answer {
        args,
        result: result.into_result(),
    }
}

impl IntentPlan {
    fn call(&self, args: &Value, n: usize) -> (ToolCall, Value) {
        let tool = if self.keyed { KEYED } else { UNKEYED };
        let mut call = ToolCall::new("sim-run", tool, args.clone())
            .call_id(format!("toolu_{}_{n}", self.intent));
        if self.with_intent_id {
            call = call.intent(format!("intent-{}", self.intent));
        }
        (call, args.clone())
    }

    fn args(&self) -> Value {
        json!({ "order": self.intent, "items": self.items })
    }

    fn changed_args(&self) -> Value {
        let mut items = self.items.clone();
        items[0] += 1;
        json!({ "order": self.intent, "items": items })
    }
}

/// A fresh file per run (on tmpfs where there is one): no two runs share a store, even
/// two runs of one seed at once in one process (tests run in parallel).
#[cfg(feature = "sqlite")]
fn sqlite_path(cfg: &Config) -> std::path::PathBuf {
    if cfg.store != StoreKind::Sqlite {
        return std::path::PathBuf::new();
    }
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!(
        "idem-sim-{}-{}-{run}.db",
        std::process::id(),
        cfg.seed
    ))
}

#[cfg(not(feature = "sqlite"))]
fn sqlite_path(_cfg: &Config) -> std::path::PathBuf {
    std::path::PathBuf::new()
}

fn remove_sqlite(path: &std::path::Path) {
    if path.as_os_str().is_empty() {
        return;
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}
