//! One scripted sequence, shared by the tests that assert on what was observed (spans,
//! metrics): a fresh call, its replay, a changed-parameters repeat, an unknown tool, a
//! timeout that ends *unknown*, and a reconciliation pass that escalates it.
//!
//! Every value the host or the model supplies that must never be recorded carries
//! [`SECRET`]: the arguments, the tenant, the principal, the handler's output.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{ManualClock, Timestamp};
use idem_runtime::{
    call::{ToolCall, ToolResult},
    identity::IdemKey,
    reconcile::Reconciler,
    registry::{Registry, RetryPolicy},
    store::{IdemStore, MemoryStore},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// In every argument, the tenant, the principal and the output.
pub const SECRET: &str = "s3cr3t-4242";

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    pub card: String,
    pub cents: u64,
}

/// Charges at once; counts its sends (the ledger).
pub struct Charge(pub Arc<AtomicU32>);

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = serde_json::Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge").description("Charge a card.")
    }
    async fn call(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<serde_json::Value, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(json!({ "receipt": format!("receipt for {} {SECRET}", args.card) }))
    }
}

/// Never answers: every call times out and ends unknown.
pub struct Slow(pub Arc<AtomicU32>);

impl WriteTool for Slow {
    type Args = ChargeArgs;
    type Output = serde_json::Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("slow_charge")
            .description("Charge slowly.")
            .timeout(Duration::from_millis(50))
    }
    async fn call(
        &self,
        _ctx: WriteCtx,
        _args: ChargeArgs,
    ) -> Result<serde_json::Value, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

/// What the sequence did, for the assertions (the replay, the changed-parameters repeat and
/// the unknown tool are checked in [`run`] itself).
pub struct Ran {
    /// Sends the downstream saw.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    // the metrics' counts compare with it
    pub sends: u32,
    /// The first call's result.
    pub fresh: ToolResult,
    /// The timed-out call's result (unknown, then escalated).
    pub timed_out: ToolResult,
    /// The reconciliation pass's decisions.
    pub decisions: Vec<idem_runtime::reconcile::Decision>,
}

impl Ran {
    pub fn charge_key(&self) -> &IdemKey {
        self.fresh.key().expect("a write has a key")
    }
    pub fn slow_key(&self) -> &IdemKey {
        self.timed_out.key().expect("a write has a key")
    }
}

fn call(tool: &str, cents: u64) -> ToolCall {
    ToolCall::new(
        "run-1",
        tool,
        json!({ "card": format!("4242 {SECRET}"), "cents": cents }),
    )
    .tenant(format!("tenant-{SECRET}"))
    .principal(format!("principal-{SECRET}"))
    .intent("order-1")
}

/// Runs the sequence on a current-thread runtime with paused time (the caller installs
/// its recorder or subscriber around it).
pub async fn run() -> Ran {
    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let store = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let sends = Arc::new(AtomicU32::new(0));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .retry_policy(RetryPolicy::never())
        .tool(Charge(sends.clone()))
        .tool(Slow(sends.clone()))
        .build()
        .expect("valid registry");

    let fresh = registry.call(call("charge", 100)).await;
    let replay = registry.call(call("charge", 100)).await;
    let changed = registry.call(call("charge", 200)).await;
    // A model's made-up tool name, longer than any tool name can be: spans keep only the
    // first 64 bytes of it, metrics none.
    let made_up = format!("nope_{}{SECRET}", "x".repeat(60));
    let unknown_tool = registry.call(call(&made_up, 100)).await;
    let timed_out = registry.call(call("slow_charge", 100)).await;
    // Past the timed-out attempt's in-flight bound: no read-back, no key contract, so the
    // reconciler escalates.
    clock.advance(Duration::from_secs(3600));
    let decisions = Reconciler::new(&registry)
        .run_once()
        .await
        .expect("the pass runs");

    // What happened, on the store and the ledger, so the observations are checked against
    // the truth and not against themselves.
    assert!(fresh.is_completed() && !fresh.replayed());
    assert!(replay.is_completed() && replay.replayed());
    assert!(matches!(
        changed.error(),
        Some(idem_runtime::call::CallError::ChangedParams { .. })
    ));
    assert!(matches!(
        unknown_tool.error(),
        Some(idem_runtime::call::CallError::UnknownTool { .. })
    ));
    assert_eq!(
        timed_out.class(),
        Some(idem_runtime::outcome::OutcomeClass::Unknown)
    );
    let slow = store.get(timed_out.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(slow.state, idem_runtime::store::RecordState::Escalated);
    Ran {
        sends: sends.load(Ordering::SeqCst),
        fresh,
        timed_out,
        decisions,
    }
}

/// A current-thread runtime with paused time: the timeout passes without waiting, and
/// everything (spawned watchers included) runs on the calling thread, inside whatever
/// thread-local recorder or subscriber the test set.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}
