//! Quick start: two read tools and two write tools, one of them stateful in a `#[toolbox]`,
//! their definitions for OpenAI, Anthropic and MCP, and a write the model sends twice that
//! charges once.
//!
//! ```sh
//! cargo run --example quickstart
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use idem::{tool, toolbox, Format, ReadCtx, Reconciler, Registry, ToolCall, ToolError, WriteCtx};
use serde::Serialize;
use serde_json::json;

// --- Arguments: what the model sends. Their JSON Schema becomes the tool's input schema. ---

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

#[idem::args]
struct ReceiptArgs {
    customer: String,
    invoice: String,
}

#[idem::args]
struct RateArgs {
    /// ISO currency code, e.g. `EUR`.
    currency: String,
}

// --- Free tools: the fn's name is the tool's name, its doc comment the description. ---

/// Look up today's exchange rate from USD.
#[tool(read)]
async fn exchange_rate(_ctx: ReadCtx, args: RateArgs) -> Result<f64, ToolError> {
    match args.currency.as_str() {
        "EUR" => Ok(0.92),
        "GBP" => Ok(0.79),
        other => Err(ToolError::rejected(format!("unknown currency {other}"))),
    }
}

static RECEIPTS_SENT: AtomicU32 = AtomicU32::new(0);

/// Email the receipt of a paid invoice to the customer.
// A write tool takes `WriteCtx`: it carries the operation's idempotency key.
#[tool(write, key(customer, invoice))]
async fn send_receipt(ctx: WriteCtx, args: ReceiptArgs) -> Result<String, ToolError> {
    RECEIPTS_SENT.fetch_add(1, Ordering::SeqCst);
    // mailer.send(&args.customer, …, ctx.key().as_str()).await
    Ok(format!(
        "receipt for {} sent to {} ({})",
        args.invoice,
        args.customer,
        ctx.key()
    ))
}

// --- A toolbox: tools that share state, as `&self` methods. ---

#[derive(Clone, Serialize)]
struct Charge {
    id: String,
    customer: String,
    cents: u64,
}

/// A stand-in for a payment API: its ledger is what really happened.
#[derive(Default)]
struct Billing {
    ledger: Mutex<Vec<Charge>>,
}

#[toolbox]
impl Billing {
    /// Charge a customer's card for one invoice.
    ///
    /// Amounts are in cents.
    #[tool(write, key(customer, invoice), downstream = "keyed", timeout = "10s")]
    async fn charge_card(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        // A real handler sends `ctx.key()` as the `Idempotency-Key` header.
        let charge = Charge {
            id: format!("ch_{}", &ctx.key().as_str()[5..13]),
            customer: args.customer,
            cents: args.cents,
        };
        self.ledger
            .lock()
            .map_err(|_| ToolError::unknown("ledger poisoned"))?
            .push(charge.clone());
        Ok(charge)
    }

    /// List a customer's charges.
    #[tool(read)]
    async fn list_charges(&self, _ctx: ReadCtx, args: ListArgs) -> Result<Vec<Charge>, ToolError> {
        let ledger = self
            .ledger
            .lock()
            .map_err(|_| ToolError::unknown("ledger poisoned"))?;
        Ok(ledger
            .iter()
            .filter(|c| c.customer == args.customer)
            .cloned()
            .collect())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let billing = Arc::new(Billing::default());
    // The default store is in memory; see the `store_*` examples for durable ones.
    let registry = Registry::builder()
        .tool(exchange_rate)
        .tool(send_receipt)
        .toolbox(billing.clone())
        .build()?;

    for (label, format) in [
        ("OpenAI", Format::OpenAi),
        ("Anthropic", Format::Anthropic),
        ("MCP", Format::Mcp),
    ] {
        println!("== {label} tool definitions");
        println!(
            "{}",
            serde_json::to_string_pretty(&registry.definitions(format))?
        );
    }

    // The model calls `charge_card`; the response is lost, so it calls again next turn with a
    // new tool_use_id. Same operation, same key: the second call replays the first result.
    let args = json!({"customer": "cus_42", "invoice": "in_7", "cents": 4900});
    let first = registry
        .call(ToolCall::new("run-1", "charge_card", args.clone()).call_id("toolu_01"))
        .await;
    let again = registry
        .call(ToolCall::new("run-1", "charge_card", args).call_id("toolu_02"))
        .await;
    println!("== charge_card, twice");
    println!("first:  replayed={} {}", first.replayed(), first.text());
    println!("second: replayed={} {}", again.replayed(), again.text());
    let charges = billing.ledger.lock().map_err(|_| "ledger poisoned")?.len();
    println!("charges in the ledger: {charges}");
    assert_eq!(charges, 1, "one operation, one effect");
    assert!(again.replayed() && first.output() == again.output());

    let receipt = json!({"customer": "cus_42", "invoice": "in_7"});
    for call_id in ["toolu_03", "toolu_04"] {
        let sent = registry
            .call(ToolCall::new("run-1", "send_receipt", receipt.clone()).call_id(call_id))
            .await;
        println!("send_receipt: replayed={} {}", sent.replayed(), sent.text());
    }
    println!("receipts sent: {}", RECEIPTS_SENT.load(Ordering::SeqCst));

    let listed = registry
        .call(ToolCall::new(
            "run-1",
            "list_charges",
            json!({"customer": "cus_42"}),
        ))
        .await;
    println!("list_charges: {}", listed.text());
    let rate = registry
        .call(ToolCall::new(
            "run-1",
            "exchange_rate",
            json!({"currency": "EUR"}),
        ))
        .await;
    println!("exchange_rate: {}", rate.text());

    // Whatever a write left unknown or pending is settled by a reconciler, never by the
    // model. A one-shot program runs a pass before it exits; a long-lived one spawns it
    // (`Reconciler::new(&registry).spawn(Duration::from_secs(30))`).
    let decisions = Reconciler::new(&registry).run_once().await?;
    println!("reconciler: {} record(s) to settle", decisions.len());
    Ok(())
}
