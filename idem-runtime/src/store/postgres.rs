//! [`PostgresStore`]: many workers sharing one PostgreSQL database, and the one thing only a
//! database you own can do — commit a handler's effect and its record in one transaction
//! (`PostgresStore::run_in_transaction`).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Row, Transaction};

use super::rules::{self, Aged};
use super::{
    AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore, ListCursor, Operation,
    ReadBackRecord, Record, RecordState, ReleaseNote, ReleaseRecord, Retention, Settlement,
    StoreError, SystemClock, Timestamp,
};
use super::{HeldClaim, TxError};
use crate::identity::{Fingerprint, IdemKey};

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "idem";

/// The newest table layout this version writes.
const SCHEMA_VERSION: i32 = 3;

/// Migration steps from this version on only drop what the statements no longer use:
/// the statements run on the layout before them as well. Such a step needs a brief
/// exclusive lock on the records table, which a transactional handler's open transaction
/// holds off; rather than stall every worker behind it, the step waits at most the
/// builder's lock timeout, and if the lock is not free it is left for the next start.
const DEFERRABLE_FROM: i32 = 3;

/// How many expired leases a listing ages per query.
const EXPIRED_PAGE: usize = 1000;

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
///   applies [`super::rules`], the same functions every backend uses.
/// - Time (leases, retention) comes from the store's [`Clock`], not the database's `now()`,
///   so all backends age records alike; keep worker clocks in sync.
/// - Completed and failed records are aged when read. Call [`PostgresStore::purge_expired`]
///   periodically to drop the results and tombstones of keys that are never read again.
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
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    schema: String,
    sql: Sql,
    clock: Arc<dyn Clock>,
    retention: Retention,
    lock_timeout: Duration,
    fences: Fences,
}

/// The row version (`xmin`) each claim this handle inserted was written as, by claim token,
/// until its settle. A settle whose row still has that version settles in one autocommit
/// statement (`settle_fenced`): the row is then exactly the claim's insert, which decoded
/// before it was written, so there is nothing to check it for. Anything that rewrote the
/// row since (a renew, a transactional mark, a takeover, an edit by hand) gave it a new
/// version, and the settle takes the checked path. Claims settled by another handle or
/// process, or never settled, are dropped from here when it holds [`FENCES_KEPT`].
#[derive(Default)]
struct Fences(std::sync::Mutex<std::collections::HashMap<ClaimToken, String>>);

/// At most this many fences are kept; past it they are all forgotten (a forgotten fence
/// costs its settle the checked path, nothing else).
const FENCES_KEPT: usize = 65_536;

impl Fences {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<ClaimToken, String>> {
        // Only inserts and removals happen under this lock: a panic cannot leave it torn.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(&self, token: ClaimToken, version: String) {
        let mut map = self.map();
        if map.len() >= FENCES_KEPT {
            map.clear();
        }
        map.insert(token, version);
    }

