//! idem next to the other Rust crates that do its job, in one process, on one payload.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/tmp-peers-target cargo build --release --manifest-path benches/peers/Cargo.toml
//! taskset -c 1 /work/tmp-peers-target/release/peers [ROUNDS [BATCH]]     # default 60 rounds of 2000 calls
//! valgrind --tool=callgrind /work/tmp-peers-target/release/peers profile CASE ITERS
//! ```
//!
//! Every round times one batch of every case, in an order that rotates by one each round, so
//! a slow moment of a shared machine lands on every case alike. Reported: each case's median
//! per call over the rounds, and the median (p10–p90) of per-round ratios: a ratio is taken
//! between two cases of the same round, never across rounds.
//!
//! `profile CASE ITERS` runs ITERS calls of one case, untimed, for callgrind: run it with two
//! ITERS and divide the difference in instructions by the difference in calls
//! (`benches/peers/callgrind.sh` does this for every case).
//!
//! `scaling SLICES CALLS` (run it without `taskset`) measures how distinct-key writes on a
//! `MemoryStore` scale from one thread to two: each slice makes CALLS fresh text writes on a
//! new registry with a 1-worker runtime (one task) and on another with a 2-worker runtime
//! (two tasks of CALLS / 2), the two sides alternating which goes first; reported is the
//! median (p10–p90) of the per-slice ratio of the 1-thread time to the 2-thread time.
//! `scaling SLICES CALLS private` gives every task a registry (and store) of its own, and
//! `scaling SLICES CALLS floor` runs the text floor instead of a call: what the machine, the
//! runtime and the allocator allow when idem shares nothing between the threads.
//! `scaling SLICES CALLS sharing` interleaves two threads on one registry with two threads
//! on a registry each, and reports the per-slice ratio: what sharing one registry costs.

use std::time::{Duration, Instant};

use agent_effects::{EffectFailure, EffectOutcome, Runtime};
use idem::identity::identify;
use idem::{MemoryStore, Registry, ToolCall};
use idem_peers_bench::{per_call_us, spread, typed, value, Charge, ChargeArgs, TEXT};
use idempotent::entry::ExistingEntry;
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

/// Every case, in the order the report lists them.
const CASES: [&str; 10] = [
    "value_floor",
    "text_floor",
    "idempotent_fresh",
    "idempotent_replay",
    "agent_effects_fresh",
    "agent_effects_replay",
    "idem_text_fresh",
    "idem_text_replay",
    "idem_value_fresh",
    "idem_value_replay",
];

const NO_KEY_FIELDS: &[&str] = &[];
const TTL: Duration = Duration::from_secs(24 * 3600);

/// The floor with the typed value in hand: canonical JSON (idem's one-pass serializer) and
/// SHA-256 of it.
fn value_floor(args: &ChargeArgs) -> idem::identity::Fingerprint {
    identify(args, NO_KEY_FIELDS)
        .expect("serializes")
        .fingerprint
}

/// The floor with the model's text in hand: decode it into the arguments' type, then the
/// value floor; both dropped.
fn text_floor(text: &str) -> idem::identity::Fingerprint {
    let args: ChargeArgs = serde_json::from_str(text).expect("decodes");
    value_floor(&args)
}

fn registry() -> Registry {
    Registry::builder()
        .store(MemoryStore::new())
        .tool(Charge)
        .build()
        .expect("valid registry")
}

