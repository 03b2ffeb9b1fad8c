//! A store wrapper that injects the store's faults: an error before the operation is
//! applied, an error after it was applied (the reply is lost), latency spikes, and for
//! durable stores a close and reopen mid-run (SQLite: the file opened again; Redis and
//! PostgreSQL: new connections). It also freezes with its worker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::{ClaimToken, ListCursor, ReleaseNote, ReleaseRecord};
use idem::{
    store::{Clock, Record, RecordState, StoreError},
    IdemKey, IdemStore,
};

use crate::faults::Fault;
use crate::tools::Worker;
use crate::world::{lock, World};

/// How to open the store again after a simulated close.
#[derive(Clone, Debug)]
pub enum Reopen {
    /// Not a durable store: nothing to reopen.
    Never,
    /// A SQLite file, opened with this clock.
    #[cfg(feature = "sqlite")]
    Sqlite(std::path::PathBuf, Arc<dyn Clock>),
    /// A seed's key space on a Redis or PostgreSQL server, connected to again with this
    /// clock (a reconnect: new connections, the records stay).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    Net(crate::net::Space, Arc<dyn Clock>),
}

impl Reopen {
    /// Opens the store this describes.
    pub async fn open(&self) -> Result<Option<Arc<dyn IdemStore>>, StoreError> {
        match self {
            Reopen::Never => Ok(None),
            #[cfg(feature = "sqlite")]
            Reopen::Sqlite(path, clock) => {
                let store = idem::SqliteStore::builder(path)
                    .clock(Arc::clone(clock))
                    .sync(idem::SqliteSync::Normal)
                    .open()
                    .await?;
                Ok(Some(Arc::new(store)))
            }
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Reopen::Net(space, clock) => space.open(Arc::clone(clock)).map(Some),
        }
    }
}

/// One worker's view of the shared store, with faults.
#[derive(Debug)]
pub struct SimStore {
    world: Arc<World>,
    worker: Arc<Worker>,
    inner: Mutex<Arc<dyn IdemStore>>,
    clock: Arc<dyn Clock>,
    reopen: Reopen,
}

enum Fate {
    Ok,
    ErrorBefore,
    ErrorAfter,
}

fn lost(op: &str) -> StoreError {
    StoreError::Unavailable(format!("simulated: {op} failed"))
}

impl SimStore {
    /// Wraps `inner` for `worker`; `clock` is the worker's (possibly skewed) clock.
    pub fn new(
        world: Arc<World>,
        worker: Arc<Worker>,
        inner: Arc<dyn IdemStore>,
        clock: Arc<dyn Clock>,
        reopen: Reopen,
    ) -> Self {
        SimStore {
            world,
            worker,
            inner: Mutex::new(inner),
            clock,
            reopen,
        }
    }

    fn inner(&self) -> Arc<dyn IdemStore> {
        Arc::clone(&lock(&self.inner))
    }

    async fn enter(&self, key: Option<&IdemKey>) -> Fate {
        let w = &*self.world;
        let fire = |f: Fault| {
            if let Some(k) = key {
                w.fired_on_key(k, f);
            }
        };
        if self.worker.gate().await {
            fire(Fault::WorkerStall);
        }
        if w.roll(Fault::StoreLatency, 0.01) {
            fire(Fault::StoreLatency);
            let d = w
                .rng()
                .millis(Duration::from_millis(500), Duration::from_secs(6));
            tokio::time::sleep(d).await;
        }
        if !matches!(self.reopen, Reopen::Never) && w.roll(Fault::StoreReopen, 0.003) {
            fire(Fault::StoreReopen);
            // Ops already under way finish on the old handle; new ones use the new one.
            if let Ok(Some(fresh)) = self.reopen.open().await {
                *lock(&self.inner) = fresh;
            }
        }
        if w.roll(Fault::StoreErrorBefore, 0.02) {
            fire(Fault::StoreErrorBefore);
            Fate::ErrorBefore
        } else if w.roll(Fault::StoreErrorAfter, 0.02) {
            fire(Fault::StoreErrorAfter);
            Fate::ErrorAfter
        } else {
            Fate::Ok
        }
    }
}

macro_rules! faulty {
    ($self:ident, $key:expr, $op:literal, $call:expr) => {{
        match $self.enter($key).await {
            Fate::ErrorBefore => Err(lost($op)),
            Fate::ErrorAfter => {
                let _applied = $call.await;
                Err(lost(concat!($op, " reply")))
            }
            Fate::Ok => $call.await,
        }
    }};
}

#[async_trait::async_trait]
impl IdemStore for SimStore {
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
        self.inner().durability()
    }

    async fn sweep_expired(&self) -> Result<idem::store::Swept, StoreError> {
        self.inner().sweep_expired().await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if let Some(order) = req
            .operation
            .as_ref()
            .map(|draft| draft.to_operation())
            .and_then(|op| op.args.get("order").and_then(|o| o.as_u64()))
        {
            self.world.own(&req.key, order as usize);
        }
        let inner = self.inner();
        faulty!(self, Some(&req.key), "claim", inner.claim(req))
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let inner = self.inner();
        faulty!(self, Some(key), "renew", inner.renew(key, token, lease))
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        let inner = self.inner();
        faulty!(
            self,
            Some(key),
            "settle",
            inner.settle(key, token, settlement)
        )
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        let inner = self.inner();
        faulty!(self, Some(key), "release", inner.release(key, token))
    }

    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        let inner = self.inner();
        faulty!(
            self,
            Some(key),
            "release_unsettled",
            inner.release_unsettled(key, expected, note)
        )
    }

    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        let inner = self.inner();
        faulty!(self, Some(key), "releases", inner.releases(key))
    }

    async fn list_releases(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        let inner = self.inner();
        faulty!(
            self,
            None,
            "list_releases",
            inner.list_releases(after, limit)
        )
    }

    fn backend_name(&self) -> &'static str {
        self.inner().backend_name()
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let inner = self.inner();
        faulty!(
            self,
            Some(key),
            "reclaim",
            inner.reclaim(key, expected, lease)
        )
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let inner = self.inner();
        faulty!(self, Some(key), "get", inner.get(key))
    }

    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        let inner = self.inner();
        faulty!(self, None, "list", inner.list(state, limit))
    }

    async fn list_after(
        &self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let inner = self.inner();
        faulty!(self, None, "list", inner.list_after(state, after, limit))
    }

    async fn wait_settled(
        &self,
        key: &IdemKey,
        timeout: Duration,
    ) -> Result<Option<Record>, StoreError> {
        if self.worker.gate().await {
            self.world.fired_on_key(key, Fault::WorkerStall);
        }
        self.inner().wait_settled(key, timeout).await
    }
}

/// A worker's clock: the shared one, off by a fixed skew.
#[derive(Debug)]
pub struct SkewedClock {
    base: Arc<dyn Clock>,
    skew_ms: i64,
}

impl SkewedClock {
    /// `base` shifted by `skew_ms` milliseconds (either way).
    pub fn new(base: Arc<dyn Clock>, skew_ms: i64) -> Self {
        SkewedClock { base, skew_ms }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> idem::store::Timestamp {
        let t = self.base.now().0;
        idem::store::Timestamp(t.saturating_add_signed(self.skew_ms))
    }
}
