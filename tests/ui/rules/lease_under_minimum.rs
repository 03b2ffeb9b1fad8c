// One below the runtime's shortest lease: refused here as `Registry::build` refuses it
// (tests/macro_rules.rs runs every `lease` of this directory through `build()` too).
use idem::{tool, ToolError, WriteCtx};

/// Charge.
#[tool(write, lease = "9ms")]
async fn charge(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(1)
}

fn main() {}
