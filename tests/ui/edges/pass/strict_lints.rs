//! Warning-free under the allow-by-default lints careful crates deny.
#![forbid(unsafe_code)]
#![deny(
    warnings,
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    unreachable_pub,
    unused_results,
    unused_lifetimes,
    single_use_lifetimes,
    trivial_casts,
    trivial_numeric_casts,
    elided_lifetimes_in_paths,
    unused_import_braces,
    let_underscore_drop,
    redundant_lifetimes,
    unnameable_types,
    meta_variable_misuse,
    non_ascii_idents,
    missing_copy_implementations,
    variant_size_differences,
    unit_bindings,
    keyword_idents,
    macro_use_extern_crate,
    unstable_features,
)]

use std::sync::Arc;

use idem::{tool, toolbox, ReadCtx, Registry, ToolError, WriteCtx};

/// Arguments.
#[idem::args]
#[derive(Debug)]
pub struct ChargeArgs {
    /// Who.
    pub customer: String,
}

/// Charge.
#[tool(write, key(customer), downstream = "keyed", destructive, reconcile = find)]
pub async fn charge(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.customer))
}

/// The read-back of `charge`.
pub async fn find(
    _ctx: idem::ReadBackCtx,
    _args: ChargeArgs,
) -> Result<idem::ReadBack, ToolError> {
    Ok(idem::ReadBack::NotFound)
}

/// No args.
#[tool(read)]
pub async fn ping(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

/// State.
#[derive(Debug)]
pub struct Billing {
    prefix: String,
}

#[toolbox]
impl Billing {
    /// Refund.
    #[tool(write, key(customer))]
    pub async fn refund(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        drop(ctx);
        Ok(format!("{}{}", self.prefix, args.customer))
    }

    /// Look up.
    #[tool(read)]
    pub async fn lookup(&self, _ctx: ReadCtx) -> Result<String, ToolError> {
        Ok(self.prefix.clone())
    }
}

fn main() {
    let registry = Registry::builder()
        .tool(charge)
        .tool(ping)
        .toolbox(Arc::new(Billing { prefix: "re_".to_owned() }))
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 4);
}
