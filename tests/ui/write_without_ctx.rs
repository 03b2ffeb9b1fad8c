use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Charge a card, but forgets the context.
#[tool(write)]
async fn charge(args: ChargeArgs) -> Result<u64, ToolError> {
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
