//! Group commit: the writes of this process queue for the one writer connection, and
//! whatever has queued while a commit was on its way runs next, in one transaction with one
//! commit, each write in its own savepoint when it has company (see [`Writer`]).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, MutexGuard};

use crate::store::{db_err, Inner};
use idem_runtime::store::{StoreError, Timestamp};
use rusqlite::Connection;
use tokio::sync::oneshot;

/// At most this many writes share one transaction, so a long queue cannot hold the
/// database's write lock (which other processes wait for) for long.
pub(crate) const BATCH_MAX: usize = 128;

/// The writer connection and the writes waiting for it.
///
/// A write is queued; if nobody is draining the queue, the writer starts a drain on the
/// blocking pool. The drain takes everything queued (up to [`BATCH_MAX`]), runs it in one
/// `BEGIN IMMEDIATE` transaction, each write in its own savepoint (a write alone in its
/// batch needs none: the transaction is its savepoint), commits once, then
/// answers each caller with its own result, and repeats until the queue is empty. So under
/// load the writes that queued during one commit share the next one, while a lone write
/// waits for nobody. A claim that finds its key free is already on the blocking pool (it
/// read the key there): it starts no task, but runs the first batch itself and hands the
/// rest to a drain of its own.
///
/// What this keeps:
/// - **Order and visibility.** Writes run one after another, in queue order; each sees what
///   the ones before it in the batch wrote, exactly as it would have after their commits.
/// - **Isolation of failures.** A write that fails (a stale token, a conflict, a corrupt
///   row, a panic) is rolled back to its savepoint (alone in its batch, with the whole
///   transaction); its neighbours keep their effects and their answers.
/// - **Durability before answers.** Every caller, the failed ones included, is answered only
///   once the commit is known. If the commit fails, every write of the batch that
///   succeeded gets that error (none of them was kept). If SQLite abandons the whole transaction midway (an I/O
///   error, a full disk), the writes already run in it get an error too (they are gone), and
///   the rest run in a new transaction.
/// - **Cancellation.** A write whose caller has gone before its turn is skipped, as a
///   cancelled write was before it took the lock; once it has run, it is kept.
#[derive(Default)]
pub(crate) struct Writer {
    /// Absent while a drain holds it (and before the first open, or after a failed connect).
    pub(crate) conn: Option<Connection>,
    pub(crate) queue: VecDeque<Box<dyn Pending>>,
    /// A drain is running (it empties the queue before it stops).
    pub(crate) draining: bool,
}

impl Inner {
    pub(crate) fn writer(&self) -> MutexGuard<'_, Writer> {
        // Only queue pushes and pops and a flag happen under this lock; a panic elsewhere
        // cannot leave it inconsistent.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the write `f`; true if the caller must start a drain (none is running).
    pub(crate) fn enqueue<T, F>(&self, f: F) -> (oneshot::Receiver<Result<T, StoreError>>, bool)
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        enqueue_on(&mut self.writer(), f)
    }
}

/// [`Inner::enqueue`] with the writer's lock already held.
pub(crate) fn enqueue_on<T, F>(
    writer: &mut Writer,
    f: F,
) -> (oneshot::Receiver<Result<T, StoreError>>, bool)
where
    T: Send + 'static,
    F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    writer.queue.push_back(Box::new(Op {
        f: Some(f),
        out: None,
        reply,
    }));
    let start = !std::mem::replace(&mut writer.draining, true);
    (answer, start)
}

pub(crate) async fn answered<T>(
    answer: oneshot::Receiver<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    answer
        .await
        .map_err(|_| StoreError::Backend("the SQLite writer stopped before answering".to_owned()))?
}

/// A queued write, its type erased so one queue holds them all.
pub(crate) trait Pending: Send {
    /// The caller is gone: skip it.
    fn abandoned(&self) -> bool;
    /// Runs the write in the open transaction and keeps its result: in a savepoint of its
    /// own when `savepoint` is set (it shares the transaction), else directly (it is alone
    /// in it, and [`run_batch`] rolls the transaction back if it fails).
    fn run(&mut self, conn: &Connection, inner: &Inner, savepoint: bool);
    /// It ran and failed (its writes must not be kept).
    fn failed(&self) -> bool;
    /// Answers the caller once the fate of the transaction is known: `Ok` if it committed.
    fn answer(self: Box<Self>, committed: Result<(), StoreError>);
}

