//! Runtime of [idem](https://docs.rs/idem): exactly-once tool calls for Rust agents.
//!
//! Users depend on the `idem` facade crate; this crate holds the machinery, arranged in the
//! order a call flows through it:
//!
//! - [`identity`]: canonical JSON, the idempotency key ([`IdemKey`]) and the
//!   [`Fingerprint`] of the arguments;
//! - [`store`]: the claim — the [`IdemStore`] contract and its backends ([`MemoryStore`]);
//! - [`tool`] and the executor: the handler runs with a [`WriteCtx`] carrying its key, under
//!   a timeout, with panics caught;
//! - [`outcome`]: every write settles in exactly one [`OutcomeClass`];
//! - [`registry`] and [`definitions`]: dispatch by name; tool definitions for OpenAI,
//!   Anthropic and MCP.
#![warn(missing_docs)]

pub mod definitions;
mod error;
mod executor;
pub mod identity;
#[doc(hidden)]
pub mod macro_support;
pub mod outcome;
pub mod reconcile;
pub mod registry;
pub mod store;
pub mod tool;

pub use definitions::{DefinitionOptions, Format};
pub use error::{BuildError, CallError};
pub use executor::RetryPolicy;
pub use identity::{Fingerprint, IdemKey, Scope};
pub use outcome::{Outcome, OutcomeClass};
pub use reconcile::{Escalation, EscalationSink, ReadBack, ReadBackCtx, Reconciler, Resolution};
pub use registry::{Registry, RegistryBuilder, ToolCall, ToolResult};
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{IdemStore, MemoryStore, Record, RecordState, StoreError};
#[cfg(feature = "sqlite")]
pub use store::{SqliteStore, SqliteSync};
pub use tool::{
    Downstream, DynTool, ReadCtx, ReadTool, ToolError, ToolKind, ToolSpec, Toolbox, WriteCtx,
    WriteTool,
};