    fn take(&self, token: ClaimToken) -> Option<String> {
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

enum Source {
    Url(String),
    Pool(Pool),
}

/// Configures and connects a [`PostgresStore`]; from [`PostgresStore::builder`] or
/// [`PostgresStore::with_pool`].
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct PostgresStoreBuilder {
    source: Source,
    schema: String,
    clock: Arc<dyn Clock>,
    retention: Retention,
    max_connections: usize,
    lock_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: Option<rustls::ClientConfig>,
    #[cfg(feature = "tls")]
    tls_files: super::tls::TlsOptions,
}

impl std::fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStoreBuilder")
            .field("schema", &self.schema)
            .field("retention", &self.retention)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    /// The TLS client configuration for a URL store (feature `tls`), e.g. with the root
    /// certificate of a private CA, or a client certificate. By default: the system's root
    /// certificates and full verification (chain and host name). Used when the URL's
    /// `sslmode` is `prefer` (the default: TLS when the server offers it, else clear text),
    /// `require`, `verify-ca` or `verify-full` (TLS or nothing); never with `disable`.
    #[cfg(feature = "tls")]
    pub fn tls_config(mut self, config: rustls::ClientConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Trust exactly these root certificates (PEM, one or more `BEGIN CERTIFICATE` blocks,
    /// e.g. a private CA's) for the server's certificate instead of the system's roots
    /// (feature `tls`); chain and host name are still verified. The URL must ask for TLS
    /// (`sslmode=require`, `verify-ca` or `verify-full`): `connect` refuses certificates
    /// that `prefer` could leave unused. The short form of [`Self::tls_config`]; give one or
    /// the other.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_files.roots = Some(pem.into());
        self
    }

    /// Present this client certificate (PEM, the chain leaf first) and its private key
    /// (PEM: PKCS#8, PKCS#1 or SEC1) to a server that asks for one (`clientcert=` in
    /// `pg_hba.conf`). Feature `tls`; the same rules as [`Self::tls_root_certificates`].
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls_files.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// The schema holding the store's tables (default `idem`): a lowercase SQL identifier
    /// (`[a-z_][a-z0-9_]*`, at most 63 characters). Created if missing.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The clock leases and retention are measured with (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long results and tombstones are kept (default [`Retention::default`]).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention.normalized();
        self
    }

    /// Size of the connection pool built from a URL (default 16; ignored with
    /// [`PostgresStore::with_pool`]).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long a settle waits for a record locked by a transactional handler that is
    /// still running before it gives up (default 2 s).
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Connects, creates the schema and applies pending migrations.
    ///
    /// Fails with [`StoreError::Unavailable`] when the database cannot be reached and with
    /// [`StoreError::Backend`] for a malformed URL or schema name, a database migrated by a
    /// newer version of this library, or TLS settings it cannot honour (certificates that
    /// do not parse, certificates for a URL that does not require TLS, both
    /// `tls_config` and certificates, or either with [`PostgresStore::with_pool`],
    /// whose pool makes its own connections).
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        if !valid_identifier(&self.schema) {
            return Err(StoreError::Backend(format!(
                "invalid schema name {:?}: use [a-z_][a-z0-9_]*, at most 63 characters",
                self.schema
            )));
        }
        #[cfg(feature = "tls")]
        let tls_given = self.tls.is_some() || self.tls_files.is_set();
        let pool = match self.source {
            #[cfg(feature = "tls")]
            Source::Pool(_) if tls_given => {
                return Err(StoreError::Backend(
                    "TLS settings were given with an existing pool, which makes its own \
                     connections: configure TLS on the pool's manager instead"
                        .into(),
                ))
            }
            Source::Pool(pool) => pool,
            Source::Url(url) => {
                let url = strict_sslmode(&url);
                let mut config: tokio_postgres::Config = url
                    .parse()
                    .map_err(|e| StoreError::Backend(format!("invalid Postgres URL: {e}")))?;
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(Duration::from_secs(5));
                }
                let manager_config = ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                };
                #[cfg(feature = "tls")]
                let manager = {
                    if self.tls_files.is_set()
                        && config.get_ssl_mode() != tokio_postgres::config::SslMode::Require
                    {
                        return Err(StoreError::Backend(
                            "TLS certificates were given, but the Postgres URL does not \
                             require TLS: add sslmode=verify-full (or require, verify-ca), \
                             or a server without TLS would get the connection in clear text"
                                .into(),
                        ));
                    }
                    let tls = match self.tls {
                        Some(_) if self.tls_files.is_set() => {
                            return Err(StoreError::Backend(
                                "both tls_config and TLS certificates were given: give the \
                                 certificates inside the one rustls::ClientConfig, or only \
                                 the certificates"
                                    .into(),
                            ));
                        }
                        Some(tls) => tls,
                        None => self.tls_files.rustls_config()?,
                    };
                    Manager::from_config(
                        config,
                        tokio_postgres_rustls::MakeRustlsConnect::new(tls),
                        manager_config,
                    )
                };
                #[cfg(not(feature = "tls"))]
                let manager = {
                    if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                        return Err(StoreError::Backend(
                            "the Postgres URL asks for TLS (sslmode=require, verify-ca or \
                             verify-full), but idem was built without it: enable the `tls` \
                             feature (idem/tls, idem-runtime/tls)"
                                .into(),
                        ));
                    }
                    // sslmode=prefer (tokio-postgres's default) falls back to clear text here.
                    Manager::from_config(config, tokio_postgres::NoTls, manager_config)
                };
                Pool::builder(manager)
                    .max_size(self.max_connections)
                    .wait_timeout(Some(Duration::from_secs(10)))
                    .create_timeout(Some(Duration::from_secs(10)))
                    .runtime(deadpool_postgres::Runtime::Tokio1)
                    .build()
                    .map_err(|e| StoreError::Backend(format!("building the pool: {e}")))?
            }
        };
        let store = PostgresStore {
            inner: Arc::new(Inner {
                pool,
                sql: Sql::new(&self.schema),
                schema: self.schema,
                clock: self.clock,
                retention: self.retention,
                lock_timeout: self.lock_timeout,
                fences: Fences::default(),
            }),
        };
        store.migrate().await?;
        Ok(store)
    }
}

