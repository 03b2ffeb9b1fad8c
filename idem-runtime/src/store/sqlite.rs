//! [`SqliteStore`]: the embedded, durable store for one machine.
//!
//! One table keyed by the key, in WAL mode. Every read-modify-write runs in a
//! `BEGIN IMMEDIATE` transaction (the database's write lock, which also excludes other
//! processes on the same file) and decides through [`rules`], so the contract lives in one
//! place. SQLite calls block, so they run on tokio's blocking pool, never on a runtime
//! worker.
//!
//! Writes are group-committed: the writes of this process queue for the one writer
//! connection, and whatever has queued while a commit was on its way runs next, in one
//! transaction with one commit, each write in its own savepoint when it has company (see
//! [`Writer`]).

use std::collections::VecDeque;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, Row, TransactionBehavior};
use tokio::sync::{oneshot, Notify, Semaphore};

use super::rules::{self, Aged};
use super::{
    AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore, ListCursor, Operation,
    ReadBackRecord, Record, RecordState, ReleaseNote, ReleaseRecord, Retention, Settlement,
    StoreError, SystemClock, Timestamp,
};
use crate::identity::{Fingerprint, IdemKey};

/// The schema version this build reads and writes.
const SCHEMA_VERSION: i64 = 2;

/// Version 2: `idem_records_by_age` (the retention scans) holds settled records only, so a
/// claim writes the table and one index instead of two. A version 1 file is upgraded in
/// place when opened (the index is rebuilt: one pass over the table, under the write lock).
const MIGRATE_TO_2: &str = "DROP INDEX IF EXISTS idem_records_by_age;
     CREATE INDEX idem_records_by_age ON idem_records (state, result_expired, updated_at)
         WHERE state IN ('completed', 'failed');
     UPDATE idem_meta SET value = 2 WHERE name = 'schema_version';";

/// The release traces ([`IdemStore::release_unsettled`]): one row per release, numbered per
/// key. Added to version 1 without a new version: created when missing, and a build that
/// predates it never reads it.
const RELEASES_DDL: &str = "CREATE TABLE IF NOT EXISTS idem_releases (
         key         TEXT NOT NULL,
         seq         INTEGER NOT NULL,
         released_at INTEGER NOT NULL,
         entry       TEXT NOT NULL,
         PRIMARY KEY (key, seq)
     ) STRICT, WITHOUT ROWID;
     CREATE INDEX IF NOT EXISTS idem_releases_by_time ON idem_releases (released_at, key, seq);";

/// Columns in the order [`decode`] reads them.
const COLUMNS: &str = "key, state, fingerprint, tool, token, lease_until, created_at, \
                       updated_at, result_expired, payload, message, downstream_ref, attempts, \
                       operation, read_backs";

/// How hard SQLite works to make a commit survive (`PRAGMA synchronous`).
///
/// Either way, a claim is committed before [`IdemStore::claim`] returns, so before the
/// handler runs; the modes differ in what a commit survives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SqliteSync {
    /// `synchronous = FULL` (the default): every commit waits for `fsync` of the write-ahead
    /// log. A committed claim or result survives a process crash **and** a power loss or
    /// kernel panic. Costs one `fsync` per commit (well under a millisecond on an SSD with
    /// a write cache, several on a spinning disk or network volume): one per claim and per
    /// settle when they come one at a time, one per batch when several wait for the writer
    /// (see the store's *Concurrency* note).
    #[default]
    Full,
    /// `synchronous = NORMAL`: commits are written to the log but only `fsync`ed at
    /// checkpoints. A committed claim survives a **process** crash (`kill -9`, panic, OOM
    /// kill) — the log is in the OS's page cache — but a power loss or kernel panic may roll
    /// back the last commits. A rolled-back claim means a restarted agent finds the key free
    /// and runs the handler again: a duplicate effect. Choose it only when the machine's
    /// durability is someone else's problem (a disposable VM whose loss also loses the agent
    /// run) or the downstream is keyed and deduplicates by itself.
    Normal,
}

impl SqliteSync {
    fn pragma(self) -> &'static str {
        match self {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        }
    }
}

