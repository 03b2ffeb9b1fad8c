//! [`PostgresStore`]: many workers sharing one PostgreSQL database, and the one thing only a
//! database you own can do — commit a handler's effect and its record in one transaction
//! ([`PostgresStore::run_in_transaction`]).
//!
//! Users reach it through the `idem` facade (feature `postgres`) as `idem::PostgresStore`;
//! this crate is built on `idem_runtime::store::backend` alone, like any other backend, and
//! sits above the runtime, so its transactional handler takes the tools' own `WriteCtx` and
//! `ToolError`. Its modules, bottom-up: `schema` (statements, layout version, migrations),
//! `codec` (rows ↔ records, through the column codec shared with SQLite,
//! `idem_runtime::store::backend::sql`), `builder`, `store` (the
//! [`IdemStore`](idem_runtime::store::IdemStore) implementation) and `transaction`.

mod builder;
mod codec;
mod schema;
mod store;
mod transaction;

pub use builder::PostgresStoreBuilder;
pub use store::{PostgresStore, DEFAULT_SCHEMA};
