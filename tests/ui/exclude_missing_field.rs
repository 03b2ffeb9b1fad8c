use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Leaves out a field the args lack.
#[tool(write, exclude(memo))]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
