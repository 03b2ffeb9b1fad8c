//! [`PostgresStore`] and its [`IdemStore`] implementation: every transition one statement
//! or one locked read-modify-write, decided by [`rules`].

use std::sync::Arc;
use std::time::Duration;

use crate::builder::{PostgresStoreBuilder, Source};
use crate::codec::{count, decode, decode_some, ms, pg_err, pg_text, pool_err, to_json};
use crate::schema::Sql;
use deadpool_postgres::{Object, Pool};
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::rules::{self, Aged};
use idem_runtime::store::backend::{
    log_field, ClaimOutcome, ClaimRequest, Settlement, SweepTask, DEFAULT_SWEEP_EVERY,
};
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ListCursor, Record, RecordState, ReleaseNote, ReleaseRecord,
    Retention, StoreError, Swept, SystemClock, Timestamp,
};
use tokio_postgres::Transaction;

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "idem";

/// How many expired leases a listing ages per query.
pub(crate) const EXPIRED_PAGE: usize = 1000;

/// An [`IdemStore`] in PostgreSQL, for many workers on many machines.
///
/// # Table
///
/// One table, `<schema>.idem_records` (default schema `idem`), keyed by the idem key, with
/// one secondary index, on `(state, created_at, key)`: it serves the listings, the
/// expired-lease scan (running rows are the calls in flight) and retention (a record's
/// `created_at` is never after its `updated_at`), so a claim and a settle each write two
/// index entries. Release traces are in `<schema>.idem_releases`.
/// [`PostgresStoreBuilder::connect`] creates the schema and applies its migrations itself,
/// under an advisory lock so that many workers starting at once do not race, and records
/// the layout version in `<schema>.idem_schema_version` (3 now); a database migrated by a
/// newer version of this library is refused rather than misread. Layout 3 dropped two
/// indexes of layout 2 (`idem_records_leases`, `idem_records_retention`); that step needs a
/// brief exclusive lock on the table, waits for it at most the builder's lock timeout, and
/// is otherwise left for a later start (this version runs on layout 2 too). Payloads and
/// attempt evidence are stored as JSON text, byte for byte what was settled
/// (`payload::jsonb` makes them queryable).
///
/// # Operations
///
/// - `claim` is one statement: `INSERT … ON CONFLICT (key) DO NOTHING` that also returns the
///   row it conflicted with. Of N concurrent claimers exactly one inserts.
/// - The statements of the common paths (claim, the fast settle, renew and release, a read
///   by key) are prepared once per pooled connection and cached with it. Behind a pooler in
///   transaction mode that needs PgBouncer 1.21 or later with `max_prepared_statements` set.
/// - `settle` of a claim this handle inserted, its row untouched since, is one autocommit
///   `UPDATE` fenced by the token and the row version the claim wrote (`xmin`): the row is
///   then the claim's own insert, so nothing in it needs checking. Otherwise `settle` and
///   `renew` are one token-fenced `UPDATE` in the common case (a live claim settled by its
///   holder), kept only when the row it returns decodes; anything else (an expired lease, a
///   late result, a repeated settle) reads the row `FOR UPDATE` in a transaction and
///   applies [`rules`], the same functions every backend uses.
/// - Time (leases, retention) comes from the store's [`Clock`], not the database's `now()`,
///   so all backends age records alike; keep worker clocks in sync.
/// - Completed and failed records are aged when read, and by a sweep of the whole table
///   ([`IdemStore::sweep_expired`], [`PostgresStore::purge_expired`]): results past their
///   window lose their arguments and output (the columns are set to `NULL`), lapsed
///   tombstones are deleted. The store sweeps by itself: a task it spawns when it connects
///   runs a sweep every [`PostgresStoreBuilder::sweep_every`] (default one minute), so
///   retention holds for keys nobody reads again; the task ends when the last handle on the
///   store is dropped. Unknown, pending and escalated rows are never touched.
///
/// # Durability
///
/// A claim is committed before the handler runs, so it survives a crash of the worker and a
/// restart of PostgreSQL (with the default `synchronous_commit = on` and `fsync = on`;
/// `synchronous_commit = off` can lose the last few hundred milliseconds of commits on a
/// server crash, and a lost claim can mean a duplicate). Replication follows your
/// PostgreSQL setup: with asynchronous replicas a failover can lose acknowledged claims.
///
/// # Transactional handlers
///
/// When the effect of a tool is a write to this same database, use
/// `PostgresStore::run_in_transaction`: the effect and the *completed* record commit
/// together, so no crash can separate them.
///
/// # Faults
///
/// An unreachable database is [`StoreError::Unavailable`] (the executor then refuses the
/// call before its handler runs). A row that does not decode — an unknown state, a
/// malformed token or fingerprint, JSON that does not parse — is [`StoreError::Corrupt`]
/// from every operation on its key, and left out of listings with an error logged.
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) schema: String,
    pub(crate) sql: Sql,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    pub(crate) lock_timeout: Duration,
    pub(crate) fences: Fences,
    /// The background sweep ([`PostgresStoreBuilder::sweep_every`]), stopped when this is
    /// dropped.
    pub(crate) sweeper: std::sync::OnceLock<SweepTask>,
}

