//! Run: the write executor (claim → run → classify → settle) and the read executor.
//!
//! - [`write`]: claim the key, replay or refuse what is already claimed, run the handler
//!   under the claim (retrying keyed downstreams with the same key), settle or release;
//! - [`late`]: a timed-out handler keeps running, and its late result is kept;
//! - [`read`]: no claim, retried freely;
//! - [`classify`]: what a handler's result or a saved record becomes (settlement, outcome);
//! - [`attempt`], [`retry`], [`evidence`]: one attempt under timeout and lease, the retry
//!   policy, and adding evidence to a record that moved on.

mod attempt;
mod classify;
mod evidence;
mod late;
mod read;
mod retry;
mod write;

pub(crate) use late::{restore, Restored};
pub use retry::RetryPolicy;
pub(crate) use write::ClaimedRun;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::call::CallError;
use crate::escalation::{EscalationSink, NoticeGate};
use crate::identity::{IdemKey, KeyMigration};
use crate::outcome::Outcome;
use crate::store::{
    claim_span, settle_span, unobserved, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken,
    Clock, IdemStore, MemoryStore, Settlement, StoreError, Timestamp,
};

/// What the executor needs besides the tool: the store, the clock, and its policies.
#[derive(Clone, Debug)]
pub(crate) struct Executor {
    pub(crate) store: Arc<dyn IdemStore>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retry: RetryPolicy,
    pub(crate) in_flight_wait: Duration,
    /// The registry's in-flight bound for tools that declare none (see
    /// [`crate::tool::ToolSpec::effective_in_flight_bound`]).
    pub(crate) default_in_flight_bound: Option<Duration>,
    pub(crate) sink: Arc<dyn EscalationSink>,
    /// Coalesces "same key, changed parameters" notices per key.
    pub(crate) notices: Arc<NoticeGate>,
    /// Which key format claims go under, and which other format's claims count too.
    pub(crate) key_migration: KeyMigration,
    /// The registry's store, when it is a [`MemoryStore`] (`store` wraps the same one):
    /// its claim and settle never wait, so while nobody observes store operations the
    /// executor calls them directly instead of through a boxed `dyn IdemStore` future.
    pub(crate) memory: Option<MemoryStore>,
}

/// The executor's account of a call, before it becomes a `ToolResult`.
pub(crate) struct Executed {
    pub(crate) key: Option<IdemKey>,
    pub(crate) result: Result<Outcome, CallError>,
    pub(crate) replayed: bool,
    pub(crate) attempts: u32,
}

impl Executed {
    fn refused(key: Option<IdemKey>, e: CallError) -> Self {
        Executed {
            key,
            result: Err(e),
            replayed: false,
            attempts: 0,
        }
    }
}

impl Executor {
    /// The store as a trait object: calling through the `Arc` would pick the blanket
    /// `impl IdemStore for Arc<S>` and box every store future twice.
    fn store(&self) -> &dyn IdemStore {
        &*self.store
    }

    /// [`IdemStore::claim`] on the registry's store, and the reading of the executor's
    /// clock the store took as the claim's time, if it shares that clock (a `MemoryStore`
    /// given no clock of its own): the caller need not read it again.
    async fn claim_key(
        &self,
        req: &ClaimRequest,
    ) -> (Result<ClaimOutcome, StoreError>, Option<Timestamp>) {
        if let Some(memory) = &self.memory {
            if unobserved(&claim_span(memory.backend_name(), req)) {
                let now = memory.reads(&self.clock).then(|| self.clock.now());
                return (memory.claim_now(req, now), now);
            }
        }
        (self.store().claim(req).await, None)
    }

    /// [`IdemStore::settle`] on the registry's store. `now`: a reading of the executor's
    /// clock just taken, which a store on the same clock takes as the settle's time. On
    /// failure, the attempts the settlement carried come back with the error (for the log):
    /// a `MemoryStore` hands them back, and only for another store are they copied first.
    /// `output`: a completed call's output, the settlement's payload: a `MemoryStore` keeps
    /// it as text written from this reference, and only another store gets a copy.
    async fn settle_key(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
        output: Option<&Value>,
        now: Option<Timestamp>,
    ) -> Result<(), (StoreError, Vec<AttemptRecord>)> {
        if let Some(memory) = &self.memory {
            if unobserved(&settle_span(memory.backend_name(), key, &settlement)) {
                let now = now.filter(|_| memory.reads(&self.clock));
                return memory.settle_now(key, token, settlement, output, now);
            }
        }
        let settlement = match output {
            Some(output) => settlement.payload(output.clone()),
            None => settlement,
        };
        let attempts = settlement.attempts.clone();
        self.store()
            .settle(key, token, settlement)
            .await
            .map_err(|e| (e, attempts))
    }
}
