//! idem tools in a rig agent: a scripted model (rig's own OpenAI wire over a scripted HTTP
//! client, no network) that repeats a write causes one effect on the ledger; the tool
//! definitions rig sends are idem's; the run id is bound per agent run.

use std::sync::{Arc, Mutex};

use crate::scripted::{text_reply, tool_call_reply, ScriptedHttp};
use idem::rig::AgentRunnerExt;
use idem::{toolbox, Format, Registry, Scope, ToolError, WriteCtx};
use rig_agent::AgentBuilder;
use serde_json::{json, Value};

#[idem::args]
struct ChargeArgs {
    /// Customer id.
    customer: String,
    /// Amount in cents.
    cents: u64,
}

#[derive(Default)]
struct Billing {
    ledger: Mutex<Vec<(String, u64, String)>>,
}

#[toolbox]
impl Billing {
    /// Charge a customer's card.
    #[tool(write, key(customer))]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((args.customer, args.cents, ctx.key().to_string()));
        Ok(format!("ch_{}", ledger.len()))
    }
}

fn billing() -> (Arc<Billing>, Registry) {
    let billing = Arc::new(Billing::default());
    let registry = Registry::builder()
        .toolbox(billing.clone())
        .build()
        .unwrap();
    (billing, registry)
}

fn charge() -> Value {
    json!({"customer": "cus_42", "cents": 4900})
}

/// The model charges, then charges again under a new call id, then answers.
fn repeating_model() -> ScriptedHttp {
    ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge()),
        tool_call_reply("call_2", "charge_card", charge()),
        text_reply("Charged cus_42 once."),
    ])
}

/// The `tool` messages of a request rig sent, by call id.
fn tool_answer(request: &Value, call_id: &str) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .map(|m| m["content"].to_string())
        .unwrap_or_else(|| panic!("no answer to {call_id} in {request}"))
}

#[tokio::test]
async fn a_rig_agent_repeating_a_write_causes_one_effect() {
    let (billing, registry) = billing();
    let http = repeating_model();
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();

    let reply = agent
        .prompt("Charge cus_42 $49.")
        .idem_run(Scope::run("run-1"))
        .await
        .unwrap();
    assert_eq!(reply.output(), "Charged cus_42 once.");

    let ledger = billing.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].1, 4900);

    let requests = http.requests();
    assert_eq!(requests.len(), 3);
    // The repeat was answered with the first charge, replayed.
    let second = tool_answer(&requests[2], "call_2");
    assert!(
        second.contains("already completed earlier") && second.contains("ch_1"),
        "{second}"
    );
    assert!(tool_answer(&requests[2], "call_1").contains("ch_1"));

    // The definition rig sent the model is idem's.
    let idem_def = &registry.definitions(Format::OpenAi)[0]["function"];
    let sent = &requests[0]["tools"][0]["function"];
    assert_eq!(sent["name"], idem_def["name"]);
    assert_eq!(sent["description"], idem_def["description"]);
    assert_eq!(sent["parameters"], idem_def["parameters"], "{sent}");
}

#[tokio::test]
async fn the_run_id_is_bound_per_agent_run() {
    let (billing, registry) = billing();
    let http = ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge()),
        text_reply("done"),
        tool_call_reply("call_1", "charge_card", charge()),
        text_reply("done"),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();
    for run in ["run-a", "run-b"] {
        agent
            .prompt("Charge cus_42 $49.")
            .idem_run(Scope::run(run))
            .await
            .unwrap();
    }
    // Two runs, two operations: saved results never cross runs.
    let ledger = billing.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_ne!(ledger[0].2, ledger[1].2, "two keys");
}

#[tokio::test]
async fn a_call_outside_an_idem_run_is_refused_and_nothing_runs() {
    let (billing, registry) = billing();
    let http = ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge()),
        text_reply("could not charge"),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();
    agent.prompt("Charge cus_42 $49.").await.unwrap();
    assert!(billing.ledger.lock().unwrap().is_empty());
    let answer = tool_answer(&http.requests()[1], "call_1");
    assert!(answer.contains("outside an idem run"), "{answer}");
    // It says how to bind one: a scope of the host's, or the rig conversation.
    assert!(
        answer.contains("AgentRunnerExt::idem_run") && answer.contains("idem_conversation"),
        "{answer}"
    );
}
