use idem::{tool, ReadCtx, ToolError, WriteCtx};

#[idem::args]
struct ChargeArgs {
    customer: String,
    memo: String,
}

/// `key_travels` on a tool whose downstream is not keyed.
#[tool(write, key_travels = "the client's middleware")]
async fn a(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

/// `key_travels` without saying how.
#[tool(write, downstream = "keyed", key_travels = " ")]
async fn b(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.customer))
}

/// A key name no tool could have.
#[tool(write, key_name = "charge card")]
async fn c(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

/// Key options on a read tool.
#[tool(read, exclude(memo), key_name = "lookup")]
async fn d(_ctx: ReadCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.memo)
}

/// `exclude` without args.
#[tool(write, exclude(memo))]
async fn e(_ctx: WriteCtx) -> Result<String, ToolError> {
    Ok(String::new())
}

fn main() {
    let _ = (a, b, c, d, e);
}
