//! The background task a durable store runs to enforce retention
//! ([`IdemStore::sweep_expired`](crate::store::IdemStore::sweep_expired) on a cadence).

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::store::{StoreError, Swept};

/// How often a store's background task sweeps when its builder is not told otherwise
/// (one minute): far shorter than any sensible retention window, so a result outlives its
/// window by at most about this much, and cheap, since a sweep with nothing due is one
/// indexed probe per partition or table.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// A store's sweep task: runs a sweep every `every` (tokio's clock) for as long as the store
/// lives, and stops when the store is dropped.
///
/// The task holds the store only weakly, between sweeps: dropping the last handle on the
/// store drops its state, and with it this guard, which aborts the task. What a sweep
/// removes is decided by the store's [`Clock`](crate::store::Clock) and retention, not by
/// the cadence: the cadence only says how soon after its window ends a result is gone.
#[derive(Debug)]
pub struct SweepTask {
    abort: tokio::task::AbortHandle,
}

impl SweepTask {
    /// Spawns the task for the store state `target`, calling `sweep` every `every`, the
    /// first time `every` from now. `None` when `every` is zero (the task is off: the host
    /// sweeps itself) or when called outside a tokio runtime (a store opened on a plain
    /// thread; it then sweeps only when asked). A failed sweep is logged and retried at the
    /// next tick.
    pub fn spawn<T, F, Fut>(target: &Arc<T>, every: Duration, sweep: F) -> Option<SweepTask>
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Swept, StoreError>> + Send,
    {
        if every.is_zero() {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let weak: Weak<T> = Arc::downgrade(target);
        let task = runtime.spawn(async move {
            let start = crate::store::deadline_after(every);
            let mut ticks = tokio::time::interval_at(start, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(target) = weak.upgrade() else {
                    return;
                };
                match sweep(target).await {
                    Ok(swept) if swept != Swept::default() => tracing::debug!(
                        results = swept.results,
                        tombstones = swept.tombstones,
                        "retention sweep"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "retention sweep failed; retried at the next tick"),
                }
            }
        });
        Some(SweepTask {
            abort: task.abort_handle(),
        })
    }
}

impl Drop for SweepTask {
    fn drop(&mut self) {
        self.abort.abort();
    }
}
