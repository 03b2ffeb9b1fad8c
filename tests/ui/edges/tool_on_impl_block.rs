// `#[tool]` on an impl block instead of `#[toolbox]`.
use idem::{tool, ToolError, WriteCtx};

struct Billing;

#[tool(write)]
impl Billing {
    /// Refund.
    async fn refund(&self, ctx: WriteCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Billing;
}