/// `idempotent` 0.3's caller loop, as its docs describe it: serialize the request,
/// fingerprint it with the default strategy, `try_insert`; if claimed, run the effect and
/// `complete` with the response; if the entry exists, compare fingerprints and decode the
/// saved response.
async fn idempotent_call(
    store: &idempotent::store::memory::MemoryStore,
    key: &IdempotencyKey,
    args: &ChargeArgs,
) -> (u64, bool) {
    let body = serde_json::to_vec(args).expect("serializes");
    let fingerprint = DefaultFingerprintStrategy.compute("charge", &body);
    let entry = IdempotencyEntry::new(fingerprint, TTL);
    match store
        .try_insert(key, entry.clone())
        .await
        .expect("infallible")
    {
        InsertResult::Claimed { fencing_token } => {
            let out = args.amount_cents; // the no-op effect
            let response = CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body: serde_json::to_vec(&out).expect("serializes").into(),
            };
            store
                .complete(key, entry.complete(response), fencing_token)
                .await
                .expect("infallible");
            (out, false)
        }
        InsertResult::Exists(ExistingEntry::Completed(saved)) => {
            assert!(saved.fingerprint_matches(fingerprint), "same request");
            let out: u64 = serde_json::from_slice(&saved.response().body).expect("decodes");
            (out, true)
        }
        InsertResult::Exists(ExistingEntry::Processing(_)) => panic!("nothing is in flight"),
    }
}

/// `agent-effects` 0.2: `Runtime::effect(name, key).input(&typed).run(no-op)`.
async fn agent_effects_call(
    rt: &Runtime<agent_effects_memory::MemoryStore>,
    key: &str,
    args: &ChargeArgs,
) -> u64 {
    let out = rt
        .effect("charge", key)
        .input(args)
        .run(|_ctx| async { Ok::<u64, EffectFailure>(4900) })
        .await
        .expect("runs");
    match out {
        EffectOutcome::Committed(n) => n,
        other => panic!("not committed: {other:?}"),
    }
}

/// One case's state: what is built once (stores primed for replays) and per batch.
struct Bench {
    args: ChargeArgs,
    replay_reg: Registry,
    ae_replay: Runtime<agent_effects_memory::MemoryStore>,
    idp_replay: idempotent::store::memory::MemoryStore,
    idp_replay_key: IdempotencyKey,
    /// Makes every fresh key unique over the whole run.
    next: u64,
}

impl Bench {
    async fn new() -> Bench {
        let args = typed();
        let replay_reg = registry();
        for call in [
            ToolCall::from_json("replay-text", "charge", TEXT.to_owned()),
            ToolCall::new("replay-value", "charge", value()),
        ] {
            let r = replay_reg.call(call).await;
            assert!(r.is_completed() && !r.replayed());
        }
        let ae_replay = Runtime::new(agent_effects_memory::MemoryStore::new());
        assert_eq!(agent_effects_call(&ae_replay, "replay", &args).await, 4900);
        let idp_replay = idempotent::store::memory::MemoryStore::new(1024, TTL);
        let idp_replay_key = IdempotencyKey::new("replay").expect("valid key");
        assert!(!idempotent_call(&idp_replay, &idp_replay_key, &args).await.1);
        Bench {
            args,
            replay_reg,
            ae_replay,
            idp_replay,
            idp_replay_key,
            next: 0,
        }
    }

    fn fresh_ids(&mut self, n: usize) -> Vec<String> {
        let start = self.next;
        self.next += n as u64;
        (start..self.next).map(|i| format!("run-{i}")).collect()
    }

    /// `n` copies of the typed arguments, each its own allocations, as `n` calls bring.
    fn args_per_call(&self, n: usize) -> Vec<ChargeArgs> {
        (0..n).map(|_| self.args.clone()).collect()
    }

