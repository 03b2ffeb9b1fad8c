// `unsafe` handlers: the model decides when they run.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Unsafe.
#[tool(write)]
async unsafe fn charge(ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