/// An [`IdemStore`] in a SQLite database file: durable across restarts, for the processes
/// of one machine.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::StoreError> {
/// use idem_runtime::store::{SqliteStore, SqliteSync};
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
///   or listed; [`SqliteStore::sweep`] applies them to every record at once (deleting
///   lapsed tombstones). [`IdemStore::list`] sweeps first.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    sync: SqliteSync,
    busy_timeout: Duration,
    clock: Arc<dyn Clock>,
    retention: Retention,
    /// The one connection for read-modify-write transactions and the writes queued for it:
    /// in-process writers queue here instead of spinning in SQLite's busy handler.
    writer: Mutex<Writer>,
    readers: Pool,
    /// Woken after every write, so in-process waiters see settlements at once.
    changed: Notify,
}

/// Connections handed out one per permit; opened lazily, returned after use.
struct Pool {
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Connection>>,
}

impl Pool {
    fn new(size: usize) -> Pool {
        Pool {
            permits: Arc::new(Semaphore::new(size.max(1))),
            idle: Mutex::new(Vec::new()),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
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

/// Options for opening a [`SqliteStore`]. See [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    sync: SqliteSync,
    busy_timeout: Duration,
    clock: Arc<dyn Clock>,
    retention: Retention,
    readers: usize,
}

impl SqliteStoreBuilder {
    /// `PRAGMA synchronous` (default [`SqliteSync::Full`]); see [`SqliteSync`] for the
    /// trade-off.
    pub fn sync(mut self, sync: SqliteSync) -> Self {
        self.sync = sync;
        self
    }

    /// The retention windows (default: results 24 h, tombstones 30 days).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention.normalized();
        self
    }

    /// The clock leases and retention are measured with (default: the system clock; a
    /// [`super::ManualClock`] in tests). Processes sharing a file should agree on the time.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long an operation waits for another process's write lock before failing with
    /// [`StoreError::Unavailable`] (default 5 s).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// How many read connections may be open at once (default 4, at least 1).
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers.max(1);
        self
    }

    /// Opens (creating if needed) the database, on tokio's blocking pool.
    pub async fn open(self) -> Result<SqliteStore, StoreError> {
        tokio::task::spawn_blocking(move || self.open_blocking())
            .await
            .map_err(|e| StoreError::Backend(format!("opening the SQLite store failed: {e}")))?
    }

    /// Opens (creating if needed) the database on the calling thread, for code outside an
    /// async context. The store's operations still need a tokio runtime.
    pub fn open_blocking(self) -> Result<SqliteStore, StoreError> {
        let inner = Inner {
            path: self.path,
            sync: self.sync,
            busy_timeout: self.busy_timeout,
            clock: self.clock,
            retention: self.retention,
            writer: Mutex::new(Writer::default()),
            readers: Pool::new(self.readers),
            changed: Notify::new(),
        };
        create_private(&inner.path)?;
        let mut conn = inner.connect()?;
        migrate(&mut conn, &inner.path)?;
        inner.writer().conn = Some(conn);
        Ok(SqliteStore {
            inner: Arc::new(inner),
        })
    }
}

