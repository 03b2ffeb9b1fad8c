// A lease too short to be renewed in time is a compile error, not a surprise at build().
use idem::{tool, ToolError, WriteCtx};

/// Charge.
#[tool(write, lease = "5ms")]
async fn charge(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(1)
}

fn main() {}
