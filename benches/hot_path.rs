//! A fixed loop over the per-call hot path, for profilers rather than for timing:
//! `cargo bench --bench hot_path --no-run`, then run the binary under
//! `valgrind --tool=callgrind` or `perf record` with `setup`, `floor`, `floor_typed`,
//! `replay`, `fresh`, `replay_text` or `fresh_text` and a count (100 000 under `cargo bench`,
//! 1 000 otherwise, as `cargo test --bench hot_path` runs it). It prints the heap allocations
//! per call in the loop (a repeatable figure, unlike time).
//!
//! Criterion's own harness (batching, statistics) would dominate an instruction profile; this
//! loop does one thing N times so the counts divide cleanly per call.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::{MemoryStore, Registry, ToolCall};
use serde_json::Value;
use support::{floor, small_args as args, typed_floor, Charge, ChargeArgs};

/// The system allocator, counting allocations (reallocations count as one more).
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` unchanged; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --bench '*'` (CI's short run) passes nothing.
    let benching = std::env::args().any(|a| a == "--bench");
    let mut argv = std::env::args().skip(1).filter(|a| a != "--bench");
    let what = argv.next().unwrap_or_else(|| "replay".to_owned());
    let default_calls = if benching { 100_000 } else { 1_000 };
    let n: usize = argv
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_calls);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let reg = Registry::builder()
        .store(MemoryStore::new())
        .tool(Charge)
        .build()
        .expect("registry");
    // Inputs are built before the loop, as the criterion benches build them outside timing.
    let text = args().to_string();
    let calls: Vec<ToolCall> = (0..n)
        .map(|i| match what.as_str() {
            "fresh" => ToolCall::new(format!("run-{i}"), "charge", args()),
            "fresh_text" => ToolCall::from_json(format!("run-{i}"), "charge", text.clone()),
            "replay_text" => ToolCall::from_json("run-replay", "charge", text.clone()),
            _ => ToolCall::new("run-replay", "charge", args()),
        })
        .collect();
    let values: Vec<Value> = (0..n).map(|_| args()).collect();
    rt.block_on(reg.call(ToolCall::new("run-replay", "charge", args())));
    let mut sink = 0usize;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    rt.block_on(async {
        match what.as_str() {
            "floor" => {
                for v in &values {
                    sink += usize::from(floor(v)[0]);
                }
            }
            // Builds the inputs and does nothing with them: subtract its count from the
            // others' to get the cost per call alone.
            "setup" => {}
            "floor_typed" => {
                for v in values {
                    sink += usize::from(typed_floor::<ChargeArgs>(v).as_bytes()[0]);
                }
            }
            _ => {
                for call in calls {
                    let r = reg.call(call).await;
                    sink += usize::from(r.is_completed());
                }
            }
        }
    });
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    println!(
        "{what} x{n}: {sink}; {:.1} allocations per call",
        allocations as f64 / n as f64
    );
}
