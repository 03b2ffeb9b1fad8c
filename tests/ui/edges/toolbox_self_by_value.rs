use std::sync::Arc;

use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};

struct Billing;

#[toolbox]
impl Billing {
    /// By value.
    #[tool(write)]
    async fn refund(self, ctx: WriteCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }

    /// Through `Arc<Self>`, which is how the toolbox holds its state.
    #[tool(read)]
    async fn balance(self: Arc<Self>, ctx: ReadCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Registry::builder().toolbox(Arc::new(Billing));
}