/// `sslmode=verify-ca` and `sslmode=verify-full` (libpq's names, which tokio-postgres does
/// not parse) as `sslmode=require`. With the `tls` feature every TLS connection verifies
/// the server's certificate chain and host name, so `require` here is `verify-full`; without
/// it, `require` is refused like the other two.
fn strict_sslmode(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

fn valid_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}

/// Every statement, with the schema filled in once.
struct Sql {
    claim: String,
    select: String,
    select_for_update: String,
    select_skip_locked: String,
    upsert: String,
    delete: String,
    settle_fast: String,
    settle_fenced: String,
    renew_fast: String,
    release_fast: String,
    expired_leases: String,
    list: String,
    list_after: String,
    expire_results: String,
    drop_tombstones: String,
    mark_tx: String,
    lock_tx: String,
    settle_tx: String,
    insert_release: String,
    trim_releases: String,
    drop_releases: String,
    select_releases: String,
    list_releases: String,
}

const COLUMNS: &str = "key, fingerprint, tool, state, token, lease_until, created_at, \
    updated_at, payload, message, downstream_ref, result_expired, attempts, tx_effect, \
    operation, read_backs";

/// Appends the JSON array `$n` to the stored one, as text (no JSON round trip: the evidence
/// is kept byte for byte).
fn append_json(column: &str, n: u8) -> String {
    format!(
        "CASE WHEN ${n} = '[]' THEN {column} WHEN {column} = '[]' THEN ${n} \
         ELSE left({column}, -1) || ',' || right(${n}, -1) END"
    )
}

