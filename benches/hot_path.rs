//! A fixed loop over the per-call hot path, for profilers rather than for timing:
//! `cargo bench --bench hot_path --no-run`, then run the binary under
//! `valgrind --tool=callgrind` or `perf record` with `floor`, `replay`, `fresh`, `replay_text`
//! or `fresh_text` and a count.
//!
//! Criterion's own harness (batching, statistics) would dominate an instruction profile; this
//! loop does one thing N times so the counts divide cleanly per call.

use idem::identity::canonical::to_canonical_vec;
use idem::{MemoryStore, Registry, ToolCall, ToolError, ToolSpec, WriteCtx, WriteTool};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    amount_cents: u64,
    currency: String,
    description: String,
    capture: bool,
}

struct Charge;
impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        Ok(args.amount_cents)
    }
}

fn args() -> Value {
    json!({"customer": "cus_9s6XKzkNRiz8i3", "amount_cents": 4900, "currency": "eur",
           "description": "Order 1234", "capture": true})
}

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
                    sink += usize::from(Sha256::digest(to_canonical_vec(v))[0]);
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
