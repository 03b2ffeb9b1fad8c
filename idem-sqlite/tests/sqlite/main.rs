//! `SqliteStore` against the store contract and beyond it: the conformance suite, the
//! store's own behaviour (durability modes, handles on one file, busy files), the upgrade of
//! older files, and the database file's permissions.

mod decode_fuzz;
mod durable;
mod files;
mod store;
mod upgrade;