impl Sql {
    fn new(schema: &str) -> Sql {
        let t = format!("\"{schema}\".idem_records");
        let r = format!("\"{schema}\".idem_releases");
        Sql {
            claim: format!(
                "WITH ins AS ( \
                   INSERT INTO {t} (key, fingerprint, tool, state, token, lease_until, \
                     created_at, updated_at, operation) \
                   VALUES ($1, $2, $3, 'running', $4, $5, $6, $6, $7) \
                   ON CONFLICT (key) DO NOTHING RETURNING xmin::text AS version) \
                 SELECT (SELECT version FROM ins), r.key, r.fingerprint, r.tool, r.state, \
                   r.token, r.lease_until, r.created_at, r.updated_at, r.payload, r.message, \
                   r.downstream_ref, r.result_expired, r.attempts, r.tx_effect, r.operation, \
                   r.read_backs \
                 FROM (SELECT 1) AS one LEFT JOIN {t} AS r ON r.key = $1"
            ),
            select: format!("SELECT {COLUMNS} FROM {t} WHERE key = $1"),
            select_for_update: format!("SELECT {COLUMNS} FROM {t} WHERE key = $1 FOR UPDATE"),
            select_skip_locked: format!(
                "SELECT {COLUMNS} FROM {t} WHERE key = $1 FOR UPDATE SKIP LOCKED"
            ),
            upsert: format!(
                "INSERT INTO {t} ({COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                   $16) \
                 ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
                   tool = EXCLUDED.tool, state = EXCLUDED.state, token = EXCLUDED.token, \
                   lease_until = EXCLUDED.lease_until, created_at = EXCLUDED.created_at, \
                   updated_at = EXCLUDED.updated_at, payload = EXCLUDED.payload, \
                   message = EXCLUDED.message, downstream_ref = EXCLUDED.downstream_ref, \
                   result_expired = EXCLUDED.result_expired, attempts = EXCLUDED.attempts, \
                   tx_effect = EXCLUDED.tx_effect, operation = EXCLUDED.operation, \
                   read_backs = EXCLUDED.read_backs"
            ),
            delete: format!("DELETE FROM {t} WHERE key = $1"),
            // The common settle: a live claim settled by its holder (rules::settle's first
            // branch). Rows of transactional handlers take the locked path, so this never
            // waits on a handler's open transaction.
            settle_fast: format!(
                "UPDATE {t} SET state = $3, lease_until = NULL, payload = $4, message = $5, \
                   downstream_ref = COALESCE($6, downstream_ref), attempts = {}, \
                   read_backs = {}, result_expired = false, updated_at = $8 \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $8 \
                   AND NOT tx_effect \
                   AND $10::int4 <= {cap} AND $11::int4 <= {cap} \
                   AND (attempts = '[]' OR json_array_length(attempts::json) + $10 <= {cap}) \
                   AND (read_backs = '[]' \
                     OR json_array_length(read_backs::json) + $11 <= {cap}) \
                 RETURNING {COLUMNS}",
                append_json("attempts", 7),
                append_json("read_backs", 9),
                // Within the evidence cap the append is exactly what rules::settle does;
                // past it, the locked path applies rules::cap_evidence. $10 and $11 count
                // the new evidence; the stored evidence of a claim is still empty (`[]`)
                // when its holder settles it, so its JSON is parsed only when it is not.
                cap = 2 * rules::EVIDENCE_KEPT,
            ),
            // The claim's own insert, settled by its holder: `xmin` is the version the
            // claim wrote (see `Fences`), so the evidence columns still hold `[]` and the
            // row needs no decoding. Otherwise exactly `settle_fast`.
            settle_fenced: format!(
                "UPDATE {t} SET state = $3, lease_until = NULL, payload = $4, message = $5, \
                   downstream_ref = COALESCE($6, downstream_ref), attempts = $7, \
                   read_backs = $9, result_expired = false, updated_at = $8 \
                 WHERE key = $1 AND token = $2 AND xmin::text = $12 AND state = 'running' \
                   AND lease_until > $8 AND NOT tx_effect \
                   AND $10::int4 <= {cap} AND $11::int4 <= {cap}",
                cap = 2 * rules::EVIDENCE_KEPT,
            ),
            renew_fast: format!(
                "UPDATE {t} SET lease_until = $3, updated_at = $4 \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $4 \
                   AND NOT tx_effect \
                 RETURNING {COLUMNS}"
            ),
            release_fast: format!(
                "DELETE FROM {t} \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $3 \
                   AND NOT tx_effect \
                 RETURNING {COLUMNS}"
            ),
            // A keyset page: rows that stay running after ageing (a corrupt row, or a
            // transactional claim still being decided) are walked past, not met again.
            // Served by the (state, created_at, key) index: the running rows are the calls
            // in flight, few, and a lease index would cost every claim an index write.
            expired_leases: format!(
                "SELECT key, lease_until FROM {t} \
                 WHERE state = 'running' AND lease_until <= $1 AND (lease_until, key) > ($2, $3) \
                 ORDER BY lease_until, key LIMIT {EXPIRED_PAGE}"
            ),
            list: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = $1 ORDER BY created_at, key LIMIT $2"
            ),
            // A keyset page: the row comparison is a range on the (state, created_at, key)
            // index, so a page deep into a large state costs no more than the first.
            list_after: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = $1 AND (created_at, key) > ($2, $3) \
                 ORDER BY created_at, key LIMIT $4"
            ),
            // Retention runs on the (state, created_at, key) index: a record is settled
            // after it is claimed, so `created_at <= $1` holds for every record the rule
            // picks and narrows the scan to the old end of each state. (A settle stamped by
            // a clock behind the claimer's ages once both times pass the cut: late by the
            // skew.) A separate index on `updated_at` would cost every settle a write.
            expire_results: format!(
                // rules::expire_result, in SQL: the tombstone keeps no arguments, output,
                // messages or read-backs.
                "UPDATE {t} SET result_expired = true, payload = NULL, message = NULL, \
                   operation = NULL, read_backs = '[]', \
                   attempts = COALESCE((SELECT jsonb_agg(a - 'message' ORDER BY n)::text \
                     FROM jsonb_array_elements(attempts::jsonb) WITH ORDINALITY AS e(a, n)), \
                     '[]') \
                 WHERE state IN ('completed', 'failed') AND NOT result_expired \
                   AND created_at <= $1 AND updated_at <= $1"
            ),
            drop_tombstones: format!(
                "DELETE FROM {t} WHERE state IN ('completed', 'failed') \
                   AND created_at <= $1 AND updated_at <= $1"
            ),
            mark_tx: format!(
                "UPDATE {t} SET tx_effect = true \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $3"
            ),
            lock_tx: format!(
                "SELECT 1 FROM {t} WHERE key = $1 AND token = $2 AND state = 'running' \
                 FOR UPDATE"
            ),
            settle_tx: format!(
                "UPDATE {t} SET state = 'completed', lease_until = NULL, payload = $3, \
                   message = NULL, result_expired = false, tx_effect = false, \
                   updated_at = $4 \
                 WHERE key = $1 AND token = $2 AND state = 'running'"
            ),
            insert_release: format!(
                "INSERT INTO {r} (key, seq, released_at, entry) \
                 SELECT $1, COALESCE(max(seq), 0) + 1, $2, $3 FROM {r} WHERE key = $1 \
                 RETURNING seq"
            ),
            trim_releases: format!("DELETE FROM {r} WHERE key = $1 AND seq <= $2"),
            drop_releases: format!("DELETE FROM {r} WHERE released_at <= $1"),
            select_releases: format!(
                "SELECT entry FROM {r} WHERE key = $1 AND released_at > $2 ORDER BY seq"
            ),
            list_releases: format!(
                "SELECT key, entry FROM {r} \
                 WHERE released_at > $1 AND (released_at, key) > ($2, $3) \
                 ORDER BY released_at, key, seq LIMIT $4"
            ),
        }
    }

    /// The layout, one step per version. Steps are never edited once released: a database
    /// of any version reaches the newest by running the steps after its own.
    fn migrations(schema: &str) -> [String; SCHEMA_VERSION as usize] {
        let s = format!("\"{schema}\"");
        let t = format!("{s}.idem_records");
        let r = format!("{s}.idem_releases");
        [
            format!(
                "CREATE TABLE {t} ( \
               key            text PRIMARY KEY, \
               fingerprint    text NOT NULL, \
               tool           text NOT NULL, \
               state          text NOT NULL, \
               token          text NOT NULL, \
               lease_until    bigint, \
               created_at     bigint NOT NULL, \
               updated_at     bigint NOT NULL, \
               payload        text, \
               message        text, \
               downstream_ref text, \
               result_expired boolean NOT NULL DEFAULT false, \
               attempts       text NOT NULL DEFAULT '[]', \
               tx_effect      boolean NOT NULL DEFAULT false, \
               operation      text, \
               read_backs     text NOT NULL DEFAULT '[]'); \
             CREATE INDEX idem_records_state ON {t} (state, created_at, key); \
             CREATE INDEX idem_records_leases ON {t} (lease_until) WHERE state = 'running'; \
             CREATE INDEX idem_records_retention ON {t} (updated_at) \
               WHERE state IN ('completed', 'failed');"
            ),
            // 2: release traces (`IdemStore::release_unsettled`), one row per release.
            format!(
                "CREATE TABLE {r} ( \
               key         text NOT NULL, \
               seq         bigint NOT NULL, \
               released_at bigint NOT NULL, \
               entry       text NOT NULL, \
               PRIMARY KEY (key, seq)); \
             CREATE INDEX idem_releases_by_time ON {r} (released_at, key, seq);"
            ),
            // 3: one secondary index on the records instead of three. The expiry scan and
            // retention run on `idem_records_state` (see `expired_leases`,
            // `expire_results`), so a claim writes two index entries instead of three and
            // a settle two instead of three. Every statement of this version runs on
            // layout 2 as well, so this step may wait for a later start (see
            // `DEFERRABLE_FROM`).
            format!(
                "DROP INDEX IF EXISTS {s}.idem_records_leases; \
                 DROP INDEX IF EXISTS {s}.idem_records_retention;"
            ),
        ]
    }
}

