//! Generated code uses absolute paths only: free-fn tools compile in a module without the
//! prelude. (`#[idem::args]` is applied outside: schemars' own derive needs the prelude.)
#![deny(warnings)]

#[idem::args]
pub struct ChargeArgs {
    pub customer: String,
}

mod bare {
    #![no_implicit_prelude]

    use ::idem::{tool, ReadCtx, ToolError, WriteCtx};

    /// Charge.
    #[tool(write, key(customer))]
    pub async fn charge(
        ctx: WriteCtx,
        args: super::ChargeArgs,
    ) -> ::core::result::Result<::std::string::String, ToolError> {
        let _ = ctx.key();
        ::core::result::Result::Ok(args.customer)
    }

    /// Ping.
    #[tool(read)]
    pub async fn ping(_ctx: ReadCtx) -> ::core::result::Result<u8, ToolError> {
        ::core::result::Result::Ok(1)
    }
}

fn main() {
    let registry = idem::Registry::builder()
        .tool(bare::charge)
        .tool(bare::ping)
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 2);
}
