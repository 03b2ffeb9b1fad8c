//! What every matrix row starts from: the Stripe-like stub in `idem_test::payments` behind
//! its faulty proxy, idem's charge and refund tools on it, a registry (an agent process) on
//! tokio's paused clock, and the calls and readings the rows share. The in-process rows
//! keep the store in memory; the restart rows reopen a SQLite file.

use std::sync::Arc;
use std::time::Duration;

use idem::reconcile::{Action, Decision};
use idem::store::{Clock, Timestamp, TokioClock};
use idem::{IdemStore, Registry, ToolCall, ToolResult};
use idem_test::payments::{Keys, Payments, Proxy, STRIPE_KEY_RETENTION};
use idem_test::tools::{ChargeTool, RefundTool};
use serde_json::json;

/// The run every row's calls belong to.
pub const RUN: &str = "run-1";
/// An hour of the paused clock.
pub const HOUR: Duration = Duration::from_secs(3600);
/// A day of the paused clock.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // only the restart rows wait days
pub const DAY: Duration = Duration::from_secs(24 * 3600);

/// A fresh service with the given key contract, and the proxy in front of it.
pub fn service(keys: Keys) -> (Payments, Proxy) {
    let payments = Payments::with(keys, STRIPE_KEY_RETENTION);
    let proxy = Proxy::new(payments.clone());
    (payments, proxy)
}

/// tokio's (paused) clock, at a fixed start, for idem's store and registry.
pub fn clock() -> Arc<dyn Clock> {
    Arc::new(TokioClock::starting_at(Timestamp(1_767_225_600_000)))
}

/// A registry on `store`: what an agent process builds when it starts. The charge tool
/// declares the service's key contract truthfully.
pub fn registry(
    proxy: &Proxy,
    clock: &Arc<dyn Clock>,
    store: Arc<dyn IdemStore>,
    keys: Keys,
) -> Registry {
    let charge = match keys {
        Keys::Honoured => ChargeTool::keyed(proxy.clone()),
        Keys::Ignored => ChargeTool::unkeyed(proxy.clone()),
    };
    Registry::builder()
        .shared_store(store)
        .clock(clock.clone())
        .tool(charge)
        .tool(RefundTool::new(proxy.clone()))
        .build()
        .expect("the test tools are valid")
}

/// The row's charge of `amount` cents to one customer, as the model first sends it.
pub fn charge(amount: u64) -> ToolCall {
    ToolCall::new(
        RUN,
        "charge",
        json!({ "customer": "acme", "amount": amount }),
    )
    .call_id("toolu_1")
}

/// What a reconciler pass did, decision by decision.
pub fn actions(decisions: &[Decision]) -> Vec<Action> {
    decisions.iter().map(|d| d.action).collect()
}

/// The service's charge id in a completed charge's output.
pub fn charge_id(result: &ToolResult) -> String {
    result
        .output()
        .and_then(|o| o["id"].as_str())
        .unwrap_or_else(|| panic!("not a completed charge: {result:?}"))
        .to_owned()
}
