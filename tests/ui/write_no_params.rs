use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Charge a card with no parameters at all.
#[tool(write)]
async fn charge() -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
