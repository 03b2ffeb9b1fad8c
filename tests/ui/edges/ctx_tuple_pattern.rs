// The context smuggled into a tuple pattern.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Context and a number in one tuple.
#[tool(write)]
async fn charge((ctx, n): (WriteCtx, u64)) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(n)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
