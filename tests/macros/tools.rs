//! `#[tool]` and `#[toolbox]` end to end: registration by name, specs from the attribute,
//! schemas, calls through the registry, replays.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    tool, tool::Downstream, toolbox, Format, ReadCtx, Registry, ToolCall, ToolError, WriteCtx,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    invoice: String,
    cents: u64,
}

/// The downstream's ledger: one idempotency key per charge. Tests in this binary run in
/// parallel, so each counts only the charges under its own key.
static CHARGES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn charges_under(key: &idem::IdemKey) -> usize {
    CHARGES
        .lock()
        .unwrap()
        .iter()
        .filter(|k| *k == key.as_str())
        .count()
}

/// Charge a customer's card
/// for one invoice.
///
/// Amounts are in cents.
#[tool(
    write,
    key(customer, invoice),
    downstream = "keyed",
    timeout = "10s",
    window = "23h",
    lease = "1m",
    destructive
)]
async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    CHARGES.lock().unwrap().push(ctx.key().to_string());
    Ok(format!(
        "{}:{}:{}",
        args.customer,
        args.cents,
        ctx.key().as_str().len()
    ))
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct ListArgs {
    customer: String,
    limit: Option<u32>,
}

/// List a customer's charges.
#[tool(read, name = "list-charges")]
pub async fn list_charges(ctx: ReadCtx, args: ListArgs) -> Result<Vec<String>, ToolError> {
    Ok(vec![
        format!("{}@{}", args.customer, ctx.run_id());
        args.limit.unwrap_or(1) as usize
    ])
}

/// What time is it?
#[tool(read)]
async fn now(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(42)
}

#[derive(Debug)]
struct Declined;

impl From<Declined> for ToolError {
    fn from(_: Declined) -> ToolError {
        ToolError::failed("card declined")
    }
}

type Ctx = idem::WriteCtx;

/// Always declined; takes its context through an alias.
#[tool(write)]
async fn decline(_ctx: Ctx) -> Result<(), Declined> {
    Err(Declined)
}

/// A tool whose name shadows the generated bindings.
#[tool(read)]
async fn args(ctx: ReadCtx, r#type: ListArgs) -> Result<String, ToolError> {
    Ok(format!("{}/{}", r#type.customer, ctx.tool()))
}

struct Billing {
    refunds: AtomicU32,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct RefundArgs {
    charge: String,
}

#[toolbox]
impl Billing {
    /// Refund a charge.
    #[tool(write, key(charge))]
    async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<u32, ToolError> {
        assert!(!ctx.key().as_str().is_empty() && !args.charge.is_empty());
        Ok(self.refunds.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Count refunds.
    #[tool(read)]
    async fn refund_count(&self, _ctx: ReadCtx) -> Result<u32, ToolError> {
        Ok(self.refunds.load(Ordering::SeqCst))
    }

    /// Not a tool.
    fn helper(&self) -> u32 {
        7
    }
}

fn registry(billing: Arc<Billing>) -> Registry {
    Registry::builder()
        .tool(charge_card)
        .tool(list_charges)
        .tool(now)
        .tool(decline)
        .tool(args)
        .toolbox(billing)
        .build()
        .expect("valid registry")
}

#[test]
fn specs_come_from_the_attribute_and_docs() {
    let registry = registry(Arc::new(Billing {
        refunds: AtomicU32::new(0),
    }));
    let charge = registry
        .get("charge_card")
        .expect("registered by fn name")
        .spec();
    assert_eq!(
        charge.description_text(),
        "Charge a customer's card for one invoice.\n\nAmounts are in cents."
    );
    assert_eq!(charge.timeout_duration(), Duration::from_secs(10));
    assert_eq!(charge.window_duration(), Duration::from_secs(23 * 3600));
    assert_eq!(charge.lease_duration(), Duration::from_secs(60));
    assert_eq!(charge.downstream_kind(), Downstream::Keyed);
    assert!(charge.is_destructive());
    assert_eq!(
        charge.key_field_names().collect::<Vec<_>>(),
        ["customer", "invoice"]
    );
    assert_eq!(charge_card::NAME, "charge_card");
    assert_eq!(list_charges::NAME, "list-charges");
    assert!(registry.get("list-charges").is_some());
    assert_eq!(
        registry.tools().map(|t| t.name()).collect::<Vec<_>>(),
        [
            "charge_card",
            "list-charges",
            "now",
            "decline",
            "args",
            "refund",
            "refund_count"
        ]
    );
}

#[test]
fn a_tool_without_args_has_an_empty_object_schema() {
    let registry = registry(Arc::new(Billing {
        refunds: AtomicU32::new(0),
    }));
    let defs = registry.definitions(Format::Anthropic);
    let now = defs.iter().find(|d| d["name"] == "now").unwrap();
    assert_eq!(
        now["input_schema"],
        json!({"type": "object", "properties": {}})
    );
    assert_eq!(now["description"], "What time is it?");
}

#[tokio::test]
async fn calls_run_and_writes_replay() {
    let billing = Arc::new(Billing {
        refunds: AtomicU32::new(0),
    });
    assert_eq!(billing.helper(), 7);
    let registry = registry(billing.clone());

    let call = || {
        ToolCall::new(
            "run-1",
            "charge_card",
            json!({"customer": "acme", "invoice": "in_1", "cents": 4900}),
        )
    };
    let first = registry.call(call()).await;
    let second = registry.call(call()).await;
    assert!(first.is_completed(), "{:?}", first.error());
    assert!(!first.replayed());
    assert!(second.replayed());
    assert_eq!(first.output(), second.output());
    assert_eq!(charges_under(first.key().unwrap()), 1);

    let listed = registry
        .call(ToolCall::new(
            "run-1",
            "list-charges",
            json!({"customer": "acme", "limit": 2}),
        ))
        .await;
    assert_eq!(listed.output(), Some(&json!(["acme@run-1", "acme@run-1"])));

    let now = registry
        .call(ToolCall::new("run-1", "now", json!({})))
        .await;
    assert_eq!(now.output(), Some(&json!(42)));

    let declined = registry
        .call(ToolCall::new("run-1", "decline", json!({})))
        .await;
    assert_eq!(declined.class(), Some(idem::OutcomeClass::Failed));

    let shadow = registry
        .call(ToolCall::new("run-1", "args", json!({"customer": "x"})))
        .await;
    assert_eq!(shadow.output(), Some(&json!("x/args")));

    for _ in 0..2 {
        let refund = registry
            .call(ToolCall::new("run-1", "refund", json!({"charge": "ch_1"})))
            .await;
        assert_eq!(refund.output(), Some(&json!(1)));
    }
    let count = registry
        .call(ToolCall::new("run-1", "refund_count", json!({})))
        .await;
    assert_eq!(count.output(), Some(&json!(1)));
}

#[tokio::test]
async fn handlers_can_be_unit_tested_with_a_test_context() {
    use idem::identity::KeyMaterial;
    use idem::{tool::WriteTool, IdemKey, Scope};
    let key = IdemKey::derive(
        &Scope::run("test"),
        "charge_card",
        KeyMaterial::Intent("t-1"),
    );
    let out = charge_card()
        .call(
            WriteCtx::for_test(key),
            ChargeArgs {
                customer: "acme".into(),
                invoice: "in_2".into(),
                cents: 1,
            },
        )
        .await;
    assert!(out.unwrap().starts_with("acme:1:"));
}