pub(crate) struct Op<T, F> {
    pub(crate) f: Option<F>,
    pub(crate) out: Option<Result<T, StoreError>>,
    pub(crate) reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Pending for Op<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
{
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }

    fn failed(&self) -> bool {
        matches!(self.out, Some(Err(_)))
    }

    fn run(&mut self, conn: &Connection, inner: &Inner, own_savepoint: bool) {
        let Some(f) = self.f.take() else { return };
        if own_savepoint {
            if let Err(e) = savepoint(conn, "SAVEPOINT idem_op") {
                self.out = Some(Err(e));
                return;
            }
        }
        let now = inner.clock.now();
        let out = std::panic::catch_unwind(AssertUnwindSafe(|| f(conn, inner, now)))
            .unwrap_or_else(|_| {
                Err(StoreError::Backend(
                    "a SQLite store operation panicked; its writes were rolled back".to_owned(),
                ))
            });
        if !own_savepoint {
            // Alone in the transaction: `run_batch` rolls it back if this failed.
            self.out = Some(out);
            return;
        }
        let out = match out {
            Ok(v) => match savepoint(conn, "RELEASE idem_op") {
                Ok(()) => Ok(v),
                Err(e) => {
                    // Not kept, so not reported as done: undo it (if the transaction is
                    // still there to undo it in).
                    let _ = undo_savepoint(conn);
                    Err(e)
                }
            },
            Err(e) => {
                // A failed undo means the transaction itself is gone, which the drain sees.
                let _ = undo_savepoint(conn);
                Err(e)
            }
        };
        self.out = Some(out);
    }

    fn answer(self: Box<Self>, committed: Result<(), StoreError>) {
        let out = match (committed, self.out) {
            // A write that failed was undone whatever became of the batch: its own error is
            // the answer (and, for the write that made SQLite abandon the transaction, the
            // cause).
            (_, Some(Err(own))) => Err(own),
            (Ok(()), Some(out)) => out,
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(StoreError::Backend(
                "a SQLite write was answered without running".to_owned(),
            )),
        };
        // The caller may have gone meanwhile; what ran is kept regardless.
        let _ = self.reply.send(out);
    }
}

pub(crate) fn savepoint(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(drop)
        .map_err(db_err)
}

pub(crate) fn undo_savepoint(conn: &Connection) -> Result<(), StoreError> {
    savepoint(conn, "ROLLBACK TO idem_op")?;
    savepoint(conn, "RELEASE idem_op")
}

/// Empties the writer's queue, a batch per transaction (see [`Writer`]). Runs on the
/// blocking pool; exactly one drain runs at a time.
///
/// With `hand_off`, runs one batch (which holds the write that started it) and leaves the
/// rest to a drain of its own: the caller running it inline is not held until the queue
/// runs dry, however busy the store is.
pub(crate) fn drain(inner: &Arc<Inner>, hand_off: bool) {
    let mut conn = inner.writer().conn.take();
    let mut ran = false;
    loop {
        let batch: Vec<Box<dyn Pending>> = {
            let mut writer = inner.writer();
            if writer.queue.is_empty() {
                // Under the same lock a new write checks `draining`: nothing queued after
                // this can be left without a drain.
                writer.draining = false;
                writer.conn = conn;
                return;
            }
            if hand_off && ran {
                // `draining` stays set: the connection goes to the new drain alone.
                writer.conn = conn;
                drop(writer);
                let inner = inner.clone();
                drop(tokio::task::spawn_blocking(move || drain(&inner, false)));
                return;
            }
            let n = writer.queue.len().min(BATCH_MAX);
            writer
                .queue
                .drain(..n)
                .filter(|op| !op.abandoned())
                .collect()
        };
        ran = true;
        if batch.is_empty() {
            continue;
        }
        let c = match conn.take() {
            Some(c) => Ok(c),
            None => inner.connect(),
        };
        match c {
            Ok(c) => {
                run_batch(&c, inner, batch);
                conn = Some(c);
            }
            Err(e) => {
                for op in batch {
                    op.answer(Err(e.clone()));
                }
            }
        }
        inner.changed.notify_waiters();
    }
}

