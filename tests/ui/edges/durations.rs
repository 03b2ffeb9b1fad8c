use idem::{tool, ToolError, WriteCtx};

/// Integer, not a string.
#[tool(write, timeout = 30)]
async fn a(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

/// Zero.
#[tool(write, window = "0s")]
async fn b(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

/// Days are not a unit.
#[tool(write, lease = "1d")]
async fn c(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

/// Fractions are not whole numbers.
#[tool(write, timeout = "1.5s")]
async fn d(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

/// No value at all.
#[tool(write, timeout)]
async fn e(ctx: WriteCtx) -> Result<(), ToolError> {
    let _ = ctx;
    Ok(())
}

fn main() {
    let _ = (a, b, c, d, e);
}
