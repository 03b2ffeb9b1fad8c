//! Record decoding under garbage ([`idem_test::decode_fuzz`]) for SQLite: the rows are
//! rewritten with rusqlite, one column at a time, between the record's last write and the
//! operations that read it.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::ManualClock;
use idem_sqlite::SqliteStore;
use idem_test::decode_fuzz::{exercise, garbage_bytes, key, prepare, run, runtime, stage};
use idem_test::stores::TempDir;
use proptest::prelude::*;

/// A column and what to put in it (STRICT tables: text columns take text, possibly
/// invalid UTF-8; integer columns take any integer).
#[derive(Clone, Debug)]
enum Damage {
    Text(&'static str, Vec<u8>),
    Int(&'static str, i64),
    Null(&'static str),
}

fn damage() -> impl Strategy<Value = Damage> {
    let text_cols = prop::sample::select(vec![
        "state",
        "fingerprint",
        "tool",
        "token",
        "payload",
        "message",
        "downstream_ref",
        "attempts",
        "operation",
        "read_backs",
    ]);
    let int_cols = prop::sample::select(vec![
        "lease_until",
        "created_at",
        "updated_at",
        "result_expired",
    ]);
    let ints = prop_oneof![
        any::<i64>(),
        prop::sample::select(vec![i64::MIN, -1, 0, 1, 2, i64::MAX])
    ];
    prop_oneof![
        3 => (text_cols.clone(), garbage_bytes()).prop_map(|(c, b)| Damage::Text(c, b)),
        2 => (int_cols.clone(), ints).prop_map(|(c, n)| Damage::Int(c, n)),
        1 => prop_oneof![text_cols, int_cols].prop_map(Damage::Null),
    ]
}

#[test]
fn damaged_sqlite_rows_are_corrupt_never_a_panic() {
    let rt = runtime();
    run("SQLite rows", (stage(), damage()), |(stage, damage)| {
        rt.block_on(async {
            let dir = TempDir::new("sqlite_decode");
            let path = dir.path().join("idem.sqlite3");
            let clock = ManualClock::starting_now();
            let store = SqliteStore::builder(&path)
                .clock(Arc::new(clock.clone()))
                .open()
                .await
                .expect("open");
            let token = prepare(&store, stage).await;
            let conn = rusqlite::Connection::open(&path).expect("open the file directly");
            conn.busy_timeout(Duration::from_secs(5)).unwrap();
            let k = key();
            let written = match &damage {
                Damage::Text(col, bytes) => conn.execute(
                    &format!("UPDATE idem_records SET {col} = CAST(?1 AS TEXT) WHERE key = ?2"),
                    rusqlite::params![bytes, k.as_str()],
                ),
                Damage::Int(col, n) => conn.execute(
                    &format!("UPDATE idem_records SET {col} = ?1 WHERE key = ?2"),
                    rusqlite::params![n, k.as_str()],
                ),
                Damage::Null(col) => conn.execute(
                    &format!("UPDATE idem_records SET {col} = NULL WHERE key = ?1"),
                    rusqlite::params![k.as_str()],
                ),
            };
            // A NOT NULL column refuses NULL: nothing was damaged, nothing to check.
            if written.is_err() {
                return Ok(());
            }
            exercise(&store, &clock, token).await
        })
    });
}