    /// Times `n` calls of `case`. Every case gets what a caller would already hold for each
    /// call, built before the clock starts, one per call: its key, and its arguments (a
    /// `ToolCall` with text or a value for idem, the typed arguments for the peers and the
    /// value floor, the text for the text floor), so no case reads one input that stays in
    /// cache while another reads a new one per call. Fresh cases get a new, empty store per
    /// batch, built and dropped outside the timing.
    async fn batch(&mut self, case: &str, n: usize) -> Duration {
        match case {
            "value_floor" => {
                let inputs = self.args_per_call(n);
                let start = Instant::now();
                for args in &inputs {
                    std::hint::black_box(value_floor(std::hint::black_box(args)));
                }
                start.elapsed()
            }
            "text_floor" => {
                let inputs: Vec<String> = (0..n).map(|_| TEXT.to_owned()).collect();
                let start = Instant::now();
                for text in &inputs {
                    std::hint::black_box(text_floor(std::hint::black_box(text)));
                }
                start.elapsed()
            }
            "idempotent_fresh" => {
                let store = idempotent::store::memory::MemoryStore::new(1024, TTL);
                let inputs: Vec<(IdempotencyKey, ChargeArgs)> = self
                    .fresh_ids(n)
                    .into_iter()
                    .map(|k| (IdempotencyKey::new(k).expect("valid key"), self.args.clone()))
                    .collect();
                let start = Instant::now();
                for (key, args) in &inputs {
                    let (out, replayed) = idempotent_call(&store, key, args).await;
                    assert!(out == 4900 && !replayed);
                }
                start.elapsed()
            }
            "idempotent_replay" => {
                let inputs: Vec<(IdempotencyKey, ChargeArgs)> = (0..n)
                    .map(|_| (self.idp_replay_key.clone(), self.args.clone()))
                    .collect();
                let start = Instant::now();
                for (key, args) in &inputs {
                    let (out, replayed) = idempotent_call(&self.idp_replay, key, args).await;
                    assert!(out == 4900 && replayed);
                }
                start.elapsed()
            }
            "agent_effects_fresh" => {
                let rt = Runtime::new(agent_effects_memory::MemoryStore::new());
                let inputs: Vec<(String, ChargeArgs)> = self
                    .fresh_ids(n)
                    .into_iter()
                    .map(|k| (k, self.args.clone()))
                    .collect();
                let start = Instant::now();
                for (key, args) in &inputs {
                    assert_eq!(agent_effects_call(&rt, key, args).await, 4900);
                }
                start.elapsed()
            }
            "agent_effects_replay" => {
                let inputs: Vec<(String, ChargeArgs)> = (0..n)
                    .map(|_| ("replay".to_owned(), self.args.clone()))
                    .collect();
                let start = Instant::now();
                for (key, args) in &inputs {
                    assert_eq!(agent_effects_call(&self.ae_replay, key, args).await, 4900);
                }
                start.elapsed()
            }
            "idem_text_fresh" | "idem_value_fresh" => {
                let reg = registry();
                let text = case == "idem_text_fresh";
                let calls: Vec<ToolCall> = self
                    .fresh_ids(n)
                    .into_iter()
                    .map(|run| {
                        if text {
                            ToolCall::from_json(run, "charge", TEXT.to_owned())
                        } else {
                            ToolCall::new(run, "charge", value())
                        }
                    })
                    .collect();
                let start = Instant::now();
                for call in calls {
                    let r = reg.call(call).await;
                    assert!(r.is_completed() && !r.replayed());
                }
                let elapsed = start.elapsed();
                drop(reg);
                elapsed
            }
            "idem_text_replay" | "idem_value_replay" => {
                let calls: Vec<ToolCall> = (0..n)
                    .map(|_| {
                        if case == "idem_text_replay" {
                            ToolCall::from_json("replay-text", "charge", TEXT.to_owned())
                        } else {
                            ToolCall::new("replay-value", "charge", value())
                        }
                    })
                    .collect();
                let start = Instant::now();
                for call in calls {
                    let r = self.replay_reg.call(call).await;
                    assert!(r.is_completed() && r.replayed());
                }
                start.elapsed()
            }
            other => panic!("unknown case {other}; cases: {CASES:?}"),
        }
    }
}

fn arg(args: &[String], i: usize, default: usize) -> usize {
    args.get(i)
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(default)
}

/// What each side of a `scaling` slice runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scaling {
    /// Every task calls one registry (one `MemoryStore`, one tool): the measured case.
    Shared,
    /// Every task calls a registry of its own: nothing of idem's is shared between the
    /// threads, so what still does not scale is the machine's, the runtime's or the
    /// allocator's.
    Private,
    /// No registry: every task runs the text floor (decode, canonical JSON, SHA-256) on its
    /// calls' arguments, the same inputs built the same way. The machine's ceiling for work
    /// that shares nothing.
    Floor,
}

