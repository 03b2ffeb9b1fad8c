//! The edge values the macro accepts, which `Registry::build` accepts too (this runs it):
//! the shortest lease, names of 1 and 64 characters, every character class of the charset.
//! tests/macro_rules.rs runs each `lease` and `name` of this directory through `build()`.
#![deny(warnings)]

use idem::{tool, ReadCtx, Registry, ToolError, WriteCtx};

/// The shortest lease.
#[tool(write, lease = "10ms")]
async fn shortest_lease(_ctx: WriteCtx) -> Result<u64, ToolError> {
    Ok(1)
}

/// 64 characters.
#[tool(read, name = "a123456789012345678901234567890123456789012345678901234567890234")]
async fn longest_name(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// One character.
#[tool(read, name = "x")]
async fn shortest_name(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

/// Every class of the charset.
#[tool(read, name = "AZaz09_-")]
async fn every_class(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

fn main() {
    let registry = Registry::builder()
        .tool(shortest_lease)
        .tool(longest_name)
        .tool(shortest_name)
        .tool(every_class)
        .build()
        .unwrap();
    assert_eq!(registry.tools().count(), 4);
}
