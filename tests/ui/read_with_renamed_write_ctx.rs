use idem::WriteCtx as W;
use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A read tool cannot see a key, whatever the context is imported as.
#[tool(read)]
async fn balance(ctx: W, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.customer))
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
