//! `#[idem::args]` with other derives before and after it, on enums and generic structs.
#![deny(warnings)]

use idem::{tool, ReadCtx, Registry, ToolError, WriteCtx};

#[derive(Debug, Clone)]
#[idem::args]
#[serde(rename_all = "camelCase")]
struct ChargeArgs {
    customer_id: String,
}

#[idem::args]
#[derive(Debug, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Add { n: u32 },
    Clear,
}

#[idem::args]
struct Page<T> {
    items: Vec<T>,
}

/// Charge.
#[tool(write)]
async fn charge(_ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    Ok(args.clone().customer_id)
}

/// Apply an op.
#[tool(write)]
async fn apply(_ctx: WriteCtx, args: Op) -> Result<bool, ToolError> {
    Ok(args == Op::Clear || matches!(args, Op::Add { n: 1 }))
}

/// Sum a page.
#[tool(read)]
async fn sum(_ctx: ReadCtx, args: Page<u32>) -> Result<u32, ToolError> {
    Ok(args.items.iter().sum())
}

fn main() {
    let registry = Registry::builder()
        .tool(charge)
        .tool(apply)
        .tool(sum)
        .build()
        .expect("valid");
    assert_eq!(registry.tools().count(), 3);
}