/// Creates the database file, if it does not exist yet, readable and writable by its owner
/// alone (0600, whatever the process umask), and refuses a path whose last component is a
/// symbolic link. SQLite creates the `-wal` and `-shm` files with the database file's
/// permissions, so they are owner-only too. An existing file keeps the permissions it has.
///
/// Paths SQLite gives a meaning of its own (`:memory:`, the empty path, `file:` URIs) are
/// left to SQLite.
fn create_private(path: &Path) -> Result<(), StoreError> {
    let special = path.as_os_str().is_empty()
        || path.as_os_str() == ":memory:"
        || path.to_str().is_some_and(|p| p.starts_with("file:"));
    if special {
        return Ok(());
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    match options.open(path) {
        Ok(_) => Ok(()),
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(StoreError::Backend(format!(
            "SQLite database {} is a symbolic link; refusing to follow it (give the real path)",
            path.display()
        ))),
        Err(e) => Err(StoreError::Unavailable(format!(
            "cannot create SQLite database {}: {e}",
            path.display()
        ))),
    }
}

impl Inner {
    fn connect(&self) -> Result<Connection, StoreError> {
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
fn retry_busy<T>(
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

/// Creates the schema on a new database and checks the version of an existing one.
fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
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

fn foreign(path: &Path, detail: &str) -> StoreError {
    StoreError::Corrupt {
        key: "<schema>".to_owned(),
        detail: format!(
            "{} is not an idem SQLite database: {detail}",
            path.display()
        ),
    }
}

fn db_err(e: rusqlite::Error) -> StoreError {
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

    /// Runs `f` on a read connection, on the blocking pool.
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
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
    async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
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
    async fn on_connection<T, F>(&self, f: F) -> Result<T, StoreError>
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

// ---------------------------------------------------------------------------------------
// Group commit
// ---------------------------------------------------------------------------------------

/// At most this many writes share one transaction, so a long queue cannot hold the
/// database's write lock (which other processes wait for) for long.
const BATCH_MAX: usize = 128;

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
struct Writer {
    /// Absent while a drain holds it (and before the first open, or after a failed connect).
    conn: Option<Connection>,
    queue: VecDeque<Box<dyn Pending>>,
    /// A drain is running (it empties the queue before it stops).
    draining: bool,
}

impl Inner {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        // Only queue pushes and pops and a flag happen under this lock; a panic elsewhere
        // cannot leave it inconsistent.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the write `f`; true if the caller must start a drain (none is running).
    fn enqueue<T, F>(&self, f: F) -> (oneshot::Receiver<Result<T, StoreError>>, bool)
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Inner, Timestamp) -> Result<T, StoreError> + Send + 'static,
    {
        enqueue_on(&mut self.writer(), f)
    }
}

/// [`Inner::enqueue`] with the writer's lock already held.
fn enqueue_on<T, F>(writer: &mut Writer, f: F) -> (oneshot::Receiver<Result<T, StoreError>>, bool)
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

async fn answered<T>(answer: oneshot::Receiver<Result<T, StoreError>>) -> Result<T, StoreError> {
    answer
        .await
        .map_err(|_| StoreError::Backend("the SQLite writer stopped before answering".to_owned()))?
}

/// A queued write, its type erased so one queue holds them all.
trait Pending: Send {
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

struct Op<T, F> {
    f: Option<F>,
    out: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
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

fn savepoint(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(drop)
        .map_err(db_err)
}

fn undo_savepoint(conn: &Connection) -> Result<(), StoreError> {
    savepoint(conn, "ROLLBACK TO idem_op")?;
    savepoint(conn, "RELEASE idem_op")
}

/// Empties the writer's queue, a batch per transaction (see [`Writer`]). Runs on the
/// blocking pool; exactly one drain runs at a time.
///
/// With `hand_off`, runs one batch (which holds the write that started it) and leaves the
/// rest to a drain of its own: the caller running it inline is not held until the queue
/// runs dry, however busy the store is.
fn drain(inner: &Arc<Inner>, hand_off: bool) {
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
fn run_batch(conn: &Connection, inner: &Inner, batch: Vec<Box<dyn Pending>>) {
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
fn run_alone(conn: &Connection, inner: &Inner, batch: Vec<Box<dyn Pending>>) {
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

// ---------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------

fn load(conn: &Connection, key: &IdemKey) -> Result<Option<Record>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records WHERE key = ?1"
        ))
        .map_err(db_err)?;
    let mut rows = stmt.query([key.as_str()]).map_err(db_err)?;
    match rows.next().map_err(db_err)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Loads `key` and applies time to it, writing back what changed (inside a write
/// transaction).
fn load_aged(
    tx: &Connection,
    inner: &Inner,
    key: &IdemKey,
    now: Timestamp,
) -> Result<Option<Record>, StoreError> {
    let Some(mut record) = load(tx, key)? else {
        return Ok(None);
    };
    match rules::age(&mut record, now, &inner.retention) {
        Aged::Unchanged => Ok(Some(record)),
        Aged::Changed => {
            put(tx, &record)?;
            Ok(Some(record))
        }
        Aged::Gone => {
            delete(tx, key)?;
            Ok(None)
        }
    }
}

/// A record's payload, attempts and read-backs as the JSON text their columns hold.
fn encode_outcome(r: &Record) -> Result<(Option<String>, String, String), StoreError> {
    let payload = r
        .payload
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Backend(format!("cannot encode the payload: {e}")))?;
    let attempts = serde_json::to_string(&r.attempts)
        .map_err(|e| StoreError::Backend(format!("cannot encode the attempts: {e}")))?;
    let read_backs = serde_json::to_string(&r.read_backs)
        .map_err(|e| StoreError::Backend(format!("cannot encode the read-backs: {e}")))?;
    Ok((payload, attempts, read_backs))
}

fn put(conn: &Connection, r: &Record) -> Result<(), StoreError> {
    let (payload, attempts, read_backs) = encode_outcome(r)?;
    let operation = r
        .operation
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Backend(format!("cannot encode the operation: {e}")))?;
    let mut stmt = conn
        .prepare_cached(&format!(
            "INSERT INTO idem_records ({COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
             ON CONFLICT (key) DO UPDATE SET
                 state = excluded.state, fingerprint = excluded.fingerprint,
                 tool = excluded.tool, token = excluded.token,
                 lease_until = excluded.lease_until, created_at = excluded.created_at,
                 updated_at = excluded.updated_at, result_expired = excluded.result_expired,
                 payload = excluded.payload, message = excluded.message,
                 downstream_ref = excluded.downstream_ref, attempts = excluded.attempts,
                 operation = excluded.operation, read_backs = excluded.read_backs"
        ))
        .map_err(db_err)?;
    stmt.execute(params![
        r.key.as_str(),
        r.state.as_str(),
        r.fingerprint.to_hex(),
        r.tool,
        r.token.to_hex(),
        r.lease_until.map(sql_time),
        sql_time(r.created_at),
        sql_time(r.updated_at),
        i64::from(r.result_expired),
        payload,
        r.message,
        r.downstream_ref,
        attempts,
        operation,
        read_backs,
    ])
    .map_err(db_err)?;
    Ok(())
}

/// Writes what a settle changes ([`rules::settle`]: the state, lease, outcome, evidence and
/// update time) to `r`'s row, which this transaction read: one `UPDATE` of those columns
/// instead of [`put`]'s upsert of every column.
fn put_settled(conn: &Connection, r: &Record) -> Result<(), StoreError> {
    let (payload, attempts, read_backs) = encode_outcome(r)?;
    let n = conn
        .prepare_cached(
            "UPDATE idem_records SET state = ?2, lease_until = ?3, updated_at = ?4,
                 result_expired = ?5, payload = ?6, message = ?7, downstream_ref = ?8,
                 attempts = ?9, read_backs = ?10
             WHERE key = ?1",
        )
        .and_then(|mut s| {
            s.execute(params![
                r.key.as_str(),
                r.state.as_str(),
                r.lease_until.map(sql_time),
                sql_time(r.updated_at),
                i64::from(r.result_expired),
                payload,
                r.message,
                r.downstream_ref,
                attempts,
                read_backs,
            ])
        })
        .map_err(db_err)?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::Backend(format!(
            "SQLite settle of {} found no row to update",
            r.key.as_str()
        )))
    }
}

fn delete(conn: &Connection, key: &IdemKey) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM idem_records WHERE key = ?1")
        .and_then(|mut s| s.execute([key.as_str()]))
        .map_err(db_err)?;
    Ok(())
}

/// Adds `release` to the trace of `key`, keeps its last [`rules::RELEASES_KEPT`] and drops
/// every release past the tombstone window (inside the release's transaction).
fn put_release(
    conn: &Connection,
    inner: &Inner,
    key: &IdemKey,
    release: &ReleaseRecord,
    now: Timestamp,
) -> Result<(), StoreError> {
    let entry = serde_json::to_string(release)
        .map_err(|e| StoreError::Backend(format!("cannot encode the release: {e}")))?;
    let seq: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM idem_releases WHERE key = ?1")
        .and_then(|mut s| s.query_row([key.as_str()], |r| r.get(0)))
        .map_err(db_err)?;
    conn.prepare_cached(
        "INSERT INTO idem_releases (key, seq, released_at, entry) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![key.as_str(), seq, sql_time(release.at), entry]))
    .map_err(db_err)?;
    let kept = i64::try_from(rules::RELEASES_KEPT).unwrap_or(i64::MAX);
    conn.prepare_cached("DELETE FROM idem_releases WHERE key = ?1 AND seq <= ?2")
        .and_then(|mut s| s.execute(params![key.as_str(), seq - kept]))
        .map_err(db_err)?;
    drop_lapsed_releases(conn, inner, now)?;
    Ok(())
}

/// Deletes every release past the tombstone window; returns how many.
fn drop_lapsed_releases(
    conn: &Connection,
    inner: &Inner,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    conn.prepare_cached("DELETE FROM idem_releases WHERE released_at <= ?1")
        .and_then(|mut s| s.execute([cut]))
        .map_err(db_err)
}

/// The releases of `key` inside the tombstone window, oldest first.
fn load_releases(
    conn: &Connection,
    inner: &Inner,
    key: &IdemKey,
    now: Timestamp,
) -> Result<Vec<ReleaseRecord>, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    let mut stmt = conn
        .prepare_cached(
            "SELECT entry FROM idem_releases WHERE key = ?1 AND released_at > ?2 ORDER BY seq",
        )
        .map_err(db_err)?;
    let mut rows = stmt.query(params![key.as_str(), cut]).map_err(db_err)?;
    let mut out: Vec<ReleaseRecord> = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        let entry: String = row.get(0).map_err(db_err)?;
        out.push(
            serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                key: key.as_str().to_owned(),
                detail: format!("a release trace entry does not decode: {e}"),
            })?,
        );
    }
    rules::keep_releases(&mut out, now, &inner.retention);
    Ok(out)
}

