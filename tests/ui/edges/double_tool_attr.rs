// `#[tool]` twice on one fn.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Twice.
#[tool(write)]
#[tool(write, timeout = "10s")]
async fn charge(ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
