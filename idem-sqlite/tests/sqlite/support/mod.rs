//! What the SQLite tests share.

pub mod old_records;