/// What a locked read-modify-write does to the row.
enum Write {
    Keep,
    Put(Box<Record>, bool),
    Delete,
    /// Delete the row and add the release to the key's trace.
    Release(Box<ReleaseRecord>),
}

/// What a successful transition leaves behind.
enum Then {
    /// The changed record (and whether it is held by a transactional handler).
    Put { tx_effect: bool },
    /// Nothing: the key is free.
    Delete,
    /// Nothing, and this release in the key's trace.
    Release(Box<ReleaseRecord>),
}

/// The result of a locked operation.
enum Locked<T> {
    Done(T),
    /// The row is locked by a transactional handler that is still running; its unlocked
    /// view.
    Busy(Box<Record>),
}

/// How a locked operation treats a row someone else holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Busy {
    /// Wait (bounded by the lock timeout): the caller must write.
    Wait,
    /// Report a row held by a running transactional handler instead of waiting for it.
    Skip,
}

/// A count for an `int4` parameter (past its range: its largest value, which no cap admits).
fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// PostgreSQL text cannot hold NUL; a message with one is kept with U+FFFD in its place.
fn pg_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// `e` and every error below it, `: `-separated. tokio-postgres's own text names only the
/// step that failed ("error performing TLS handshake", "db error"); the reason (a
/// certificate signed by an unknown CA, the server's `pg_hba.conf` refusal) is its source.
fn chain(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

fn pg_err(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().cloned();
    let e = chain(&e);
    match code.as_ref() {
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE => StoreError::Backend(
            "the record is locked by a transaction still in progress \
             (a transactional handler that is still running)"
                .into(),
        ),
        Some(c)
            if c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Unavailable(format!("postgres: {e}"))
        }
        Some(_) => StoreError::Backend(format!("postgres: {e}")),
        // No SQLSTATE: the connection broke, timed out or could not be made.
        None => StoreError::Unavailable(format!("postgres: {e}")),
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(format!("postgres pool: {other}")),
    }
}

