//! Configuring and connecting a store: [`RedisStoreBuilder`], one server or a cluster, TLS,
//! partitions, the key prefix.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use idem_runtime::store::{Clock, Retention, StoreError, SystemClock};

#[cfg(feature = "tls")]
use idem_runtime::store::backend::tls::TlsOptions;

use crate::codec::map_err;
use crate::connection::Conn;
use crate::library::{load_library, load_script, Calls};
use crate::partition::Layout;
use crate::store::{Inner, RedisStore, Target, DEFAULT_PREFIX};

/// Configures and connects a [`RedisStore`]; from [`RedisStore::builder`] or
/// [`RedisStore::cluster`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedisStoreBuilder {
    pub(crate) target: Target,
    pub(crate) prefix: String,
    pub(crate) partitions: u16,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) retention: Retention,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) reconnect_retries: usize,
    #[cfg(feature = "tls")]
    pub(crate) tls: TlsOptions,
    /// Runs the code with `EVALSHA` even where `FUNCTION` exists (tests of that path).
    pub(crate) force_script: bool,
    pub(crate) read_before_claim: bool,
    pub(crate) replicas: Option<ReplicaWait>,
    pub(crate) sweep_every: Duration,
}

/// What [`RedisStoreBuilder::wait_for_replicas`] set: how many replicas must confirm a
/// claim or a settle, and how long to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    /// `WAIT`'s `numreplicas`.
    pub(crate) replicas: u32,
    /// `WAIT`'s timeout.
    pub(crate) timeout: Duration,
}

