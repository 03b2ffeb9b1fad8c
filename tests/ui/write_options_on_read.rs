use idem::{tool, ReadCtx, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A read tool has no key.
#[tool(read, key(customer), downstream = "keyed")]
async fn balance(ctx: ReadCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