/// Runs `batch` in one transaction (more if SQLite abandons one midway) and answers every
/// write in it. A write alone in its batch (every write when nothing else waits) needs no
/// savepoint of its own: if it fails, the transaction is rolled back instead, which undoes
/// exactly its writes; that saves two statements per write.
pub(crate) fn run_batch(conn: &Connection, inner: &Inner, batch: Vec<Box<dyn Pending>>) {
    if batch.len() == 1 {
        return run_alone(conn, inner, batch);
    }
    let mut batch = batch.into_iter().peekable();
    while batch.peek().is_some() {
        if let Err(e) = savepoint(conn, "BEGIN IMMEDIATE") {
            for op in batch {
                op.answer(Err(e.clone()));
            }
            return;
        }
        let mut ran: Vec<Box<dyn Pending>> = Vec::new();
        let mut abandoned = false;
        for mut op in batch.by_ref() {
            op.run(conn, inner, true);
            ran.push(op);
            if conn.is_autocommit() {
                abandoned = true;
                break;
            }
        }
        let committed = if abandoned {
            Err(StoreError::Unavailable(
                "SQLite abandoned the transaction (an I/O error, a full disk or the like); \
                 nothing in it was written"
                    .to_owned(),
            ))
        } else {
            // Returns only once the commit is in the log (and, with `Full`, on disk).
            savepoint(conn, "COMMIT").inspect_err(|_| {
                if !conn.is_autocommit() {
                    let _ = savepoint(conn, "ROLLBACK");
                }
            })
        };
        for op in ran {
            op.answer(committed.clone());
        }
    }
}

/// [`run_batch`] for a batch of one write: `BEGIN IMMEDIATE`, the write, then `COMMIT` if it
/// succeeded and `ROLLBACK` if it failed; answered once that is known.
pub(crate) fn run_alone(conn: &Connection, inner: &Inner, batch: Vec<Box<dyn Pending>>) {
    for mut op in batch {
        if let Err(e) = savepoint(conn, "BEGIN IMMEDIATE") {
            op.answer(Err(e));
            continue;
        }
        op.run(conn, inner, false);
        let done = if conn.is_autocommit() {
            Err(StoreError::Unavailable(
                "SQLite abandoned the transaction (an I/O error, a full disk or the like); \
                 nothing in it was written"
                    .to_owned(),
            ))
        } else if op.failed() {
            // The rollback undoes what it wrote before failing; its own error is its
            // answer whatever the rollback says (see `Op::answer`).
            savepoint(conn, "ROLLBACK")
        } else {
            savepoint(conn, "COMMIT").inspect_err(|_| {
                if !conn.is_autocommit() {
                    let _ = savepoint(conn, "ROLLBACK");
                }
            })
        };
        op.answer(done);
    }
}

#[cfg(test)]
mod tests {
    //! The group commit's batch, driven directly: the order in which writes share one
    //! transaction is fixed here, not left to the scheduler.

    use std::path::Path;
    use std::time::Duration;

    use idem_runtime::identity::{Fingerprint, IdemKey};
    use idem_runtime::store::backend::{rules, ClaimRequest};
    use idem_runtime::store::ClaimToken;

    use super::*;
    use crate::codec::{load, put};
    use crate::store::SqliteStore;

    fn req(name: &str) -> ClaimRequest {
        ClaimRequest {
            key: key(name),
            fingerprint: Fingerprint::of_canonical(name.as_bytes()),
            tool: "batch_test".into(),
            lease: Duration::from_secs(30),
            operation: None,
        }
    }

    fn key(name: &str) -> IdemKey {
        let scope = idem_runtime::identity::Scope::run("batch-test");
        IdemKey::derive(
            &scope,
            "batch_test",
            idem_runtime::identity::KeyMaterial::Intent(name),
        )
    }

    type Reply<T> = oneshot::Receiver<Result<T, StoreError>>;

