// A `crate = "…"` that names no crate: one error, on the path given.
use idem::{tool, ReadCtx, Registry, ToolError};

/// Pong.
#[tool(read, crate = "::idem_renamed")]
async fn ping(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(1)
}

fn main() {
    let _ = Registry::builder().tool(ping);
}
