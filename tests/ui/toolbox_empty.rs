use std::sync::Arc;

use idem::{toolbox, Registry, ToolError, WriteCtx};

struct Billing;

#[toolbox]
impl Billing {
    /// Not marked `#[tool]`.
    async fn refund(&self, ctx: WriteCtx) -> Result<String, ToolError> {
        let _ = ctx;
        Ok(String::new())
    }
}

fn main() {
    let _ = Registry::builder().toolbox(Arc::new(Billing));
}
