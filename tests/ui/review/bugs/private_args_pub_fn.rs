//! A `pub` handler with private args: a plain fn is only warned about (`private_interfaces`),
//! so a user expects the same from `#[tool]`.
use idem::{tool, Registry, ToolError, WriteCtx};

mod billing {
    use idem::{tool, ToolError, WriteCtx};

    #[idem::args]
    struct PrivateArgs {
        cents: u64,
    }

    /// Charge.
    #[tool(write)]
    #[allow(private_interfaces)]
    pub async fn charge(_ctx: WriteCtx, args: PrivateArgs) -> Result<u64, ToolError> {
        Ok(args.cents)
    }
}

/// Top level too.
#[tool(write)]
async fn unused(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let _ = Registry::builder().tool(billing::charge).tool(unused).build();
}
