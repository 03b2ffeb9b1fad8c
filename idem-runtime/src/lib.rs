//! Runtime of idem: exactly-once tool calls for Rust agents.
//!
//! Users depend on the `idem` facade crate; this crate holds the machinery. Its top-level
//! modules are layers, listed here from the bottom up, in the order a call travels through
//! them; each uses only the layers below it, the ones listed before it (`.ci/check-layers`
//! enforces it):
//!
//! 1. [`identity`]: canonical JSON, the idempotency key ([`IdemKey`](identity::IdemKey)) and the
//!    [`Fingerprint`](identity::Fingerprint) of the arguments;
//! 2. [`outcome`]: the classes every write ends in, and what the model is told of each;
//! 3. [`store`]: the claim — the [`IdemStore`](store::IdemStore) contract, its records, the in-memory store,
//!    clocks, and what a backend is built from ([`store::backend`]; the durable backends are
//!    the crates `idem-sqlite`, `idem-redis` and `idem-postgres`, above this one);
//! 4. [`escalation`]: what a person gets when nobody else can settle an operation;
//! 5. [`tool`]: what a tool declares and its handler receives ([`WriteCtx`](tool::WriteCtx) carries the
//!    key), its input schema and read-back;
//! 6. [`definitions`]: tool definitions for OpenAI, Anthropic and MCP;
//! 7. [`call`]: a [`ToolCall`](call::ToolCall) as the agent loop makes it and the [`ToolResult`](call::ToolResult) it gets;
//! 8. the executor (private): claim → run under timeout and lease → classify → settle;
//! 9. [`registry`]: tools by name, dispatch, definitions for a whole registry;
//! 10. [`reconcile`]: the [`Reconciler`](reconcile::Reconciler) and a person's [`resolve`](reconcile::resolve).
//!
//! On top, with the feature `testing`: [`fault_kit`], which runs a user's write tool under
//! the retry matrix's faults through the registry and the reconciler.
//!
//! Under them all, [`observe`] names the spans and metrics (feature `metrics`) the layers
//! record.
//!
//! Each public item has one path, in the module that defines its concept; the crate root
//! re-exports nothing. The facade chooses which of them a user sees at `idem`'s root.
#![warn(missing_docs)]
// One `unsafe` block in all (a `pthread_atfork` registration, `store::record`), allowed
// where it stands.
#![deny(unsafe_code)]

pub mod call;
pub mod definitions;
pub mod escalation;
mod executor;
#[cfg(feature = "testing")]
pub mod fault_kit;
pub mod identity;
#[doc(hidden)]
pub mod macro_support;
pub mod observe;
pub mod outcome;
pub mod reconcile;
pub mod registry;
pub mod store;
pub mod tool;
