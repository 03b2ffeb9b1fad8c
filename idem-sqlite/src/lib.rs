//! [`SqliteStore`]: the embedded, durable store of idem, for the processes of one machine.
//!
//! One table keyed by the key, in WAL mode. Every read-modify-write runs in a
//! `BEGIN IMMEDIATE` transaction (the database's write lock, which also excludes other
//! processes on the same file) and decides through
//! [`rules`](idem_runtime::store::backend::rules), so the contract lives in one place. SQLite
//! calls block, so they run on tokio's blocking pool, never on a runtime worker.
//!
//! Writes are group-committed: the writes of this process queue for the one writer
//! connection, and whatever has queued while a commit was on its way runs next, in one
//! transaction with one commit, each write in its own savepoint when it has company.
//!
//! Users reach it through the `idem` facade (feature `sqlite`) as `idem::SqliteStore`; this
//! crate is built on `idem_runtime::store::backend` alone, like any other backend. Its
//! modules, bottom-up: `schema` (tables, version, upgrade of older files), `codec` (rows ↔
//! records, through the column codec shared with Postgres,
//! `idem_runtime::store::backend::sql`), `builder`, `writer` (group commit), `sweep`, and
//! `store` (the [`IdemStore`](idem_runtime::store::IdemStore) implementation).

mod builder;
mod codec;
mod schema;
mod store;
mod sweep;
mod writer;

pub use builder::{SqliteStoreBuilder, SqliteSync};
pub use store::SqliteStore;
