//! A fixed loop over the per-call hot path, for profilers rather than for timing:
//! `cargo bench --bench hot_path --no-run`, then run the binary under
//! `valgrind --tool=callgrind` or `perf record` with `floor`, `replay`, `fresh`, `replay_text`
//! or `fresh_text` and a count.
//!
//! Criterion's own harness (batching, statistics) would dominate an instruction profile; this
//! loop does one thing N times so the counts divide cleanly per call.

mod support;

use idem::{MemoryStore, Registry, ToolCall};
use serde_json::Value;
use support::{floor, small_args as args, Charge};

fn main() {
    let mut argv = std::env::args().skip(1).filter(|a| a != "--bench");
    let what = argv.next().unwrap_or_else(|| "replay".to_owned());
    let n: usize = argv.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
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
    rt.block_on(async {
        match what.as_str() {
            "floor" => {
                for v in &values {
                    sink += usize::from(floor(v)[0]);
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
    println!("{what} x{n}: {sink}");
}