/// CALLS fresh text writes with distinct keys, split over `threads` tasks on a runtime of
/// `threads` workers; the time from the first call to the last result.
fn scaling_side(threads: usize, calls: usize, slice: usize, mode: Scaling) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime");
    let shared = registry();
    let per_task: Vec<(Registry, Vec<ToolCall>)> = (0..threads)
        .map(|t| {
            let reg = if mode == Scaling::Private {
                registry()
            } else {
                shared.clone()
            };
            let calls = (0..calls / threads)
                .map(|i| {
                    let run = format!("scale-{slice}-{threads}-{t}-{i}");
                    ToolCall::from_json(run, "charge", TEXT.to_owned())
                })
                .collect();
            (reg, calls)
        })
        .collect();
    let elapsed = rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = per_task
            .into_iter()
            .map(|(reg, calls)| {
                tokio::spawn(async move {
                    for call in calls {
                        if mode == Scaling::Floor {
                            std::hint::black_box(text_floor(TEXT));
                            drop(std::hint::black_box(call));
                            continue;
                        }
                        let r = reg.call(call).await;
                        assert!(r.is_completed() && !r.replayed());
                    }
                    reg
                })
            })
            .collect();
        let mut regs = Vec::with_capacity(tasks.len());
        for t in tasks {
            regs.push(t.await.expect("a scaling task"));
        }
        (start.elapsed(), regs)
    });
    let (elapsed, regs) = elapsed;
    drop(regs);
    drop(shared);
    elapsed
}

/// Two threads on one registry against two threads on a registry each, interleaved by
/// slice: the median (p10–p90) of the per-slice ratio of the shared time to the private
/// time. Near 1 when what the threads share in idem (the store's counters and maps, the
/// tool's reference counts) costs nothing; a load on the machine slows both sides alike.
fn sharing(slices: usize, calls: usize) {
    let mut ratios = Vec::with_capacity(slices);
    let (mut shared, mut private) = (Vec::new(), Vec::new());
    scaling_side(2, calls, usize::MAX, Scaling::Shared);
    scaling_side(2, calls, usize::MAX - 1, Scaling::Private);
    for slice in 0..slices {
        let (s, p) = if slice % 2 == 0 {
            let s = scaling_side(2, calls, slice, Scaling::Shared);
            (s, scaling_side(2, calls, slice, Scaling::Private))
        } else {
            let p = scaling_side(2, calls, slice, Scaling::Private);
            (scaling_side(2, calls, slice, Scaling::Shared), p)
        };
        shared.push(per_call_us(s, calls));
        private.push(per_call_us(p, calls));
        ratios.push(s.as_secs_f64() / p.as_secs_f64());
    }
    let (m, lo, hi) = spread(&ratios);
    let (ms, _, _) = spread(&shared);
    let (mp, _, _) = spread(&private);
    println!("{slices} slices x {calls} distinct-key text writes, 2 threads per side");
    println!("one registry: {ms:.2} µs/call, a registry per thread: {mp:.2} µs/call (medians)");
    println!("shared / private, per slice: median {m:.2} (p10–p90 {lo:.2}–{hi:.2})");
}

