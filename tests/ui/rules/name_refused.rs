// Tool names outside 1–64 of `[A-Za-z0-9_-]`, each refused here as `Registry::build` refuses
// it (tests/macro_rules.rs runs every `name` of this directory through `build()` too).
use idem::{tool, ReadCtx, ToolError};

/// 65 characters.
#[tool(read, name = "a123456789012345678901234567890123456789012345678901234567890234x")]
async fn too_long(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// Empty.
#[tool(read, name = "")]
async fn empty(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// A dot.
#[tool(read, name = "billing.charge")]
async fn dot(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// A space.
#[tool(read, name = "look up")]
async fn space(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// A slash.
#[tool(read, name = "billing/charge")]
async fn slash(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// A letter outside ASCII.
#[tool(read, name = "café")]
async fn accent(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {}
