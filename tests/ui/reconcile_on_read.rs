use idem::{tool, ReadCtx, ToolError};

/// A read tool has nothing to reconcile.
#[tool(read, reconcile = find)]
async fn lookup(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(1)
}

fn main() {}
