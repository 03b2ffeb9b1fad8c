// `impl Trait` args: no concrete type to decode into.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Args of no concrete type.
#[tool(write)]
async fn charge(ctx: WriteCtx, args: impl Send + 'static) -> Result<u64, ToolError> {
    let _ = (ctx, args);
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
