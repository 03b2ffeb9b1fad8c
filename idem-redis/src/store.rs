//! [`RedisStore`] and its [`IdemStore`] implementation: every operation one `FCALL` of the
//! store's function library ([`crate::library`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use futures_util::future::try_join_all;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::rules;
use idem_runtime::store::backend::{log_field, ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ListCursor, Record, RecordState, ReleaseNote, ReleaseRecord,
    Retention, StoreError, Timestamp,
};

use crate::builder::RedisStoreBuilder;
use crate::codec::{
    decode_record, map_err, millis, opt_arg, refusal, settle_args, tag, text, to_json, unexpected,
    StoredRelease,
};
use crate::connection::Conn;
use crate::library::{load_library, Calls, LIBRARY};
use crate::partition::{Layout, Part};

pub(crate) const LEASE_PAGE: usize = 128;

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "idem:";

/// An [`IdemStore`] in Redis, for many workers on many machines.
///
/// # One round trip, atomic
///
/// `claim`, `settle`, `renew`, `release`, `release_unsettled`, `release_traced`, `reclaim`
/// and `get` are each a single `FCALL` of one Lua function, which Redis runs atomically (a
/// listing is one more per page and partition, after one per 128 expired leases it first
/// turns *unknown*, so no single call blocks Redis for long): of N workers racing for a key
/// exactly one gets the token, and a settle is fenced by the claim's token inside the same
/// call that writes it.
///
/// The code is a Redis Function library, loaded by `connect` with `FUNCTION LOAD` on the
/// server (on a cluster, on every master), so a call runs only the operation, not the
/// setup of the whole library. Its name is `idem_` and a hash of the code: two idem
/// versions on one server each call their own. When a server has lost it (`FUNCTION
/// FLUSH`, a restart without persistence, a new master), the first call that misses it
/// loads it again and retries, once. On a server without `FUNCTION` (Redis < 7, or a
/// server compatible with an older Redis), or for an ACL user who may not load functions,
/// `connect` logs a warning and the store runs the same code as a script with `EVALSHA`:
/// the same behaviour, at a higher server cost per call ([`RedisStore::function_library`]
/// is then `None`). A function is refused outright while Redis is over `maxmemory` (it may
/// write), where a script failed at its first write.
///
/// Time is read from the store's [`Clock`] on the worker
/// and passed into the script, not taken from Redis `TIME`, so every backend ages records
/// the same way; keep worker clocks in sync (NTP) and leases much longer than their skew.
///
/// # Layout
///
/// With the prefix `p` (default `idem:`) and one partition (the default):
///
/// | key | type | holds |
/// |---|---|---|
/// | `p` `r:` *idem key* | hash | the record; a running claim's lease end is a field in it |
/// | `p` `s:` *state* | sorted set | keys in that state, scored by claim time (for [`IdemStore::list`]; equal scores sort by key, which is exactly [`ListCursor`] order) |
/// | `p` `leases` | sorted set | running keys by lease end (expired leases become *unknown* on listing) |
/// | `p` `expiry` | sorted set | completed/failed keys by their next retention step: the result window's end while the result is kept, the tombstone window's end after (swept by [`IdemStore::sweep_expired`]) |
/// | `p` `rel:` *idem key* | string | the key's release trace (JSON; [`IdemStore::releases`]), expiring a tombstone window after its newest release |
/// | `p` `releases` | sorted set | every kept release as *time*`|`*key*, all scores 0, so in (time, key) order (for [`IdemStore::list_releases`]) |
/// | `p` `partitions` | string | the store's partition count, written by the first store to connect and checked by every later one |
///
/// A running, pending, unknown or escalated record never has a Redis TTL: a TTL that fired
/// on an unsettled claim would free a key whose handler may have committed — the duplicate
/// this library exists to prevent. Lease expiry is decided by the lease end stored *in* the
/// record. Completed and failed records get a `PEXPIRE` of the tombstone window (plus a
/// minute of slack for clock skew). The shorter result window is a timestamp in the value,
/// applied when the record is read and by a sweep without any read: a task the store
/// spawns when it connects runs [`IdemStore::sweep_expired`] every
/// [`RedisStoreBuilder::sweep_every`] (default one minute), which takes each partition's
/// due records from `expiry` and drops the arguments and output of those past the result
/// window (and deletes lapsed tombstones, ahead of their TTL); it ends when the last handle
/// on the store is dropped.
///
/// # Redis Cluster: partitions
///
/// A script touches the record's key and the indexes above, and on Redis Cluster every key
/// one script names must hash to one slot. One partition therefore keeps the whole store in
/// one slot (put the prefix in a hash tag, e.g. `{idem}:`): it works on a cluster but adds no
/// capacity. [`RedisStoreBuilder::partitions`]`(n)` splits the store into `n` partitions,
/// each with every index above under its own prefix `p` `{`*tag*`}:` (e.g.
/// `idem:{1.17}:r:`*key*); a key lives in partition `sha256(key) mod n`, so every per-key
/// operation is still one script on one slot, and the partitions spread over the shards.
/// Partition *i*'s tag is chosen to hash into the *i*-th of `n` equal slot ranges, and
/// `redis-cli --cluster create` gives each of `k` masters one of `k` equal ranges: with `n`
/// a multiple of `k`, every master holds `n / k` partitions. A listing
/// ([`IdemStore::list`], [`IdemStore::list_after`], [`IdemStore::list_releases`]) asks every
/// partition for a page after the cursor and merges them, so it keeps the [`ListCursor`]
/// order and paging guarantees and costs one script call per partition per page.
///
/// The partition count is part of the layout: it is fixed for the store's lifetime (a key
/// would be looked for in another partition than the one holding it). The first store to
/// connect records it at `p` `partitions`, and a store built with another count refuses to
/// connect, as does a partitioned store over a prefix that holds unpartitioned data. To
/// change it, copy the store into a new one ([`RedisStore::copy_into`], or `idem copy`),
/// with the workers stopped.
/// Connect to a cluster with [`RedisStore::cluster`]; a single Redis takes a partitioned
/// store too (the tags then change nothing).
///
/// # Durability: what survives what
///
/// A claim is acknowledged once Redis has applied it **in memory**. Whether it survives a
/// Redis crash or restart depends on Redis persistence, not on this library:
///
/// - `appendonly yes` + `appendfsync always`: every claim is fsynced before the reply. A
///   Redis crash or power loss loses nothing acknowledged. Slowest.
/// - `appendonly yes` + `appendfsync everysec` (Redis's default AOF policy): a Redis
///   *process* crash loses nothing (the OS has the writes); a power loss or kernel crash can
///   lose up to about a second of claims.
/// - RDB snapshots only, or no persistence: a restart loses every claim since the last
///   snapshot. A worker that retries such a call finds the key free and **runs the handler
///   again**: a possible duplicate after a Redis crash. Use a durable configuration when the
///   calls move money.
///
/// Replication is asynchronous: a failover to a replica can lose the last acknowledged
/// claims in the same way, unless the store waits for replicas
/// ([`RedisStoreBuilder::wait_for_replicas`]): a claim the replicas do not confirm is then
/// released and refused before the handler runs, and a settle they do not confirm stands
/// but, after a failover, is the running claim again, which turns unknown at its lease's end
/// and is settled by the reconciler. Set `maxmemory-policy noeviction`: an eviction policy that may
/// drop keys can drop a claim (any `allkeys-*` policy) or a tombstone early (`volatile-*`).
///
/// # Faults
///
/// An unreachable or timed-out Redis is [`StoreError::Unavailable`]; the executor refuses
/// the call *before* running its handler. A reply that never arrives leaves the caller
/// unsure whether the script ran: a claim that did run is then found as this worker's
/// running claim by the next attempt and turns *unknown* when its lease passes — never a
/// second execution. A stored value that is not a record of this layout is
/// [`StoreError::Corrupt`] from every operation on its key and is left out of listings
/// (with an error logged).
///
/// # Example
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::store::StoreError> {
/// use idem_redis::RedisStore;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379/")
///     .prefix("billing:idem:")
///     .connect()
///     .await?;
/// let registry = idem_runtime::registry::Registry::builder().store(store) /* .tool(…) */;
/// # let _ = registry;
///
/// // A Redis Cluster: the store spread over its masters in 12 partitions.
/// let store = RedisStore::cluster(["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"])
///     .partitions(12)
///     .connect()
///     .await?;
/// # let _ = store;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) calls: Calls,
    /// See [`RedisStoreBuilder::read_before_claim`].
    pub(crate) read_before_claim: bool,
    /// See [`RedisStoreBuilder::wait_for_replicas`].
    pub(crate) replicas: Option<crate::builder::ReplicaWait>,
    pub(crate) prefix: String,
    pub(crate) layout: Layout,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    /// The background sweep ([`RedisStoreBuilder::sweep_every`]), stopped when this is
    /// dropped.
    pub(crate) sweeper: std::sync::OnceLock<idem_runtime::store::backend::SweepTask>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("partitions", &self.inner.layout.parts.len())
            .field("cluster", &self.inner.conn.is_cluster())
            .field("retention", &self.inner.retention)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

/// Where a builder connects.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One Redis at this URL.
    Single(String),
    /// A Redis Cluster, reached through these nodes (any of them; the rest are discovered).
    Cluster(Vec<String>),
}

