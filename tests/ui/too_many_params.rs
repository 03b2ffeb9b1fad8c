use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A third parameter.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs, retries: u32) -> Result<u64, ToolError> {
    let _ = (ctx, retries);
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
