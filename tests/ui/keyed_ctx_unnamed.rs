use idem::{tool, toolbox, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// The context marked unused.
#[tool(write, downstream = "keyed")]
async fn a(_ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    Ok(args.cents)
}

/// The context ignored.
#[tool(write, downstream = "keyed")]
async fn b(_: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    Ok(args.cents)
}

/// The context named, never used.
#[tool(write, downstream = "keyed")]
async fn c(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

struct Billing;

#[toolbox]
impl Billing {
    /// A method that forgets the key too.
    #[tool(write, downstream = "keyed")]
    async fn d(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
        Ok(args.cents)
    }
}

fn main() {
    let _ = (a, b, c, Billing);
}
