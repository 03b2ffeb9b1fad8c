//! [`SqliteStore`] and its [`IdemStore`] implementation: reads on a pool of connections,
//! writes through the group-commit writer ([`crate::writer`]), every decision by [`rules`].

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::builder::{SqliteStoreBuilder, SqliteSync};
use crate::codec::{
    delete, list_release_rows, list_rows, load, load_aged, load_releases, put, put_release,
    put_settled,
};
use crate::sweep::{needs_sweep, sweep, sweep_counted};
use crate::writer::{answered, drain, enqueue_on, Writer};
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::rules::{self, Aged};
use idem_runtime::store::backend::{
    ClaimOutcome, ClaimRequest, Settlement, SweepTask, DEFAULT_SWEEP_EVERY,
};
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ListCursor, Record, RecordState, ReleaseNote, ReleaseRecord,
    Retention, StoreError, Swept, SystemClock, Timestamp,
};
use rusqlite::{Connection, ErrorCode};
use tokio::sync::{oneshot, Notify, Semaphore};

/// An [`IdemStore`] in a SQLite database file: durable across restarts, for the processes
/// of one machine.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::store::StoreError> {
/// use idem_sqlite::{SqliteStore, SqliteSync};
///
/// let store = SqliteStore::open("/var/lib/my-agent/idem.sqlite3").await?;
/// // or, with options:
/// let store = SqliteStore::builder("/var/lib/my-agent/idem.sqlite3")
///     .sync(SqliteSync::Full)
///     .open()
///     .await?;
/// # Ok(()) }
/// ```
///
/// - **Durability.** A claim is committed (and, with the default [`SqliteSync::Full`],
///   `fsync`ed) before `claim` returns, so a crash at any later point leaves the claim on
///   disk; after the lease passes it reads as *unknown*, and the handler never runs twice.
/// - **Concurrency.** Safe from many tasks and many processes on one file. Writes in this
///   process go through one connection, one at a time (SQLite has one writer anyway), and
///   are group-committed: the claims and settles that queue while a commit is on its way
///   run next in one transaction (each in a savepoint of its own, so one failing leaves the
///   others alone) with one commit, and none is answered before that commit. Reads use a
///   small pool and run alongside writes (WAL). Other processes wait for the write lock up
///   to the busy timeout, then get [`StoreError::Unavailable`].
/// - **Not** for a network file system (NFS, SMB): SQLite's locking is unreliable there,
///   and two machines could both claim a key. Use Redis or Postgres across machines.
/// - **Schema.** One table `idem_records` with two indexes (`idem_records_by_state` on
///   `(state, created_at, key)` for listings and lease expiry; `idem_records_by_age` on
///   `(state, result_expired, updated_at)` for retention, over settled records only), the
///   release traces in `idem_releases`, and `idem_meta`, holding the schema version (2 now);
///   created on first open. A version 1 file is upgraded in place when opened (its
///   retention index is rebuilt, one pass over the table under the write lock); a file
///   whose schema version this build does not know is refused, never rewritten. Rows that
///   do not decode are [`StoreError::Corrupt`].
/// - **Files.** A new database file is created owner-only (0600, whatever the umask), and
///   its `-wal` and `-shm` files inherit that; a path that is a symbolic link is refused.
///   The records hold the saved arguments and outputs: keep the directory private too.
/// - **Housekeeping.** Expired leases and retention are applied whenever a record is read
///   or listed, and to every record at once by a sweep ([`IdemStore::sweep_expired`],
///   [`SqliteStore::sweep`]): results past their window become tombstones (arguments and
///   output deleted from the file), lapsed tombstones are deleted. The store sweeps by
///   itself: a task it spawns when opened runs a sweep every
///   [`SqliteStoreBuilder::sweep_every`] (default one minute), so retention holds for keys
///   nobody reads again; the task ends when the last handle on the store is dropped.
///   [`IdemStore::list`] sweeps first.
#[derive(Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) path: PathBuf,
    pub(crate) sync: SqliteSync,
    pub(crate) busy_timeout: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    /// The one connection for read-modify-write transactions and the writes queued for it:
    /// in-process writers queue here instead of spinning in SQLite's busy handler.
    pub(crate) writer: Mutex<Writer>,
    pub(crate) readers: Pool,
    /// Woken after every write, so in-process waiters see settlements at once.
    pub(crate) changed: Notify,
    /// The background sweep ([`SqliteStoreBuilder::sweep_every`]), stopped when this is
    /// dropped.
    pub(crate) sweeper: OnceLock<SweepTask>,
}

