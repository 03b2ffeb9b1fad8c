//! Configuring and connecting a store: [`PostgresStoreBuilder`], the URL's `sslmode`, the
//! schema's name.

use std::sync::Arc;
use std::time::Duration;

use crate::schema::Sql;
use crate::store::{Fences, Inner, PostgresStore};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use idem_runtime::store::{Clock, Retention, StoreError};

pub(crate) enum Source {
    Url(String),
    Pool(Pool),
}

/// Configures and connects a [`PostgresStore`]; from [`PostgresStore::builder`] or
/// [`PostgresStore::with_pool`].
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct PostgresStoreBuilder {
    pub(crate) source: Source,
    pub(crate) schema: String,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    pub(crate) max_connections: usize,
    pub(crate) lock_timeout: Duration,
    pub(crate) sweep_every: Duration,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<rustls::ClientConfig>,
    #[cfg(feature = "tls")]
    pub(crate) tls_files: idem_runtime::store::backend::tls::TlsOptions,
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

    /// How often the store's background task sweeps retention (default
    /// [`DEFAULT_SWEEP_EVERY`](idem_runtime::store::backend::DEFAULT_SWEEP_EVERY), one
    /// minute): every `every`, on tokio's clock, one
    /// [`IdemStore::sweep_expired`](idem_runtime::store::IdemStore::sweep_expired) (three
    /// statements on the retention index) sets the arguments and output of results past
    /// their window to `NULL` and deletes lapsed tombstones and release traces, whether or
    /// not anyone reads them. What is past its window is judged by the store's
    /// [`clock`](Self::clock); the cadence only bounds how long after its window a result
    /// stays in the table. The task starts when the store connects and ends when the last
    /// handle on the store is dropped. Every process sweeps on its own (sweeps of several
    /// processes are harmless: the second finds nothing). `Duration::ZERO` turns the task
    /// off: then sweep from elsewhere ([`PostgresStore::purge_expired`], a cron).
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = every;
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
                sweeper: std::sync::OnceLock::new(),
            }),
        };
        store.migrate().await?;
        store.start_sweeping(self.sweep_every);
        Ok(store)
    }
}

/// `sslmode=verify-ca` and `sslmode=verify-full` (libpq's names, which tokio-postgres does
/// not parse) as `sslmode=require`. With the `tls` feature every TLS connection verifies
/// the server's certificate chain and host name, so `require` here is `verify-full`; without
/// it, `require` is refused like the other two.
pub(crate) fn strict_sslmode(url: &str) -> String {
    url.replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require")
}

pub(crate) fn valid_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && s.len() <= 63
}
