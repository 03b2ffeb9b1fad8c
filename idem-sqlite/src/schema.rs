//! The tables, their version, and the upgrade of an older file in place when it is opened.

use std::path::Path;

use crate::store::db_err;
use idem_runtime::store::StoreError;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

/// The schema version this build reads and writes.
pub(crate) const SCHEMA_VERSION: i64 = 2;

/// Version 2: `idem_records_by_age` (the retention scans) holds settled records only, so a
/// claim writes the table and one index instead of two. A version 1 file is upgraded in
/// place when opened (the index is rebuilt: one pass over the table, under the write lock).
pub(crate) const MIGRATE_TO_2: &str = "DROP INDEX IF EXISTS idem_records_by_age;
     CREATE INDEX idem_records_by_age ON idem_records (state, result_expired, updated_at)
         WHERE state IN ('completed', 'failed');
     UPDATE idem_meta SET value = 2 WHERE name = 'schema_version';";

/// The release traces ([`IdemStore::release_unsettled`]): one row per release, numbered per
/// key. Added to version 1 without a new version: created when missing, and a build that
/// predates it never reads it.
pub(crate) const RELEASES_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_releases (
         key         TEXT NOT NULL,
         seq         INTEGER NOT NULL,
         released_at INTEGER NOT NULL,
         entry       TEXT NOT NULL,
         PRIMARY KEY (key, seq)
     ) STRICT, WITHOUT ROWID;
     CREATE INDEX IF NOT EXISTS idem_releases_by_time ON idem_releases (released_at, key, seq);";

/// Creates the schema on a new database and checks the version of an existing one.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err)?;
    let table_exists = |name: &str| -> Result<bool, StoreError> {
        tx.query_row(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1",
            [name],
            |_| Ok(()),
        )
        .optional()
        .map(|found| found.is_some())
        .map_err(db_err)
    };
    let had_meta = table_exists("idem_meta")?;
    let had_records = table_exists("idem_records")?;
    if had_meta {
        let version: Option<i64> = tx
            .query_row(
                "SELECT value FROM idem_meta WHERE name = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| foreign(path, &format!("unreadable schema version ({e})")))?;
        return match version {
            Some(v @ 1..=SCHEMA_VERSION) if had_records => {
                tx.execute_batch(RELEASES_DDL).map_err(db_err)?;
                if v < 2 {
                    tx.execute_batch(MIGRATE_TO_2).map_err(db_err)?;
                }
                tx.commit().map_err(db_err)
            }
            Some(1..=SCHEMA_VERSION) => {
                Err(foreign(path, "idem_meta exists but idem_records does not"))
            }
            Some(v) if v > SCHEMA_VERSION => Err(StoreError::Backend(format!(
                "SQLite database {} has idem schema version {v}, written by a newer idem; \
                 this build knows version {SCHEMA_VERSION}. Upgrade idem (the file is untouched).",
                path.display()
            ))),
            Some(v) => Err(foreign(path, &format!("unknown schema version {v}"))),
            None => Err(foreign(path, "idem_meta has no schema version")),
        };
    }
    if had_records {
        return Err(foreign(
            path,
            "a table named idem_records exists but was not created by idem",
        ));
    }
    tx.execute_batch(
        "CREATE TABLE idem_meta (
             name  TEXT PRIMARY KEY NOT NULL,
             value ANY NOT NULL
         ) STRICT;
         CREATE TABLE idem_records (
             key            TEXT PRIMARY KEY NOT NULL,
             state          TEXT NOT NULL,
             fingerprint    TEXT NOT NULL,
             tool           TEXT NOT NULL,
             token          TEXT NOT NULL,
             lease_until    INTEGER,
             created_at     INTEGER NOT NULL,
             updated_at     INTEGER NOT NULL,
             result_expired INTEGER NOT NULL,
             payload        TEXT,
             message        TEXT,
             downstream_ref TEXT,
             attempts       TEXT NOT NULL,
             operation      TEXT,
             read_backs     TEXT NOT NULL
         ) STRICT, WITHOUT ROWID;
         CREATE INDEX idem_records_by_state ON idem_records (state, created_at, key);
         CREATE INDEX idem_records_by_age ON idem_records (state, result_expired, updated_at)
             WHERE state IN ('completed', 'failed');",
    )
    .map_err(db_err)?;
    tx.execute_batch(RELEASES_DDL).map_err(db_err)?;
    tx.execute(
        "INSERT INTO idem_meta (name, value) VALUES ('schema_version', ?1)",
        [SCHEMA_VERSION],
    )
    .map_err(db_err)?;
    tx.commit().map_err(db_err)
}

pub(crate) fn foreign(path: &Path, detail: &str) -> StoreError {
    StoreError::Corrupt {
        key: "<schema>".to_owned(),
        detail: format!(
            "{} is not an idem SQLite database: {detail}",
            path.display()
        ),
    }
}
