use idem::{tool, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    customer: String,
    invoice: String,
}

/// Empty key.
#[tool(write, key())]
async fn a(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.customer)
}

/// A field twice.
#[tool(write, key(customer, customer))]
async fn b(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// A string instead of a list.
#[tool(write, key = "customer")]
async fn c(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// A nested path.
#[tool(write, key(customer.id))]
async fn d(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// No args to key on.
#[tool(write, key(customer))]
async fn e(ctx: WriteCtx) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(String::new())
}

fn main() {
    let _ = (a, b, c, d, e);
}