fn scaling(slices: usize, calls: usize, mode: Scaling) {
    let mut ratios = Vec::with_capacity(slices);
    let (mut one, mut two) = (Vec::new(), Vec::new());
    // One slice of each first, untimed: page in the code and the allocator's arenas.
    scaling_side(1, calls, usize::MAX, mode);
    scaling_side(2, calls, usize::MAX - 1, mode);
    for slice in 0..slices {
        let (t1, t2) = if slice % 2 == 0 {
            let t1 = scaling_side(1, calls, slice, mode);
            (t1, scaling_side(2, calls, slice, mode))
        } else {
            let t2 = scaling_side(2, calls, slice, mode);
            (scaling_side(1, calls, slice, mode), t2)
        };
        one.push(per_call_us(t1, calls));
        two.push(per_call_us(t2, calls));
        ratios.push(t1.as_secs_f64() / t2.as_secs_f64());
    }
    let (m, lo, hi) = spread(&ratios);
    let (m1, _, _) = spread(&one);
    let (m2, _, _) = spread(&two);
    let what = match mode {
        Scaling::Shared => "distinct-key text writes per side, one MemoryStore",
        Scaling::Private => "distinct-key text writes per side, a MemoryStore per task",
        Scaling::Floor => "text floors per side (no registry)",
    };
    println!("{slices} slices x {calls} {what}");
    println!("1 thread: {m1:.2} µs/call, 2 threads: {m2:.2} µs/call (medians)");
    println!("2-thread scaling, per slice: median {m:.2} (p10–p90 {lo:.2}–{hi:.2}); target ≥ 1.7");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("scaling") {
        if args.get(3).map(String::as_str) == Some("sharing") {
            sharing(arg(&args, 1, 20), arg(&args, 2, 20_000));
            return;
        }
        let mode = match args.get(3).map(String::as_str) {
            None | Some("shared") => Scaling::Shared,
            Some("private") => Scaling::Private,
            Some("floor") => Scaling::Floor,
            Some(other) => panic!("unknown scaling mode {other}: shared, private or floor"),
        };
        scaling(arg(&args, 1, 20), arg(&args, 2, 20_000), mode);
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if args.first().map(String::as_str) == Some("profile") {
        let case = args.get(1).expect("profile CASE ITERS").clone();
        let iters = arg(&args, 2, 10_000);
        rt.block_on(async {
            let mut bench = Bench::new().await;
            bench.batch(&case, iters).await;
        });
        return;
    }
    let rounds = arg(&args, 0, 60);
    let batch = arg(&args, 1, 2000);
    const WARMUP: usize = 3;
    let mut per_call: Vec<Vec<f64>> = vec![Vec::with_capacity(rounds); CASES.len()];
    rt.block_on(async {
        let mut bench = Bench::new().await;
        for round in 0..WARMUP + rounds {
            for k in 0..CASES.len() {
                let i = (round + k) % CASES.len();
                let t = bench.batch(CASES[i], batch).await;
                if round >= WARMUP {
                    per_call[i].push(per_call_us(t, batch));
                }
            }
        }
    });
    report(&per_call, rounds, batch);
}

fn idx(name: &str) -> usize {
    CASES.iter().position(|c| *c == name).expect("a case")
}

/// Per-round ratios of case `a` to case `b`: median, p10, p90.
fn ratio(per_call: &[Vec<f64>], a: &str, b: &str) -> (f64, f64, f64) {
    let (a, b) = (&per_call[idx(a)], &per_call[idx(b)]);
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    spread(&r)
}

fn report(per_call: &[Vec<f64>], rounds: usize, batch: usize) {
    println!("{rounds} rounds x {batch} calls per case; payload {TEXT}");
    println!();
    println!(
        "| case | median µs/call (p10–p90) | × value floor (p10–p90) | × text floor (p10–p90) |"
    );
    println!("|---|---|---|---|");
    for (i, case) in CASES.iter().enumerate() {
        let (m, lo, hi) = spread(&per_call[i]);
        let (vf, vlo, vhi) = ratio(per_call, case, "value_floor");
        let (tf, tlo, thi) = ratio(per_call, case, "text_floor");
        println!(
            "| {case} | {m:.2} ({lo:.2}–{hi:.2}) | {vf:.2} ({vlo:.2}–{vhi:.2}) | {tf:.2} ({tlo:.2}–{thi:.2}) |"
        );
    }
    println!();
    println!("| idem vs idempotent 0.3, same round | median ratio (p10–p90) | target |");
    println!("|---|---|---|");
    for (a, b, target) in [
        ("idem_text_fresh", "idempotent_fresh", "< 1"),
        ("idem_value_fresh", "idempotent_fresh", "< 1"),
        ("idem_text_replay", "idempotent_replay", "< 1"),
        ("idem_value_replay", "idempotent_replay", "< 1"),
        ("idem_text_fresh", "agent_effects_fresh", "—"),
        ("idem_text_replay", "agent_effects_replay", "—"),
    ] {
        let (m, lo, hi) = ratio(per_call, a, b);
        println!("| {a} / {b} | {m:.2} ({lo:.2}–{hi:.2}) | {target} |");
    }
}