/// Connections handed out one per permit; opened lazily, returned after use.
pub(crate) struct Pool {
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) idle: Mutex<Vec<Connection>>,
}

impl Pool {
    pub(crate) fn new(size: usize) -> Pool {
        Pool {
            permits: Arc::new(Semaphore::new(size.max(1))),
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
        // The vector is only pushed to and popped from; a panic elsewhere cannot leave it
        // inconsistent.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("sync", &self.inner.sync)
            .field("retention", &self.inner.retention)
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn connect(&self) -> Result<Connection, StoreError> {
        // NOFOLLOW: SQLite too refuses a symbolic link in place of the file (checked above
        // on first open; every later connection checks again).
        let flags = rusqlite::OpenFlags::default() | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot open SQLite database {}: {e}",
                self.path.display()
            ))
        })?;
        conn.busy_timeout(self.busy_timeout).map_err(db_err)?;
        let mode: String = retry_busy(self.busy_timeout, || {
            conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        })
        .map_err(db_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Backend(format!(
                "SQLite database {} cannot use WAL (journal_mode is {mode})",
                self.path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", self.sync.pragma())
            .map_err(db_err)?;
        Ok(conn)
    }
}

/// Runs `f` again while SQLite answers BUSY or LOCKED, until `timeout` has passed.
///
/// Switching a new database to WAL takes a lock that SQLite's busy handler does not wait
/// for: several processes opening one new file at once would otherwise fail at once, well
/// inside the busy timeout they were promised.
pub(crate) fn retry_busy<T>(
    timeout: Duration,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match f() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
                    && start.elapsed() + pause < timeout =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

pub(crate) fn db_err(e: rusqlite::Error) -> StoreError {
    if let rusqlite::Error::SqliteFailure(f, _) = &e {
        match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                return StoreError::Unavailable(format!(
                    "SQLite database is locked by another writer past the busy timeout: {e}"
                ))
            }
            ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OutOfMemory => return StoreError::Unavailable(format!("SQLite: {e}")),
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                return StoreError::Corrupt {
                    key: "<database>".to_owned(),
                    detail: e.to_string(),
                }
            }
            _ => {}
        }
    }
    StoreError::Backend(format!("SQLite: {e}"))
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with the defaults: [`SqliteSync::Full`],
    /// the system clock, default [`Retention`].
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::builder(path).open().await
    }

    /// Options for the store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.as_ref().to_owned(),
            sync: SqliteSync::default(),
            busy_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
            retention: Retention::default(),
            readers: 4,
            sweep_every: DEFAULT_SWEEP_EVERY,
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The synchronous mode in use.
    pub fn sync_mode(&self) -> SqliteSync {
        self.inner.sync
    }

    /// Applies lease expiry and retention to every record now: expired running claims
    /// become *unknown*, results past the retention window become tombstones, lapsed
    /// tombstones are deleted. Returns how many records changed or were deleted.
    ///
    /// Reads and listings do this for the records they touch; call it periodically to keep
    /// the file from holding lapsed tombstones of keys nobody asks about again.
    pub async fn sweep(&self) -> Result<usize, StoreError> {
        self.write(sweep).await
    }

    /// Starts the background sweep of [`SqliteStoreBuilder::sweep_every`].
    pub(crate) fn start_sweeping(&self, every: Duration) {
        let task = SweepTask::spawn(&self.inner, every, |inner| async move {
            SqliteStore { inner }.sweep_expired().await
        });
        if let Some(task) = task {
            let _ = self.inner.sweeper.set(task);
        }
    }

    /// Runs `f` on a read connection, on the blocking pool.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Arc<Inner>) -> Result<T, StoreError> + Send + 'static,
    {
        self.on_connection(move |conn, inner| f(conn, inner)).await
    }

    /// Runs `f` on the writer connection inside a `BEGIN IMMEDIATE` transaction (in a
    /// savepoint of its own if other writes share it), with the time read once the lock is
    /// held. What `f` wrote is
    /// kept if it returns `Ok` and undone if it fails (or panics); either way the answer
    /// comes back only after the transaction's commit (which, with [`SqliteSync::Full`], is
    /// on disk). Writes queued meanwhile by other tasks share that transaction and commit:
    /// see [`Writer`].
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        let (answer, start) = self.inner.enqueue(f);
        if start {
            let inner = self.inner.clone();
            // Detached: the writes run (and the connection goes back) even if every caller
            // waiting on them is cancelled.
            drop(tokio::task::spawn_blocking(move || drain(&inner, false)));
        }
        answered(answer).await
    }

    /// Runs `f` on a read connection, on the blocking pool.
    pub(crate) async fn on_connection<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, &Arc<Inner>) -> Result<T, StoreError> + Send + 'static,
    {
        let inner = self.inner.clone();
        let permit = inner
            .readers
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("the SQLite store is closed".to_owned()))?;
        // Giving the connection back happens on the blocking thread too, so a cancelled
        // caller cannot lose it.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let popped = inner.readers.idle().pop();
            let mut conn = match popped {
                Some(c) => c,
                None => inner.connect()?,
            };
            let out = f(&mut conn, &inner);
            inner.readers.idle().push(conn);
            out
        })
        .await
        .map_err(|e| StoreError::Backend(format!("SQLite store task failed: {e}")))?
    }
}

