use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

mod fake {
    /// Not idem's context, though it has the same name.
    pub struct WriteCtx;
}

/// The last path segment says `WriteCtx`; the type checker knows better.
#[tool(write)]
async fn charge(ctx: fake::WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
