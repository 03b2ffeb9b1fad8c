//! `#[toolbox]` in a module without the prelude: the generated `::std::sync::Arc::clone(..)`
//! needs `Clone` in scope, so it is not an absolute path in effect.
#![deny(warnings)]

#[idem::args]
pub struct ChargeArgs {
    pub customer: String,
}

mod bare {
    #![no_implicit_prelude]

    use ::idem::{toolbox, ToolError, WriteCtx};

    pub struct Billing;

    #[toolbox]
    impl Billing {
        /// Refund.
        #[tool(write)]
        pub async fn refund(
            &self,
            _ctx: WriteCtx,
            args: super::ChargeArgs,
        ) -> ::core::result::Result<::std::string::String, ToolError> {
            ::core::result::Result::Ok(args.customer)
        }
    }
}

fn main() {
    let registry = idem::Registry::builder()
        .toolbox(std::sync::Arc::new(bare::Billing))
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 1);
}
