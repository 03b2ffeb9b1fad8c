// One bad option in a toolbox method: one error, the method stays callable, the toolbox registers.
use std::sync::Arc;

use idem::{toolbox, Registry, ToolError, WriteCtx};

struct Billing;

#[toolbox]
impl Billing {
    /// Refund.
    #[tool(write, retries = 3)]
    async fn refund(&self, ctx: WriteCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Billing::refund;
    let _ = Registry::builder().toolbox(Arc::new(Billing)).build();
}
