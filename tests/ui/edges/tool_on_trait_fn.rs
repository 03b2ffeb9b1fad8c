// `#[tool]` on a trait method declaration (no body).
use idem::{tool, ToolError, WriteCtx};

trait Refunds {
    /// Refund.
    #[tool(write)]
    async fn refund(&self, ctx: WriteCtx) -> Result<u64, ToolError>;
}

fn main() {}