/// A page of every key's releases inside the tombstone window, in `(released_at, key)`
/// order after `after` (a range on `idem_releases_by_time`).
fn list_release_rows(
    conn: &Connection,
    inner: &Inner,
    after: Option<&ListCursor>,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<ReleaseRecord>, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    let (at, key) = match after {
        Some(c) => (sql_time(c.created_at), c.key.as_str().to_owned()),
        None => (i64::MIN, String::new()),
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, entry FROM idem_releases
             WHERE released_at > ?1 AND (released_at, key) > (?2, ?3)
             ORDER BY released_at, key, seq LIMIT ?4",
        )
        .map_err(db_err)?;
    let mut rows = stmt.query(params![cut, at, key, limit]).map_err(db_err)?;
    let mut out: Vec<ReleaseRecord> = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        let key: String = row.get(0).map_err(db_err)?;
        let entry: String = row.get(1).map_err(db_err)?;
        out.push(
            serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                key: key.clone(),
                detail: format!("a release trace entry does not decode: {e}"),
            })?,
        );
    }
    Ok(out)
}

/// Milliseconds as SQLite's signed integer. Times past year 292 million (a `Duration::MAX`
/// lease) are stored as `i64::MAX`: still "never" in practice.
fn sql_time(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Decodes a row selected with [`COLUMNS`]. Anything unexpected is [`StoreError::Corrupt`].
fn decode(row: &Row<'_>) -> Result<Record, StoreError> {
    let raw_key = match row.get_ref(0) {
        Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        Ok(other) => format!("<{:?} key>", other.data_type()),
        Err(e) => format!("<unreadable key: {e}>"),
    };
    decode_fields(row).map_err(|detail| StoreError::Corrupt {
        key: raw_key,
        detail,
    })
}

fn decode_fields(row: &Row<'_>) -> Result<Record, String> {
    let key = IdemKey::parse(text(row, 0, "key")?).map_err(|e| format!("key: {e}"))?;
    let state_name = text(row, 1, "state")?;
    let state = RecordState::parse(state_name)
        .ok_or_else(|| format!("state: unknown state {state_name:?}"))?;
    let fingerprint = Fingerprint::from_hex(text(row, 2, "fingerprint")?)
        .ok_or("fingerprint: not 64 hex digits")?;
    let tool = text(row, 3, "tool")?.to_owned();
    let token = ClaimToken::from_hex(text(row, 4, "token")?).ok_or("token: not 32 hex digits")?;
    let lease_until = opt_int(row, 5, "lease_until")?.map(time).transpose()?;
    let created_at = time(int(row, 6, "created_at")?)?;
    let updated_at = time(int(row, 7, "updated_at")?)?;
    let result_expired = match int(row, 8, "result_expired")? {
        0 => false,
        1 => true,
        n => return Err(format!("result_expired: {n} is not 0 or 1")),
    };
    let payload = opt_text(row, 9, "payload")?
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| format!("payload: not JSON ({e})"))?;
    let message = opt_text(row, 10, "message")?.map(str::to_owned);
    let downstream_ref = opt_text(row, 11, "downstream_ref")?.map(str::to_owned);
    let attempts: Vec<AttemptRecord> =
        serde_json::from_str(text(row, 12, "attempts")?).map_err(|e| format!("attempts: {e}"))?;
    let operation: Option<Operation> = opt_text(row, 13, "operation")?
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| format!("operation: {e}"))?;
    let read_backs: Vec<ReadBackRecord> = serde_json::from_str(text(row, 14, "read_backs")?)
        .map_err(|e| format!("read_backs: {e}"))?;
    if state == RecordState::Running && lease_until.is_none() {
        // It would never expire: the key would be in flight forever.
        return Err("running without a lease".to_owned());
    }
    Ok(Record {
        key,
        fingerprint,
        tool: tool.into(),
        state,
        token,
        lease_until,
        created_at,
        updated_at,
        payload,
        message,
        downstream_ref,
        result_expired,
        attempts,
        operation,
        read_backs,
    })
}

