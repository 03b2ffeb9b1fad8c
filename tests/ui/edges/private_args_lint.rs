// A `pub` tool with private args compiles (it was E0446); of the two, only the plain `pub fn`
// gets `private_interfaces` (denied here): rustc does not report it inside macro output.
#![deny(private_interfaces)]

mod billing {
    use idem::{tool, ToolError, WriteCtx};

    #[idem::args]
    struct PrivateArgs {
        cents: u64,
    }

    /// Charge.
    #[tool(write)]
    pub async fn charge(_ctx: WriteCtx, args: PrivateArgs) -> Result<u64, ToolError> {
        Ok(args.cents)
    }

    /// The same handler as a plain fn.
    pub async fn plain(args: PrivateArgs) -> u64 {
        args.cents
    }

    pub fn registry() -> idem::Registry {
        idem::Registry::builder().tool(charge).build().unwrap()
    }
}

fn main() {
    let _ = billing::registry();
}
