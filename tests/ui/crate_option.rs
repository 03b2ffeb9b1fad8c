// `crate = "…"` takes the path of the idem crate in a string; `#[toolbox]` and `#[args]` take
// no other option, and a method inside a `#[toolbox]` leaves it to the `#[toolbox]`.
use std::sync::Arc;

use idem::{tool, toolbox, ReadCtx, Registry, ToolError};

#[allow(dead_code)]
#[idem::args(crate = ::idem)]
struct PingArgs {
    n: u64,
}

/// Not a path.
#[tool(read, crate = "not a path")]
async fn ping(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(1)
}

struct Billing;

#[toolbox(crate = "::idem", timeout = "1s")]
impl Billing {
    /// On the method.
    #[tool(read, crate = "::idem")]
    async fn balance(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
        Ok(0)
    }
}

fn main() {
    let _ = Registry::builder().tool(ping).toolbox(Arc::new(Billing));
}
