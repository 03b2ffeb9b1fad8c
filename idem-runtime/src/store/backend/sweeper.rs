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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    /// A store's state as the backends hold it: the task's guard inside.
    struct State {
        sweeper: OnceLock<SweepTask>,
    }

    /// The task sweeps on its cadence while the store lives, and once the last handle is
    /// dropped it ends: its sweep function (and the channel end it holds) is dropped, so
    /// the receiver sees the channel close instead of waiting for another sweep.
    #[tokio::test(start_paused = true)]
    async fn sweeps_on_its_cadence_and_stops_with_the_store() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let state = Arc::new(State {
            sweeper: OnceLock::new(),
        });
        let task = SweepTask::spawn(
            &state,
            Duration::from_secs(60),
            move |_state: Arc<State>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(());
                    Ok(Swept::default())
                }
            },
        )
        .expect("inside a runtime, with a cadence, the task starts");
        let _ = state.sweeper.set(task);
        for _ in 0..3 {
            assert_eq!(
                rx.recv().await,
                Some(()),
                "a sweep per tick while the store lives"
            );
        }
        drop(state);
        // A sweep already sent may be queued; after it the channel closes.
        for _ in 0..2 {
            if rx.recv().await.is_none() {
                return;
            }
        }
        panic!("the task kept sweeping after the store was dropped");
    }

    #[tokio::test]
    async fn a_zero_cadence_starts_no_task() {
        let state = Arc::new(());
        let task = SweepTask::spawn(&state, Duration::ZERO, |_| async { Ok(Swept::default()) });
        assert!(task.is_none());
    }

    #[test]
    fn outside_a_runtime_no_task_starts() {
        let state = Arc::new(());
        let task = SweepTask::spawn(&state, Duration::from_secs(1), |_| async {
            Ok(Swept::default())
        });
        assert!(task.is_none());
    }
}
