//! idem write tools inside rig agents, where the agent loop re-issues a call in ways
//! `agent.rs` does not script: the model sends the same charge twice in *one*
//! assistant message (rig runs both calls); a resumed agent run (same run id, a new agent
//! run on a store that outlived the first process) asks again; the first answer is lost
//! (unknown) and the model asks again; the model asks again with a changed amount. The
//! ledger holds one charge in every case.

use std::sync::{Arc, Mutex};

use crate::scripted::{text_reply, tool_call_reply, ScriptedHttp};
use idem::rig::AgentRunnerExt;
use idem::{toolbox, IdemStore, Registry, Scope, ToolError, WriteCtx};
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
    /// (customer, cents, key) per request that reached the bank.
    requests: Mutex<Vec<(String, u64, String)>>,
    /// Lose the answer to every request (the charge is made; the reply never arrives).
    lose_answers: Mutex<bool>,
}

impl Billing {
    fn requests(&self) -> Vec<(String, u64, String)> {
        self.requests.lock().unwrap().clone()
    }
}

#[toolbox]
impl Billing {
    /// Charge a customer's card.
    #[tool(write, key(customer))]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let n = {
            let mut requests = self.requests.lock().unwrap();
            requests.push((args.customer, args.cents, ctx.key().to_string()));
            requests.len()
        };
        // Both calls of one message are in flight together.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if *self.lose_answers.lock().unwrap() {
            return Err(ToolError::unknown("connection reset after sending"));
        }
        Ok(format!("ch_{n}"))
    }
}

fn registry(billing: &Arc<Billing>, store: Arc<dyn IdemStore>) -> Registry {
    Registry::builder()
        .shared_store(store)
        .toolbox(billing.clone())
        .build()
        .unwrap()
}

fn charge(cents: u64) -> Value {
    json!({"customer": "cus_42", "cents": cents})
}

/// A Chat Completions response calling `charge_card` once per call id, in one message.
fn parallel_calls(ids: &[&str], arguments: Value) -> Value {
    let mut reply = tool_call_reply(ids[0], "charge_card", arguments.clone());
    let calls: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "type": "function",
                   "function": {"name": "charge_card", "arguments": arguments.to_string()}})
        })
        .collect();
    reply["choices"][0]["message"]["tool_calls"] = Value::Array(calls);
    reply
}

/// The content of the `tool` message answering `call_id` in a request rig sent.
fn tool_answer(request: &Value, call_id: &str) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .map(|m| m["content"].to_string())
        .unwrap_or_else(|| panic!("no answer to {call_id} in {request}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_charge_twice_in_one_message_is_one_charge() {
    let billing = Arc::new(Billing::default());
    let registry = registry(&billing, Arc::new(idem::MemoryStore::new()));
    let http = ScriptedHttp::new([
        parallel_calls(&["call_1", "call_2"], charge(4900)),
        text_reply("Charged."),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();
    agent
        .prompt("Charge cus_42 $49.")
        .idem_run(Scope::run("run-1"))
        .await
        .unwrap();
    let requests = billing.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let sent = http.requests();
    let (a, b) = (
        tool_answer(&sent[1], "call_1"),
        tool_answer(&sent[1], "call_2"),
    );
    // Both answers carry the one charge: one ran it, the other waited and got its result.
    assert!(a.contains("ch_1") && b.contains("ch_1"), "{a} / {b}");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_agent_run_on_a_durable_store_replays() {
    let dir = std::env::temp_dir().join(format!("idem-rig-repeats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("idem.sqlite3");
    let billing = Arc::new(Billing::default());
    for (turn, call_id) in ["call_1", "call_9"].into_iter().enumerate() {
        // A new process each time: a new store handle, a new registry, a new agent.
        let store = Arc::new(idem::SqliteStore::open(&path).await.unwrap());
        let registry = registry(&billing, store);
        let http = ScriptedHttp::new([
            tool_call_reply(call_id, "charge_card", charge(4900)),
            text_reply("Charged."),
        ]);
        let agent = AgentBuilder::new(http.model())
            .default_max_turns(5)
            .dynamic_tools(idem::rig::tools(&registry))
            .build();
        agent
            .prompt("Charge cus_42 $49.")
            .idem_run(Scope::run("run-7").with_tenant("acme"))
            .await
            .unwrap();
        let answer = tool_answer(&http.requests()[1], call_id);
        if turn == 1 {
            assert!(answer.contains("already completed earlier"), "{answer}");
        }
        assert!(answer.contains("ch_1"), "{answer}");
    }
    assert_eq!(billing.requests().len(), 1, "{:?}", billing.requests());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_unknown_and_the_models_repeat_is_not_sent() {
    let billing = Arc::new(Billing::default());
    *billing.lose_answers.lock().unwrap() = true;
    let registry = registry(&billing, Arc::new(idem::MemoryStore::new()));
    let http = ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge(4900)),
        tool_call_reply("call_2", "charge_card", charge(4900)),
        tool_call_reply("call_3", "charge_card", charge(4900)),
        text_reply("I could not confirm the charge."),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(6)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();
    agent
        .prompt("Charge cus_42 $49.")
        .idem_run(Scope::run("run-2"))
        .await
        .unwrap();
    assert_eq!(billing.requests().len(), 1, "{:?}", billing.requests());
    let sent = http.requests();
    for (i, id) in ["call_1", "call_2", "call_3"].iter().enumerate() {
        let answer = tool_answer(&sent[i + 1], id);
        assert!(answer.contains("outcome unknown"), "{id}: {answer}");
        assert!(answer.contains("not sent again"), "{id}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_with_a_changed_amount_is_refused() {
    let billing = Arc::new(Billing::default());
    let registry = registry(&billing, Arc::new(idem::MemoryStore::new()));
    let http = ScriptedHttp::new([
        tool_call_reply("call_1", "charge_card", charge(4900)),
        tool_call_reply("call_2", "charge_card", charge(9900)),
        text_reply("Done."),
    ]);
    let agent = AgentBuilder::new(http.model())
        .default_max_turns(5)
        .dynamic_tools(idem::rig::tools(&registry))
        .build();
    agent
        .prompt("Charge cus_42 $49.")
        .idem_run(Scope::run("run-3"))
        .await
        .unwrap();
    let requests = billing.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].1, 4900);
    let answer = tool_answer(&http.requests()[2], "call_2");
    assert!(answer.contains("different parameters"), "{answer}");
}
