//! Copying a store into another one: how a store changes its partition count (or prefix, or
//! server), which is otherwise fixed for its lifetime. See [`RedisStore::copy_into`].

use std::collections::HashMap;

use ::redis::Value;

use idem_runtime::store::{RecordState, StoreError};

use crate::codec::{decode_record, map_err, millis, tag, unexpected};
use crate::partition::Part;
use crate::store::RedisStore;

/// How many index members or release-listing members one command reads.
const PAGE: usize = 512;

/// What [`RedisStore::copy_into`] copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisCopy {
    /// Records copied (one the target held already, unchanged, counts as copied).
    pub records: usize,
    /// Completed or failed records whose tombstone window had passed: not copied, since
    /// either store answers for them as for a key never claimed.
    pub lapsed: usize,
    /// Keys whose release trace was copied.
    pub traces: usize,
    /// The records each partition of the target holds after the copy, in partition order:
    /// how the keys spread over it.
    pub per_partition: Vec<usize>,
}

impl RedisStore {
    /// Copies every record and every kept release trace of this store into `target`,
    /// unchanged (states, tokens, times, evidence, results), so that `target` answers every
    /// repeat as this store would. This is how a store changes what is fixed for its
    /// lifetime — its partition count, its prefix, its server: connect a second store with
    /// the new settings, copy, point the workers at it.
    ///
    /// **Offline.** Stop every worker (and reconciler) that uses this store first, and
    /// start none on `target` until the copy has returned. A copy refuses to start while
    /// this store holds a running claim whose lease has not passed (its worker would settle
    /// it here, not in `target`); a running claim whose lease has passed is copied as
    /// *unknown*, as any reader would see it. It fails, too, if a claim appears during the
    /// copy.
    ///
    /// Idempotent: a key `target` already holds with the same record counts as copied, so
    /// a copy that stopped half-way (a lost connection) is simply run again. A key `target`
    /// holds with another record fails the copy with [`StoreError::Backend`] (copy into an
    /// unused prefix), as does a record of this store that does not decode
    /// ([`StoreError::Corrupt`]): nothing is guessed. `target` measures tombstone windows
    /// with its own [`Retention`](idem_runtime::store::Retention); a completed or failed record whose window
    /// has passed is left out (see [`RedisCopy::lapsed`]). This store is only read: delete
    /// its keys (everything under its prefix) once the workers run on `target`.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idem_runtime::store::StoreError> {
    /// use idem_redis::RedisStore;
    ///
    /// let nodes = ["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"];
    /// // Today's store: one partition (its prefix in a hash tag, so one slot).
    /// let old = RedisStore::cluster(nodes).prefix("{idem}:").connect().await?;
    /// // The same records spread over the cluster's masters, under a new prefix.
    /// let new = RedisStore::cluster(nodes)
    ///     .prefix("idem2:")
    ///     .partitions(12)
    ///     .connect()
    ///     .await?;
    /// let copied = old.copy_into(&new).await?;
    /// println!("{} records, {:?} per partition", copied.records, copied.per_partition);
    /// # Ok(()) }
    /// ```
    pub async fn copy_into(&self, target: &RedisStore) -> Result<RedisCopy, StoreError> {
        let parts = &self.inner.layout.parts;
        // A claim whose lease has passed is *unknown* to every reader: copy it as such.
        for part in parts {
            self.age_leases(part).await?;
        }
        // What every index lists, to see whether anybody writes to the store meanwhile.
        let census = self.census().await?;
        let running: usize = census
            .iter()
            .map(|c| c[state_slot(RecordState::Running)])
            .sum();
        if running > 0 {
            return Err(StoreError::Backend(format!(
                "{running} claim(s) are running in the store at prefix `{}`: stop every worker \
                 that uses it and let their claims settle (or their leases pass) before \
                 copying it; a running claim's worker would settle it there, not in the copy",
                self.inner.prefix
            )));
        }
        let mut copied = RedisCopy::default();
        for part in parts {
            for state in RecordState::ALL {
                if state != RecordState::Running {
                    self.copy_state(part, state, target, &mut copied).await?;
                }
            }
            self.copy_traces(part, target, &mut copied).await?;
        }
        if self.census().await? != census {
            return Err(StoreError::Backend(format!(
                "the store at prefix `{}` changed during the copy (a worker claimed, settled \
                 or released a key): stop every worker and reconciler that uses it, and copy \
                 again (what was copied stays, and copying again keeps it)",
                self.inner.prefix
            )));
        }
        copied.per_partition = target
            .census()
            .await?
            .iter()
            .map(|c| c[..RecordState::ALL.len()].iter().sum())
            .collect();
        Ok(copied)
    }

