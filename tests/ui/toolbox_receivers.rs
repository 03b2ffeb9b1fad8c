use std::sync::Arc;

use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct RefundArgs {
    charge: String,
}

struct Billing;

#[toolbox]
impl Billing {
    /// Takes `&mut self`.
    #[tool(write)]
    async fn refund(&mut self, ctx: WriteCtx, args: RefundArgs) -> Result<String, ToolError> {
        let _ = ctx;
        Ok(args.charge)
    }

    /// Takes no `self`.
    #[tool(read)]
    async fn balance(ctx: ReadCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Registry::builder().toolbox(Arc::new(Billing));
}
