use std::sync::Arc;

use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct RefundArgs {
    charge: String,
}

struct Billing;

trait Refunds {
    async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<String, ToolError>;
}

#[toolbox]
impl Refunds for Billing {
    /// Refund.
    #[tool(write)]
    async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<String, ToolError> {
        let _ = ctx;
        Ok(args.charge)
    }
}

fn main() {
    let _ = (ReadCtx::run_id, Registry::builder().toolbox(Arc::new(Billing)));
}
