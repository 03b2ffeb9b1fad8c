use idem::{tool, ReadCtx, ToolError};

/// Every write-only option on a read tool.
#[tool(read, window = "1h", lease = "1m", destructive, in_flight = "2m")]
async fn lookup(ctx: ReadCtx) -> Result<String, ToolError> {
    Ok(ctx.run_id().to_owned())
}

fn main() {
    let _ = lookup::NAME;
}