fn value<'r>(row: &'r Row<'_>, i: usize, name: &str) -> Result<ValueRef<'r>, String> {
    row.get_ref(i).map_err(|e| format!("{name}: {e}"))
}

fn text<'r>(row: &'r Row<'_>, i: usize, name: &str) -> Result<&'r str, String> {
    opt_text(row, i, name)?.ok_or_else(|| format!("{name}: NULL"))
}

fn opt_text<'r>(row: &'r Row<'_>, i: usize, name: &str) -> Result<Option<&'r str>, String> {
    match value(row, i, name)? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(Some)
            .map_err(|_| format!("{name}: not UTF-8")),
        other => Err(format!(
            "{name}: {:?} where text belongs",
            other.data_type()
        )),
    }
}

fn int(row: &Row<'_>, i: usize, name: &str) -> Result<i64, String> {
    opt_int(row, i, name)?.ok_or_else(|| format!("{name}: NULL"))
}

fn opt_int(row: &Row<'_>, i: usize, name: &str) -> Result<Option<i64>, String> {
    match value(row, i, name)? {
        ValueRef::Null => Ok(None),
        ValueRef::Integer(n) => Ok(Some(n)),
        other => Err(format!(
            "{name}: {:?} where an integer belongs",
            other.data_type()
        )),
    }
}

