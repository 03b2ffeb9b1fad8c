//! What idem costs per call, against its floor (canonical JSON + SHA-256 of the arguments,
//! the hashing no idempotency layer can skip) and against calling the handler directly.
//!
//! `cargo bench --bench call`. Figures and ratios: BENCHMARKS.md.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use idem::{
    tool::{ReadTool, ToolSpec, WriteTool},
    MemoryStore, ReadCtx, Registry, ToolCall, ToolError, WriteCtx,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{floor, small_args, typed_floor, Charge, ChargeArgs};

const KEY: &str = "idem:0000000000000000000000000000000000000000000000000000000000000000";

/// A write taking arbitrary JSON, for the 10 KiB case.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Blob {
    items: Vec<Value>,
}
struct Store;
impl WriteTool for Store {
    type Args = Blob;
    type Output = usize;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("store_blob")
    }
    async fn call(&self, _ctx: WriteCtx, args: Blob) -> Result<usize, ToolError> {
        Ok(args.items.len())
    }
}

struct Lookup;
impl ReadTool for Lookup {
    type Args = ChargeArgs;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("lookup")
    }
    async fn call(&self, _ctx: ReadCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        Ok(args.amount_cents)
    }
}

fn large_args() -> Value {
    let items: Vec<Value> = (0..100)
        .map(|i| json!({"sku": format!("sku-{i:05}"), "qty": i % 7, "note": "x".repeat(60)}))
        .collect();
    json!({ "items": items })
}

/// Times `iters` calls made by `make`. Calls are built in small batches just before they are
/// timed (the caller owns its arguments either way, and has just built them: warm in cache);
/// each result is dropped inside the timing. The registry is dropped after the clock stops.
async fn timed_calls(reg: Registry, iters: u64, make: impl Fn(u64) -> ToolCall) -> Duration {
    const BATCH: u64 = 64;
    let mut total = Duration::ZERO;
    let mut next = 0;
    while next < iters {
        let end = (next + BATCH).min(iters);
        let calls: Vec<ToolCall> = (next..end).map(&make).collect();
        next = end;
        let start = Instant::now();
        for call in calls {
            let result = reg.call(call).await;
            assert!(result.is_completed());
        }
        total += start.elapsed();
    }
    drop(reg);
    total
}

fn registry() -> Registry {
    // Unbounded: a sample of fresh writes claims as many new keys as criterion asks for
    // iterations (`--quick` asks for more than the default capacity of 100 000), and a
    // refused claim would fail the bench, not measure it.
    Registry::builder()
        .store(MemoryStore::new().capacity(usize::MAX))
        .tool(Charge)
        .tool(Store)
        .tool(Lookup)
        .build()
        .expect("valid registry")
}

