//! Networked stores (Redis, PostgreSQL) in the simulation's virtual time.
//!
//! The simulation runs on tokio's paused clock, which jumps to the next timer whenever the
//! runtime has nothing to do: a runtime waiting on a socket would see every round trip to a
//! server as a jump to the next lease expiry or timeout. So every operation on a networked
//! store runs on a separate, real-time runtime (the *bridge*), and the simulation's thread
//! waits for it, blocked. To the simulation a store operation then takes no virtual time
//! (latency spikes are still injected by [`crate::store::SimStore`], in virtual time), and
//! the paused runtime never sees an idle socket to jump over.
//!
//! The store reads the time from a [`StepClock`] set to the calling worker's (virtual,
//! possibly skewed) clock right before each operation, so leases and retention move with
//! the simulation exactly as over MemoryStore and SQLite. Operations run one at a time per
//! seed, in the order the single-threaded scheduler reaches them, so a seed replays.
//!
//! Every seed gets its own key space (a Redis key prefix, a PostgreSQL schema), named after
//! the process, the run and the seed, and removed when the seed ends: seeds running at once
//! (`--jobs`, tests in parallel) never see each other's records.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::{ClaimToken, ListCursor, ReleaseNote, ReleaseRecord};
use idem::{
    store::{Clock, Record, RecordState, StoreError, Timestamp},
    IdemKey, IdemStore,
};

/// Which networked store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `RedisStore`; the server from `IDEM_REDIS_URL`.
    #[cfg(feature = "redis")]
    Redis,
    /// `PostgresStore`; the server from `IDEM_POSTGRES_URL`.
    #[cfg(feature = "postgres")]
    Postgres,
}

impl Backend {
    /// The environment variable naming the server.
    pub fn url_var(self) -> &'static str {
        match self {
            #[cfg(feature = "redis")]
            Backend::Redis => "IDEM_REDIS_URL",
            #[cfg(feature = "postgres")]
            Backend::Postgres => "IDEM_POSTGRES_URL",
        }
    }
}

/// One seed's key space on one server.
#[derive(Clone, Debug)]
pub struct Space {
    /// The store.
    pub backend: Backend,
    /// The server.
    pub url: String,
    /// The Redis key prefix or the PostgreSQL schema.
    pub name: String,
}

impl Space {
    /// A fresh key space for `seed` on the server named by the backend's variable.
    pub fn fresh(backend: Backend, seed: u64) -> Result<Space, String> {
        let var = backend.url_var();
        let url = std::env::var(var).map_err(|_| {
            format!(
                "{var} is not set: the simulation over this store needs a server \
                 (`source .ci/services.sh && idem_services_start` starts one)"
            )
        })?;
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = match backend {
            #[cfg(feature = "redis")]
            Backend::Redis => format!("idem-sim:{pid}:{run}:{seed}:"),
            #[cfg(feature = "postgres")]
            Backend::Postgres => format!("idem_sim_{pid}_{run}_{seed}"),
        };
        Ok(Space { backend, url, name })
    }

    /// Opens one worker's connection to the space; `clock` is the worker's.
    pub fn open(&self, clock: Arc<dyn Clock>) -> Result<Arc<dyn IdemStore>, StoreError> {
        let now = Arc::new(StepClock::default());
        now.set(clock.now());
        let store_clock: Arc<dyn Clock> = now.clone();
        let (url, name) = (self.url.clone(), self.name.clone());
        let inner: Arc<dyn IdemStore> = match self.backend {
            #[cfg(feature = "redis")]
            Backend::Redis => run(async move {
                let s = idem::RedisStore::builder(url)
                    .prefix(name)
                    .clock(store_clock)
                    .connect()
                    .await?;
                Ok(Arc::new(s) as Arc<dyn IdemStore>)
            })?,
            #[cfg(feature = "postgres")]
            Backend::Postgres => run(async move {
                // Operations run one at a time: two connections are plenty.
                let s = idem::PostgresStore::builder(url)
                    .schema(name)
                    .clock(store_clock)
                    .max_connections(2)
                    .connect()
                    .await?;
                Ok(Arc::new(s) as Arc<dyn IdemStore>)
            })?,
        };
        Ok(Arc::new(Bridged { inner, now, clock }))
    }

