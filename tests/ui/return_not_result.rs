use idem::{tool, Registry, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// Returns a bare value.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> u64 {
    let _ = ctx;
    args.cents
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
