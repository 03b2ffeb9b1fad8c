//! What the Postgres tests share: a schema of its own per check, and records in older
//! layouts.

pub mod old_records;
pub mod postgres_schema;
