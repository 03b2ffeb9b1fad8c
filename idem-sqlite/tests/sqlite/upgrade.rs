//! Upgrading a SQLite file written at schema version 1 (its retention index covering every
//! record) to the current layout: in place, when opened, once however many handles open it
//! at once, with every record reading back as it was written; then the whole store
//! conformance suite on files that started at version 1.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_runtime::identity::IdemKey;
use idem_runtime::store::conformance::{StoreFactory, StoreOptions};
use idem_runtime::store::{Clock, IdemStore, ManualClock, StoreError};
use idem_sqlite::SqliteStore;
use idem_test::stores::TempDir;

/// The layout as version 1 left it.
const LAYOUT_V1: &str = include_str!("layout_v1.sql");

fn db(dir: &TempDir) -> PathBuf {
    dir.path().join("idem.sqlite3")
}

/// A second connection onto the file, as another process (or an older idem) would have.
fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the database file directly");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("set a busy timeout");
    conn
}

/// A fresh file holding the version 1 layout (in WAL mode, as version 1 left it) and no
/// records.
fn file_at_v1() -> TempDir {
    let dir = TempDir::new("sqlite");
    let conn = raw(&db(&dir));
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .expect("WAL");
    assert_eq!(mode, "wal");
    conn.execute_batch(LAYOUT_V1).expect("the version 1 layout");
    dir
}

/// The conformance suite on files that start at schema version 1, upgraded by the first
/// open.
struct SqliteFromV1;

impl StoreFactory for SqliteFromV1 {
    type Store = SqliteStore;
    type Location = TempDir;

    fn durable(&self) -> bool {
        true
    }

    async fn location(&self) -> Result<TempDir, StoreError> {
        Ok(file_at_v1())
    }

    async fn open(&self, at: &TempDir, options: &StoreOptions) -> Result<SqliteStore, StoreError> {
        SqliteStore::builder(db(at))
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .open()
            .await
    }

    async fn corrupt(&self, at: &TempDir, key: &IdemKey) -> Result<bool, StoreError> {
        raw(&db(at))
            .execute(
                "UPDATE idem_records SET state = 'exploded' WHERE key = ?1",
                [key.as_str()],
            )
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(true)
    }
}

idem_runtime::store_conformance_tests!(SqliteFromV1);

use idem_test::old_records;
use old_records::{ms, OldRecords};

/// A version 1 file with records in every shape its code wrote (running, completed with
/// evidence and arguments, unknown) is upgraded by four handles opening it at once: the
/// version is 2, the retention index covers settled records only, and every record reads
/// back field for field and keeps working (settle, replay, listing, sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_1_file_is_upgraded_in_place() {
    let dir = file_at_v1();
    let path = db(&dir);
    let clock = ManualClock::starting_now();
    let old = OldRecords::new(clock.now());
    let OldRecords {
        t0,
        fingerprint,
        ref operation_json,
        ..
    } = old;
    {
        let conn = raw(&path);
        let mut insert = conn
            .prepare(
                "INSERT INTO idem_records (key, state, fingerprint, tool, token, lease_until,
                     created_at, updated_at, result_expired, payload, message, downstream_ref,
                     attempts, operation, read_backs)
                 VALUES (?1, ?2, ?3, 'charge', ?4, ?5, ?6, ?7, 0, ?8, ?9, ?10, ?11, ?12, ?13)",
            )
            .unwrap();
        let rows = old.rows();
        for row in rows {
            insert
                .execute(rusqlite::params![
                    row.key.as_str(),
                    row.state,
                    fingerprint.to_hex(),
                    row.token.to_hex(),
                    row.lease_until,
                    ms(t0),
                    ms(t0) + 100,
                    row.payload,
                    row.message,
                    row.downstream_ref,
                    row.attempts,
                    operation_json,
                    row.read_backs,
                ])
                .expect("an old-format row");
        }
    }

    let opens: Vec<_> = (0..4)
        .map(|_| {
            let (path, clock) = (path.clone(), clock.clone());
            tokio::spawn(async move {
                SqliteStore::builder(path)
                    .clock(std::sync::Arc::new(clock))
                    .open()
                    .await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for o in opens {
        stores.push(o.await.expect("task").expect("an upgrading open"));
    }
    let conn = raw(&path);
    let version: i64 = conn
        .query_row(
            "SELECT value FROM idem_meta WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, 2);
    let by_age: String = conn
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE name = 'idem_records_by_age'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        by_age.contains("WHERE state IN ('completed', 'failed')"),
        "{by_age}"
    );
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");

    let store = &stores[0];
    old.check_upgraded(store, &stores[1]).await;

    // Retention still finds the upgraded records through the new index: past the results
    // window both results become tombstones.
    clock.advance(Duration::from_secs(25 * 3600));
    assert_eq!(store.sweep().await.unwrap(), 2);
    let got = store.get(&old.done).await.unwrap().expect("a tombstone");
    assert!(got.result_expired && got.payload.is_none() && got.operation.is_none());
}
