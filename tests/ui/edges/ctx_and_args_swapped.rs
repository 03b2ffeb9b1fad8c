// Args first, context second: one mistake, which should be one error.
use idem::{tool, Registry, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    cents: u64,
}

/// Parameters in the wrong order.
#[tool(write)]
async fn charge(args: ChargeArgs, ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
