// The read-back takes a `ReadCtx` instead of a `ReadBackCtx`.
use idem::{tool, ReadBack, ReadCtx, Registry, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    cents: u64,
}

/// A read-back of the wrong shape.
async fn find_charge(_ctx: ReadCtx, _args: ChargeArgs) -> Result<ReadBack, ToolError> {
    Ok(ReadBack::NotFound)
}

/// Charge.
#[tool(write, reconcile = find_charge)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(args.cents)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
