use idem::{tool, Registry, ToolError, WriteCtx};

/// An empty name.
#[tool(write, name = "")]
async fn charge(ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
