// A doc the macro cannot read must not become an empty description without a word.
use idem::{tool, ReadCtx, Registry, ToolError};

#[doc = concat!("Look up ", "a charge.")]
#[tool(read)]
async fn lookup(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

// With `description = "…"` the same doc is fine.
#[doc = concat!("Look up ", "a refund.")]
#[tool(read, description = "Look up a refund.")]
async fn lookup_refund(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

fn main() {
    let _ = Registry::builder().tool(lookup).tool(lookup_refund).build();
}
