//! `RedisStore` over TLS with certificates the system does not trust: a private CA named
//! with `tls_root_certificates`, and servers that require a client certificate
//! (`tls_client_certificate`). The whole conformance suite runs on a three-master Redis
//! Cluster that serves TLS only (on its cluster bus too), so every byte of every check went
//! over TLS; the single-server checks show what is refused, and that it fails at connect.
//!
//! Needs what `.ci/services.sh` starts and exports: `IDEM_REDIS_TLS_CLUSTER_URLS`
//! (`rediss://` URLs of the masters), `IDEM_REDIS_TLS_URL` (one TLS-only server),
//! `IDEM_REDIS_TLS_CA`, `IDEM_REDIS_TLS_OTHER_CA`, `IDEM_REDIS_TLS_CLIENT_CERT` and
//! `IDEM_REDIS_TLS_CLIENT_KEY` (PEM files). Without them every check prints why it skips,
//! and fails when `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(feature = "tls")]

use crate::garbage;
use idem_test::stores::unique_prefix;

use std::time::Duration;

use idem_redis::{RedisStore, RedisStoreBuilder};
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{IdemStore, RecordState, StoreError};

/// One partition per master of the three-master test cluster.
const PARTITIONS: u16 = 3;

/// The PEM files and URLs of the TLS services.
#[derive(Clone)]
struct Tls {
    cluster: Vec<String>,
    single: String,
    ca: Vec<u8>,
    other_ca: Vec<u8>,
    client_cert: Vec<u8>,
    client_key: Vec<u8>,
}

const VARS: [&str; 6] = [
    "IDEM_REDIS_TLS_CLUSTER_URLS",
    "IDEM_REDIS_TLS_URL",
    "IDEM_REDIS_TLS_CA",
    "IDEM_REDIS_TLS_OTHER_CA",
    "IDEM_REDIS_TLS_CLIENT_CERT",
    "IDEM_REDIS_TLS_CLIENT_KEY",
];

fn skip_reason() -> String {
    format!(
        "{} not all set; source .ci/services.sh and run idem_services_start (.ci/run does)",
        VARS.join(", ")
    )
}

impl Tls {
    fn from_env() -> Option<Tls> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let file = |name: &str| {
            let path = var(name)?;
            Some(std::fs::read(&path).unwrap_or_else(|e| panic!("{name}={path}: {e}")))
        };
        Some(Tls {
            cluster: var(VARS[0])?
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            single: var(VARS[1])?,
            ca: file(VARS[2])?,
            other_ca: file(VARS[3])?,
            client_cert: file(VARS[4])?,
            client_key: file(VARS[5])?,
        })
    }

    /// The TLS services, or `None` after skipping `check`.
    fn or_skip(check: &str) -> Option<Tls> {
        let tls = Tls::from_env();
        if tls.is_none() {
            conformance::skip(check, &skip_reason());
        }
        tls
    }

    /// A cluster store builder with the right CA and the client certificate.
    fn cluster_store(&self, prefix: &str) -> RedisStoreBuilder {
        RedisStore::cluster(self.cluster.iter().cloned())
            .prefix(prefix)
            .partitions(PARTITIONS)
            .tls_root_certificates(self.ca.clone())
            .tls_client_certificate(self.client_cert.clone(), self.client_key.clone())
    }

    /// A raw cluster client with the same certificates, for clean-up and corruption.
    fn raw_cluster(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClientBuilder::new(self.cluster.iter().map(String::as_str))
            .certs(redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: self.client_cert.clone(),
                    client_key: self.client_key.clone(),
                }),
                root_cert: Some(self.ca.clone()),
            })
            .build()
            .expect("a TLS cluster client")
    }
}

/// A key prefix of its own on the TLS cluster, deleted with everything under it when
/// dropped.
struct Prefix {
    tls: Tls,
    prefix: String,
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(mut conn) = self.tls.raw_cluster().get_connection() else {
            return;
        };
        // `KEYS` goes to every master through the cluster connection, merged.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        for k in keys {
            let _: Result<(), _> = redis::cmd("DEL").arg(k).query(&mut conn);
        }
    }
}

struct TlsCluster;

impl StoreFactory for TlsCluster {
    type Store = RedisStore;
    type Location = Prefix;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        Tls::from_env().is_none().then(skip_reason)
    }

    async fn location(&self) -> Result<Prefix, StoreError> {
        let tls = Tls::from_env().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(Prefix {
            tls,
            prefix: unique_prefix("tls-cluster"),
        })
    }

    async fn open(&self, at: &Prefix, options: &StoreOptions) -> Result<RedisStore, StoreError> {
        at.tls
            .cluster_store(&at.prefix)
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .connect()
            .await
    }

    async fn corrupt(&self, at: &Prefix, key: &IdemKey) -> Result<bool, StoreError> {
        let record_key = at
            .tls
            .cluster_store(&at.prefix)
            .connect()
            .await?
            .record_key(key);
        let mut conn = at
            .tls
            .raw_cluster()
            .get_async_connection()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        garbage::overwrite_with_garbage(&mut conn, &record_key).await
    }
}

