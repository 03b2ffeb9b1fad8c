// The context by shared reference: each attempt owns its context.
use idem::{tool, Registry, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    cents: u64,
}

/// Borrows the context.
#[tool(write)]
async fn charge(ctx: &WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx.key();
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
    let _ = charge::NAME;
}