/// Decodes a record from `row`'s columns starting at `at` (in [`COLUMNS`] order); `None`
/// when the key column is NULL (an outer join that found nothing). The flag is `tx_effect`.
fn decode(row: &Row, at: usize) -> Result<Option<(Record, bool)>, StoreError> {
    let raw_key: Option<String> = row.try_get(at).map_err(|e| StoreError::Corrupt {
        key: "?".into(),
        detail: e.to_string(),
    })?;
    let Some(raw_key) = raw_key else {
        return Ok(None);
    };
    let corrupt = |detail: String| StoreError::Corrupt {
        key: raw_key.clone(),
        detail,
    };
    let col = |i: usize| at + i;
    macro_rules! get {
        ($i:expr, $t:ty) => {
            row.try_get::<_, $t>(col($i))
                .map_err(|e| corrupt(format!("column {}: {e}", $i)))?
        };
    }
    let time = |v: i64, what: &str| {
        u64::try_from(v)
            .map(Timestamp)
            .map_err(|_| corrupt(format!("negative {what}")))
    };
    let key = IdemKey::parse(&raw_key).map_err(|e| corrupt(e.to_string()))?;
    let fingerprint = Fingerprint::from_hex(&get!(1, String))
        .ok_or_else(|| corrupt("malformed fingerprint".into()))?;
    let tool = get!(2, String);
    let state_name = get!(3, String);
    let state = RecordState::parse(&state_name)
        .ok_or_else(|| corrupt(format!("unknown state `{state_name}`")))?;
    let token = ClaimToken::from_hex(&get!(4, String))
        .ok_or_else(|| corrupt("malformed claim token".into()))?;
    let lease_until = match get!(5, Option<i64>) {
        Some(v) => Some(time(v, "lease")?),
        None => None,
    };
    if state == RecordState::Running && lease_until.is_none() {
        return Err(corrupt("a running record without a lease".into()));
    }
    let created_at = time(get!(6, i64), "created_at")?;
    let updated_at = time(get!(7, i64), "updated_at")?;
    let payload = match get!(8, Option<String>) {
        Some(p) => Some(
            serde_json::from_str(&p).map_err(|e| corrupt(format!("payload is not JSON: {e}")))?,
        ),
        None => None,
    };
    let message = get!(9, Option<String>);
    let downstream_ref = get!(10, Option<String>);
    let result_expired = get!(11, bool);
    let attempts: Vec<AttemptRecord> = serde_json::from_str(&get!(12, String))
        .map_err(|e| corrupt(format!("malformed attempts: {e}")))?;
    let tx_effect = get!(13, bool);
    let operation: Option<Operation> = match get!(14, Option<String>) {
        Some(op) => Some(
            serde_json::from_str(&op).map_err(|e| corrupt(format!("malformed operation: {e}")))?,
        ),
        None => None,
    };
    let read_backs: Vec<ReadBackRecord> = serde_json::from_str(&get!(15, String))
        .map_err(|e| corrupt(format!("malformed read-backs: {e}")))?;
    Ok(Some((
        Record {
            key,
            fingerprint,
            tool: tool.into(),
            state,
            token,
            lease_until,
            created_at,
            updated_at,
            payload,
            message,
            downstream_ref,
            result_expired,
            attempts,
            operation,
            read_backs,
        },
        tx_effect,
    )))
}

