//! `crate = "…"` names the facade by any path to it, as a crate that renames the `idem-rs`
//! dependency must (`tests/fixtures/renamed` is that crate).
#![deny(warnings)]

use std::sync::Arc;

use ::idem as facade;
use idem::{tool, toolbox, ReadCtx, Registry, ToolError, WriteCtx};

/// Arguments of `charge_card`.
#[idem::args(crate = "crate::facade")]
struct ChargeArgs {
    customer: String,
}

/// Charge a card.
#[tool(write, key(customer), crate = "crate::facade")]
async fn charge_card(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

struct Billing;

#[toolbox(crate = "::idem")]
impl Billing {
    /// The balance.
    #[tool(read)]
    async fn balance(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
        Ok(0)
    }
}

fn main() {
    let registry = Registry::builder()
        .tool(charge_card)
        .toolbox(Arc::new(Billing))
        .build()
        .unwrap();
    let charge = registry.get("charge_card").unwrap().spec();
    assert!(charge.key_field_names().eq(["customer"]));
    assert!(registry.get("balance").is_some());
}
