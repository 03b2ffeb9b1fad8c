//! The MCP server (feature `mcp`) from a client's side, in process: every test asserts on
//! what the tools did (their ledger) or on the store's record, not on what the server said.

mod calls;
mod destructive_ranges_escalations;
mod result_schema;
mod support;