fn time(ms: i64) -> Result<Timestamp, String> {
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| format!("negative time {ms}"))
}

/// Applies time to every record that may need it: expired leases, results past retention,
/// lapsed tombstones. The SQL only preselects; [`rules::age`] decides.
fn sweep(tx: &Connection, inner: &Inner, now: Timestamp) -> Result<usize, StoreError> {
    let now_sql = sql_time(now);
    let results_cut = now_sql.saturating_sub(millis(inner.retention.results));
    let tombstones_cut = now_sql.saturating_sub(millis(inner.retention.tombstones));
    let candidates = {
        // One arm per rule, so each is a range on an index (an `OR` of the three would
        // scan the table).
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM idem_records
                     WHERE state = 'running' AND lease_until <= ?1
                 UNION SELECT {COLUMNS} FROM idem_records
                     WHERE state IN ('completed', 'failed') AND result_expired = 0
                         AND updated_at <= ?2
                 UNION SELECT {COLUMNS} FROM idem_records
                     WHERE state IN ('completed', 'failed') AND updated_at <= ?3"
            ))
            .map_err(db_err)?;
        let mut rows = stmt
            .query(params![now_sql, results_cut, tombstones_cut])
            .map_err(db_err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(db_err)? {
            match decode(row) {
                Ok(record) => out.push(record),
                // One bad row must not stop housekeeping for the rest; it is reported as
                // corrupt to whoever reads or lists it.
                Err(e) => tracing::warn!(error = %e, "sweep skipped an undecodable record"),
            }
        }
        out
    };
    let mut changed = 0;
    for mut record in candidates {
        match rules::age(&mut record, now, &inner.retention) {
            Aged::Unchanged => {}
            Aged::Changed => {
                put(tx, &record)?;
                changed += 1;
            }
            Aged::Gone => {
                delete(tx, &record.key)?;
                changed += 1;
            }
        }
    }
    changed += drop_lapsed_releases(tx, inner, now)?;
    Ok(changed)
}

