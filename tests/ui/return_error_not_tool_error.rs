use idem::{tool, Registry, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Returns an error type without `Into<ToolError>`.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<u64, String> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
