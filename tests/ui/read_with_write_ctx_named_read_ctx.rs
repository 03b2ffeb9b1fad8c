use idem::WriteCtx as ReadCtx;
use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// `WriteCtx` imported under the name `ReadCtx`: a read tool still cannot take it.
#[tool(read)]
async fn balance(ctx: ReadCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.customer))
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
