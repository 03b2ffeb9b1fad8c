//! The MCP server (feature `mcp`) from a client's side, in process: every test asserts on
//! what the tools did (their ledger) or on the store's record, not on what the server said.

mod axum_mount;
mod billing;
mod caller_scope;
mod calls;
mod destructive_ranges_escalations;
mod http_client;
mod http_guard;
mod idempotency_keys;
mod idempotent_hint;
mod result_schema;
mod router;
mod support;
mod transport_config;