    /// Copies the records of partition `part` listed in `state`'s index.
    async fn copy_state(
        &self,
        part: &Part,
        state: RecordState,
        target: &RedisStore,
        copied: &mut RedisCopy,
    ) -> Result<(), StoreError> {
        let index = &part.index_keys[state_slot(state)];
        let mut conn = self.inner.conn.clone();
        let mut offset = 0usize;
        loop {
            let keys: Vec<String> = ::redis::cmd("ZRANGE")
                .arg(index)
                .arg(offset)
                .arg(offset + PAGE - 1)
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
            offset += keys.len();
            for key in &keys {
                let fields: Value = ::redis::cmd("HGETALL")
                    .arg(part.record_key(key))
                    .query_async(&mut conn)
                    .await
                    .map_err(map_err)?;
                let Value::Array(items) = &fields else {
                    return Err(unexpected("HGETALL", &fields));
                };
                if items.is_empty() {
                    // An index entry the store drops lazily: its record is gone.
                    continue;
                }
                let record = decode_record(&fields, &part.record_prefix)?;
                if record.state != state {
                    // Listed under a state it has left; copied from its current one.
                    continue;
                }
                let mut args: Vec<&[u8]> = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        Value::BulkString(b) => args.push(b),
                        other => return Err(unexpected("HGETALL", other)),
                    }
                }
                let reply = target.run_on(&record.key, "import", &args).await?;
                match tag(&reply) {
                    Some("ok") => copied.records += 1,
                    Some("lapsed") => copied.lapsed += 1,
                    Some("conflict") => {
                        return Err(StoreError::Backend(format!(
                            "the store at prefix `{}` already holds another record for {}: \
                             copy into a prefix no store uses",
                            target.inner.prefix, record.key
                        )))
                    }
                    Some("invalid") => {
                        return Err(StoreError::Corrupt {
                            key: part.record_key(key),
                            detail: "not a record that can be copied".into(),
                        })
                    }
                    _ => return Err(unexpected("import", &Value::Array(reply))),
                }
            }
            if keys.len() < PAGE {
                return Ok(());
            }
        }
    }

    /// Copies the release traces of partition `part`, with their entries in the listing of
    /// releases.
    async fn copy_traces(
        &self,
        part: &Part,
        target: &RedisStore,
        copied: &mut RedisCopy,
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        // Every member is `time|key`; a key's members, in listing order, keys in the order
        // of their first release.
        let mut members: Vec<(String, Vec<String>)> = Vec::new();
        let mut of: HashMap<String, usize> = HashMap::new();
        let mut from = "-".to_owned();
        loop {
            let page = self.release_listing_page(part, &from, PAGE).await?;
            for m in &page {
                let Some((_, key)) = m.split_once('|') else {
                    continue;
                };
                match of.get(key) {
                    Some(&i) => members[i].1.push(m.clone()),
                    None => {
                        of.insert(key.to_owned(), members.len());
                        members.push((key.to_owned(), vec![m.clone()]));
                    }
                }
            }
            match page.last() {
                Some(last) if page.len() == PAGE => from = format!("({last}"),
                _ => break,
            }
        }
        for (key, of_key) in members {
            let trace_key = part.release_key(&key);
            let (trace, ttl): (Option<String>, i64) = ::redis::pipe()
                .cmd("GET")
                .arg(&trace_key)
                .cmd("PTTL")
                .arg(&trace_key)
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
            let Some(trace) = trace else {
                // The trace lapsed; its members are dropped lazily.
                continue;
            };
            let key =
                idem_runtime::identity::IdemKey::parse(&key).map_err(|e| StoreError::Corrupt {
                    key: trace_key.clone(),
                    detail: e.to_string(),
                })?;
            // No TTL (never written so): keep it a tombstone window in the target.
            let ttl = if ttl > 0 {
                ttl.to_string()
            } else {
                millis(target.inner.retention.tombstones).to_string()
            };
            let mut args: Vec<&[u8]> = vec![trace.as_bytes(), ttl.as_bytes()];
            args.extend(of_key.iter().map(String::as_bytes));
            let reply = target.run_on(&key, "import_trace", &args).await?;
            match tag(&reply) {
                Some("ok") => copied.traces += 1,
                Some("conflict") => {
                    return Err(StoreError::Backend(format!(
                        "the store at prefix `{}` already holds another release trace for \
                         {key}: copy into a prefix no store uses",
                        target.inner.prefix
                    )))
                }
                Some("invalid") => {
                    return Err(StoreError::Corrupt {
                        key: trace_key,
                        detail: "the release trace is not a JSON array".into(),
                    })
                }
                _ => return Err(unexpected("import_trace", &Value::Array(reply))),
            }
        }
        Ok(())
    }

    /// How many keys each index of each partition lists: per partition, the state indexes
    /// (in [`RecordState::ALL`] order), the leases, the expiry index and the releases listing.
    async fn census(&self) -> Result<Vec<[usize; 9]>, StoreError> {
        let mut counts = Vec::with_capacity(self.inner.layout.parts.len());
        for part in &self.inner.layout.parts {
            let mut of_part = [0; 9];
            for (n, index) in of_part
                .iter_mut()
                .zip(part.index_keys.iter().chain([&part.releases_key]))
            {
                *n = self.zcard(index).await?;
            }
            counts.push(of_part);
        }
        Ok(counts)
    }

    /// The size of the sorted set at `key`.
    async fn zcard(&self, key: &str) -> Result<usize, StoreError> {
        ::redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(map_err)
    }
}

/// Where `state`'s index is among a partition's index keys (they are in
/// [`RecordState::ALL`] order).
fn state_slot(state: RecordState) -> usize {
    RecordState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}
