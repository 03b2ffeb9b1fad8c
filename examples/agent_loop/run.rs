//! The agent loop of `examples/agent_loop.rs`, shared with its integration test
//! (`tests/agent_loop.rs`): a billing toolbox with a ledger, a scripted model that replays a
//! recorded transcript, and one loop per provider.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use idem::providers::{anthropic, call_all, is_error, openai};
use idem::{toolbox, Format, ReadCtx, Registry, Scope, ToolError, ToolResult, WriteCtx};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

// ---- the tools and their downstream ------------------------------------------------------

/// One charge on the billing service's ledger.
#[derive(Clone, Debug, Serialize)]
pub struct Charge {
    /// The billing service's id.
    pub id: String,
    /// Who paid.
    pub customer: String,
    /// For which invoice.
    pub invoice: String,
    /// How much.
    pub cents: u64,
    /// The idempotency key the charge was made under.
    pub key: String,
}

#[idem::args]
struct ChargeArgs {
    /// Customer id, e.g. `cus_42`.
    customer: String,
    /// The invoice this charge pays.
    invoice: String,
    /// Amount in cents.
    cents: u64,
}

#[idem::args]
struct ListArgs {
    customer: String,
}

/// The billing service: a ledger the charge tool writes to, and how often the charge
/// handler ran at all.
#[derive(Default)]
pub struct Billing {
    ledger: Mutex<Vec<Charge>>,
    handler_runs: AtomicU32,
}

impl Billing {
    /// The charges on the ledger.
    pub fn ledger(&self) -> Vec<Charge> {
        self.ledger.lock().unwrap().clone()
    }

    /// How many times the charge handler ran.
    pub fn handler_runs(&self) -> u32 {
        self.handler_runs.load(Ordering::SeqCst)
    }
}

#[toolbox]
impl Billing {
    /// Charge a customer's card for one invoice.
    #[tool(write, key(customer, invoice), downstream = "keyed")]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        self.handler_runs.fetch_add(1, Ordering::SeqCst);
        let mut ledger = self.ledger.lock().unwrap();
        let charge = Charge {
            id: format!("ch_{}", ledger.len() + 1),
            customer: args.customer,
            invoice: args.invoice,
            cents: args.cents,
            key: ctx.key().to_string(),
        };
        ledger.push(charge.clone());
        Ok(charge)
    }

    /// List a customer's charges.
    #[tool(read)]
    async fn list_charges(&self, _ctx: ReadCtx, args: ListArgs) -> Result<Vec<String>, ToolError> {
        let ledger = self.ledger.lock().unwrap();
        Ok(ledger
            .iter()
            .filter(|c| c.customer == args.customer)
            .map(|c| format!("{} {} {} cents", c.id, c.invoice, c.cents))
            .collect())
    }
}

// ---- the transcript and the scripted model -----------------------------------------------

/// A recorded conversation: the model's replies, in order, and which tool answers the
/// harness lost on the way back (the effect happened, the model never heard of it).
#[derive(Debug, Deserialize)]
pub struct Transcript {
    /// Which API the replies come from.
    pub api: String,
    /// The system prompt.
    pub system: String,
    /// The user's request.
    pub user: String,
    /// Call ids whose answers are lost: the model is told the call timed out.
    pub lost_responses: Vec<String>,
    /// The model's replies, one per turn (whole response bodies).
    pub replies: Vec<Value>,
}

impl Transcript {
    /// Reads a transcript file.
    pub fn load(path: &str) -> Result<Transcript, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
    }
}

/// Stands in for the provider: answers each request with the transcript's next reply, after
/// checking what the real API would refuse with a 400 (a tool call left unanswered or
/// answered out of order, a tool that was not offered).
struct ScriptedModel {
    replies: std::vec::IntoIter<Value>,
}

impl ScriptedModel {
    fn respond(
        &mut self,
        request: &Value,
        check: fn(&Value) -> Result<(), String>,
    ) -> Result<Value, String> {
        check(request)?;
        self.replies
            .next()
            .ok_or_else(|| "the transcript has no reply left".to_owned())
    }
}

/// What the harness told the model about one call.
#[derive(Debug)]
pub struct Told {
    /// The model's call id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// What idem answered.
    pub result: ToolResult,
    /// What reached the model (a timeout notice, when the answer was lost).
    pub text: String,
    /// Whether the model saw it as an error.
    pub is_error: bool,
}

/// A finished run: every answer, and the model's final words.
#[derive(Debug)]
pub struct Run {
    /// Every call and what the model was told, in order.
    pub told: Vec<Told>,
    /// The model's final answer.
    pub answer: String,
}

/// What a harness sends when its tool call timed out before the answer arrived.
const LOST: &str = "error: the tool call timed out before a response arrived";

fn told(result: ToolResult, lost: &[String]) -> Told {
    let call_id = result.call_id().unwrap_or_default().to_owned();
    let delivered = !lost.contains(&call_id);
    Told {
        tool: result.tool().to_owned(),
        text: if delivered {
            result.text()
        } else {
            LOST.to_owned()
        },
        is_error: !delivered || is_error(&result),
        call_id,
        result,
    }
}

