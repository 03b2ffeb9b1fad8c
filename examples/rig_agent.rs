//! idem tools inside a rig agent. The model is scripted (rig's OpenAI wire over a scripted
//! HTTP client, no network): it charges a card, then charges again under a new call id, as
//! a model does after a lost response. One charge on the ledger.
//!
//! ```sh
//! cargo run --example rig_agent --features rig
//! ```

#[path = "rig_agent/scripted.rs"]
mod scripted;

use std::sync::{Arc, Mutex};

use idem::rig::AgentRunnerExt;
use idem::{toolbox, Reconciler, Registry, Scope, ToolError, WriteCtx};
use rig_agent::AgentBuilder;
use scripted::{text_reply, tool_call_reply, ScriptedHttp};
use serde_json::json;

#[idem::args]
struct ChargeArgs {
    /// Customer id, e.g. `cus_42`.
    customer: String,
    /// The invoice this charge pays.
    invoice: String,
    /// Amount in cents.
    cents: u64,
}

/// The billing service's ledger.
#[derive(Default)]
struct Billing {
    ledger: Mutex<Vec<String>>,
}

#[toolbox]
impl Billing {
    /// Charge a customer's card for one invoice.
    #[tool(write, key(customer, invoice), downstream = "keyed")]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let mut ledger = self.ledger.lock().unwrap();
        let id = format!("ch_{}", ledger.len() + 1);
        ledger.push(format!(
            "{id} {} {} {} cents (key {})",
            args.customer,
            args.invoice,
            args.cents,
            ctx.key()
        ));
        Ok(id)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let billing = Arc::new(Billing::default());
    let registry = Registry::builder().toolbox(billing.clone()).build()?;

    let charge = json!({"customer": "cus_42", "invoice": "in_7", "cents": 4900});
    let http = ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge.clone()),
        tool_call_reply("call_2", "charge_card", charge),
        text_reply("Charged cus_42 $49.00 for in_7 (ch_1)."),
    ]);
    let agent = AgentBuilder::new(http.model())
        .preamble("You are a billing assistant.")
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();

    let reply = agent
        .prompt("Charge cus_42 $49.00 for invoice in_7.")
        .idem_run(Scope::run("run-rig-1"))
        .await?;

    let requests = http.requests();
    println!("tools rig offered the model (idem's definitions):");
    for tool in requests[0]["tools"].as_array().into_iter().flatten() {
        println!("  {}", tool["function"]);
    }
    println!("what the model was told:");
    for m in requests
        .last()
        .and_then(|r| r["messages"].as_array())
        .into_iter()
        .flatten()
    {
        if m["role"] == "tool" {
            println!("  {}: {}", m["tool_call_id"], m["content"]);
        }
    }
    println!("model: {}", reply.output());
    {
        let ledger = billing.ledger.lock().unwrap();
        println!("ledger: {} charge(s)", ledger.len());
        for line in ledger.iter() {
            println!("  {line}");
        }
    }
    // What a charge left unknown or pending is settled by a reconciler, never by the model.
    let decisions = Reconciler::new(&registry).run_once().await?;
    println!("reconciler: {} record(s) to settle", decisions.len());
    Ok(())
}
