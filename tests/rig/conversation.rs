//! A rig conversation as the idem run (`AgentRunnerExt::idem_conversation`): the runs of one
//! conversation share their saved results, so a repeat in a later prompt of the same
//! conversation replays; another conversation has its own. Judged on the bank's ledger.

use std::sync::{Arc, Mutex};

use crate::scripted::{text_reply, tool_call_reply, ScriptedHttp};
use idem::rig::AgentRunnerExt;
use idem::{toolbox, IdemStore, Registry, ToolError, WriteCtx};
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
struct Bank {
    /// (customer, cents, key) per charge made.
    ledger: Mutex<Vec<(String, u64, String)>>,
}

#[toolbox]
impl Bank {
    /// Charge a customer's card.
    #[tool(write, key(customer))]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((args.customer, args.cents, ctx.key().to_string()));
        Ok(format!("ch_{}", ledger.len()))
    }
}

fn charge() -> Value {
    json!({"customer": "cus_42", "cents": 4900})
}

/// One prompt of `conversation` whose model charges once under `call_id`; the answer the
/// tool gave the model.
async fn prompt(registry: &Registry, conversation: &str, call_id: &str) -> String {
    let http = ScriptedHttp::new([
        tool_call_reply(call_id, "charge_card", charge()),
        text_reply("Charged."),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(registry))
        .build();
    agent
        .prompt("Charge cus_42 $49.")
        .idem_conversation(conversation)
        .await
        .unwrap();
    http.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .map(|m| m["content"].to_string())
        .unwrap_or_else(|| panic!("no answer to {call_id}"))
}

#[tokio::test]
async fn two_prompts_of_one_conversation_are_one_charge_and_another_conversation_its_own() {
    let bank = Arc::new(Bank::default());
    let store: Arc<dyn IdemStore> = Arc::new(idem::MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store)
        .toolbox(bank.clone())
        .build()
        .unwrap();

    let first = prompt(&registry, "thread-1", "call_1").await;
    let again = prompt(&registry, "thread-1", "call_2").await;
    assert_eq!(bank.ledger.lock().unwrap().len(), 1, "{again}");
    assert!(first.contains("ch_1"), "{first}");
    assert!(
        again.contains("already completed earlier") && again.contains("ch_1"),
        "{again}"
    );

    let other = prompt(&registry, "thread-2", "call_3").await;
    let ledger = bank.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_ne!(ledger[0].2, ledger[1].2, "one key per conversation");
    assert!(other.contains("ch_2"), "{other}");
}
