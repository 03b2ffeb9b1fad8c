use std::sync::Arc;

use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct RefundArgs {
    charge: String,
}

struct Billing<T> {
    client: T,
}

#[toolbox]
impl<T: Send + Sync + 'static> Billing<T> {
    /// Refund.
    #[tool(write)]
    async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<String, ToolError> {
        let _ = (ctx, &self.client);
        Ok(args.charge)
    }

    /// Balance.
    #[tool(read)]
    async fn balance(&self, ctx: ReadCtx) -> Result<u64, ToolError> {
        let _ = ctx;
        Ok(0)
    }
}

fn main() {
    let _ = Billing { client: () };
    let _ = Registry::builder;
    let _ = Arc::new(0);
}
