//! Every supported form, warning-free under `#![deny(warnings)]` (and a few allow-by-default
//! lints users commonly deny).
#![deny(warnings, missing_docs, unused_qualifications, unreachable_pub)]

use std::sync::Arc;

use idem::{tool, toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde::{Deserialize, Serialize};

/// Arguments.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// Who.
    pub customer: String,
    /// A raw identifier as a key field.
    pub r#type: String,
    /// How much.
    pub cents: u64,
}

/// Charge a card.
#[tool(write, key(customer, r#type), downstream = "keyed", timeout = "10s", window = "23h", lease = "1m", destructive)]
pub async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(format!("{}{}", ctx.key(), args.cents))
}

type Ctx = WriteCtx;

/// Through an alias, with no args and a custom error.
#[tool(write, name = "reset-all")]
pub(crate) async fn reset(_ctx: Ctx) -> Result<(), Failure> {
    Err(Failure)
}

/// A custom error type.
#[derive(Debug)]
pub struct Failure;

impl From<Failure> for ToolError {
    fn from(_: Failure) -> Self {
        ToolError::failed("nope")
    }
}

/// Only in some builds.
#[cfg(any())]
#[tool(read)]
async fn never(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

/// Read without args, private, with an attribute for the handler.
#[tool(read)]
#[allow(clippy::unused_async)]
async fn ping(_: ReadCtx) -> Result<&'static str, ToolError> {
    Ok("pong")
}

/// Shared state.
pub struct Billing {
    prefix: String,
}

#[toolbox]
impl Billing {
    /// Refund.
    #[tool(write, key(customer))]
    pub async fn refund(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let _ = ctx;
        Ok(format!("{}{}", self.prefix, args.customer))
    }

    /// Look up.
    #[idem::tool(read)]
    async fn lookup(&self, _ctx: ReadCtx) -> Result<String, ToolError> {
        Ok(self.prefix.clone())
    }
}

fn main() {
    let registry = Registry::builder()
        .tool(charge_card)
        .tool(reset)
        .tool(ping)
        .toolbox(Arc::new(Billing { prefix: "re_".to_owned() }))
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 5);
    assert_eq!(reset::NAME, "reset-all");
}

/// A return type behind an alias: the type checker resolves it.
type Reply = Result<u64, ToolError>;

/// Returns through an alias.
#[tool(read)]
async fn aliased(_ctx: ReadCtx) -> Reply {
    Ok(1)
}

#[allow(dead_code)]
fn register_aliased() -> Registry {
    Registry::builder().tool(aliased).build().expect("valid")
}
