use idem::{tool, ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Bad name.
#[tool(write, name = "charge card!")]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

/// A fn name outside the charset.
#[tool(read)]
async fn café(ctx: ReadCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).tool(café).build();
}
