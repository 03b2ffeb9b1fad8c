//! The in-flight bound a tool declares is a promise the reconciler relies on: a handler that
//! timed out is dropped `bound` after its timeout, so once `timeout + 2 × bound` has passed
//! since the last send a read-back that finds nothing proves the effect will never land.
//! Found by `idem-sim` (seed 143 of `--store memory --faults all`): the promise must hold when
//! the store is slow, too. Paused tokio time; the test asserts on the downstream's ledger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{ClaimToken, ListCursor, Record, StoreError, Timestamp, TokioClock};
use idem_runtime::{
    call::ToolCall,
    identity::IdemKey,
    registry::{Registry, RetryPolicy},
    store::{Clock, IdemStore, MemoryStore},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(4);

/// A `MemoryStore` whose reads take `slow` seconds once armed (a latency spike).
#[derive(Debug)]
struct SlowReads {
    inner: MemoryStore,
    armed: AtomicBool,
}

#[async_trait::async_trait]
impl IdemStore for SlowReads {
    // A test double that keeps no release traces: a release takes the record over and frees
    // it, a traced release settles and then releases, and no trace is listed.
    async fn release_unsettled(
        &self,
        key: &idem_runtime::identity::IdemKey,
        expected: idem_runtime::store::ClaimToken,
        _note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        let token = self
            .reclaim(key, expected, std::time::Duration::from_secs(60))
            .await?;
        self.release(key, token).await
    }

    async fn release_traced(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
        settlement: idem_runtime::store::backend::Settlement,
        note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        idem_runtime::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    async fn releases(
        &self,
        _key: &idem_runtime::identity::IdemKey,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    async fn list_releases(
        &self,
        _after: Option<&idem_runtime::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.inner.claim(req).await
    }
    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        s: Settlement,
    ) -> Result<(), StoreError> {
        self.inner.settle(key, token, s).await
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        self.inner.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        self.inner.reclaim(key, expected, lease).await
    }
    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        if self.armed.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        self.inner.get(key).await
    }
    async fn list(
        &self,
        state: idem_runtime::store::RecordState,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list(state, limit).await
    }
    async fn list_after(
        &self,
        state: idem_runtime::store::RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_after(state, after, limit).await
    }
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    cents: u64,
}

/// A handler whose request reaches the downstream 8 s after it starts (past its timeout and
/// its bound): it must have been dropped by then, so nothing is committed.
struct SlowCharge {
    ledger: Arc<Mutex<Vec<Duration>>>,
    started: tokio::time::Instant,
}

impl WriteTool for SlowCharge {
    type Args = Args;
    type Output = serde_json::Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
            .description("Charge.")
            .timeout(TIMEOUT)
            .lease(Duration::from_secs(3))
            .in_flight_bound(BOUND)
    }
    async fn call(&self, _ctx: WriteCtx, _args: Args) -> Result<serde_json::Value, ToolError> {
        tokio::time::sleep(Duration::from_secs(8)).await;
        self.ledger.lock().unwrap().push(self.started.elapsed());
        Ok(json!({ "ok": true }))
    }
}

/// A slow store read after the timeout (here 6 s) must not push back the moment the handler
/// is dropped: the watcher that keeps a timed-out handler reads the record first and only
/// then starts the bound's timer, with the handler unpolled meanwhile, so the handler runs on
/// to `timeout + read + bound` and commits at 8 s, after the reconciler may already have
/// proved "never happened" (at `timeout + 2 × bound` = 10 s after the send, a request could
/// still land at up to 12 s).
#[tokio::test(start_paused = true)]
async fn a_slow_store_does_not_stretch_the_in_flight_bound() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    let store = Arc::new(SlowReads {
        inner: MemoryStore::with_clock(clock.clone()),
        armed: AtomicBool::new(true),
    });
    let ledger = Arc::new(Mutex::new(Vec::new()));
    let registry = Registry::builder()
        .shared_store(store.clone())
        .clock(clock)
        .retry_policy(RetryPolicy::never())
        .tool(SlowCharge {
            ledger: ledger.clone(),
            started: tokio::time::Instant::now(),
        })
        .build()
        .unwrap();
    let result = registry
        .call(ToolCall::new("run", "charge", json!({ "cents": 1 })))
        .await;
    assert!(!result.is_completed());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let landed = ledger.lock().unwrap().clone();
    assert!(
        landed.iter().all(|at| *at <= TIMEOUT + BOUND),
        "a request reached the downstream at {landed:?}, past timeout + bound = {:?}",
        TIMEOUT + BOUND
    );
}
