use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Takes the context twice.
#[tool(write)]
async fn charge(ctx: WriteCtx, again: WriteCtx) -> Result<u64, ToolError> {
    let _ = (ctx, again);
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