    /// Removes every record of the space (Redis: the prefix's keys; PostgreSQL: the
    /// schema).
    pub fn remove(&self) -> Result<(), String> {
        let (url, name) = (self.url.clone(), self.name.clone());
        match self.backend {
            #[cfg(feature = "redis")]
            Backend::Redis => run(async move {
                let err = |e: redis::RedisError| StoreError::Backend(e.to_string());
                let client = redis::Client::open(url.as_str()).map_err(err)?;
                let mut con = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(err)?;
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{name}*"))
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut con)
                        .await
                        .map_err(err)?;
                    if !keys.is_empty() {
                        redis::cmd("DEL")
                            .arg(&keys)
                            .query_async::<()>(&mut con)
                            .await
                            .map_err(err)?;
                    }
                    if next == 0 {
                        return Ok(());
                    }
                    cursor = next;
                }
            }),
            #[cfg(feature = "postgres")]
            Backend::Postgres => run(async move {
                let err = |e: tokio_postgres::Error| StoreError::Backend(e.to_string());
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(err)?;
                let driver = tokio::spawn(connection);
                let dropped = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                    .await
                    .map_err(err);
                drop(client);
                let _ = driver.await;
                dropped
            }),
        }
        .map_err(|e| format!("could not remove {}: {e}", self.name))
    }
}

/// The real-time runtime networked stores run on, shared by every seed of the process.
fn bridge() -> Result<&'static tokio::runtime::Runtime, StoreError> {
    static BRIDGE: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    BRIDGE
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("idem-sim-bridge")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| StoreError::Backend(format!("no bridge runtime: {e}")))
}

/// Runs `fut` on the bridge and blocks the calling thread until it ends. Called on the
/// simulation's runtime, it holds that runtime (and its paused clock) still meanwhile.
fn run<T, F>(fut: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    bridge()?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| StoreError::Backend("the store operation panicked".into()))?
}

/// A clock that reads what it was last set to: the virtual time of the worker whose
/// operation runs now.
#[derive(Debug, Default)]
pub struct StepClock(AtomicU64);

impl StepClock {
    /// Sets the time read until the next call.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for StepClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// A networked store seen from the simulation: each operation sets the store's clock to
/// the worker's, then runs on the bridge while the simulation waits. `wait_settled` is the
/// trait's default (reads, with pauses in virtual time).
#[derive(Debug)]
struct Bridged {
    inner: Arc<dyn IdemStore>,
    now: Arc<StepClock>,
    clock: Arc<dyn Clock>,
}

impl Bridged {
    fn op<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<dyn IdemStore>) -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        self.now.set(self.clock.now());
        run(f(Arc::clone(&self.inner)))
    }
}

#[async_trait::async_trait]
impl IdemStore for Bridged {
    // A traced release settles and then releases, in two steps.
    async fn release_traced(
        &self,
        key: &idem::IdemKey,
        token: idem::store::ClaimToken,
        settlement: idem::store::backend::Settlement,
        note: &idem::store::ReleaseNote,
    ) -> Result<(), idem::store::StoreError> {
        idem::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    // What the wrapped store says: a wrapper must not hide that a store outlives the process
    // or that it sweeps.
    fn durability(&self) -> idem::store::Durability {
        self.inner.durability()
    }

    async fn sweep_expired(&self) -> Result<idem::store::Swept, StoreError> {
        self.op(|s| async move { s.sweep_expired().await })
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let req = req.clone();
        self.op(|s| async move { s.claim(&req).await })
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.renew(&key, token, lease).await })
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.settle(&key, token, settlement).await })
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.release(&key, token).await })
    }

    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        let (key, note) = (key.clone(), note.clone());
        self.op(|s| async move { s.release_unsettled(&key, expected, &note).await })
    }

    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.releases(&key).await })
    }

    async fn list_releases(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        let after = after.cloned();
        self.op(|s| async move { s.list_releases(after.as_ref(), limit).await })
    }

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.reclaim(&key, expected, lease).await })
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let key = key.clone();
        self.op(|s| async move { s.get(&key).await })
    }

    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.op(|s| async move { s.list(state, limit).await })
    }

    async fn list_after(
        &self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let after = after.cloned();
        self.op(|s| async move { s.list_after(state, after.as_ref(), limit).await })
    }
}