idem_runtime::store_conformance_tests!(TlsCluster);

fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint(name),
        tool: "t".into(),
        lease: Duration::from_secs(60),
        operation: None,
    }
}

/// A single server's builder with short timeouts, so a refused handshake fails fast.
fn single(tls: &Tls, prefix: &str) -> RedisStoreBuilder {
    RedisStore::builder(tls.single.as_str())
        .prefix(prefix)
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .reconnect_retries(0)
}

/// With the private CA and a client certificate a store works, and a second store (a new
/// connection, a new handshake) reads back what the first one settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_and_a_client_certificate_get_through() {
    let Some(tls) = Tls::or_skip("this Redis TLS check") else {
        return;
    };
    let prefix = unique_prefix("tls-single");
    let open = || {
        single(&tls, &prefix)
            .tls_root_certificates(tls.ca.clone())
            .tls_client_certificate(tls.client_cert.clone(), tls.client_key.clone())
            .connect()
    };
    let store = open()
        .await
        .expect("connect with the CA and a client certificate");
    let req = request("tls-single");
    let ClaimOutcome::Claimed(token) = store.claim(&req).await.expect("claim") else {
        panic!("a fresh key must be claimed");
    };
    store
        .settle(&req.key, token, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    let other = open().await.expect("a second connection");
    let record = other.get(&req.key).await.expect("get").expect("the record");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.fingerprint, req.fingerprint);
}

/// Each missing or wrong piece is refused when the store connects: no client certificate
/// (the server requires one), a CA that did not sign the server's certificate, and the
/// system's roots (which do not hold the private CA).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_certificate_is_refused_at_connect() {
    let Some(tls) = Tls::or_skip("this Redis TLS check") else {
        return;
    };
    let prefix = unique_prefix("tls-refused");
    let cases: [(&str, RedisStoreBuilder); 3] = [
        (
            "no client certificate",
            single(&tls, &prefix).tls_root_certificates(tls.ca.clone()),
        ),
        (
            "another CA",
            single(&tls, &prefix)
                .tls_root_certificates(tls.other_ca.clone())
                .tls_client_certificate(tls.client_cert.clone(), tls.client_key.clone()),
        ),
        (
            "the system's roots",
            single(&tls, &prefix)
                .tls_client_certificate(tls.client_cert.clone(), tls.client_key.clone()),
        ),
    ];
    for (case, builder) in cases {
        match builder.connect().await {
            Err(StoreError::Unavailable(_) | StoreError::Backend(_)) => {}
            other => panic!("{case}: the store must not connect, got {other:?}"),
        }
    }
    // And on the cluster, another CA is refused too.
    match RedisStore::cluster(tls.cluster.iter().cloned())
        .prefix(prefix.as_str())
        .partitions(PARTITIONS)
        .connection_timeout(Duration::from_secs(2))
        .reconnect_retries(0)
        .tls_root_certificates(tls.other_ca.clone())
        .tls_client_certificate(tls.client_cert.clone(), tls.client_key.clone())
        .connect()
        .await
    {
        Err(StoreError::Unavailable(_) | StoreError::Backend(_)) => {}
        other => panic!("a cluster store with another CA must not connect, got {other:?}"),
    }
}

/// Certificates given for a clear-text URL are refused, not silently unused, and so is a
/// PEM that holds no certificate: before any connection is made.
#[tokio::test]
async fn certificates_for_a_clear_text_url_or_an_empty_pem_are_refused() {
    // Port 9 (discard) on loopback: nothing is reached, the refusal comes first.
    let clear = RedisStore::builder("redis://127.0.0.1:9/")
        .tls_root_certificates(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
        )
        .connect()
        .await;
    match clear {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("rediss://"), "{msg}"),
        other => panic!("certificates with redis:// must be refused, got {other:?}"),
    }
    let empty = RedisStore::cluster(["rediss://127.0.0.1:9/"])
        .prefix("{p}:")
        .tls_root_certificates(Vec::new())
        .connect()
        .await;
    match empty {
        Err(StoreError::Backend(msg)) => {
            assert!(msg.contains("tls_root_certificates"), "{msg}")
        }
        other => panic!("an empty root PEM must be refused, got {other:?}"),
    }
}
