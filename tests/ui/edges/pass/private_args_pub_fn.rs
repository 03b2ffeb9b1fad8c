//! A `pub` handler with private args compiles, as a plain fn does (which rustc only warns
//! about, `private_interfaces`); the handler's `#[allow(..)]` reaches what is generated from
//! it. As with a plain fn, the tool is usable where its args type is visible.
#![deny(warnings)]

use idem::{tool, Registry, ToolError, WriteCtx};

mod billing {
    use idem::{tool, Registry, ToolError, WriteCtx};

    #[idem::args]
    struct PrivateArgs {
        cents: u64,
    }

    struct PrivateReceipt(u64);

    impl From<PrivateReceipt> for u64 {
        fn from(r: PrivateReceipt) -> u64 {
            r.0
        }
    }

    /// Charge.
    #[tool(write)]
    #[allow(private_interfaces)]
    pub async fn charge(_ctx: WriteCtx, args: PrivateArgs) -> Result<u64, ToolError> {
        Ok(PrivateReceipt(args.cents).into())
    }

    #[idem::args]
    pub(crate) struct CrateArgs {
        pub(crate) cents: u64,
    }

    /// Refund, with args visible in the crate only.
    #[tool(write, key(cents))]
    #[allow(private_interfaces)]
    pub async fn refund(_ctx: WriteCtx, args: CrateArgs) -> Result<u64, ToolError> {
        Ok(args.cents)
    }

    /// Registers the tools where their args are visible.
    pub fn registry() -> Registry {
        assert_eq!(charge::NAME, "charge");
        Registry::builder()
            .tool(charge)
            .tool(refund)
            .tool(super::unused)
            .build()
            .unwrap()
    }
}

/// Top level too.
#[tool(write)]
async fn unused(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let registry: Registry = billing::registry();
    assert_eq!(registry.tools().count(), 3);
}
