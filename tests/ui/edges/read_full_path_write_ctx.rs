// A read tool asking for `idem::WriteCtx` by its full path.
use idem::{tool, Registry, ToolError};

/// Reads, but asks for a key.
#[tool(read)]
async fn balance(ctx: idem::WriteCtx) -> Result<String, ToolError> {
    Ok(ctx.key().to_string())
}

fn main() {
    let _ = Registry::builder().tool(balance).build();
}
