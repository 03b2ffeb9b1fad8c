//! Retention swept without anyone reading: [`IdemStore::sweep_expired`] over every
//! partition, and the background task that runs it
//! ([`RedisStoreBuilder::sweep_every`]).
//!
//! Every completed or failed record is in its partition's `expiry` index, scored by its next
//! retention step: the end of its result window while the result is kept, of its tombstone
//! window after. A sweep takes the due members a page at a time (one `sweep` call of the
//! script per page, atomic and within the partition's slot, so per shard on a cluster) and
//! applies the contract's rules to each: a result past its window loses its arguments,
//! output, messages and read-backs; a lapsed tombstone is deleted. Unknown, pending and
//! escalated records are never in the index.

use std::time::Duration;

use ::redis::Value;
use idem_runtime::store::backend::{log_field, SweepTask};
use idem_runtime::store::{StoreError, Swept};

#[cfg(doc)]
use idem_runtime::store::IdemStore;

use crate::builder::RedisStoreBuilder;
use crate::codec::{text, unexpected};
use crate::partition::Part;
use crate::store::RedisStore;

/// How many due records one script call ages at most: a sweep after a long pause (a backlog
/// of a day's results) is many short calls, never one that holds Redis for the lot.
pub(crate) const SWEEP_PAGE: usize = 128;

impl RedisStoreBuilder {
    /// How often the store's background task sweeps retention (default
    /// [`DEFAULT_SWEEP_EVERY`](idem_runtime::store::backend::DEFAULT_SWEEP_EVERY), one
    /// minute): every `every`, on tokio's clock, one [`IdemStore::sweep_expired`] asks each
    /// partition for its records whose result or tombstone window has ended (a range of its
    /// `expiry` index, 128 records per script call) and drops their arguments and
    /// output or deletes them, whether or not anyone reads them. What has ended is judged by
    /// the store's [`clock`](Self::clock); the cadence only bounds how long after its
    /// window a result stays in Redis. (A lapsed tombstone also goes by itself: its key's
    /// `PEXPIRE` fires a minute after its window.) The task starts when the store connects
    /// and ends when the last handle on the store is dropped. Every process sweeps on its
    /// own (a second sweep finds nothing due). `Duration::ZERO` turns the task off: then
    /// call [`IdemStore::sweep_expired`] from elsewhere (a cron, a reconciler pass).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
        self
    }
}

impl RedisStore {
    /// Starts the background sweep of [`RedisStoreBuilder::sweep_every`].
    pub(crate) fn start_sweeping(&self, every: Duration) {
        let task = SweepTask::spawn(&self.inner, every, |inner| async move {
            RedisStore { inner }.sweep_all().await
        });
        if let Some(task) = task {
            let _ = self.inner.sweeper.set(task);
        }
    }

    /// [`IdemStore::sweep_expired`]: every partition, one after the other.
    pub(crate) async fn sweep_all(&self) -> Result<Swept, StoreError> {
        let mut swept = Swept::default();
        for part in &self.inner.layout.parts {
            let done = self.sweep_part(part).await?;
            swept.results += done.results;
            swept.tombstones += done.tombstones;
        }
        Ok(swept)
    }

    /// Sweeps partition `part`, a page of [`SWEEP_PAGE`] due records per script call, until a
    /// page comes back short.
    async fn sweep_part(&self, part: &Part) -> Result<Swept, StoreError> {
        let page = SWEEP_PAGE.to_string();
        let mut swept = Swept::default();
        loop {
            let items = self.run(part, None, "sweep", &[page.as_bytes()]).await?;
            let (Some(Value::Int(more)), Some(Value::Int(results)), Some(Value::Int(gone))) =
                (items.first(), items.get(1), items.get(2))
            else {
                return Err(unexpected("sweep", &Value::Array(items)));
            };
            swept.results += u64::try_from(*results).unwrap_or(0);
            swept.tombstones += u64::try_from(*gone).unwrap_or(0);
            if let Some(Value::Array(bad)) = items.get(3) {
                for k in bad.iter().filter_map(text) {
                    tracing::error!(key = %log_field(&k), prefix = %part.prefix,
                        "corrupt idem record left out of the retention sweep; inspect it with HGETALL");
                }
            }
            if *more == 0 {
                return Ok(swept);
            }
        }
    }
}