/// What a read says of a claim on `req`'s key: `Some` when the key is taken (a repeat, a
/// conflict, a claim in flight) and no time rule would change its record; `None` when the
/// claim needs the write lock (a free key, or a record due to age).
pub(crate) fn seen_claim(
    conn: &Connection,
    inner: &Inner,
    req: &ClaimRequest,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let now = inner.clock.now();
    let seen = load(conn, &req.key)?.and_then(|mut r| {
        (rules::age(&mut r, now, &inner.retention) == Aged::Unchanged).then_some(r)
    });
    Ok(rules::claim_against(seen.as_ref(), req))
}

pub(crate) type Answer<T> = oneshot::Receiver<Result<T, StoreError>>;

/// Where a claim's first look at its key led.
pub(crate) enum ClaimPath {
    /// Read on the idle writer connection: the key is taken (or the read failed).
    Seen(Result<ClaimOutcome, StoreError>),
    /// Read on the idle writer connection: the key is free, its write queued and drained.
    Queued(Answer<ClaimOutcome>),
    /// The writer was busy: look from a reader instead.
    WriterBusy(ClaimRequest),
}

/// Queues the write of a claim on `req`'s key (decided again under the write lock); true
/// if the caller must start a drain.
pub(crate) fn queue_claim(writer: &mut Writer, req: ClaimRequest) -> (Answer<ClaimOutcome>, bool) {
    enqueue_on(writer, move |tx, inner, now| {
        let existing = load_aged(tx, inner, &req.key, now)?;
        if let Some(outcome) = rules::claim_against(existing.as_ref(), &req) {
            return Ok(outcome);
        }
        let token = ClaimToken::fresh();
        put(tx, &rules::new_claim(&req, token, now))?;
        Ok(ClaimOutcome::Claimed(token))
    })
}