/// True when [`sweep`] would find something to look at.
fn needs_sweep(conn: &Connection, inner: &Inner, now: Timestamp) -> Result<bool, StoreError> {
    let now_sql = sql_time(now);
    let results_cut = now_sql.saturating_sub(millis(inner.retention.results));
    let tombstones_cut = now_sql.saturating_sub(millis(inner.retention.tombstones));
    // One probe per rule, each a range on an index (see `sweep`).
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM idem_records
                 WHERE state = 'running' AND lease_until <= ?1)
             OR EXISTS (SELECT 1 FROM idem_records
                 WHERE state IN ('completed', 'failed') AND result_expired = 0
                     AND updated_at <= ?2)
             OR EXISTS (SELECT 1 FROM idem_records
                 WHERE state IN ('completed', 'failed') AND updated_at <= ?3)",
    )
    .and_then(|mut s| {
        s.query_row(params![now_sql, results_cut, tombstones_cut], |r| {
            r.get::<_, bool>(0)
        })
    })
    .map_err(db_err)
}

/// One page of a listing. The index `idem_records_by_state (state, created_at, key)` serves
/// both forms: the row-value comparison is a range on it, so a page costs `limit` rows,
/// however deep into the state it starts.
fn list_rows(
    conn: &Connection,
    state: RecordState,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt;
    let mut rows = match after {
        None => {
            stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM idem_records WHERE state = ?1
                     ORDER BY created_at, key LIMIT ?2"
                ))
                .map_err(db_err)?;
            stmt.query(params![state.as_str(), limit]).map_err(db_err)?
        }
        Some(c) => {
            stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM idem_records
                     WHERE state = ?1 AND (created_at, key) > (?2, ?3)
                     ORDER BY created_at, key LIMIT ?4"
                ))
                .map_err(db_err)?;
            stmt.query(params![
                state.as_str(),
                sql_time(c.created_at),
                c.key.as_str(),
                limit
            ])
            .map_err(db_err)?
        }
    };
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

/// What a read says of a claim on `req`'s key: `Some` when the key is taken (a repeat, a
/// conflict, a claim in flight) and no time rule would change its record; `None` when the
/// claim needs the write lock (a free key, or a record due to age).
fn seen_claim(
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

type Answer<T> = oneshot::Receiver<Result<T, StoreError>>;

/// Where a claim's first look at its key led.
enum ClaimPath {
    /// Read on the idle writer connection: the key is taken (or the read failed).
    Seen(Result<ClaimOutcome, StoreError>),
    /// Read on the idle writer connection: the key is free, its write queued and drained.
    Queued(Answer<ClaimOutcome>),
    /// The writer was busy: look from a reader instead.
    WriterBusy(ClaimRequest),
}

/// Queues the write of a claim on `req`'s key (decided again under the write lock); true
/// if the caller must start a drain.
fn queue_claim(writer: &mut Writer, req: ClaimRequest) -> (Answer<ClaimOutcome>, bool) {
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
    fn durability(&self) -> crate::store::Durability {
        crate::store::Durability::Durable
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
        let deadline = super::deadline_after(timeout);
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

#[cfg(test)]
mod tests {
    //! The group commit's batch, driven directly: the order in which writes share one
    //! transaction is fixed here, not left to the scheduler.

    use super::*;

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
        let scope = crate::identity::Scope::run("batch-test");
        IdemKey::derive(
            &scope,
            "batch_test",
            crate::identity::KeyMaterial::Intent(name),
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
