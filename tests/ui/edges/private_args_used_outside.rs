// A `pub` tool whose args type is private is usable only where the args type is visible:
// outside, rustc refuses it with the same error as a plain `pub fn` with private args.
use idem::{tool, Registry, ToolError};

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

    /// The same handler as a plain fn.
    #[allow(private_interfaces)]
    pub async fn plain(args: PrivateArgs) -> u64 {
        args.cents
    }
}

/// Makes the file's `tool` import used.
#[tool(read)]
async fn balance(_ctx: idem::ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let _plain = billing::plain;
    let _ = Registry::builder().tool(billing::charge).tool(balance).build();
}
