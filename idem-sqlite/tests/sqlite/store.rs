//! `SqliteStore`: the store conformance suite (reopen and two-handle races included), plus
//! what only SQLite has — its schema, its file, and the rows a foreign writer can leave.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{IdemStore, ManualClock, RecordState, Retention, StoreError};
use idem_sqlite::{SqliteStore, SqliteSync};
use idem_test::stores::TempDir;
use serde_json::json;

/// A fresh temporary directory per location; the database is `idem.sqlite3` inside it.
struct Sqlite;

fn db(dir: &TempDir) -> PathBuf {
    dir.path().join("idem.sqlite3")
}

impl StoreFactory for Sqlite {
    type Store = SqliteStore;
    type Location = TempDir;

    fn durable(&self) -> bool {
        true
    }

    async fn location(&self) -> Result<TempDir, StoreError> {
        Ok(TempDir::new("sqlite_conformance"))
    }

    async fn open(&self, at: &TempDir, options: &StoreOptions) -> Result<SqliteStore, StoreError> {
        SqliteStore::builder(db(at))
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .open()
            .await
    }

    fn corruptions(&self) -> &'static [&'static str] {
        crate::durable::SQL_CORRUPTIONS
    }

    async fn break_record(&self, at: &TempDir, _: &SqliteStore, key: &IdemKey, how: &str) {
        crate::durable::SqliteRows(db(at)).corrupt(key, how).await;
    }

    async fn raw_record(&self, at: &TempDir, _: &SqliteStore, key: &IdemKey) -> Option<String> {
        crate::durable::SqliteRows(db(at)).raw(key).await
    }

    async fn corrupt(
        &self,
        at: &TempDir,
        key: &idem_runtime::identity::IdemKey,
    ) -> Result<bool, StoreError> {
        raw(&db(at))
            .execute(
                "UPDATE idem_records SET state = 'exploded' WHERE key = ?1",
                [key.as_str()],
            )
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(true)
    }
}

idem_runtime::store_conformance_tests!(Sqlite);

/// A second, independent connection onto the store's file (another process, in effect).
fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("open the database file directly");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("set a busy timeout");
    conn
}

fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint("args"),
        tool: "sqlite_test".into(),
        lease: Duration::from_secs(30),
        operation: None,
    }
}

async fn store_at(path: &Path, clock: &ManualClock) -> SqliteStore {
    SqliteStore::builder(path)
        .clock(std::sync::Arc::new(clock.clone()))
        .retention(Retention {
            results: Duration::from_secs(60),
            tombstones: Duration::from_secs(600),
        })
        .open()
        .await
        .expect("open the store")
}

