use idem::{tool, Registry, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// No return type.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) {
    let _ = (ctx, args);
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