// ---- OpenAI Chat Completions -------------------------------------------------------------

/// Runs the loop over an OpenAI Chat Completions transcript.
pub async fn run_openai(registry: &Registry, scope: &Scope, t: Transcript) -> Result<Run, String> {
    let mut model = ScriptedModel {
        replies: t.replies.into_iter(),
    };
    let mut messages = vec![
        json!({"role": "system", "content": t.system}),
        json!({"role": "user", "content": t.user}),
    ];
    let tools = registry.definitions(Format::OpenAi);
    let mut all = Vec::new();
    loop {
        let request = json!({"model": "gpt-4.1", "messages": messages, "tools": tools});
        let reply = model.respond(&request, check_openai)?;
        let message = reply["choices"][0]["message"].clone();
        let parsed: openai::ChatAssistantMessage =
            serde_json::from_value(message.clone()).map_err(|e| e.to_string())?;
        messages.push(message.clone());
        if parsed.tool_calls.is_empty() {
            let answer = message["content"].as_str().unwrap_or_default().to_owned();
            return Ok(Run { told: all, answer });
        }
        for result in call_all(registry, parsed.to_calls(scope)).await {
            let told = told(result, &t.lost_responses);
            let mut answer = openai::ChatToolMessage::from(&told.result);
            answer.content.clone_from(&told.text);
            messages.push(serde_json::to_value(answer).map_err(|e| e.to_string())?);
            all.push(told);
        }
    }
}

fn check_openai(request: &Value) -> Result<(), String> {
    let offered: Vec<&str> = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    let messages = request["messages"].as_array().ok_or("no messages")?;
    for (i, m) in messages.iter().enumerate() {
        let Some(calls) = m["tool_calls"].as_array() else {
            continue;
        };
        for (j, call) in calls.iter().enumerate() {
            let id = &call["id"];
            let name = call["function"]["name"].as_str().unwrap_or_default();
            if !offered.contains(&name) {
                return Err(format!("tool {name} was not offered"));
            }
            let answer = &messages.get(i + 1 + j).ok_or(format!("{id} unanswered"))?;
            if answer["role"] != "tool" || answer["tool_call_id"] != *id {
                return Err(format!("{id} is not answered in order: {answer}"));
            }
        }
    }
    Ok(())
}

// ---- Anthropic Messages ------------------------------------------------------------------

/// Runs the loop over an Anthropic Messages transcript.
pub async fn run_anthropic(
    registry: &Registry,
    scope: &Scope,
    t: Transcript,
) -> Result<Run, String> {
    let mut model = ScriptedModel {
        replies: t.replies.into_iter(),
    };
    let mut messages = vec![json!({"role": "user", "content": t.user})];
    let tools = registry.definitions(Format::Anthropic);
    let mut all = Vec::new();
    loop {
        let request = json!({
            "model": "claude-sonnet-4-5", "max_tokens": 1024,
            "system": t.system, "messages": messages, "tools": tools,
        });
        let reply = model.respond(&request, check_anthropic)?;
        let parsed: anthropic::AssistantMessage =
            serde_json::from_value(reply.clone()).map_err(|e| e.to_string())?;
        messages.push(json!({"role": "assistant", "content": reply["content"]}));
        if parsed.tool_uses().next().is_none() {
            let answer = reply["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            return Ok(Run { told: all, answer });
        }
        let mut blocks = Vec::new();
        for result in call_all(registry, parsed.to_calls(scope)).await {
            let told = told(result, &t.lost_responses);
            let mut block = anthropic::ToolResultBlock::from(&told.result);
            block.content.clone_from(&told.text);
            block.is_error = told.is_error;
            blocks.push(block);
            all.push(told);
        }
        // Every result of one assistant message goes back in one user message.
        messages.push(json!({"role": "user", "content": blocks}));
    }
}

fn check_anthropic(request: &Value) -> Result<(), String> {
    let offered: Vec<&str> = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let messages = request["messages"].as_array().ok_or("no messages")?;
    for (i, m) in messages.iter().enumerate() {
        let uses: Vec<&Value> = m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use")
            .collect();
        if uses.is_empty() {
            continue;
        }
        let next = messages
            .get(i + 1)
            .ok_or("tool_use without a following user message")?;
        let results: Vec<&Value> = next["content"].as_array().into_iter().flatten().collect();
        if results.len() != uses.len() {
            return Err(format!(
                "{} tool uses, {} results",
                uses.len(),
                results.len()
            ));
        }
        for (u, r) in uses.iter().zip(results) {
            let name = u["name"].as_str().unwrap_or_default();
            if !offered.contains(&name) {
                return Err(format!("tool {name} was not offered"));
            }
            if r["type"] != "tool_result" || r["tool_use_id"] != u["id"] {
                return Err(format!("{} is not answered in order: {r}", u["id"]));
            }
        }
    }
    Ok(())
}

/// A registry over a fresh billing service.
pub fn billing() -> (Arc<Billing>, Registry) {
    let billing = Arc::new(Billing::default());
    let registry = Registry::builder()
        .toolbox(billing.clone())
        .build()
        .expect("the billing tools are valid");
    (billing, registry)
}
