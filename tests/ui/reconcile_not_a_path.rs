use idem::{tool, ToolError, WriteCtx};

/// The read-back is named by a path, not a string.
#[tool(write, reconcile = "find_charge")]
async fn charge(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(1)
}

fn main() {}
