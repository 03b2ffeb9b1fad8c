// A read tool asking for `WriteCtx` spelled as a raw identifier.
use idem::{tool, Registry, ToolError, WriteCtx};

/// Reads, but asks for a key.
#[tool(read)]
async fn balance(ctx: r#WriteCtx) -> Result<String, ToolError> {
    let _: &WriteCtx = &ctx;
    Ok(ctx.key().to_string())
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