impl Target {
    /// The URLs it names.
    pub(crate) fn urls(&self) -> &[String] {
        match self {
            Target::Single(url) => std::slice::from_ref(url),
            Target::Cluster(nodes) => nodes,
        }
    }
}

impl RedisStore {
    /// The most partitions a store may have ([`RedisStoreBuilder::partitions`]).
    pub const MAX_PARTITIONS: u16 = crate::partition::MAX_PARTITIONS;

    /// Connects to `url` (`redis://[:password@]host:port[/db]`, or `rediss://…` for TLS,
    /// which needs the `tls` feature: the server's certificate is verified against the
    /// system's root certificates; for a private CA or a client certificate, use
    /// [`RedisStore::builder`]) with the default prefix, the system clock and default
    /// retention.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::to(Target::Single(url.into()))
    }

    /// A builder for a store on the Redis Cluster that `nodes` (URLs of some of its nodes;
    /// the others are discovered) belong to. Spread the store over the cluster's shards with
    /// [`RedisStoreBuilder::partitions`]; one partition needs a hash tag in the prefix.
    pub fn cluster<I, S>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisStoreBuilder::to(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// The prefix of every key this store writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// How many partitions the store's keys are spread over.
    pub fn partitions(&self) -> usize {
        self.inner.layout.parts.len()
    }

    /// The name of the Redis Function library this store calls (`idem_` and a hash of its
    /// code), or `None` when it runs its code with `EVALSHA` (a server without `FUNCTION`,
    /// or a user who may not load functions). Libraries of idem versions no worker runs any
    /// more can be deleted with `FUNCTION DELETE` (for operators and tests).
    pub fn function_library(&self) -> Option<&str> {
        (self.inner.calls == Calls::Function).then(|| LIBRARY.name())
    }

    /// The Redis key holding `key`'s record (for operators and tests).
    pub fn record_key(&self, key: &IdemKey) -> String {
        self.inner
            .layout
            .part(key.as_str())
            .record_key(key.as_str())
    }

    /// The Redis key holding the release trace of `key` (for operators and tests).
    pub fn release_key(&self, key: &IdemKey) -> String {
        self.inner
            .layout
            .part(key.as_str())
            .release_key(key.as_str())
    }

    /// The key recording the partition count.
    pub(crate) fn partitions_key(&self) -> String {
        format!("{}partitions", self.inner.prefix)
    }

    /// Records the partition count on first use and refuses a store built with another one
    /// (see "Redis Cluster: partitions" on [`RedisStore`]).
    pub(crate) async fn check_partitions(&self) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.clone();
        let meta = self.partitions_key();
        let n = self.partitions();
        let mut stored: Option<String> = ::redis::cmd("GET")
            .arg(&meta)
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        if stored.is_none() {
            if n > 1 {
                // Data of an unpartitioned store written before the count was recorded.
                let old = Layout::new(&self.inner.prefix, 1)?;
                let part = &old.parts[0];
                for k in part.index_keys.iter().chain([&part.releases_key]) {
                    let exists: bool = ::redis::cmd("EXISTS")
                        .arg(k)
                        .query_async(&mut conn)
                        .await
                        .map_err(map_err)?;
                    if exists {
                        return Err(StoreError::Backend(format!(
                            "the prefix `{}` holds the data of an unpartitioned store (found \
                             `{k}`); a store with {n} partitions would not see it: keep one \
                             partition, or use a new prefix",
                            self.inner.prefix
                        )));
                    }
                }
            }
            let () = ::redis::cmd("SET")
                .arg(&meta)
                .arg(n)
                .arg("NX")
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
            stored = ::redis::cmd("GET")
                .arg(&meta)
                .query_async(&mut conn)
                .await
                .map_err(map_err)?;
        }
        match stored {
            Some(s) if s == n.to_string() => Ok(()),
            Some(s) => Err(StoreError::Backend(format!(
                "the store at prefix `{}` was written with {s} partition(s) (recorded at \
                 `{meta}`), and this one is built with {n}: the partition count is fixed for a \
                 store's lifetime",
                self.inner.prefix
            ))),
            None => Err(StoreError::Backend(format!(
                "the partition count at `{meta}` vanished while connecting"
            ))),
        }
    }

    /// The kept releases of the idem key `key` (its trace at `p` `rel:` *key*), decoded,
    /// lapsed ones dropped.
    pub(crate) async fn trace(&self, key: &str) -> Result<Vec<ReleaseRecord>, StoreError> {
        let part = self.inner.layout.part(key);
        let rk = part.release_key(key);
        let mut conn = self.inner.conn.clone();
        let stored: Option<String> = ::redis::cmd("GET")
            .arg(&rk)
            .query_async(&mut conn)
            .await
            .map_err(map_err)?;
        let Some(stored) = stored else {
            return Ok(Vec::new());
        };
        let corrupt = |detail: String| StoreError::Corrupt {
            key: rk.clone(),
            detail,
        };
        let entries: Vec<StoredRelease> = serde_json::from_str(&stored)
            .map_err(|e| corrupt(format!("the release trace does not decode: {e}")))?;
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let at =
                e.at.parse::<u64>()
                    .map(Timestamp)
                    .map_err(|_| corrupt("a release time is not a time".into()))?;
            let fields = Value::Array(
                e.record
                    .into_iter()
                    .map(|f| Value::BulkString(f.into_bytes()))
                    .collect(),
            );
            out.push(ReleaseRecord {
                at,
                by: e.by,
                note: e.note,
                record: decode_record(&fields, &part.record_prefix)?,
            });
        }
        rules::keep_releases(&mut out, self.inner.clock.now(), &self.inner.retention);
        Ok(out)
    }

    /// A claim the replicas did not confirm (fewer than
    /// [`RedisStoreBuilder::wait_for_replicas`] asks for, in time) is released and refused:
    /// the handler must not run on a claim a failover could forget.
    async fn confirm_claim(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        acks: Option<u32>,
    ) -> Result<(), StoreError> {
        let (Some(wait), Some(acks)) = (self.inner.replicas, acks) else {
            return Ok(());
        };
        if acks >= wait.replicas {
            return Ok(());
        }
        let released = match self.release(key, token).await {
            Ok(()) => "released".to_owned(),
            Err(e) => {
                format!("not released ({e}): it turns unknown at its lease's end, with no attempt")
            }
        };
        Err(StoreError::Unavailable(format!(
            "the claim of {key} was confirmed by {acks} of the {} replicas asked for within              {:?} (WAIT), so a failover could forget it; {released}, nothing was run",
            wait.replicas, wait.timeout
        )))
    }

    /// A settle the replicas did not confirm stands (the effect happened, the caller is
    /// told); it is only logged.
    fn confirm_settle(&self, key: &IdemKey, state: RecordState, acks: Option<u32>) {
        if let (Some(wait), Some(acks)) = (self.inner.replicas, acks) {
            if acks < wait.replicas {
                tracing::warn!(key = %key, state = %state, acks, replicas = wait.replicas,
                    "a settle was confirmed by fewer replicas than asked for in time: after a \
                     failover now the record is the running claim, which turns unknown for \
                     the reconciler");
            }
        }
    }

    /// Runs one operation of the script on `key`'s record.
    pub(crate) async fn run_on(
        &self,
        key: &IdemKey,
        op: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Value>, StoreError> {
        let part = self.inner.layout.part(key.as_str());
        self.run(part, Some(key.as_str()), op, args).await
    }

    /// Runs one operation of the script in partition `part`, on `key`'s record or (`None`)
    /// on none. Every key the script is given is of `part`, so of one slot.
    pub(crate) async fn run(
        &self,
        part: &Part,
        key: Option<&str>,
        op: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Value>, StoreError> {
        Ok(self.run_waiting(part, key, op, args, None).await?.0)
    }

    /// [`RedisStore::run`], followed by a `WAIT` when `wait` is given: also returns how
    /// many replicas confirmed the write in time (see
    /// [`RedisStoreBuilder::wait_for_replicas`]).
    pub(crate) async fn run_waiting(
        &self,
        part: &Part,
        key: Option<&str>,
        op: &str,
        args: &[&[u8]],
        wait: Option<crate::builder::ReplicaWait>,
    ) -> Result<(Vec<Value>, Option<u32>), StoreError> {
        let inner = &*self.inner;
        // An operation on no record names the first index key in the record's place: every
        // key a call names must be in the partition's slot. Only the releases with a trace
        // (`release_unsettled`, `release_traced`) and a copied trace's import read the
        // release trace and the releases listing (KEYS[10] and KEYS[11]); every other
        // operation names nine keys, each of which costs the server a Lua string per call.
        let first = part.index_keys[0].as_str();
        let record = key.map(|k| part.record_key(k));
        let trace = match key {
            Some(k) if matches!(op, "release_unsettled" | "release_traced" | "import_trace") => {
                Some(part.release_key(k))
            }
            _ => None,
        };
        let mut keys: Vec<&str> = Vec::with_capacity(3 + part.index_keys.len());
        keys.push(record.as_deref().unwrap_or(first));
        keys.extend(part.index_keys.iter().map(String::as_str));
        if let Some(trace) = trace.as_deref() {
            keys.push(trace);
            keys.push(part.releases_key.as_str());
        }
        let now = inner.clock.now().as_millis().to_string();
        let results = millis(inner.retention.results).to_string();
        let tombstones = millis(inner.retention.tombstones).to_string();
        let mut argv: Vec<&[u8]> = Vec::with_capacity(5 + args.len());
        argv.extend([
            now.as_bytes(),
            results.as_bytes(),
            tombstones.as_bytes(),
            part.record_prefix.as_bytes(),
            op.as_bytes(),
        ]);
        argv.extend_from_slice(args);
        let mut conn = inner.conn.clone();
        let mut acks = None;
        let reply: Value = match (inner.calls, wait) {
            (Calls::Function, Some(wait)) => {
                let call = LIBRARY.fcall(&keys, &argv);
                let (reply, confirmed) = match conn.query_confirmed(&call, wait).await {
                    Err(e) if crate::library::function_missing(&e) => {
                        load_library(&mut conn).await.map_err(map_err)?;
                        conn.query_confirmed(&call, wait).await.map_err(map_err)?
                    }
                    other => other.map_err(map_err)?,
                };
                acks = Some(confirmed);
                reply
            }
            (Calls::Script, Some(wait)) => {
                let mut call = ::redis::cmd("EVALSHA");
                call.arg(LIBRARY.script().get_hash()).arg(keys.len());
                for k in &keys {
                    call.arg(*k);
                }
                for a in &argv {
                    call.arg(*a);
                }
                let (reply, confirmed) = match conn.query_confirmed(&call, wait).await {
                    Err(e) if e.kind() == ::redis::ErrorKind::NoScriptError => {
                        crate::library::load_script(&mut conn).await?;
                        conn.query_confirmed(&call, wait).await.map_err(map_err)?
                    }
                    other => other.map_err(map_err)?,
                };
                acks = Some(confirmed);
                reply
            }
            (Calls::Function, None) => {
                let call = LIBRARY.fcall(&keys, &argv);
                match call.query_async(&mut conn).await {
                    Err(e) if crate::library::function_missing(&e) => {
                        load_library(&mut conn).await.map_err(map_err)?;
                        call.query_async(&mut conn).await.map_err(map_err)?
                    }
                    other => other.map_err(map_err)?,
                }
            }
            (Calls::Script, None) => {
                let mut inv = LIBRARY.script().prepare_invoke();
                for k in &keys {
                    inv.key(*k);
                }
                for a in &argv {
                    inv.arg(*a);
                }
                inv.invoke_async(&mut conn).await.map_err(map_err)?
            }
        };
        match reply {
            Value::Array(items) => Ok((items, acks)),
            // A success with nothing more to say (`ok`, `claimed`) comes as one string: the
            // server then builds no table for it.
            Value::BulkString(_) | Value::SimpleString(_) => Ok((vec![reply], acks)),
            other => Err(unexpected(op, &other)),
        }
    }

    /// Turns every running record of partition `part` whose lease has passed into
    /// *unknown*, a page of [`LEASE_PAGE`] per script call: a listing after a mass expiry (a
    /// fleet of workers lost at once) costs several short calls, never one that blocks Redis
    /// for the lot.
    pub(crate) async fn age_leases(&self, part: &Part) -> Result<(), StoreError> {
        let page = LEASE_PAGE.to_string();
        let mut skip = 0u64;
        loop {
            let skipped = skip.to_string();
            let items = self
                .run(
                    part,
                    None,
                    "age_leases",
                    &[skipped.as_bytes(), page.as_bytes()],
                )
                .await?;
            let (Some(Value::Int(more)), Some(Value::Int(next))) = (items.first(), items.get(1))
            else {
                return Err(unexpected("age_leases", &Value::Array(items)));
            };
            if *more == 0 {
                return Ok(());
            }
            skip = u64::try_from(*next).unwrap_or(0);
        }
    }

    /// Up to `limit` records of partition `part` in `state` after `after`, in
    /// [`ListCursor`] order (leases already aged).
    pub(crate) async fn list_part(
        &self,
        part: &Part,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = limit.to_string();
        let cursor = after.map(|c| (c.created_at.as_millis().to_string(), c.key.as_str()));
        let mut args = vec![state.as_str().as_bytes(), limit.as_bytes()];
        if let Some((created_at, key)) = &cursor {
            args.extend([created_at.as_bytes(), key.as_bytes()]);
        }
        let items = self.run(part, None, "list", &args).await?;
        let (Some(Value::Array(records)), Some(Value::Array(bad))) = (items.first(), items.get(1))
        else {
            return Err(unexpected("list", &Value::Array(items)));
        };
        for k in bad.iter().filter_map(text) {
            tracing::error!(key = %log_field(&k), prefix = %part.prefix,
                "corrupt idem record left out of a listing; inspect it with HGETALL");
        }
        let mut out = Vec::with_capacity(records.len());
        for fields in records {
            match decode_record(fields, &part.record_prefix) {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::error!(error = %log_field(&e), "corrupt idem record left out of a listing")
                }
            }
        }
        Ok(out)
    }

    /// Up to `limit` kept releases of partition `part` after `after`, in (time, key) order.
    pub(crate) async fn releases_part(
        &self,
        part: &Part,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        const PAGE: usize = 128;
        let member = |at: Timestamp, key: &str| format!("{:020}|{key}", at.as_millis());
        let mut from = match after {
            Some(c) => format!("({}", member(c.created_at, c.key.as_str())),
            None => "-".to_owned(),
        };
        let mut out = Vec::new();
        let mut traces: HashMap<String, Vec<ReleaseRecord>> = HashMap::new();
        while out.len() < limit {
            let members = self.release_listing_page(part, &from, PAGE).await?;
            for m in &members {
                let Some((at, key)) = m.split_once('|') else {
                    continue;
                };
                let Ok(at) = at.parse::<u64>().map(Timestamp) else {
                    continue;
                };
                if !traces.contains_key(key) {
                    let trace = self.trace(key).await?;
                    traces.insert(key.to_owned(), trace);
                }
                // Members whose release was dropped meanwhile (trimmed, lapsed, or the
                // trace expired) find nothing here and are passed over.
                for r in traces[key].iter().filter(|r| r.at == at) {
                    if out.len() < limit {
                        out.push(r.clone());
                    }
                }
            }
            match members.last() {
                Some(last) if members.len() == PAGE => from = format!("({last}"),
                _ => break,
            }
        }
        Ok(out)
    }

    /// What a claim of `req` finds, read with a plain `HGETALL` when its record is completed
    /// or failed and no retention rule changes it now (the claim script's own test for a
    /// replay: `settled_and_current`); `None` when the script must decide (no record, any
    /// other state, one due to age, a value that does not decode — the script reports it).
    pub(crate) async fn settled_by_read(
        &self,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let part = self.inner.layout.part(req.key.as_str());
        let mut conn = self.inner.conn.clone();
        let fields: Value = match ::redis::cmd("HGETALL")
            .arg(part.record_key(req.key.as_str()))
            .query_async(&mut conn)
            .await
        {
            Ok(fields) => fields,
            Err(e) => {
                return match map_err(e) {
                    e @ StoreError::Unavailable(_) => Err(e),
                    // Not a hash, say: the script names what it is.
                    _ => Ok(None),
                };
            }
        };
        if !matches!(&fields, Value::Array(items) if !items.is_empty()) {
            return Ok(None);
        }
        let Ok(record) = decode_record(&fields, &part.record_prefix) else {
            return Ok(None);
        };
        let now = self.inner.clock.now();
        let current = record.key == req.key
            && matches!(record.state, RecordState::Completed | RecordState::Failed)
            && !rules::due(&record, now, &self.inner.retention);
        Ok(current.then(|| rules::judge(Arc::new(record), req)))
    }

    /// Up to `page` members (`time|key`) of partition `part`'s releases listing from
    /// `from` (a `ZRANGEBYLEX` bound: `-`, or `(` and the last member seen).
    pub(crate) async fn release_listing_page(
        &self,
        part: &Part,
        from: &str,
        page: usize,
    ) -> Result<Vec<String>, StoreError> {
        ::redis::cmd("ZRANGEBYLEX")
            .arg(part.releases_key.as_str())
            .arg(from)
            .arg("+")
            .arg("LIMIT")
            .arg(0)
            .arg(page)
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(map_err)
    }

    pub(crate) fn decode(&self, key: &IdemKey, fields: &Value) -> Result<Record, StoreError> {
        let part = self.inner.layout.part(key.as_str());
        decode_record(fields, &part.record_prefix)
    }
}
#[async_trait::async_trait]
impl IdemStore for RedisStore {
    fn backend_name(&self) -> &'static str {
        "redis"
    }
    fn durability(&self) -> idem_runtime::store::Durability {
        idem_runtime::store::Durability::Durable
    }
    async fn sweep_expired(&self) -> Result<idem_runtime::store::Swept, StoreError> {
        self.sweep_all().await
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.inner.read_before_claim {
            if let Some(settled) = self.settled_by_read(req).await? {
                return Ok(settled);
            }
        }
        let token = ClaimToken::fresh();
        let operation = match &req.operation {
            Some(op) => Some(to_json(op, "operation")?),
            None => None,
        };
        let part = self.inner.layout.part(req.key.as_str());
        let (items, acks) = self
            .run_waiting(
                part,
                Some(req.key.as_str()),
                "claim",
                &[
                    req.key.as_str().as_bytes(),
                    req.fingerprint.to_hex().as_bytes(),
                    req.tool.as_bytes(),
                    token.to_hex().as_bytes(),
                    millis(req.lease).to_string().as_bytes(),
                    &opt_arg(operation.as_deref()),
                ],
                self.inner.replicas,
            )
            .await?;
        match (tag(&items), items.get(1)) {
            (Some("claimed"), _) => {
                self.confirm_claim(&req.key, token, acks).await?;
                Ok(ClaimOutcome::Claimed(token))
            }
            (Some("existing"), Some(fields)) => {
                let record = self.decode(&req.key, fields)?;
                Ok(rules::claim_against(Some(&record), req)
                    .unwrap_or(ClaimOutcome::Existing(Arc::new(record))))
            }
            _ => Err(unexpected("claim", &Value::Array(items))),
        }
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let items = self
            .run_on(
                key,
                "renew",
                &[
                    token.to_hex().as_bytes(),
                    millis(lease).to_string().as_bytes(),
                ],
            )
            .await?;
        match tag(&items) {
            Some("ok") => Ok(()),
            _ => Err(refusal(key, "renew", &items)),
        }
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        if settlement.state == RecordState::Running {
            // Still checked by the script; refusing here saves the round trip.
            return Err(StoreError::Backend(
                "a settlement cannot return a record to running".into(),
            ));
        }
        let args = settle_args(token, &settlement)?;
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let part = self.inner.layout.part(key.as_str());
        let (items, acks) = self
            .run_waiting(
                part,
                Some(key.as_str()),
                "settle",
                &argv,
                self.inner.replicas,
            )
            .await?;
        match tag(&items) {
            Some("ok") => {
                self.confirm_settle(key, settlement.state, acks);
                Ok(())
            }
            _ => Err(refusal(key, "settle", &items)),
        }
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        let items = self
            .run_on(key, "release", &[token.to_hex().as_bytes()])
            .await?;
        match tag(&items) {
            Some("ok") => Ok(()),
            _ => Err(refusal(key, "release", &items)),
        }
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let fresh = ClaimToken::fresh();
        let items = self
            .run_on(
                key,
                "reclaim",
                &[
                    expected.to_hex().as_bytes(),
                    fresh.to_hex().as_bytes(),
                    millis(lease).to_string().as_bytes(),
                ],
            )
            .await?;
        match tag(&items) {
            Some("ok") => Ok(fresh),
            Some("absent") => Err(StoreError::NotFound(key.clone())),
            _ => Err(refusal(key, "reclaim", &items)),
        }
    }

    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        let items = self
            .run_on(
                key,
                "release_unsettled",
                &[
                    expected.to_hex().as_bytes(),
                    note.by.as_bytes(),
                    note.note.as_bytes(),
                    rules::RELEASES_KEPT.to_string().as_bytes(),
                ],
            )
            .await?;
        match tag(&items) {
            Some("ok") => Ok(()),
            Some("absent") => Err(StoreError::NotFound(key.clone())),
            _ => Err(refusal(key, "release_unsettled", &items)),
        }
    }

    async fn release_traced(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        rules::releasable_settlement(key, &settlement)?;
        let kept = rules::RELEASES_KEPT.to_string();
        let settled = settle_args(token, &settlement)?;
        let mut argv: Vec<&[u8]> = settled.iter().map(Vec::as_slice).collect();
        argv.extend([note.by.as_bytes(), note.note.as_bytes(), kept.as_bytes()]);
        let items = self.run_on(key, "release_traced", &argv).await?;
        match tag(&items) {
            Some("ok") => Ok(()),
            _ => Err(refusal(key, "release_traced", &items)),
        }
    }

    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        self.trace(key.as_str()).await
    }

    async fn list_releases(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let parts = &self.inner.layout.parts;
        let pages = try_join_all(parts.iter().map(|p| self.releases_part(p, after, limit))).await?;
        // Each partition's page is in (time, key) order; the first `limit` of their merge are
        // the first `limit` after the cursor overall.
        let mut out: Vec<ReleaseRecord> = pages.into_iter().flatten().collect();
        if parts.len() > 1 {
            out.sort_by(ListCursor::cmp_releases);
        }
        out.truncate(limit);
        Ok(out)
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let items = self.run_on(key, "get", &[]).await?;
        match (tag(&items), items.get(1)) {
            (Some("absent"), _) => Ok(None),
            (Some("record"), Some(fields)) => self.decode(key, fields).map(Some),
            _ => Err(unexpected("get", &Value::Array(items))),
        }
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
        if limit == 0 {
            return Ok(Vec::new());
        }
        let parts = &self.inner.layout.parts;
        try_join_all(parts.iter().map(|p| self.age_leases(p))).await?;
        let pages =
            try_join_all(parts.iter().map(|p| self.list_part(p, state, after, limit))).await?;
        // Each partition's page is in ListCursor order; the first `limit` of their merge are
        // the first `limit` after the cursor overall, so paging by the last one's cursor
        // visits every record once, as with one partition.
        let mut out: Vec<Record> = pages.into_iter().flatten().collect();
        if parts.len() > 1 {
            out.sort_by(ListCursor::cmp_records);
        }
        out.truncate(limit);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_runtime::identity::{Fingerprint, KeyMaterial, Scope};
    use idem_runtime::store::ManualClock;

    /// A Redis from `IDEM_REDIS_URL`, or `None` after saying why (a failure under
    /// `IDEM_REQUIRE_BACKENDS=1`).
    fn url() -> Option<String> {
        let url = std::env::var("IDEM_REDIS_URL")
            .ok()
            .filter(|s| !s.trim().is_empty());
        if url.is_none() {
            assert!(
                std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() != Ok("1"),
                "IDEM_REQUIRE_BACKENDS=1, but IDEM_REDIS_URL is not set"
            );
            eprintln!("skipping: IDEM_REDIS_URL is not set (start a Redis to run this test)");
        }
        url
    }

    /// A prefix of its own for the script-path suite, deleted with its keys when dropped.
    struct ScriptPrefix {
        url: String,
        prefix: String,
    }

    impl Drop for ScriptPrefix {
        fn drop(&mut self) {
            let Ok(client) = ::redis::Client::open(self.url.as_str()) else {
                return;
            };
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = ::redis::cmd("KEYS")
                .arg(format!("{}*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = ::redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }

    /// Stores that run their code with `EVALSHA`, as on a Redis without `FUNCTION`.
    struct ScriptPath;

    impl idem_runtime::store::conformance::StoreFactory for ScriptPath {
        type Store = RedisStore;
        type Location = ScriptPrefix;

        fn durable(&self) -> bool {
            true
        }

        fn unavailable(&self) -> Option<String> {
            url()
                .is_none()
                .then(|| "IDEM_REDIS_URL is not set".to_owned())
        }

        async fn location(&self) -> Result<ScriptPrefix, StoreError> {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let url = url().ok_or_else(|| StoreError::Unavailable("no IDEM_REDIS_URL".into()))?;
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            Ok(ScriptPrefix {
                url,
                prefix: format!("idem-test:script-{}-{nanos}-{n}:", std::process::id()),
            })
        }

        async fn open(
            &self,
            at: &ScriptPrefix,
            options: &idem_runtime::store::conformance::StoreOptions,
        ) -> Result<RedisStore, StoreError> {
            let mut builder = RedisStore::builder(at.url.as_str())
                .prefix(at.prefix.as_str())
                .clock(options.clock())
                .retention(options.retention);
            builder.force_script = true;
            let store = builder.connect().await?;
            assert_eq!(store.inner.calls, Calls::Script);
            Ok(store)
        }

        async fn corrupt(&self, at: &ScriptPrefix, key: &IdemKey) -> Result<bool, StoreError> {
            let client = ::redis::Client::open(at.url.as_str())
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            ::redis::pipe()
                .del(format!("{}r:{}", at.prefix, key.as_str()))
                .set(
                    format!("{}r:{}", at.prefix, key.as_str()),
                    b"\xff not a record".as_slice(),
                )
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            Ok(true)
        }
    }

    /// The `EVALSHA` path (a Redis without `FUNCTION`) keeps the whole store contract: the
    /// conformance suite, run against it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_script_path_passes_the_conformance_suite() {
        if url().is_none() {
            return;
        }
        idem_runtime::store::conformance::run_all(&ScriptPath).await;
    }

    async fn count(store: &RedisStore, index: usize) -> i64 {
        let mut conn = store.inner.conn.clone();
        ::redis::cmd("ZCARD")
            .arg(&store.inner.layout.parts[0].index_keys[index])
            .query_async(&mut conn)
            .await
            .expect("ZCARD")
    }

    /// After a mass lease expiry, one script call ages at most one page of leases (Redis
    /// runs a script to its end before serving anyone else), and a listing still sees every
    /// expired claim as unknown, paging through the script as many times as it takes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_leases_are_aged_a_page_per_call() {
        let Some(url) = url() else { return };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let prefix = format!("idem-test:pages-{}-{nanos}:", std::process::id());
        let clock = ManualClock::starting_now();
        let store = RedisStore::builder(url.as_str())
            .prefix(prefix.as_str())
            .clock(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect");
        let claims = 2 * LEASE_PAGE + 17;
        for i in 0..claims {
            let req = ClaimRequest {
                key: IdemKey::derive(
                    &Scope::run("pages"),
                    "t",
                    KeyMaterial::Intent(&i.to_string()),
                ),
                fingerprint: Fingerprint::of_canonical(b"{}"),
                tool: "t".into(),
                lease: Duration::from_secs(10),
                operation: None,
            };
            assert!(matches!(
                store.claim(&req).await,
                Ok(ClaimOutcome::Claimed(_))
            ));
        }
        clock.advance(Duration::from_secs(11));
        // index_keys: 0 running, 4 unknown (RecordState::ALL order, minus nothing).
        let (running, unknown) = (0, 4);
        let items = store
            .run(
                &store.inner.layout.parts[0],
                None,
                "age_leases",
                &[b"0", b"128"],
            )
            .await
            .expect("age_leases");
        assert_eq!(
            items.first(),
            Some(&Value::Int(1)),
            "a full page: more to do"
        );
        assert_eq!(count(&store, unknown).await, LEASE_PAGE as i64);
        assert_eq!(
            count(&store, running).await,
            (claims - LEASE_PAGE) as i64,
            "one call aged one page, no more"
        );

        let listed = store
            .list(RecordState::Unknown, usize::MAX)
            .await
            .expect("list");
        assert_eq!(
            listed.len(),
            claims,
            "the listing paged through every expired lease"
        );
        assert_eq!(count(&store, running).await, 0);

        let mut conn = store.inner.conn.clone();
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        let _: () = ::redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .expect("DEL");
    }
}
