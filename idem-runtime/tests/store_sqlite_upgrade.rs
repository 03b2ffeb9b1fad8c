//! Upgrading a SQLite file written at schema version 1 (its retention index covering every
//! record) to the current layout: in place, when opened, once however many handles open it
//! at once, with every record reading back as it was written; then the whole store
//! conformance suite on files that started at version 1.
#![cfg(all(feature = "sqlite", feature = "testing"))]

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_runtime::identity::CanonicalJson;
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{
    AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore,
    ManualClock, Operation, ReadBackRecord, Settlement, SqliteStore, StoreError, Timestamp,
};
use idem_runtime::{IdemKey, OutcomeClass, RecordState, Scope};
use tempfile::TempDir;

/// The layout as version 1 left it.
const LAYOUT_V1: &str = include_str!("support/sqlite_layout_v1.sql");

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
    let dir = tempfile::tempdir().expect("a temporary directory");
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

/// One record as an earlier version stored it: the columns the rows of the upgrade check
/// differ in.
struct OldRow<'a> {
    key: &'a IdemKey,
    state: &'a str,
    token: ClaimToken,
    lease_until: Option<i64>,
    payload: Option<&'a str>,
    message: Option<&'a str>,
    downstream_ref: Option<&'a str>,
    attempts: &'a str,
    read_backs: &'a str,
}

fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).expect("a time in range")
}

/// A version 1 file with records in every shape its code wrote (running, completed with
/// evidence and arguments, unknown) is upgraded by four handles opening it at once: the
/// version is 2, the retention index covers settled records only, and every record reads
/// back field for field and keeps working (settle, replay, listing, sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_1_file_is_upgraded_in_place() {
    let dir = file_at_v1();
    let path = db(&dir);
    let clock = ManualClock::starting_now();
    let now = clock.now();
    let t0 = Timestamp(now.as_millis() - 5_000);
    let fingerprint = conformance::fingerprint("args");
    let operation = Operation {
        scope: Scope::run("upgrade-run"),
        intent: Some("order-7".into()),
        args: CanonicalJson::from_value(&serde_json::json!({"amount": 4900, "to": "acct_1"})),
    };
    let attempts = vec![AttemptRecord::new(
        1,
        t0,
        Timestamp(t0.as_millis() + 40),
        AttemptKind::Returned,
        OutcomeClass::Completed,
        Some("charged".into()),
    )];
    let read_backs = vec![ReadBackRecord {
        at: Timestamp(t0.as_millis() + 50),
        result: "found completed ch_1".into(),
    }];
    let op_json = serde_json::to_string(&operation).unwrap();
    let attempts_json = serde_json::to_string(&attempts).unwrap();
    let read_backs_json = serde_json::to_string(&read_backs).unwrap();
    let (done, running, unknown) = (
        conformance::key("upgrade-done"),
        conformance::key("upgrade-running"),
        conformance::key("upgrade-unknown"),
    );
    let (done_token, running_token, unknown_token) = (
        ClaimToken::fresh(),
        ClaimToken::fresh(),
        ClaimToken::fresh(),
    );
    let lease = ms(now) + 60_000;
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
        let rows = [
            OldRow {
                key: &done,
                state: "completed",
                token: done_token,
                lease_until: None,
                payload: Some(r#"{"charged":4900}"#),
                message: None,
                downstream_ref: Some("ch_1"),
                attempts: &attempts_json,
                read_backs: &read_backs_json,
            },
            OldRow {
                key: &running,
                state: "running",
                token: running_token,
                lease_until: Some(lease),
                payload: None,
                message: None,
                downstream_ref: None,
                attempts: "[]",
                read_backs: "[]",
            },
            OldRow {
                key: &unknown,
                state: "unknown",
                token: unknown_token,
                lease_until: None,
                payload: None,
                message: Some("timed out after 30s"),
                downstream_ref: None,
                attempts: &attempts_json,
                read_backs: "[]",
            },
        ];
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
                    op_json,
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
    let got = store
        .get(&done)
        .await
        .unwrap()
        .expect("the completed record");
    assert_eq!(got.state, RecordState::Completed);
    assert_eq!(got.fingerprint, fingerprint);
    assert_eq!(&*got.tool, "charge");
    assert_eq!(got.token, done_token);
    assert_eq!(got.lease_until, None);
    assert_eq!(
        (got.created_at, got.updated_at),
        (t0, Timestamp(t0.as_millis() + 100))
    );
    assert_eq!(got.payload, Some(serde_json::json!({"charged": 4900})));
    assert_eq!(got.downstream_ref.as_deref(), Some("ch_1"));
    assert_eq!(got.attempts, attempts);
    assert_eq!(got.read_backs, read_backs);
    assert_eq!(got.operation.as_ref(), Some(&operation));
    assert!(!got.result_expired);

    let got = store
        .get(&unknown)
        .await
        .unwrap()
        .expect("the unknown record");
    assert_eq!(got.state, RecordState::Unknown);
    assert_eq!(got.token, unknown_token);
    assert_eq!(got.message.as_deref(), Some("timed out after 30s"));

    let got = store
        .get(&running)
        .await
        .unwrap()
        .expect("the running record");
    assert_eq!(
        (got.state, got.lease_until),
        (RecordState::Running, Some(Timestamp(lease as u64)))
    );
    let mut settlement = Settlement::new(RecordState::Completed);
    settlement.payload = Some(serde_json::json!({"charged": 100}));
    stores[1]
        .settle(&running, running_token, settlement)
        .await
        .unwrap();
    let got = store
        .get(&running)
        .await
        .unwrap()
        .expect("the settled record");
    assert_eq!(got.state, RecordState::Completed);
    assert_eq!(got.payload, Some(serde_json::json!({"charged": 100})));

    let repeat = ClaimRequest {
        key: done.clone(),
        fingerprint,
        tool: "charge".into(),
        lease: Duration::from_secs(30),
        operation: None,
    };
    match store.claim(&repeat).await.unwrap() {
        ClaimOutcome::Existing(r) => {
            assert_eq!(r.payload, Some(serde_json::json!({"charged": 4900})));
        }
        other => panic!("a settled key must replay, got {other:?}"),
    }
    let listed: Vec<IdemKey> = store
        .list(RecordState::Unknown, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&unknown));

    // Retention still finds the upgraded records through the new index: past the results
    // window both results become tombstones.
    clock.advance(Duration::from_secs(25 * 3600));
    assert_eq!(store.sweep().await.unwrap(), 2);
    let got = store.get(&done).await.unwrap().expect("a tombstone");
    assert!(got.result_expired && got.payload.is_none() && got.operation.is_none());
}