fn bench_per_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("per_call");
    for (label, tool, args) in [
        ("100B", "charge", small_args()),
        ("10KiB", "store_blob", large_args()),
    ] {
        let bytes = serde_json::to_vec(&args).unwrap().len();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(
            BenchmarkId::new("floor_canonical_sha256", label),
            &args,
            |b, a| b.iter(|| floor(std::hint::black_box(a))),
        );
        // The floor again, when the arguments are owned and dropped afterwards, as a call's
        // are: a `Value` tree costs about as much to free as to hash.
        g.bench_with_input(
            BenchmarkId::new("floor_owned_value", label),
            &args,
            |b, a| b.iter_batched(|| a.clone(), |v| floor(&v), BatchSize::SmallInput),
        );
        // The typed floor: decode into the tool's type, identify the typed value, drop both.
        g.bench_with_input(BenchmarkId::new("floor_typed", label), &args, |b, a| {
            b.iter_batched(
                || a.clone(),
                |v| match tool {
                    "charge" => typed_floor::<ChargeArgs>(v),
                    _ => typed_floor::<Blob>(v),
                },
                BatchSize::SmallInput,
            )
        });
        // The model's JSON text: the registry decodes it straight into the tool's `Args`.
        let text = serde_json::to_string(&args).unwrap();
        g.bench_with_input(
            BenchmarkId::new("floor_parse_canonical_sha256", label),
            &text,
            |b, t| b.iter(|| floor(&serde_json::from_str(std::hint::black_box(t)).unwrap())),
        );
        let value_call = |run: String| ToolCall::new(run, tool, args.clone());
        let text_call = |run: String| ToolCall::from_json(run, tool, text.clone());
        for (name, make) in [
            ("fresh_write", &value_call as &dyn Fn(String) -> ToolCall),
            ("fresh_write_text", &text_call),
        ] {
            // A new run id per call, so every call claims a new key, in a store that starts
            // empty for each sample.
            g.bench_function(BenchmarkId::new(name, label), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    timed_calls(registry(), iters, |i| make(format!("run-{i}")))
                })
            });
        }
        for (name, make) in [
            ("replay", &value_call as &dyn Fn(String) -> ToolCall),
            ("replay_text", &text_call),
        ] {
            g.bench_function(BenchmarkId::new(name, label), |b| {
                b.to_async(&rt).iter_custom(|iters| async move {
                    let reg = registry();
                    assert!(reg.call(make("run-replay".into())).await.is_completed());
                    timed_calls(reg, iters, |_| make("run-replay".into())).await
                })
            });
        }
    }
    let reg = registry();
    let args = small_args();
    g.throughput(Throughput::Elements(1));
    g.bench_function("read_via_registry", |b| {
        b.to_async(&rt).iter_batched(
            || ToolCall::new("run-read", "lookup", args.clone()),
            |call| {
                let reg = &reg;
                async move { assert!(reg.call(call).await.is_completed()) }
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("write_direct_handler", |b| {
        // What a write costs without idem: deserialize, call the (no-op) handler, serialize.
        b.to_async(&rt).iter_batched(
            || args.clone(),
            |args| async move {
                let typed: ChargeArgs = serde_json::from_value(args).unwrap();
                let ctx = WriteCtx::for_test(idem::IdemKey::parse(KEY).unwrap());
                let out = Charge.call(ctx, typed).await.unwrap();
                serde_json::to_value(out).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("read_direct_handler", |b| {
        // The baseline: what a caller without idem does — deserialize, call, serialize.
        b.to_async(&rt).iter_batched(
            || args.clone(),
            |args| async move {
                let typed: ChargeArgs = serde_json::from_value(args).unwrap();
                let out = Lookup.call(ReadCtx::for_test("run"), typed).await.unwrap();
                serde_json::to_value(out).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn bench_concurrency(c: &mut Criterion) {
    let mut g = c.benchmark_group("concurrency");
    const CALLS: u64 = 2_000;
    g.throughput(Throughput::Elements(CALLS));
    for threads in [1usize, 2] {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap();
        g.bench_function(
            BenchmarkId::new("distinct_keys", format!("{threads}_threads")),
            |b| {
                b.to_async(&rt).iter_custom(|iters| async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        // A new store per iteration (built and dropped outside the timing):
                        // every iteration inserts into an empty map, so later iterations do
                        // not pay for the growth of earlier ones and 1 and 2 threads compare
                        // like for like.
                        let reg = registry();
                        let start = Instant::now();
                        // One task per worker thread, each making CALLS / threads calls.
                        let tasks: Vec<_> = (0..threads)
                            .map(|t| {
                                let reg = reg.clone();
                                tokio::spawn(async move {
                                    for i in 0..CALLS / threads as u64 {
                                        let call = ToolCall::new(
                                            format!("run-{t}-{i}"),
                                            "charge",
                                            small_args(),
                                        );
                                        assert!(reg.call(call).await.is_completed());
                                    }
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.unwrap();
                        }
                        total += start.elapsed();
                        drop(reg);
                    }
                    total
                })
            },
        );
    }
    g.finish();

    // 64 tasks on one key: exactly one execution; time until all 64 have the result.
    let mut g = c.benchmark_group("one_key_64_tasks");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reg = registry();
    let n = Arc::new(AtomicU64::new(0));
    g.bench_function("all_have_result", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let reg = reg.clone();
            let n = n.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let run = format!("run-{}", n.fetch_add(1, Ordering::Relaxed));
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..64)
                        .map(|_| {
                            let reg = reg.clone();
                            let call = ToolCall::new(run.clone(), "charge", small_args());
                            tokio::spawn(async move { reg.call(call).await })
                        })
                        .collect();
                    let mut executed = 0;
                    for t in tasks {
                        let r = t.await.unwrap();
                        assert!(r.is_completed());
                        executed += usize::from(!r.replayed());
                    }
                    total += start.elapsed();
                    assert_eq!(executed, 1, "exactly one execution");
                }
                total
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench_per_call, bench_concurrency);
criterion_main!(benches);