/// The row version (`xmin`) each claim this handle inserted was written as, by claim token,
/// until its settle. A settle whose row still has that version settles in one autocommit
/// statement (`settle_fenced`): the row is then exactly the claim's insert, which decoded
/// before it was written, so there is nothing to check it for. Anything that rewrote the
/// row since (a renew, a transactional mark, a takeover, an edit by hand) gave it a new
/// version, and the settle takes the checked path. Claims settled by another handle or
/// process, or never settled, are dropped from here when it holds [`FENCES_KEPT`].
#[derive(Default)]
pub(crate) struct Fences(std::sync::Mutex<std::collections::HashMap<ClaimToken, String>>);

/// At most this many fences are kept; past it they are all forgotten (a forgotten fence
/// costs its settle the checked path, nothing else).
pub(crate) const FENCES_KEPT: usize = 65_536;

impl Fences {
    pub(crate) fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<ClaimToken, String>> {
        // Only inserts and removals happen under this lock: a panic cannot leave it torn.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn keep(&self, token: ClaimToken, version: String) {
        let mut map = self.map();
        if map.len() >= FENCES_KEPT {
            map.clear();
        }
        map.insert(token, version);
    }

    pub(crate) fn take(&self, token: ClaimToken) -> Option<String> {
        self.map().remove(&token)
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.inner.schema)
            .field("retention", &self.inner.retention)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

/// What a locked read-modify-write does to the row.
pub(crate) enum Write {
    Keep,
    Put(Box<Record>, bool),
    Delete,
    /// Delete the row and add the release to the key's trace.
    Release(Box<ReleaseRecord>),
}

/// What a successful transition leaves behind.
pub(crate) enum Then {
    /// The changed record (and whether it is held by a transactional handler).
    Put { tx_effect: bool },
    /// Nothing: the key is free.
    Delete,
    /// Nothing, and this release in the key's trace.
    Release(Box<ReleaseRecord>),
}

/// The result of a locked operation.
pub(crate) enum Locked<T> {
    Done(T),
    /// The row is locked by a transactional handler that is still running; its unlocked
    /// view.
    Busy(Box<Record>),
}

/// How a locked operation treats a row someone else holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// Wait (bounded by the lock timeout): the caller must write.
    Wait,
    /// Report a row held by a running transactional handler instead of waiting for it.
    Skip,
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/db`) with the default schema,
    /// the system clock and default retention, applying migrations.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(url).connect().await
    }

    /// A builder for a store at `url`.
    pub fn builder(url: impl Into<String>) -> PostgresStoreBuilder {
        PostgresStore::builder_from(Source::Url(url.into()))
    }

    /// A builder for a store on an existing pool (e.g. one configured with TLS, or the pool
    /// your handlers already use).
    pub fn with_pool(pool: Pool) -> PostgresStoreBuilder {
        PostgresStore::builder_from(Source::Pool(pool))
    }

    pub(crate) fn builder_from(source: Source) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            source,
            schema: DEFAULT_SCHEMA.to_owned(),
            clock: Arc::new(SystemClock),
            retention: Retention::default(),
            max_connections: 16,
            lock_timeout: Duration::from_secs(2),
            sweep_every: DEFAULT_SWEEP_EVERY,
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "tls")]
            tls_files: idem_runtime::store::backend::tls::TlsOptions::default(),
        }
    }

    /// The schema holding the store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The connection pool (the same one `PostgresStore::run_in_transaction` uses).
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    pub(crate) async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    /// Applies lease expiry and retention to `record` (`rules::age`), plus one rule of this
    /// backend: the running claim of a transactional handler whose lease has passed is
    /// *freed*, not made unknown — its effect could only commit together with the record,
    /// and the record is not completed, so nothing happened. Callers hold the row lock.
    pub(crate) fn age(&self, record: &mut Record, tx_effect: bool, now: Timestamp) -> Aged {
        if record.state == RecordState::Running
            && tx_effect
            && record.lease_until.is_some_and(|until| until <= now)
        {
            return Aged::Gone;
        }
        rules::age(record, now, &self.inner.retention)
    }

    /// Reads `key`'s row `FOR UPDATE` in a transaction, lets `f` decide, writes and commits.
    /// Locks `key`, applies time, then `rule`: on success writes what `rule` says; on
    /// failure keeps only what aging changed. The shape of every fenced transition.
    /// Runs one of the single-row fast statements (`renew_fast`, `settle_fast`,
    /// `release_fast`) and keeps its write only when the row it returns decodes. In
    /// autocommit the write would land before the decode: a settle would mark a corrupt
    /// row completed and a release would delete it, freeing its key. So the statement runs
    /// in a transaction that is rolled back, leaving the row exactly as it was, when the row
    /// is `Corrupt`. `Ok(false)`: no row matched, nothing was written (the caller takes the
    /// locked path).
    pub(crate) async fn fast(
        &self,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let statement = tx.prepare_cached(statement).await.map_err(pg_err)?;
        let found = match tx.query_opt(&statement, params).await {
            Ok(found) => found,
            // A data exception (SQLSTATE class 22): the row's JSON columns do not parse, so
            // the statement's evidence-cap check failed on them. Nothing was written; the
            // locked path decodes the row and reports it `Corrupt`.
            Err(e) if e.code().is_some_and(|c| c.code().starts_with("22")) => {
                tx.rollback().await.map_err(pg_err)?;
                return Ok(false);
            }
            Err(e) => return Err(pg_err(e)),
        };
        let Some(row) = found else {
            tx.rollback().await.map_err(pg_err)?;
            return Ok(false);
        };
        if let Err(e) = decode_some(&row) {
            tx.rollback().await.map_err(pg_err)?;
            return Err(e);
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(true)
    }

    pub(crate) async fn transition<T>(
        &self,
        key: &IdemKey,
        busy: Busy,
        now: Timestamp,
        absent: impl Fn() -> StoreError,
        rule: impl FnOnce(&mut Record, bool) -> Result<(Then, T), StoreError>,
    ) -> Result<Locked<T>, StoreError> {
        self.locked(key, busy, |current| {
            let Some((mut record, tx_effect)) = current else {
                return (Write::Keep, Err(absent()));
            };
            let changed = match self.age(&mut record, tx_effect, now) {
                Aged::Gone => return (Write::Delete, Err(absent())),
                Aged::Changed => true,
                Aged::Unchanged => false,
            };
            match rule(&mut record, tx_effect) {
                Ok((Then::Put { tx_effect }, out)) => {
                    (Write::Put(Box::new(record), tx_effect), Ok(out))
                }
                Ok((Then::Delete, out)) => (Write::Delete, Ok(out)),
                Ok((Then::Release(release), out)) => (Write::Release(release), Ok(out)),
                Err(e) if changed => (Write::Put(Box::new(record), tx_effect), Err(e)),
                Err(e) => (Write::Keep, Err(e)),
            }
        })
        .await
    }

    pub(crate) async fn locked<T>(
        &self,
        key: &IdemKey,
        busy: Busy,
        f: impl FnOnce(Option<(Record, bool)>) -> (Write, Result<T, StoreError>),
    ) -> Result<Locked<T>, StoreError> {
        let sql = &self.inner.sql;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {}",
            self.inner.lock_timeout.as_millis().max(1)
        ))
        .await
        .map_err(pg_err)?;
        let k = key.as_str();
        let row = match busy {
            Busy::Wait => tx.query_opt(&sql.select_for_update, &[&k]).await,
            Busy::Skip => match tx.query_opt(&sql.select_skip_locked, &[&k]).await {
                Ok(Some(row)) => Ok(Some(row)),
                Ok(None) => match tx.query_opt(&sql.select, &[&k]).await.map_err(pg_err)? {
                    None => Ok(None),
                    Some(row) => {
                        let (record, tx_effect) = decode_some(&row)?;
                        if tx_effect && record.state == RecordState::Running {
                            return Ok(Locked::Busy(Box::new(record)));
                        }
                        // Another store operation holds it for a moment: wait for it.
                        tx.query_opt(&sql.select_for_update, &[&k]).await
                    }
                },
                Err(e) => Err(e),
            },
        }
        .map_err(pg_err)?;
        let current = match &row {
            Some(row) => Some(decode_some(row)?),
            None => None,
        };
        let (write, out) = f(current);
        match write {
            Write::Keep => {}
            Write::Delete => {
                tx.execute(&sql.delete, &[&k]).await.map_err(pg_err)?;
            }
            Write::Put(record, tx_effect) => {
                put(&tx, sql, &record, tx_effect).await?;
            }
            Write::Release(release) => {
                tx.execute(&sql.delete, &[&k]).await.map_err(pg_err)?;
                self.put_release(&tx, key, &release).await?;
            }
        }
        tx.commit().await.map_err(pg_err)?;
        out.map(Locked::Done)
    }

    /// Adds `release` to the trace of `key` inside `tx`, keeps the last
    /// [`rules::RELEASES_KEPT`], and drops every release past the tombstone window.
    pub(crate) async fn put_release(
        &self,
        tx: &Transaction<'_>,
        key: &IdemKey,
        release: &ReleaseRecord,
    ) -> Result<(), StoreError> {
        let sql = &self.inner.sql;
        let entry = to_json(release, "release")?;
        let k = key.as_str();
        let seq: i64 = tx
            .query_one(&sql.insert_release, &[&k, &ms(release.at), &entry])
            .await
            .map_err(pg_err)?
            .get(0);
        let kept = i64::try_from(rules::RELEASES_KEPT).unwrap_or(i64::MAX);
        tx.execute(&sql.trim_releases, &[&k, &(seq - kept)])
            .await
            .map_err(pg_err)?;
        tx.execute(&sql.drop_releases, &[&self.release_cut(release.at)])
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    /// Releases at or before this time (ms) are past the tombstone window as of `now`.
    pub(crate) fn release_cut(&self, now: Timestamp) -> i64 {
        let window = ms(Timestamp(0).plus(self.inner.retention.normalized().tombstones));
        ms(now).saturating_sub(window)
    }

    /// Applies retention to every completed and failed record at once: drops results past
    /// the result window and tombstones past theirs. Records are also aged whenever they
    /// are read, and the store's background task calls this every
    /// [`PostgresStoreBuilder::sweep_every`], so keys that are never seen again do not stay
    /// forever. Release traces past the tombstone window go too. Returns (results
    /// dropped, tombstones and release traces deleted).
    pub async fn purge_expired(&self) -> Result<(u64, u64), StoreError> {
        let now = self.inner.clock.now();
        let r = &self.inner.retention;
        let client = self.client().await?;
        let cutoff = |d: Duration| ms(now).saturating_sub(ms(Timestamp(0).plus(d)));
        let tombstones = client
            .execute(&self.inner.sql.drop_tombstones, &[&cutoff(r.tombstones)])
            .await
            .map_err(pg_err)?;
        let results = client
            .execute(&self.inner.sql.expire_results, &[&cutoff(r.results)])
            .await
            .map_err(pg_err)?;
        // Release traces lapse with the tombstone window too (counted as tombstones).
        let releases = client
            .execute(&self.inner.sql.drop_releases, &[&self.release_cut(now)])
            .await
            .map_err(pg_err)?;
        Ok((results, tombstones + releases))
    }

    /// Starts the background sweep of [`PostgresStoreBuilder::sweep_every`].
    pub(crate) fn start_sweeping(&self, every: Duration) {
        let task = SweepTask::spawn(&self.inner, every, |inner| async move {
            PostgresStore { inner }.sweep_expired().await
        });
        if let Some(task) = task {
            let _ = self.inner.sweeper.set(task);
        }
    }
}

pub(crate) async fn put(
    tx: &Transaction<'_>,
    sql: &Sql,
    r: &Record,
    tx_effect: bool,
) -> Result<(), StoreError> {
    let payload = match &r.payload {
        Some(p) => Some(to_json(p, "payload")?),
        None => None,
    };
    let attempts = to_json(&r.attempts, "attempts")?;
    let operation = match &r.operation {
        Some(op) => Some(to_json(op, "operation")?),
        None => None,
    };
    let read_backs = to_json(&r.read_backs, "read-backs")?;
    // Only a running claim can be transactional; a takeover or a settlement ends that.
    let tx_effect = tx_effect && r.state == RecordState::Running;
    tx.execute(
        &sql.upsert,
        &[
            &r.key.as_str(),
            &r.fingerprint.to_hex(),
            &pg_text(&r.tool),
            &r.state.as_str(),
            &r.token.to_hex(),
            &r.lease_until.map(ms),
            &ms(r.created_at),
            &ms(r.updated_at),
            &payload,
            &r.message.as_deref().map(pg_text),
            &r.downstream_ref.as_deref().map(pg_text),
            &r.result_expired,
            &attempts,
            &tx_effect,
            &operation,
            &read_backs,
        ],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

#[async_trait::async_trait]
impl IdemStore for PostgresStore {
    fn backend_name(&self) -> &'static str {
        "postgres"
    }
    fn durability(&self) -> idem_runtime::store::Durability {
        idem_runtime::store::Durability::Durable
    }
    async fn sweep_expired(&self) -> Result<Swept, StoreError> {
        let (results, tombstones) = self.purge_expired().await?;
        Ok(Swept::new(results, tombstones))
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let sql = &self.inner.sql;
        let k = req.key.as_str();
        let operation = match &req.operation {
            Some(op) => Some(to_json(op, "operation")?),
            None => None,
        };
        // A claim that races a concurrent insert, delete or free sees nothing in its
        // snapshot; it simply tries again.
        for _ in 0..16 {
            let now = self.inner.clock.now();
            let token = ClaimToken::fresh();
            let row = {
                let client = self.client().await?;
                // Prepared once per connection: parsing and planning the statement on every
                // claim would cost the server more than running it.
                let claim = client.prepare_cached(&sql.claim).await.map_err(pg_err)?;
                client
                    .query_one(
                        &claim,
                        &[
                            &k,
                            &req.fingerprint.to_hex(),
                            &pg_text(&req.tool),
                            &token.to_hex(),
                            &ms(now.plus(req.lease)),
                            &ms(now),
                            &operation,
                        ],
                    )
                    .await
                    .map_err(pg_err)?
            };
            let inserted: Option<String> = row.try_get(0).map_err(pg_err)?;
            if let Some(version) = inserted {
                self.inner.fences.keep(token, version);
                return Ok(ClaimOutcome::Claimed(token));
            }
            let Some((record, tx_effect)) = decode(&row, 1)? else {
                continue;
            };
            let probe = record.state == RecordState::Running && tx_effect;
            if !probe && self.age(&mut record.clone(), tx_effect, now) == Aged::Unchanged {
                return Ok(rules::claim_against(Some(&record), req)
                    .unwrap_or(ClaimOutcome::Existing(Arc::new(record))));
            }
            // Something to write (expiry), or a transactional claim to probe: if we can lock
            // its row, the handler's transaction is gone without committing, and since its
            // effect could only commit with the record, nothing happened: the key is free.
            let outcome = self
                .locked(&req.key, Busy::Skip, |current| {
                    let fresh = || rules::new_claim(req, token, now);
                    let Some((mut record, tx_effect)) = current else {
                        return (
                            Write::Put(Box::new(fresh()), false),
                            Ok(ClaimOutcome::Claimed(token)),
                        );
                    };
                    if record.state == RecordState::Running && tx_effect {
                        return (
                            Write::Put(Box::new(fresh()), false),
                            Ok(ClaimOutcome::Claimed(token)),
                        );
                    }
                    let write = match self.age(&mut record, tx_effect, now) {
                        Aged::Gone => {
                            return (
                                Write::Put(Box::new(fresh()), false),
                                Ok(ClaimOutcome::Claimed(token)),
                            )
                        }
                        Aged::Changed => Write::Put(Box::new(record.clone()), tx_effect),
                        Aged::Unchanged => Write::Keep,
                    };
                    let outcome = rules::claim_against(Some(&record), req)
                        .unwrap_or(ClaimOutcome::Existing(Arc::new(record)));
                    (write, Ok(outcome))
                })
                .await?;
            return Ok(match outcome {
                Locked::Done(outcome) => outcome,
                // Its transaction is open: the handler is running.
                Locked::Busy(record) => rules::claim_against(Some(&record), req)
                    .unwrap_or(ClaimOutcome::Existing(Arc::new(*record))),
            });
        }
        Err(StoreError::Backend(format!(
            "claiming {} kept racing concurrent changes",
            req.key
        )))
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let (k, t) = (key.as_str(), token.to_hex());
        if self
            .fast(
                &self.inner.sql.renew_fast,
                &[&k, &t, &ms(now.plus(lease)), &ms(now)],
            )
            .await?
        {
            return Ok(());
        }
        let outcome = self
            .transition(
                key,
                Busy::Skip,
                now,
                || rules::stale_absent(key),
                |record, tx_effect| {
                    rules::renew(record, token, lease, now).map(|()| (Then::Put { tx_effect }, ()))
                },
            )
            .await?;
        match outcome {
            Locked::Done(()) => Ok(()),
            // The handler's open transaction holds the record: a stronger lease than any.
            Locked::Busy(record) if record.token == token => Ok(()),
            Locked::Busy(record) => Err(StoreError::StaleToken {
                key: key.clone(),
                state: record.state.as_str().to_owned(),
            }),
        }
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        if settlement.state == RecordState::Running {
            return Err(StoreError::Backend(
                "a settlement cannot return a record to running".into(),
            ));
        }
        let now = self.inner.clock.now();
        let (k, t) = (key.as_str(), token.to_hex());
        let payload = match &settlement.payload {
            Some(p) => Some(to_json(p, "payload")?),
            None => None,
        };
        let attempts = to_json(&settlement.attempts, "attempts")?;
        let read_backs = to_json(&settlement.read_backs, "read-backs")?;
        let fence = self.inner.fences.take(token);
        let (message, downstream_ref) = (
            settlement.message.as_deref().map(pg_text),
            settlement.downstream_ref.as_deref().map(pg_text),
        );
        let (counted_attempts, counted_read_backs) = (
            count(settlement.attempts.len()),
            count(settlement.read_backs.len()),
        );
        // `settle_fast`'s parameters, then the fence's row version for `settle_fenced`.
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [
            &k,
            &t,
            &settlement.state.as_str(),
            &payload,
            &message,
            &downstream_ref,
            &attempts,
            &ms(now),
            &read_backs,
            &counted_attempts,
            &counted_read_backs,
            &fence,
        ];
        if fence.is_some() {
            let settled = {
                let client = self.client().await?;
                let statement = client
                    .prepare_cached(&self.inner.sql.settle_fenced)
                    .await
                    .map_err(pg_err)?;
                client.execute(&statement, &params).await.map_err(pg_err)?
            };
            if settled == 1 {
                return Ok(());
            }
        }
        if self
            .fast(&self.inner.sql.settle_fast, &params[..11])
            .await?
        {
            return Ok(());
        }
        let outcome = self
            .transition(
                key,
                Busy::Wait,
                now,
                || rules::stale_absent(key),
                |record, tx_effect| {
                    rules::settle(record, token, settlement, now)
                        .map(|()| (Then::Put { tx_effect }, ()))
                },
            )
            .await?;
        match outcome {
            Locked::Done(()) => Ok(()),
            Locked::Busy(_) => unreachable_busy(),
        }
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        self.inner.fences.take(token);
        let now = self.inner.clock.now();
        let (k, t) = (key.as_str(), token.to_hex());
        if self
            .fast(&self.inner.sql.release_fast, &[&k, &t, &ms(now)])
            .await?
        {
            return Ok(());
        }
        let outcome = self
            .transition(
                key,
                Busy::Wait,
                now,
                || rules::stale_absent(key),
                |record, _| rules::release(record, token).map(|()| (Then::Delete, ())),
            )
            .await?;
        match outcome {
            Locked::Done(()) => Ok(()),
            Locked::Busy(_) => unreachable_busy(),
        }
    }

    async fn release_unsettled(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        note: &ReleaseNote,
    ) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let outcome = self
            .transition(
                key,
                Busy::Wait,
                now,
                || StoreError::NotFound(key.clone()),
                |record, _| {
                    rules::release_unsettled(record, expected, note, now)
                        .map(|release| (Then::Release(Box::new(release)), ()))
                },
            )
            .await?;
        match outcome {
            Locked::Done(()) => Ok(()),
            Locked::Busy(_) => unreachable_busy(),
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
        self.inner.fences.take(token);
        let now = self.inner.clock.now();
        let outcome = self
            .transition(
                key,
                Busy::Wait,
                now,
                || rules::stale_absent(key),
                |record, _| {
                    rules::release_traced(record, token, settlement, note, now)
                        .map(|release| (Then::Release(Box::new(release)), ()))
                },
            )
            .await?;
        match outcome {
            Locked::Done(()) => Ok(()),
            Locked::Busy(_) => unreachable_busy(),
        }
    }

    async fn releases(&self, key: &IdemKey) -> Result<Vec<ReleaseRecord>, StoreError> {
        let now = self.inner.clock.now();
        let client = self.client().await?;
        let rows = client
            .query(
                &self.inner.sql.select_releases,
                &[&key.as_str(), &self.release_cut(now)],
            )
            .await
            .map_err(pg_err)?;
        let mut out: Vec<ReleaseRecord> = Vec::with_capacity(rows.len());
        for row in rows {
            let entry: String = row.get(0);
            out.push(
                serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                    key: key.as_str().to_owned(),
                    detail: format!("a release trace entry does not decode: {e}"),
                })?,
            );
        }
        rules::keep_releases(&mut out, now, &self.inner.retention);
        Ok(out)
    }

    async fn list_releases(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<ReleaseRecord>, StoreError> {
        let now = self.inner.clock.now();
        let (at, key) = match after {
            Some(c) => (ms(c.created_at), c.key.as_str()),
            None => (i64::MIN, ""),
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let rows = client
            .query(
                &self.inner.sql.list_releases,
                &[&self.release_cut(now), &at, &key, &limit],
            )
            .await
            .map_err(pg_err)?;
        let mut out: Vec<ReleaseRecord> = Vec::with_capacity(rows.len());
        for row in rows {
            let (key, entry): (String, String) = (row.get(0), row.get(1));
            out.push(
                serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                    key,
                    detail: format!("a release trace entry does not decode: {e}"),
                })?,
            );
        }
        Ok(out)
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let now = self.inner.clock.now();
        let fresh = ClaimToken::fresh();
        let outcome = self
            .transition(
                key,
                Busy::Wait,
                now,
                || StoreError::NotFound(key.clone()),
                // A takeover is an ordinary claim, not a transactional one.
                |record, _| {
                    rules::reclaim(record, expected, fresh, lease, now)
                        .map(|()| (Then::Put { tx_effect: false }, fresh))
                },
            )
            .await?;
        match outcome {
            Locked::Done(t) => Ok(t),
            Locked::Busy(_) => unreachable_busy(),
        }
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let now = self.inner.clock.now();
        let row = {
            let client = self.client().await?;
            let select = client
                .prepare_cached(&self.inner.sql.select)
                .await
                .map_err(pg_err)?;
            client
                .query_opt(&select, &[&key.as_str()])
                .await
                .map_err(pg_err)?
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let (record, tx_effect) = decode_some(&row)?;
        if self.age(&mut record.clone(), tx_effect, now) == Aged::Unchanged {
            return Ok(Some(record));
        }
        let outcome = self
            .locked(key, Busy::Skip, |current| {
                let Some((mut record, tx_effect)) = current else {
                    return (Write::Keep, Ok(None));
                };
                match self.age(&mut record, tx_effect, now) {
                    Aged::Gone => (Write::Delete, Ok(None)),
                    Aged::Changed => (
                        Write::Put(Box::new(record.clone()), tx_effect),
                        Ok(Some(record)),
                    ),
                    Aged::Unchanged => (Write::Keep, Ok(Some(record))),
                }
            })
            .await?;
        Ok(match outcome {
            Locked::Done(r) => r,
            // Held by its handler's open transaction: running, whatever the lease says.
            Locked::Busy(record) => Some(*record),
        })
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
        let now = self.inner.clock.now();
        let sql = &self.inner.sql;
        // Expired leases first, so list(unknown) includes them and list(running) does not:
        // page after page, however many leases expired.
        let mut past: (i64, String) = (i64::MIN, String::new());
        loop {
            let expired = {
                let client = self.client().await?;
                client
                    .query(&sql.expired_leases, &[&ms(now), &past.0, &past.1])
                    .await
                    .map_err(pg_err)?
            };
            let page = expired.len();
            for row in expired {
                let raw: String = row.try_get(0).map_err(pg_err)?;
                past = (row.try_get(1).map_err(pg_err)?, raw.clone());
                let Ok(key) = IdemKey::parse(&raw) else {
                    tracing::error!(key = %log_field(&raw), "corrupt idem record left out of a listing");
                    continue;
                };
                match self.get(&key).await {
                    Ok(_) => {}
                    Err(e @ StoreError::Corrupt { .. }) => {
                        tracing::error!(error = %log_field(&e), "corrupt idem record left out of a listing");
                    }
                    Err(e) => return Err(e),
                }
            }
            if page < EXPIRED_PAGE {
                break;
            }
        }
        if state.is_terminal() {
            self.purge_expired().await?;
        }
        let rows = {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            match after {
                None => client.query(&sql.list, &[&state.as_str(), &limit]).await,
                Some(c) => {
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                        [&state.as_str(), &ms(c.created_at), &c.key.as_str(), &limit];
                    client.query(&sql.list_after, &params).await
                }
            }
            .map_err(pg_err)?
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            match decode_some(row) {
                Ok((record, _)) => out.push(record),
                Err(e) => {
                    tracing::error!(error = %log_field(&e), "corrupt idem record left out of a listing")
                }
            }
        }
        Ok(out)
    }
}

/// `Busy` is only reported to [`Busy::Skip`] callers.
pub(crate) fn unreachable_busy<T>() -> Result<T, StoreError> {
    Err(StoreError::Backend(
        "internal: a waiting lock reported a busy row".into(),
    ))
}