    fn op<T, F>(f: F) -> (Box<dyn Pending>, Reply<T>)
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            f: Some(f),
            out: None,
            reply,
        };
        (Box::new(op), answer)
    }

    fn claim_op(
        name: &str,
    ) -> impl FnOnce(&Connection, &Inner, Timestamp) -> Result<(), StoreError> {
        let r = req(name);
        move |conn, _, now| put(conn, &rules::new_claim(&r, ClaimToken::fresh(), now))
    }

    #[test]
    fn a_failed_write_in_a_batch_leaves_its_neighbours_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("batch.sqlite3");
        let store = SqliteStore::builder(&path).open_blocking().unwrap();
        let inner = &store.inner;
        let conn = inner.writer().conn.take().unwrap();

        let (a, a_says) = op(claim_op("a"));
        // Writes, then fails: its own write must be undone, nobody else's.
        let (b, b_says) = op({
            let claim = claim_op("b");
            move |conn, inner, now| {
                claim(conn, inner, now)?;
                Err::<(), _>(StoreError::Backend("refused after writing".to_owned()))
            }
        });
        // Sees what `a` wrote earlier in the same transaction.
        let (seen, seen_says) = op(|conn, _, _| Ok(load(conn, &req("a").key)?.is_some()));
        let (c, c_says) = op({
            let claim = claim_op("c");
            move |conn, inner, now| -> Result<(), StoreError> {
                claim(conn, inner, now)?;
                panic!("a write that panics after writing")
            }
        });
        let (d, d_says) = op(claim_op("d"));
        // Its caller has gone: never run.
        let (gone, gone_says) = op(claim_op("gone"));
        drop(gone_says);
        let mut batch = vec![a, b, seen, c, d];
        batch.extend([gone].into_iter().filter(|op| !op.abandoned()));
        run_batch(&conn, inner, batch);

        let answer = |mut rx: Reply<()>| rx.try_recv().expect("answered");
        assert_eq!(answer(a_says), Ok(()));
        assert!(matches!(answer(b_says), Err(StoreError::Backend(m)) if m.contains("refused")));
        assert_eq!(seen_says.blocking_recv().unwrap(), Ok(true));
        assert!(matches!(answer(c_says), Err(StoreError::Backend(m)) if m.contains("panicked")));
        assert_eq!(answer(d_says), Ok(()));

        // What the file holds, through a connection of its own.
        let other = Connection::open(&path).unwrap();
        let mut rows: Vec<(String, String)> = other
            .prepare("SELECT key, state FROM idem_records")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        rows.sort();
        let mut expected: Vec<(String, String)> = ["a", "d"]
            .iter()
            .map(|n| (key(n).as_str().to_owned(), "running".to_owned()))
            .collect();
        expected.sort();
        assert_eq!(
            rows, expected,
            "a and d kept; b, c and the abandoned write not"
        );
        assert!(conn.is_autocommit(), "the batch left no transaction open");
    }

    /// The file's rows, read through a connection of its own.
    fn rows_in(path: &Path) -> Vec<(String, String)> {
        let other = Connection::open(path).unwrap();
        let mut rows: Vec<(String, String)> = other
            .prepare("SELECT key, state FROM idem_records")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        rows.sort();
        rows
    }

    /// A write alone in its batch runs without a savepoint: when it fails (or panics) after
    /// writing, the whole transaction is rolled back, its caller gets its own error, and the
    /// next lone write commits as usual.
    #[test]
    fn a_lone_write_that_fails_is_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lone.sqlite3");
        let store = SqliteStore::builder(&path).open_blocking().unwrap();
        let inner = &store.inner;
        let conn = inner.writer().conn.take().unwrap();

        let (b, b_says) = op({
            let claim = claim_op("b");
            move |conn, inner, now| {
                claim(conn, inner, now)?;
                Err::<(), _>(StoreError::Backend("refused after writing".to_owned()))
            }
        });
        run_batch(&conn, inner, vec![b]);
        let (c, c_says) = op({
            let claim = claim_op("c");
            move |conn, inner, now| -> Result<(), StoreError> {
                claim(conn, inner, now)?;
                panic!("a write that panics after writing")
            }
        });
        run_batch(&conn, inner, vec![c]);
        let (d, d_says) = op(claim_op("d"));
        run_batch(&conn, inner, vec![d]);

        let answer = |mut rx: Reply<()>| rx.try_recv().expect("answered");
        assert!(matches!(answer(b_says), Err(StoreError::Backend(m)) if m.contains("refused")));
        assert!(matches!(answer(c_says), Err(StoreError::Backend(m)) if m.contains("panicked")));
        assert_eq!(answer(d_says), Ok(()));
        assert_eq!(
            rows_in(&path),
            [(key("d").as_str().to_owned(), "running".to_owned())],
            "only d kept"
        );
        assert!(conn.is_autocommit(), "no transaction left open");
    }
}
