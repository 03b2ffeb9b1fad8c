use idem::{tool, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    customer: Customer,
    invoice: String,
}

#[idem::args]
struct Customer {
    id: String,
}

/// A quoted path without the leading `/`.
#[tool(write, key("customer/id"))]
async fn a(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// A `~` that escapes nothing.
#[tool(write, key("/customer/id"), exclude("/note~2"))]
async fn b(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

/// One member named twice, as a field and as a one-step pointer.
#[tool(write, key(invoice, "/invoice"))]
async fn c(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    let _ = ctx;
    Ok(args.invoice)
}

fn main() {
    let _ = (a, b, c);
}
