//! The contexts imported under other names: the type checker, not the name, decides.
#![deny(warnings)]

use idem::{tool, Registry, ToolError};
use idem::ReadCtx as Look;
use idem::WriteCtx as W;
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Charge a card, the context imported as `W`.
#[tool(write, key(customer))]
async fn charge(ctx: W, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{} {} {}", ctx.key(), args.customer, args.cents))
}

/// Look a charge up, the context imported as `Look`.
#[tool(read)]
async fn look(_ctx: Look, args: ChargeArgs) -> Result<u64, ToolError> {
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).tool(look).build();
}
