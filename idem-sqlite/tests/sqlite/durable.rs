//! What only the SQLite store has to get right beyond the conformance suite: many
//! processes opening one new file at once, and its rows read and broken directly (for the
//! suite's corruption check).

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, ManualClock};
use idem_sqlite::SqliteStore;

const LEASE: Duration = Duration::from_secs(10);

fn request(name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint("args"),
        tool: "backend_tool".into(),
        lease,
        operation: None,
    }
}

/// An SQLite file, read and written directly (another process, in effect).
pub(crate) struct SqliteRows(pub(crate) std::path::PathBuf);

impl SqliteRows {
    fn conn(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&self.0).expect("open the file directly");
        conn.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        conn
    }
}

/// The ways the SQL backends' running record is broken: a column that does not decode.
pub(crate) const SQL_CORRUPTIONS: &[&str] = &["fingerprint", "state", "attempts"];

impl SqliteRows {
    pub(crate) async fn corrupt(&self, key: &IdemKey, how: &str) {
        let set = match how {
            "fingerprint" => "fingerprint = 'garbage'",
            "state" => "state = 'exploded'",
            "attempts" => "attempts = '[not json'",
            other => unreachable!("{other}"),
        };
        let n = self
            .conn()
            .execute(
                &format!("UPDATE idem_records SET {set} WHERE key = ?1"),
                [key.as_str()],
            )
            .expect("corrupt");
        assert_eq!(n, 1, "the record to corrupt must exist");
    }

    pub(crate) async fn raw(&self, key: &IdemKey) -> Option<String> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT * FROM idem_records WHERE key = ?1")
            .expect("prepare");
        let n = stmt.column_count();
        let mut rows = stmt.query([key.as_str()]).expect("select");
        let row = rows.next().expect("read a row")?;
        let values: Vec<rusqlite::types::Value> =
            (0..n).map(|i| row.get(i).expect("a column")).collect();
        Some(format!("{values:?}"))
    }
}

/// Several processes starting at once on a file that does not exist yet (a fresh machine,
/// a fleet of agent processes): every one of them opens the store, the schema is created
/// once, and their claims exclude each other. (Racy by nature: many rounds of 8 openers
/// released by a barrier make the failure near-certain; the failing open returns within a
/// millisecond, not after the 5 s busy timeout its message claims.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_many_handles_open_a_fresh_file_at_once() {
    for round in 0..150 {
        let dir = idem_test::stores::TempDir::new("sqlite");
        let path = dir.path().join("idem.sqlite3");
        let clock = ManualClock::starting_now();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let (path, clock, barrier) = (path.clone(), clock.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::builder(path)
                        .clock(Arc::new(clock))
                        .sync(idem_sqlite::SqliteSync::Normal)
                        .open_blocking()
                })
            })
            .collect();
        let mut stores = Vec::new();
        for o in opens {
            match o.join().expect("thread") {
                Ok(s) => stores.push(s),
                Err(e) => panic!("round {round}: concurrent first open failed: {e}"),
            }
        }
        let req = request("fresh-file", LEASE);
        let mut winners = 0;
        for s in &stores {
            if let ClaimOutcome::Claimed(_) = s.claim(&req).await.expect("claim") {
                winners += 1;
            }
        }
        assert_eq!(winners, 1);
    }
}
