use idem::{tool, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Args without `JsonSchema`.
#[derive(Deserialize, Serialize)]
struct NoSchema {
    cents: u64,
}

#[tool(write)]
async fn charge(ctx: WriteCtx, args: NoSchema) -> Result<u64, ToolError> {
    let _ = (ctx, ChargeArgs { customer: String::new(), cents: 0 }.customer);
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
