// `#[tool]` imported under another name inside a `#[toolbox]`.
use std::sync::Arc;

use idem::tool as idem_tool;
use idem::{toolbox, ReadCtx, Registry, ToolError};

struct Billing;

#[toolbox]
impl Billing {
    /// Balance.
    #[idem_tool(read)]
    async fn balance(&self, ctx: ReadCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Registry::builder().toolbox(Arc::new(Billing));
}
