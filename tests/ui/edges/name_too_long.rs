use idem::{tool, Registry, ToolError, WriteCtx};

/// 65 characters.
#[tool(write, name = "a234567890123456789012345678901234567890123456789012345678901234x")]
async fn charge(ctx: WriteCtx) -> Result<u64, ToolError> {
    let _ = ctx;
    Ok(0)
}

/// 64 characters, one of them `é` (two bytes): the charset is the problem, not the length.
#[tool(read, name = "a23456789012345678901234567890123456789012345678901234567890123é")]
async fn lookup(_ctx: idem::ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// A space.
#[tool(read, name = "look up")]
async fn look(_ctx: idem::ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(charge).tool(lookup).tool(look).build();
}