impl RedisStoreBuilder {
    pub(crate) fn to(target: Target) -> RedisStoreBuilder {
        RedisStoreBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            partitions: 1,
            clock: Arc::new(SystemClock),
            retention: Retention::default(),
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            reconnect_retries: 2,
            #[cfg(feature = "tls")]
            tls: TlsOptions::default(),
            force_script: false,
            read_before_claim: false,
            replicas: None,
            sweep_every: idem_runtime::store::backend::DEFAULT_SWEEP_EVERY,
        }
    }

    /// Prefix of every key this store writes (default `idem:`). Stores with different
    /// prefixes on one Redis are independent.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many partitions the store's keys are spread over (default 1; at most
    /// [`RedisStore::MAX_PARTITIONS`]). More than one spreads a store over a Redis Cluster's shards: use
    /// a multiple of the number of masters (see "Redis Cluster: partitions" on
    /// [`RedisStore`]). Fixed for the store's lifetime: `connect` refuses a count other than
    /// the one the store's data was written with. A partitioned store's prefix must not hold
    /// a brace.
    pub fn partitions(mut self, partitions: u16) -> Self {
        self.partitions = partitions;
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

    /// Answer a repeat of a settled call with a plain `HGETALL` of its record, before any
    /// script runs (default off).
    ///
    /// Every claim then reads first: one that finds a completed or failed record still
    /// inside its windows (the saved result, or the tombstone) answers from it, as the
    /// claim script would have; anything else (no record, a running, unknown, pending or
    /// escalated one, one due to age) goes on to the script, unchanged. A replay then costs
    /// the server one read instead of a function call (1–2 µs of server time against
    /// 10–13 µs in `benches/peers/backends.sh redis`), and a fresh write one more round
    /// trip (the read that finds nothing). Worth it where repeats are common (agents
    /// re-calling, harnesses retrying whole runs) or the server is the bottleneck; the
    /// answers are the same either way, since a settled record changes only by ageing,
    /// which the read applies as the script does.
    pub fn read_before_claim(mut self, on: bool) -> Self {
        self.read_before_claim = on;
        self
    }

    /// Wait for `replicas` replicas to confirm each claim and settle, for at most `timeout`
    /// (default: no wait). A failover then does not forget a claim: without it, a claim the
    /// primary acknowledged and died before replicating is gone from the promoted replica,
    /// and the next call runs the handler again.
    ///
    /// Each `claim` and `settle` is sent with a `WAIT replicas timeout` behind it, in one
    /// pipeline on the same connection (on a Redis Cluster, to the master of the key's
    /// slot: the wait is per shard), so the wait covers exactly that write:
    ///
    /// - A claim fewer replicas confirm in time is released and refused with
    ///   [`StoreError::Unavailable`]: the handler does not run. (Were the release lost in a
    ///   failover too, the claim survives on no replica; on the old primary it is a running
    ///   claim of nobody that turns unknown at its lease's end, for the reconciler.)
    /// - A settle fewer replicas confirm in time is kept as it is (the effect happened; the
    ///   caller gets its answer) and logged as a warning. Should the primary then fail over,
    ///   the promoted replica holds the record as the confirmed claim left it, running: it
    ///   turns unknown when its lease passes and the reconciler settles it (read-back or a
    ///   retry with the same key), never a second run of the handler.
    ///
    /// `WAIT` confirms that replicas received the write, not that they fsynced it (Redis
    /// 7.0 has no `WAITAOF`). It blocks the connection it is sent on until the replicas
    /// answer: every command pipelined behind it waits too, so on a healthy replica each
    /// claim and settle pays a replica round trip (see the README's durability table for
    /// the measured cost), and a stalled replica holds them up to `timeout`. `replicas`
    /// must be at least 1 and `timeout` at least 1 ms and under the response timeout
    /// ([`RedisStoreBuilder::response_timeout`]), or `connect` refuses.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// How long one connection attempt may take (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long to wait for a reply before reporting [`StoreError::Unavailable`]
    /// (default 5 s). A Redis that hangs must not hang the agent.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How many times a (re)connection is retried, with exponential backoff, before
    /// an operation fails as unavailable (default 2). On a cluster: how many times a
    /// command is retried (after a redirection or a lost connection).
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Trust exactly these root certificates (PEM, one or more `BEGIN CERTIFICATE` blocks,
    /// e.g. a private CA's) for the server's certificate instead of the system's roots
    /// (feature `tls`). The host name is still verified. Needs `rediss://` URLs: `connect`
    /// refuses certificates given for a clear-text URL rather than ignore them.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.roots = Some(pem.into());
        self
    }

    /// Present this client certificate (PEM, the chain leaf first) and its private key
    /// (PEM: PKCS#8, PKCS#1 or SEC1) to servers that require one: Redis does by default
    /// when it serves TLS (`tls-auth-clients yes`). Feature `tls`; needs `rediss://` URLs.
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Connects. Fails with [`StoreError::Unavailable`] when Redis cannot be reached, and
    /// with [`StoreError::Backend`] when a URL is malformed, the partition count is out of
    /// range or differs from the one the store's data was written with, a cluster store
    /// would not fit its scripts' keys in one slot (one partition and no hash tag in the
    /// prefix), the server refuses the store's code (`FUNCTION LOAD`, or `SCRIPT LOAD`
    /// where it has no functions; see "One round trip, atomic" on [`RedisStore`]), or TLS
    /// certificates were given that do not parse or for a URL that is not `rediss://`.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        #[cfg(not(feature = "tls"))]
        if self.target.urls().iter().any(|url| is_tls_url(url)) {
            return Err(StoreError::Backend(
                "the Redis URL asks for TLS (rediss://), but idem was built without it: \
                 enable the `tls` feature (idem/tls, idem-runtime/tls), or use redis:// on a \
                 trusted network"
                    .into(),
            ));
        }
        let layout = Layout::new(&self.prefix, self.partitions)?;
        if let Some(wait) = self.replicas {
            if wait.replicas == 0
                || wait.timeout < Duration::from_millis(1)
                || wait.timeout >= self.response_timeout
            {
                return Err(StoreError::Backend(format!(
                    "wait_for_replicas({}, {:?}) needs at least 1 replica and a timeout of at \
                     least 1 ms under the response timeout ({:?}), or a claim could time out \
                     unsure whether it was made",
                    wait.replicas, wait.timeout, self.response_timeout
                )));
            }
        }
        #[cfg(feature = "tls")]
        let certificates = redis_certificates(&self.tls)?;
        #[cfg(feature = "tls")]
        if certificates.is_some() {
            if let Some(url) = self.target.urls().iter().find(|url| !is_tls_url(url)) {
                return Err(StoreError::Backend(format!(
                    "TLS certificates were given, but the Redis URL {} is not rediss://: \
                     use rediss:// so the connection is encrypted and they are used",
                    redact(url)
                )));
            }
        }
        let conn = match &self.target {
            Target::Single(url) => {
                #[cfg(feature = "tls")]
                let client = match certificates.clone() {
                    Some(certificates) => {
                        ::redis::Client::build_with_tls(url.as_str(), certificates)
                    }
                    None => ::redis::Client::open(url.as_str()),
                };
                #[cfg(not(feature = "tls"))]
                let client = ::redis::Client::open(url.as_str());
                let client =
                    client.map_err(|e| StoreError::Backend(format!("invalid Redis URL: {e}")))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.connection_timeout)
                    .set_response_timeout(self.response_timeout)
                    .set_number_of_retries(self.reconnect_retries)
                    .set_max_delay(1000);
                Conn::Single(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .map_err(map_err)?,
                )
            }
            Target::Cluster(nodes) => {
                if nodes.is_empty() {
                    return Err(StoreError::Backend(
                        "a Redis Cluster store needs at least one node URL".into(),
                    ));
                }
                if self.partitions == 1 && hash_tag(&self.prefix).is_none() {
                    return Err(StoreError::Backend(format!(
                        "on a Redis Cluster, a store of one partition needs its prefix in a \
                         hash tag (e.g. `{{idem}}:`), or every script would name keys of \
                         several slots; better, spread the store with `.partitions(n)` \
                         (prefix `{}`)",
                        self.prefix
                    )));
                }
                let builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(self.connection_timeout)
                    .response_timeout(self.response_timeout)
                    .retries(u32::try_from(self.reconnect_retries).unwrap_or(u32::MAX));
                #[cfg(feature = "tls")]
                let builder = match certificates {
                    Some(certificates) => builder.certs(certificates),
                    None => builder,
                };
                let client = builder
                    .build()
                    .map_err(|e| StoreError::Backend(format!("invalid Redis Cluster URL: {e}")))?;
                Conn::Cluster(client.get_async_connection().await.map_err(map_err)?)
            }
        };
        // Load the code now, so a Redis that refuses it fails here, not mid-call.
        let mut loading = conn.clone();
        let calls = if self.force_script {
            load_script(&mut loading).await?;
            Calls::Script
        } else {
            match load_library(&mut loading).await {
                Ok(()) => Calls::Function,
                Err(e) if crate::library::no_functions(&e) => {
                    tracing::warn!(
                        "this Redis has no FUNCTION command (Redis < 7): the idem store runs \
                         its code with EVALSHA, at a higher server cost per call"
                    );
                    load_script(&mut loading).await?;
                    Calls::Script
                }
                Err(e) if crate::library::functions_denied(&e) => {
                    tracing::warn!(error = %e,
                        "this Redis user may not load functions (ACL): the idem store runs \
                         its code with EVALSHA, at a higher server cost per call; allow \
                         `function|load` and `fcall` to use the Function library");
                    load_script(&mut loading).await?;
                    Calls::Script
                }
                Err(e) => return Err(map_err(e)),
            }
        };
        let store = RedisStore {
            inner: Arc::new(Inner {
                conn,
                calls,
                read_before_claim: self.read_before_claim,
                replicas: self.replicas,
                prefix: self.prefix,
                layout,
                clock: self.clock,
                retention: self.retention,
                sweeper: std::sync::OnceLock::new(),
            }),
        };
        store.check_partitions().await?;
        store.start_sweeping(self.sweep_every);
        Ok(store)
    }
}

/// True for a `rediss://` URL (TLS).
pub(crate) fn is_tls_url(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// `url` without its password, for an error message.
#[cfg(feature = "tls")]
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The hash tag Redis Cluster hashes a name by: what lies between its first `{` and the
/// first `}` after it, when that is not empty.
pub(crate) fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let rest = &name[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The certificates in the `redis` client's form, after checking each PEM holds what it
/// must; `None` when nothing was given (the system's roots, no client certificate).
#[cfg(feature = "tls")]
fn redis_certificates(tls: &TlsOptions) -> Result<Option<::redis::TlsCertificates>, StoreError> {
    if !tls.is_set() {
        return Ok(None);
    }
    tls.parsed_roots()?;
    tls.parsed_client()?;
    Ok(Some(::redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| ::redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.roots.clone(),
    }))
}
