//! `#[toolbox]` owns the `#[tool]` attributes of its methods: they need no import, bare or
//! by path, and a module that imports nothing but the toolbox stays warning-free.
#![deny(warnings)]

use std::sync::Arc;

use idem::{ReadCtx, Registry, ToolError, WriteCtx};

struct Billing;

#[idem::toolbox]
impl Billing {
    /// Balance.
    #[tool(read)]
    async fn balance(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
        Ok(0)
    }

    /// Refund.
    #[idem::tool(write, name = "refund-all")]
    async fn refund(&self, _ctx: WriteCtx) -> Result<u64, ToolError> {
        Ok(1)
    }
}

fn main() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Billing))
        .build()
        .unwrap();
    let names: Vec<&str> = registry.tools().map(|t| t.name()).collect();
    assert_eq!(names, ["balance", "refund-all"]);
}
