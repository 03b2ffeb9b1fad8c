//! Parameter patterns, full paths, raw names, visibility and attributes a plain fn accepts.
#![deny(warnings, missing_docs, unused_qualifications, unreachable_pub)]

use idem::{tool, ReadCtx, Registry, ToolError, WriteCtx};

/// Arguments.
#[idem::args]
pub struct ChargeArgs {
    /// Who.
    pub customer: String,
    /// How much.
    pub cents: u64,
}

/// `mut` bindings.
#[tool(write)]
pub async fn charge(mut ctx: WriteCtx, mut args: ChargeArgs) -> Result<String, ToolError> {
    args.cents += 1;
    ctx = ctx;
    Ok(format!("{}{}", ctx.key(), args.cents))
}

/// A wildcard context and a destructuring args pattern.
#[tool(write, key(customer))]
pub async fn refund(
    _: WriteCtx,
    ChargeArgs { customer, .. }: ChargeArgs,
) -> Result<String, ToolError> {
    Ok(customer)
}

mod paths {
    /// Full paths for the context and the error, nothing imported.
    #[idem::tool(write)]
    pub async fn full(
        ctx: idem::WriteCtx,
        args: super::ChargeArgs,
    ) -> Result<u64, idem::ToolError> {
        let _ = ctx.key();
        Ok(args.cents)
    }
}

/// A raw fn name: the tool is called `match`.
#[tool(read)]
pub async fn r#match(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

mod inner {
    use idem::{tool, ReadCtx, ToolError};

    /// Visible to the parent only.
    #[tool(read)]
    pub(super) async fn nested(ctx: ReadCtx) -> Result<String, ToolError> {
        Ok(ctx.tool().to_owned())
    }

    /// Visible in the crate.
    #[tool(read, name = "crate-wide")]
    #[allow(clippy::unused_async)]
    #[inline]
    pub(crate) async fn crate_wide(ctx: ReadCtx) -> Result<String, ToolError> {
        Ok(ctx.tool().to_owned())
    }
}

fn main() {
    /// A tool declared inside a fn body.
    #[tool(read)]
    async fn local(_ctx: ReadCtx) -> Result<u8, ToolError> {
        Ok(1)
    }

    let registry = Registry::builder()
        .tool(charge)
        .tool(refund)
        .tool(paths::full)
        .tool(r#match)
        .tool(inner::nested)
        .tool(inner::crate_wide)
        .tool(local)
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 7);
    assert_eq!(r#match::NAME, "match");
    assert!(registry.get("match").is_some());
    assert_eq!(inner::crate_wide::NAME, "crate-wide");
}
