use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// The output must serialize.
struct Receipt;

#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, ToolError> {
    let _ = (ctx, args);
    Ok(Receipt)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