// ---------------------------------------------------------------------------------------
// The contract
// ---------------------------------------------------------------------------------------

#[async_trait::async_trait]
impl IdemStore for SqliteStore {
    fn backend_name(&self) -> &'static str {
        "sqlite"
    }
    fn durability(&self) -> idem_runtime::store::Durability {
        idem_runtime::store::Durability::Durable
    }
    async fn sweep_expired(&self) -> Result<Swept, StoreError> {
        self.write(|tx, inner, now| sweep_counted(tx, inner, now).map(|(swept, _)| swept))
            .await
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        // A repeat of a settled or running key is answered from a read, without queueing
        // for the write lock; only a free (or time-changed) key needs it. Its write is
        // queued from the same blocking task (which drains the queue itself if nobody is),
        // saving a second trip through the blocking pool. The read runs on the writer
        // connection when no write is under way (its pages are the ones just written;
        // a reader's cache is dropped whenever the file changed since its last read, so
        // each lone claim would read its pages again), else on a reader, so repeats never
        // wait for queued writes.
        let req = req.clone();
        let inner = self.inner.clone();
        let first = tokio::task::spawn_blocking(move || {
            let idle_writer = {
                let mut writer = inner.writer();
                if writer.draining || writer.conn.is_none() {
                    None
                } else {
                    writer.draining = true;
                    writer.conn.take()
                }
            };
            let Some(conn) = idle_writer else {
                return ClaimPath::WriterBusy(req);
            };
            // The connection must go back whatever happens: a panic here would otherwise
            // leave the writer taken and every write queued behind it forever.
            let seen =
                std::panic::catch_unwind(AssertUnwindSafe(|| seen_claim(&conn, &inner, &req)))
                    .unwrap_or_else(|_| {
                        Err(StoreError::Backend(
                            "a SQLite claim's read panicked".to_owned(),
                        ))
                    });
            let mut writer = inner.writer();
            writer.conn = Some(conn);
            let seen = match seen {
                Ok(None) => {
                    let (answer, _) = queue_claim(&mut writer, req);
                    drop(writer);
                    // `draining` is ours: this task drains, as a claim that found no drain
                    // does.
                    drain(&inner, true);
                    return ClaimPath::Queued(answer);
                }
                Ok(Some(outcome)) => Ok(outcome),
                Err(e) => Err(e),
            };
            // Hand the writer back; writes that queued meanwhile get a drain.
            if writer.queue.is_empty() {
                writer.draining = false;
            } else {
                drop(writer);
                let inner = inner.clone();
                drop(tokio::task::spawn_blocking(move || drain(&inner, false)));
            }
            ClaimPath::Seen(seen)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("SQLite store task failed: {e}")))?;
        let answer = match first {
            ClaimPath::Seen(outcome) => return outcome,
            ClaimPath::Queued(answer) => answer,
            ClaimPath::WriterBusy(req) => {
                let queued = self
                    .read(move |conn, inner| match seen_claim(conn, inner, &req)? {
                        Some(outcome) => Ok(Err(outcome)),
                        None => {
                            let (answer, start) = queue_claim(&mut inner.writer(), req);
                            if start {
                                drain(inner, true);
                            }
                            Ok(Ok(answer))
                        }
                    })
                    .await?;
                match queued {
                    Err(outcome) => return Ok(outcome),
                    Ok(answer) => answer,
                }
            }
        };
        answered(answer).await
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |tx, inner, now| {
            let mut record =
                load_aged(tx, inner, &key, now)?.ok_or_else(|| rules::stale_absent(&key))?;
            rules::renew(&mut record, token, lease, now)?;
            put(tx, &record)
        })
        .await
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |tx, inner, now| {
            let mut record =
                load_aged(tx, inner, &key, now)?.ok_or_else(|| rules::stale_absent(&key))?;
            rules::settle(&mut record, token, settlement, now)?;
            put_settled(tx, &record)
        })
        .await
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |tx, inner, now| {
            let record =
                load_aged(tx, inner, &key, now)?.ok_or_else(|| rules::stale_absent(&key))?;
            rules::release(&record, token)?;
            delete(tx, &key)
        })
        .await
    }

    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        let key = key.clone();
        let note = note.clone();
        self.write(move |tx, inner, now| {
            let record = load_aged(tx, inner, &key, now)?
                .ok_or_else(|| StoreError::NotFound(key.clone()))?;
            let release = rules::release_unsettled(&record, expected, &note, now)?;
            delete(tx, &key)?;
            put_release(tx, inner, &key, &release, now)
        })
        .await
    }

    async fn release_traced(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        rules::releasable_settlement(key, &settlement)?;
        let key = key.clone();
        let note = note.clone();
        self.write(move |tx, inner, now| {
            let record =
                load_aged(tx, inner, &key, now)?.ok_or_else(|| rules::stale_absent(&key))?;
            let release = rules::release_traced(&record, token, settlement, &note, now)?;
            delete(tx, &key)?;
            put_release(tx, inner, &key, &release, now)
        })
        .await
    }

    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        let key = key.clone();
        self.read(move |conn, inner| load_releases(conn, inner, &key, inner.clock.now()))
            .await
    }

    async fn list_releases(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        let after = after.cloned();
        self.read(move |conn, inner| {
            list_release_rows(conn, inner, after.as_ref(), limit, inner.clock.now())
        })
        .await
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let key = key.clone();
        self.write(move |tx, inner, now| {
            let mut record = load_aged(tx, inner, &key, now)?
                .ok_or_else(|| StoreError::NotFound(key.clone()))?;
            let fresh = ClaimToken::fresh();
            rules::reclaim(&mut record, expected, fresh, lease, now)?;
            put(tx, &record)?;
            Ok(fresh)
        })
        .await
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let k = key.clone();
        let seen = self
            .read(move |conn, inner| {
                let now = inner.clock.now();
                Ok(match load(conn, &k)? {
                    None => Some(None),
                    Some(mut r) => (rules::age(&mut r, now, &inner.retention) == Aged::Unchanged)
                        .then_some(Some(r)),
                })
            })
            .await?;
        if let Some(record) = seen {
            return Ok(record);
        }
        // Time changed the record: record that (once), under the write lock.
        let key = key.clone();
        self.write(move |tx, inner, now| load_aged(tx, inner, &key, now))
            .await
    }

    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list_after(state, None, limit).await
    }

    async fn list_after(
        &self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let after = after.cloned();
        let cursor = after.clone();
        let listed = self
            .read(move |conn, inner| {
                // One read transaction: the check and the listing see the same snapshot.
                let tx = conn.unchecked_transaction().map_err(db_err)?;
                if needs_sweep(&tx, inner, inner.clock.now())? {
                    return Ok(None);
                }
                list_rows(&tx, state, cursor.as_ref(), limit).map(Some)
            })
            .await?;
        if let Some(records) = listed {
            return Ok(records);
        }
        self.write(move |tx, inner, now| {
            sweep(tx, inner, now)?;
            list_rows(tx, state, after.as_ref(), limit)
        })
        .await
    }

    async fn wait_settled(
        &self,
        key: &IdemKey,
        timeout: Duration,
    ) -> Result<Option<Record>, StoreError> {
        let deadline = idem_runtime::store::backend::deadline_after(timeout);
        let mut pause = Duration::from_millis(2);
        loop {
            // Registered before looking, so a write in between still wakes us.
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let record = self.get(key).await?;
            if !matches!(&record, Some(r) if r.state == RecordState::Running) {
                return Ok(record);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(record);
            }
            // In-process writes wake us at once; other processes' writes and lease expiry
            // are noticed by polling.
            let _ = tokio::time::timeout(pause.min(deadline - now), changed).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
