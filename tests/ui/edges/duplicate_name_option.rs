use idem::{tool, Registry, ToolError, WriteCtx};

/// Named twice.
#[tool(write, name = "charge", name = "charge_card")]
async fn charge(ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).build();
}
