use idem::ReadCtx as WriteCtx;
use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// `ReadCtx` imported under the name `WriteCtx`: the name says write, the type says read.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