fn decode_some(row: &Row) -> Result<(Record, bool), StoreError> {
    decode(row, 0)?.ok_or_else(|| StoreError::Corrupt {
        key: "?".into(),
        detail: "a row without a key".into(),
    })
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(format!("{what}: {e}")))
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

    fn builder_from(source: Source) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            source,
            schema: DEFAULT_SCHEMA.to_owned(),
            clock: Arc::new(SystemClock),
            retention: Retention::default(),
            max_connections: 16,
            lock_timeout: Duration::from_secs(2),
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "tls")]
            tls_files: super::tls::TlsOptions::default(),
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

    async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(pool_err)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let schema = &self.inner.schema;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        // One migrator per schema at a time, across every worker.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('idem-migrate:' || $1::text))",
            &[schema],
        )
        .await
        .map_err(pg_err)?;
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; \
             CREATE TABLE IF NOT EXISTS \"{schema}\".idem_schema_version ( \
               version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());"
        ))
        .await
        .map_err(pg_err)?;
        let current: i32 = tx
            .query_one(
                &format!("SELECT COALESCE(max(version), 0) FROM \"{schema}\".idem_schema_version"),
                &[],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if current > SCHEMA_VERSION {
            return Err(StoreError::Backend(format!(
                "schema \"{schema}\" is at version {current}, newer than this version of idem \
                 understands ({SCHEMA_VERSION}); upgrade idem"
            )));
        }
        for (i, step) in Sql::migrations(schema).iter().enumerate() {
            let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
            if version <= current {
                continue;
            }
            let record = format!(
                "INSERT INTO \"{schema}\".idem_schema_version (version) VALUES ({version})"
            );
            if version < DEFERRABLE_FROM {
                tx.batch_execute(&format!("{step}; {record}"))
                    .await
                    .map_err(pg_err)?;
                continue;
            }
            let lock_timeout = self.inner.lock_timeout.as_millis().max(1);
            let tried = tx
                .batch_execute(&format!(
                    "SAVEPOINT idem_migrate; SET LOCAL lock_timeout = {lock_timeout}; \
                     {step}; {record}; RELEASE idem_migrate"
                ))
                .await;
            match tried {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    tx.batch_execute("ROLLBACK TO idem_migrate")
                        .await
                        .map_err(pg_err)?;
                    tracing::warn!(
                        schema = %schema,
                        version,
                        "idem schema upgrade left for a later start: the records table is \
                         locked by a transaction still in progress"
                    );
                    break;
                }
                Err(e) => return Err(pg_err(e)),
            }
        }
        tx.commit().await.map_err(pg_err)
    }

    /// Applies lease expiry and retention to `record` (`rules::age`), plus one rule of this
    /// backend: the running claim of a transactional handler whose lease has passed is
    /// *freed*, not made unknown — its effect could only commit together with the record,
    /// and the record is not completed, so nothing happened. Callers hold the row lock.
    fn age(&self, record: &mut Record, tx_effect: bool, now: Timestamp) -> Aged {
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
    async fn fast(
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

    async fn transition<T>(
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

    async fn locked<T>(
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
    async fn put_release(
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
    fn release_cut(&self, now: Timestamp) -> i64 {
        let window = ms(Timestamp(0).plus(self.inner.retention.normalized().tombstones));
        ms(now).saturating_sub(window)
    }

    /// Applies retention to every completed and failed record at once: drops results past
    /// the result window and tombstones past theirs. Records are also aged whenever they
    /// are read; call this periodically (e.g. hourly) so keys that are never seen again do
    /// not stay forever. Release traces past the tombstone window go too. Returns (results
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

    /// Runs an effect and settles the claim's record as *completed* in **one** PostgreSQL
    /// transaction: the store-level form of `PostgresStore::run_in_transaction` (defined
    /// with the tools, for a `WriteCtx` and `ToolError`), for any claim holder and any error
    /// type that a [`TxError`] converts into. See that method for what it guarantees.
    ///
    /// # Errors
    ///
    /// `f`'s error after rolling back; [`TxError::NotExecuted`] when the claim is no longer
    /// held or the store is unreachable (nothing was executed); [`TxError::Unknown`] when
    /// the commit's outcome could not be determined.
    pub async fn transact<T, E, F>(&self, ctx: &impl HeldClaim, f: F) -> Result<T, E>
    where
        T: serde::Serialize + Send,
        E: From<TxError>,
        F: for<'c> FnOnce(&'c mut Transaction<'_>) -> BoxFuture<'c, Result<T, E>> + Send,
    {
        let sql = &self.inner.sql;
        let key = ctx.key().as_str();
        let token = ctx.claim_token().to_hex();
        // Marking the claim rewrites its row: the fence of its insert is spent.
        self.inner.fences.take(ctx.claim_token());
        let not_run = |why: String| E::from(TxError::NotExecuted(why));
        let mut client = self
            .client()
            .await
            .map_err(|e| not_run(format!("the idem store is unreachable ({e})")))?;

        // 1. Mark the claim transactional, committed on its own: from here on a running
        //    record whose transaction is gone provably has no effect.
        let now = self.inner.clock.now();
        let marked = client
            .execute(&sql.mark_tx, &[&key, &token, &ms(now)])
            .await
            .map_err(|e| not_run(format!("could not mark the claim ({e})")))?;
        if marked != 1 {
            return Err(not_run(
                "the claim is no longer held (its lease passed or it was taken over)".into(),
            ));
        }

        // 2. Open the transaction and lock the record in it: while it is open, nobody can
        //    free or settle the record; if the process dies, PostgreSQL rolls it back.
        let mut tx = client
            .transaction()
            .await
            .map_err(|e| not_run(format!("could not begin ({e})")))?;
        let held = tx
            .query_opt(&sql.lock_tx, &[&key, &token])
            .await
            .map_err(|e| not_run(format!("could not lock the record ({e})")))?;
        if held.is_none() {
            return Err(not_run(
                "the claim was taken over before the transaction began".into(),
            ));
        }

        // 3. The effect.
        let output = match f(&mut tx).await {
            Ok(output) => output,
            Err(e) => {
                // Dropping would roll back too; doing it here returns the connection clean.
                let _ = tx.rollback().await;
                return Err(e);
            }
        };

        // 4. The record, in the same transaction, then one COMMIT for both.
        let payload = match serde_json::to_string(&output) {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(not_run(format!("the output does not serialize ({e})")));
            }
        };
        let settled = tx
            .execute(
                &sql.settle_tx,
                &[&key, &token, &payload, &ms(self.inner.clock.now())],
            )
            .await;
        match settled {
            Ok(1) => {}
            Ok(_) => {
                let _ = tx.rollback().await;
                return Err(not_run("the record was not held at settle time".into()));
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(not_run(format!("could not settle the record ({e})")));
            }
        }
        match tx.commit().await {
            Ok(()) => Ok(output),
            Err(e) if e.code().is_some() => {
                // The server answered: it refused the commit, so it rolled back.
                Err(not_run(format!("the transaction did not commit ({e})")))
            }
            Err(e) => {
                drop(client);
                self.resolve_commit(ctx, output, e).await.map_err(E::from)
            }
        }
    }

    /// The connection broke during COMMIT: read the record back (waiting for the commit to
    /// finish if the server is still at it) to learn which way it went.
    async fn resolve_commit<T>(
        &self,
        ctx: &impl HeldClaim,
        output: T,
        e: tokio_postgres::Error,
    ) -> Result<T, TxError> {
        let outcome = self
            .locked(ctx.key(), Busy::Wait, |current| {
                let state = current.map(|(r, _)| (r.state, r.token));
                (Write::Keep, Ok(state))
            })
            .await;
        match outcome {
            Ok(Locked::Done(Some((RecordState::Completed, t)))) if t == ctx.claim_token() => {
                Ok(output)
            }
            Ok(Locked::Done(Some((RecordState::Running, t)))) if t == ctx.claim_token() => Err(
                TxError::NotExecuted(format!("the transaction did not commit ({e})")),
            ),
            Ok(Locked::Done(Some((state, _)))) => Err(TxError::NotExecuted(format!(
                "the transaction did not commit ({e}); the record has moved on (now {state})"
            ))),
            Ok(Locked::Done(None)) => Err(TxError::NotExecuted(format!(
                "the transaction did not commit ({e}); the claim was freed"
            ))),
            Ok(Locked::Busy(_)) | Err(_) => Err(TxError::Unknown(format!(
                "the connection broke during COMMIT ({e}) and the record could not be read \
                 back: the effect may or may not have committed"
            ))),
        }
    }
}

async fn put(
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
    fn durability(&self) -> crate::store::Durability {
        crate::store::Durability::Durable
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
                    tracing::error!(key = %raw, "corrupt idem record left out of a listing");
                    continue;
                };
                match self.get(&key).await {
                    Ok(_) => {}
                    Err(e @ StoreError::Corrupt { .. }) => {
                        tracing::error!(error = %e, "corrupt idem record left out of a listing");
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
                Err(e) => tracing::error!(error = %e, "corrupt idem record left out of a listing"),
            }
        }
        Ok(out)
    }
}

/// `Busy` is only reported to [`Busy::Skip`] callers.
fn unreachable_busy<T>() -> Result<T, StoreError> {
    Err(StoreError::Backend(
        "internal: a waiting lock reported a busy row".into(),
    ))
}
