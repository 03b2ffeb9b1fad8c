use idem::{tool, Registry, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// The alias hides the name; the type checker still sees a `WriteCtx`.
type Ctx = idem::WriteCtx;

#[tool(read)]
async fn balance(ctx: Ctx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.customer))
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
