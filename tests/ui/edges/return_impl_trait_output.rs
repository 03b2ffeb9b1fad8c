// The output as `impl Trait` inside the `Result`.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Opaque output.
#[tool(write)]
async fn charge(ctx: WriteCtx) -> Result<impl serde::Serialize, ToolError> {
    let _ = ctx;
    Ok(1u64)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
