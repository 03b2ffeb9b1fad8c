//! Generated code uses absolute paths only: it compiles in a module without the prelude.
#![deny(warnings)]

mod bare {
    #![no_implicit_prelude]

    use ::idem::{tool, toolbox, ReadCtx, ToolError, WriteCtx};

    #[::idem::args]
    pub struct ChargeArgs {
        pub customer: ::std::string::String,
    }

    /// Charge.
    #[tool(write, key(customer))]
    pub async fn charge(
        ctx: WriteCtx,
        args: ChargeArgs,
    ) -> ::core::result::Result<::std::string::String, ToolError> {
        let _ = ctx;
        ::core::result::Result::Ok(args.customer)
    }

    /// Ping.
    #[tool(read)]
    pub async fn ping(_ctx: ReadCtx) -> ::core::result::Result<u8, ToolError> {
        ::core::result::Result::Ok(1)
    }

    pub struct Billing;

    #[toolbox]
    impl Billing {
        /// Refund.
        #[tool(write)]
        pub async fn refund(
            &self,
            _ctx: WriteCtx,
            args: ChargeArgs,
        ) -> ::core::result::Result<::std::string::String, ToolError> {
            ::core::result::Result::Ok(args.customer)
        }
    }
}

fn main() {
    let registry = idem::Registry::builder()
        .tool(bare::charge)
        .tool(bare::ping)
        .toolbox(std::sync::Arc::new(bare::Billing))
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 3);
}
