use idem::{tool, Registry, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    customer: String,
    invoice: String,
}

/// `write` twice.
#[tool(write, write)]
async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.customer)
}

/// `key` twice.
#[tool(write, key(customer), key(invoice))]
async fn refund(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// `destructive` twice.
#[tool(write, destructive, destructive)]
async fn wipe(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

fn main() {
    let _ = Registry::builder().tool(charge).tool(refund).tool(wipe).build();
}
