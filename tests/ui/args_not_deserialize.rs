use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Args without derives.
struct Plain {
    cents: u64,
}

#[tool(write)]
async fn charge(ctx: WriteCtx, args: Plain) -> Result<u64, ToolError> {
    let _ = (ctx, &args.cents, ChargeArgs { customer: String::new(), cents: 0 }.customer);
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
