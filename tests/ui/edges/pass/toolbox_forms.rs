//! A toolbox with a where clause, consts, helpers, a `#[cfg]`-ed tool, a renamed tool and a
//! read-back method.
#![deny(warnings, missing_docs)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{toolbox, ReadBack, ReadBackCtx, ReadCtx, Registry, ToolError, WriteCtx};

/// Args.
#[idem::args]
pub struct RefundArgs {
    /// The charge.
    pub charge: String,
}

/// State.
pub struct Billing {
    refunds: AtomicU32,
}

#[toolbox]
impl Billing
where
    Billing: Send + Sync,
{
    /// A constant.
    pub const LIMIT: u32 = 3;

    /// Refund.
    #[tool(write, key(charge), name = "refund-charge", reconcile = find_refund)]
    pub async fn refund(&self, ctx: WriteCtx, args: RefundArgs) -> Result<u32, ToolError> {
        let _ = (ctx, args);
        Ok(self.bump())
    }

    /// The read-back.
    pub async fn find_refund(
        &self,
        _ctx: ReadBackCtx,
        _args: RefundArgs,
    ) -> Result<ReadBack, ToolError> {
        Ok(ReadBack::NotFound)
    }

    /// Only in some builds.
    #[cfg(any())]
    #[tool(read)]
    pub async fn never(&self, _ctx: ReadCtx) -> Result<u32, ToolError> {
        Ok(0)
    }

    /// Count.
    #[idem::tool(read)]
    pub async fn count(&self, _ctx: ReadCtx) -> Result<u32, ToolError> {
        Ok(self.refunds.load(Ordering::SeqCst).min(Self::LIMIT))
    }

    fn bump(&self) -> u32 {
        self.refunds.fetch_add(1, Ordering::SeqCst) + 1
    }
}

fn main() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Billing { refunds: AtomicU32::new(0) }))
        .build()
        .expect("valid");
    let names: Vec<&str> = registry.tools().map(|t| t.name()).collect();
    assert_eq!(names, ["refund-charge", "count"]);
}
