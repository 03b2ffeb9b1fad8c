//! `#[idem::args]` derives everything a tool's arguments need, with no serde or schemars in
//! scope, and serde options on the type keep working.
#![deny(warnings)]

use idem::{tool, Registry, ToolError, WriteCtx};

/// Arguments of `charge_card`.
#[idem::args]
#[serde(rename_all = "camelCase")]
struct ChargeArgs {
    customer_id: String,
    amount_cents: u64,
}

/// Charge a card.
#[tool(write)]
async fn charge_card(_ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    Ok(args.amount_cents)
}

fn main() {
    let registry = Registry::builder().tool(charge_card).build().unwrap();
    let schema = registry.get("charge_card").unwrap().input_schema();
    assert!(schema["properties"]["customerId"].is_object());
    let _ = &ChargeArgs {
        customer_id: String::new(),
        amount_cents: 0,
    }
    .customer_id;
}
