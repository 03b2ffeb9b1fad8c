//! Opening a store: [`SqliteStoreBuilder`], the durability mode ([`SqliteSync`]), and the
//! database file, created owner-only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::schema::migrate;
use crate::store::{Inner, Pool, SqliteStore};
use crate::writer::Writer;
#[cfg(doc)]
use idem_runtime::store::IdemStore;
use idem_runtime::store::{Clock, Retention, StoreError};
use tokio::sync::Notify;

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
    pub(crate) fn pragma(self) -> &'static str {
        match self {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        }
    }
}
/// Options for opening a [`SqliteStore`]. See [`SqliteStore::builder`].
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    pub(crate) path: PathBuf,
    pub(crate) sync: SqliteSync,
    pub(crate) busy_timeout: Duration,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    pub(crate) readers: usize,
    pub(crate) sweep_every: Duration,
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
    /// [`ManualClock`](idem_runtime::store::ManualClock) in tests). Processes sharing a file should agree on the time.
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

    /// How often the store's background task sweeps retention (default
    /// [`DEFAULT_SWEEP_EVERY`](idem_runtime::store::backend::DEFAULT_SWEEP_EVERY), one minute): every `every`, on tokio's clock, one
    /// [`IdemStore::sweep_expired`] turns the results past their window into tombstones
    /// (deleting their arguments and output from the file) and deletes lapsed tombstones,
    /// whether or not anyone reads them. What is past its window is judged by the store's
    /// [`clock`](Self::clock); the cadence only bounds how long after its window a result
    /// stays on disk. The task starts when the store is opened inside a tokio runtime
    /// ([`open_blocking`](Self::open_blocking) on a plain thread starts none) and ends when
    /// the last handle on the store is dropped. Each process sweeps on its own; a sweep
    /// takes the write lock for as long as it has records to age. `Duration::ZERO` turns the
    /// task off: then sweep from elsewhere ([`SqliteStore::sweep`], a cron).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }

    /// Opens (creating if needed) the database, on tokio's blocking pool.
    pub async fn open(self) -> Result<SqliteStore, StoreError> {
        // The blocking pool is inside the runtime: `open_blocking` starts the sweep there.
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
            sweeper: OnceLock::new(),
        };
        create_private(&inner.path)?;
        let mut conn = inner.connect()?;
        migrate(&mut conn, &inner.path)?;
        inner.writer().conn = Some(conn);
        let store = SqliteStore {
            inner: Arc::new(inner),
        };
        store.start_sweeping(self.sweep_every);
        Ok(store)
    }
}

/// Creates the database file, if it does not exist yet, readable and writable by its owner
/// alone (0600, whatever the process umask), and refuses a path whose last component is a
/// symbolic link. SQLite creates the `-wal` and `-shm` files with the database file's
/// permissions, so they are owner-only too. An existing file keeps the permissions it has.
///
/// Paths SQLite gives a meaning of its own (`:memory:`, the empty path, `file:` URIs) are
/// left to SQLite.
pub(crate) fn create_private(path: &Path) -> Result<(), StoreError> {
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