async fn claimed(store: &SqliteStore, req: &ClaimRequest) -> idem_runtime::store::ClaimToken {
    match store.claim(req).await {
        Ok(ClaimOutcome::Claimed(t)) => t,
        other => panic!("expected a granted claim, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_on_disk_before_claim_returns() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let store = store_at(&path, &ManualClock::starting_now()).await;
    let req = request("on-disk");
    claimed(&store, &req).await;
    // Read through another connection while the store is still open: the claim is
    // committed, not buffered in this process.
    let state: String = raw(&path)
        .query_row(
            "SELECT state FROM idem_records WHERE key = ?1",
            [req.key.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(state, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_in_wal_mode_with_the_chosen_sync() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let full = SqliteStore::open(&path).await.unwrap();
    assert_eq!(full.sync_mode(), SqliteSync::Full, "FULL is the default");
    let normal = SqliteStore::builder(&path)
        .sync(SqliteSync::Normal)
        .open()
        .await
        .unwrap();
    assert_eq!(normal.sync_mode(), SqliteSync::Normal);
    let mode: String = raw(&path)
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    // Both handles work on the one file.
    let req = request("wal");
    let token = claimed(&normal, &req).await;
    full.settle(
        &req.key,
        token,
        Settlement::new(RecordState::Completed).payload(json!(1)),
    )
    .await
    .unwrap();
    assert_eq!(
        normal.get(&req.key).await.unwrap().map(|r| r.state),
        Some(RecordState::Completed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_rows_are_corrupt_errors() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let store = store_at(&path, &ManualClock::starting_now()).await;
    let damage = [
        (
            "state",
            "UPDATE idem_records SET state = 'Completed' WHERE key = ?1",
        ),
        (
            "payload",
            "UPDATE idem_records SET payload = '{\"cut' WHERE key = ?1",
        ),
        (
            "fingerprint",
            "UPDATE idem_records SET fingerprint = 'abc' WHERE key = ?1",
        ),
        (
            "token",
            "UPDATE idem_records SET token = 'zz' WHERE key = ?1",
        ),
        (
            "created_at",
            "UPDATE idem_records SET created_at = -5 WHERE key = ?1",
        ),
        (
            "lease",
            "UPDATE idem_records SET lease_until = NULL WHERE key = ?1",
        ),
        (
            "attempts",
            "UPDATE idem_records SET attempts = '{}' WHERE key = ?1",
        ),
        (
            "read_backs",
            "UPDATE idem_records SET read_backs = '[1]' WHERE key = ?1",
        ),
        (
            "operation",
            "UPDATE idem_records SET operation = 'null x' WHERE key = ?1",
        ),
        (
            "expired",
            "UPDATE idem_records SET result_expired = 7 WHERE key = ?1",
        ),
        ("tool", "UPDATE idem_records SET tool = NULL WHERE key = ?1"),
        (
            "utf8",
            "UPDATE idem_records SET message = CAST(x'ff00' AS TEXT) WHERE key = ?1",
        ),
    ];
    for (name, sql) in damage {
        let req = request(&format!("damaged-{name}"));
        claimed(&store, &req).await;
        let changed = raw(&path).execute(sql, [req.key.as_str()]);
        if name == "tool" {
            // NOT NULL holds the line for this one: the schema refuses the damage outright.
            assert!(changed.is_err(), "the schema must refuse a NULL tool");
            continue;
        }
        assert_eq!(changed.unwrap(), 1, "{name}: damage applied");
        match store.get(&req.key).await {
            Err(StoreError::Corrupt { key, detail }) => {
                assert_eq!(key, req.key.as_str(), "{name}: the error names the key");
                assert!(!detail.is_empty());
            }
            other => panic!("{name}: expected StoreError::Corrupt, got {other:?}"),
        }
        assert!(
            matches!(store.claim(&req).await, Err(StoreError::Corrupt { .. })),
            "{name}: a corrupt record must never be claimed over"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_rows_in_a_listing_are_corrupt_errors() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let store = store_at(&path, &ManualClock::starting_now()).await;
    raw(&path)
        .execute(
            "INSERT INTO idem_records (key, state, fingerprint, tool, token, lease_until,
                 created_at, updated_at, result_expired, payload, message, downstream_ref,
                 attempts, operation, read_backs)
             VALUES ('order-17', 'failed', '', 't', '', NULL, 0, 0, 0, NULL, NULL, NULL,
                 '[]', NULL, '[]')",
            [],
        )
        .unwrap();
    match store.list(RecordState::Failed, 10).await {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "order-17"),
        other => panic!("expected StoreError::Corrupt, got {other:?}"),
    }
    assert!(store
        .list(RecordState::Completed, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A database written before release traces existed (no `idem_releases` table) gets the
/// table when opened, and its unsettled records can then be released with a trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_before_release_traces_gains_them() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let req = ClaimRequest {
        key: conformance::key("old-file"),
        fingerprint: conformance::fingerprint("args"),
        tool: "t".into(),
        lease: Duration::from_secs(10),
        operation: None,
    };
    let store = SqliteStore::open(&path).await.unwrap();
    let token = match store.claim(&req).await.unwrap() {
        ClaimOutcome::Claimed(t) => t,
        other => panic!("{other:?}"),
    };
    store
        .settle(&req.key, token, Settlement::new(RecordState::Unknown))
        .await
        .unwrap();
    drop(store);
    raw(&path)
        .execute_batch("DROP TABLE idem_releases")
        .unwrap();

    let store = SqliteStore::open(&path).await.unwrap();
    store
        .release_unsettled(
            &req.key,
            token,
            &idem_runtime::store::ReleaseNote::new("ops", "not in the ledger"),
        )
        .await
        .unwrap();
    let trace = store.releases(&req.key).await.unwrap();
    assert_eq!(trace.len(), 1);
    assert_eq!(trace[0].record.state, RecordState::Unknown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_left_alone() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    drop(SqliteStore::open(&path).await.unwrap());
    raw(&path)
        .execute(
            "UPDATE idem_meta SET value = 99 WHERE name = 'schema_version'",
            [],
        )
        .unwrap();
    match SqliteStore::open(&path).await {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("newer"), "{msg}"),
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
    let version: i64 = raw(&path)
        .query_row(
            "SELECT value FROM idem_meta WHERE name = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, 99, "the file is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_table_or_file_is_refused() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    raw(&path)
        .execute(
            "CREATE TABLE idem_records (id INTEGER PRIMARY KEY, v TEXT)",
            [],
        )
        .unwrap();
    assert!(
        matches!(
            SqliteStore::open(&path).await,
            Err(StoreError::Corrupt { .. })
        ),
        "a table idem did not create must not be adopted"
    );

    let junk = dir.path().join("junk.sqlite3");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    match SqliteStore::open(&junk).await {
        Err(StoreError::Corrupt { .. } | StoreError::Backend(_)) => {}
        other => panic!("a file that is not a database must be an error, got {other:?}"),
    }

    let nowhere = dir.path().join("missing-dir").join("idem.sqlite3");
    assert!(
        matches!(
            SqliteStore::open(&nowhere).await,
            Err(StoreError::Unavailable(_))
        ),
        "an unopenable path is unavailable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_applies_time_to_every_record() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let clock = ManualClock::starting_now();
    let store = store_at(&path, &clock).await;
    let done = request("sweep-done");
    let token = claimed(&store, &done).await;
    store
        .settle(
            &done.key,
            token,
            Settlement::new(RecordState::Completed).payload(json!({"big": "result"})),
        )
        .await
        .unwrap();
    let running = request("sweep-running");
    claimed(&store, &running).await;
    let count = |sql: &str| -> i64 { raw(&path).query_row(sql, [], |r| r.get(0)).unwrap() };

    assert_eq!(store.sweep().await.unwrap(), 0, "nothing is due yet");
    clock.advance(Duration::from_secs(60));
    // The result is past retention and the lease has passed: two rows change.
    assert_eq!(store.sweep().await.unwrap(), 2);
    assert_eq!(
        count("SELECT count(*) FROM idem_records WHERE payload IS NOT NULL"),
        0,
        "the expired result is dropped from the file"
    );
    assert_eq!(
        count("SELECT count(*) FROM idem_records WHERE state = 'unknown'"),
        1,
        "the expired lease is recorded as unknown"
    );
    assert_eq!(store.sweep().await.unwrap(), 0, "sweeping is idempotent");
    clock.advance(Duration::from_secs(600));
    assert_eq!(store.sweep().await.unwrap(), 1, "the tombstone lapses");
    assert_eq!(
        count("SELECT count(*) FROM idem_records"),
        1,
        "unknown stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_many_keys() {
    let dir = TempDir::new("sqlite");
    let store = store_at(&db(&dir), &ManualClock::starting_now()).await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let req = request(&format!("many-{}", i % 16));
                match store.claim(&req).await.unwrap() {
                    ClaimOutcome::Claimed(t) => {
                        store
                            .settle(
                                &req.key,
                                t,
                                Settlement::new(RecordState::Completed).payload(json!(i)),
                            )
                            .await
                            .unwrap();
                        1
                    }
                    ClaimOutcome::Existing(_) => 0,
                    ClaimOutcome::Mismatch(r) => panic!("unexpected mismatch: {r:?}"),
                }
            })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += t.await.unwrap();
    }
    assert_eq!(wins, 16, "one winner per key");
    assert_eq!(
        store.list(RecordState::Completed, 100).await.unwrap().len(),
        16
    );
}

/// Group commit under load: many tasks claim, settle and fail at once on one store (so
/// their writes share transactions); what the file holds afterwards, read back through a
/// new store and a connection of its own, is exactly what each caller was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_and_settles_are_all_on_disk_after_reopening() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let clock = ManualClock::starting_now();
    let store = store_at(&path, &clock).await;
    const KEYS: usize = 48;
    // Two claimants per key; the winner settles two keys in three and leaves the third
    // running; the loser tries a settle with a token of its own, which must fail and
    // change nothing.
    let tasks: Vec<_> = (0..2 * KEYS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let n = i % KEYS;
                let req = request(&format!("group-{n}"));
                match store.claim(&req).await.unwrap() {
                    ClaimOutcome::Claimed(t) => {
                        if n % 3 != 0 {
                            let done = Settlement::new(RecordState::Completed).payload(json!(n));
                            store.settle(&req.key, t, done).await.unwrap();
                        }
                        Some(n)
                    }
                    ClaimOutcome::Existing(_) => {
                        let forged = idem_runtime::store::ClaimToken::fresh();
                        let bad = Settlement::new(RecordState::Failed).payload(json!("forged"));
                        let refused = store.settle(&req.key, forged, bad).await;
                        assert!(
                            matches!(refused, Err(StoreError::StaleToken { .. })),
                            "{refused:?}"
                        );
                        None
                    }
                    ClaimOutcome::Mismatch(r) => panic!("unexpected mismatch: {r:?}"),
                }
            })
        })
        .collect();
    let mut winners = vec![0; KEYS];
    for t in tasks {
        if let Some(n) = t.await.unwrap() {
            winners[n] += 1;
        }
    }
    assert!(
        winners.iter().all(|&w| w == 1),
        "one winner per key: {winners:?}"
    );
    drop(store);

    // The file, through a connection of its own.
    let conn = raw(&path);
    let total: i64 = conn
        .query_row("SELECT count(*) FROM idem_records", [], |r| r.get(0))
        .unwrap();
    assert_eq!(total, KEYS as i64, "every claimed key once, nothing else");
    for n in 0..KEYS {
        let key = request(&format!("group-{n}")).key;
        let (rows, state, payload): (i64, String, Option<String>) = conn
            .query_row(
                "SELECT count(*), max(state), max(payload) FROM idem_records WHERE key = ?1",
                [key.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(rows, 1, "group-{n}");
        if n % 3 == 0 {
            assert_eq!((state.as_str(), payload), ("running", None), "group-{n}");
        } else {
            assert_eq!(state, "completed", "group-{n}");
            assert_eq!(payload, Some(n.to_string()), "group-{n}");
        }
    }

    // And through a reopened store.
    let store = store_at(&path, &clock).await;
    for n in 0..KEYS {
        let record = store
            .get(&request(&format!("group-{n}")).key)
            .await
            .unwrap()
            .expect("kept");
        let want = if n % 3 == 0 {
            RecordState::Running
        } else {
            RecordState::Completed
        };
        assert_eq!(record.state, want, "group-{n}");
    }
}

/// Writes that fail (a stale token, an absent key) queue among writes that succeed while
/// another process holds the write lock, so they run together once it is released; the
/// failures change nothing and the successes all land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_leaves_the_writes_queued_with_it_alone() {
    let dir = TempDir::new("sqlite");
    let path = db(&dir);
    let clock = ManualClock::starting_now();
    let store = store_at(&path, &clock).await;
    let held = request("held");
    let held_token = claimed(&store, &held).await;

    // Another process takes the write lock; everything below queues behind it.
    let blocker = raw(&path);
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            let req = request(&format!("queued-{i}"));
            s.claim(&req).await.map(|_| ())
        }));
        let s = store.clone();
        let key = held.key.clone();
        tasks.push(tokio::spawn(async move {
            let forged = idem_runtime::store::ClaimToken::fresh();
            let r = s
                .settle(&key, forged, Settlement::new(RecordState::Failed))
                .await;
            assert!(matches!(r, Err(StoreError::StaleToken { .. })), "{r:?}");
            Ok(())
        }));
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            let absent = request(&format!("absent-{i}")).key;
            let forged = idem_runtime::store::ClaimToken::fresh();
            let r = s.release(&absent, forged).await;
            assert!(r.is_err(), "releasing an absent key: {r:?}");
            Ok(())
        }));
    }
    // Let them queue (the assertions below hold however they were batched).
    tokio::time::sleep(Duration::from_millis(200)).await;
    blocker.execute_batch("COMMIT").unwrap();
    for t in tasks {
        t.await.unwrap().unwrap();
    }

    let conn = raw(&path);
    let states: Vec<(String, String)> = conn
        .prepare("SELECT key, state FROM idem_records")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        states.len(),
        7,
        "the held key and six queued claims: {states:?}"
    );
    assert!(states.iter().all(|(_, s)| s == "running"), "{states:?}");
    for i in 0..6 {
        let key = request(&format!("queued-{i}")).key;
        assert!(states.iter().any(|(k, _)| k == key.as_str()), "queued-{i}");
    }
    // The held claim's token still settles it: the forged settles took nothing from it.
    store
        .settle(
            &held.key,
            held_token,
            Settlement::new(RecordState::Completed).payload(json!("real")),
        )
        .await
        .unwrap();
    let payload: String = conn
        .query_row(
            "SELECT payload FROM idem_records WHERE key = ?1",
            [held.key.as_str()],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(payload, "\"real\"");
}
