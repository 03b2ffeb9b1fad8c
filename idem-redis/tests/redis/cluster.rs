//! `RedisStore` on a real Redis Cluster, spread over its masters in partitions: the store
//! conformance suite, where the records land (asked of each server), and the partition
//! count's checks.
//!
//! Needs a cluster: `IDEM_REDIS_CLUSTER_URLS=redis://127.0.0.1:7000/,redis://…` (the
//! masters' URLs, comma-separated; `.ci/services.sh` starts one of three masters and exports
//! it). The partition-count checks also run on a single Redis (`IDEM_REDIS_URL`). Without
//! the variables every check prints why it is skipped, and fails when
//! `IDEM_REQUIRE_BACKENDS=1`. Each check works under its own key prefix and deletes it
//! afterwards.

use crate::garbage;
use idem_test::stores::unique_prefix;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{IdemStore, RecordState, StoreError};

const VAR: &str = "IDEM_REDIS_CLUSTER_URLS";

/// One partition per master of the three-master test cluster.
const PARTITIONS: u16 = 3;

fn nodes() -> Option<Vec<String>> {
    let v = std::env::var(VAR).ok()?;
    let nodes: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    (!nodes.is_empty()).then_some(nodes)
}

fn skip_reason() -> String {
    format!(
        "{VAR} not set; start a Redis Cluster and export {VAR}=redis://127.0.0.1:7000/,… (the \
         masters' URLs) to run the Redis Cluster checks (.ci/run does this)"
    )
}

/// The keys under `prefix` on each server, by node URL (every node is a master here).
async fn keys_by_node(nodes: &[String], prefix: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for node in nodes {
        let client = redis::Client::open(node.as_str()).expect("node URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        out.insert(node.clone(), keys);
    }
    out
}

/// A key prefix of its own on the cluster, deleted with everything under it when dropped.
struct Prefix {
    nodes: Vec<String>,
    prefix: String,
}

impl Drop for Prefix {
    fn drop(&mut self) {
        for node in &self.nodes {
            let Ok(client) = redis::Client::open(node.as_str()) else {
                continue;
            };
            let Ok(mut conn) = client.get_connection() else {
                continue;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*", self.prefix))
                .query(&mut conn)
                .unwrap_or_default();
            // One DEL per key: a node refuses a DEL naming keys of several slots.
            for k in keys {
                let _: Result<(), _> = redis::cmd("DEL").arg(k).query(&mut conn);
            }
        }
    }
}

struct Cluster;

impl Cluster {
    async fn store(at: &Prefix) -> Result<RedisStore, StoreError> {
        RedisStore::cluster(at.nodes.iter().cloned())
            .prefix(at.prefix.as_str())
            .partitions(PARTITIONS)
            .connect()
            .await
    }
}

impl StoreFactory for Cluster {
    type Store = RedisStore;
    type Location = Prefix;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        nodes().is_none().then(skip_reason)
    }

    async fn location(&self) -> Result<Prefix, StoreError> {
        let nodes = nodes().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(Prefix {
            nodes,
            prefix: unique_prefix("cluster"),
        })
    }

    async fn open(&self, at: &Prefix, options: &StoreOptions) -> Result<RedisStore, StoreError> {
        RedisStore::cluster(at.nodes.iter().cloned())
            .prefix(at.prefix.as_str())
            .partitions(PARTITIONS)
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .connect()
            .await
    }

    async fn corrupt(&self, at: &Prefix, key: &IdemKey) -> Result<bool, StoreError> {
        let record_key = Cluster::store(at).await?.record_key(key);
        let client = redis::cluster::ClusterClient::new(at.nodes.clone())
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = client
            .get_async_connection()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        garbage::overwrite_with_garbage(&mut conn, &record_key).await
    }
}

idem_runtime::store_conformance_tests!(Cluster);

fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint(name),
        tool: "t".into(),
        lease: Duration::from_secs(60),
        operation: None,
    }
}

/// Records spread over every master, and each partition lives whole on one master: asked
/// of the servers themselves (`KEYS` on each node), not of the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_spread_over_every_master() {
    let Some(nodes) = nodes() else {
        conformance::skip("this Redis Cluster check", &skip_reason());
        return;
    };
    let at = Prefix {
        nodes: nodes.clone(),
        prefix: unique_prefix("spread"),
    };
    let store = Cluster::store(&at).await.expect("connect");
    const CALLS: usize = 300;
    for i in 0..CALLS {
        let req = request(&format!("spread-{i}"));
        let t = match store.claim(&req).await.expect("claim") {
            ClaimOutcome::Claimed(t) => t,
            other => panic!("a fresh key must be claimed, got {other:?}"),
        };
        if i % 2 == 0 {
            store
                .settle(&req.key, t, Settlement::new(RecordState::Completed))
                .await
                .expect("settle");
        }
    }
    let by_node = keys_by_node(&nodes, &at.prefix).await;
    let mut tags_by_node: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut records_by_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (node, keys) in &by_node {
        for k in keys {
            let rest = &k[at.prefix.len()..];
            if let Some(tagged) = rest.strip_prefix('{') {
                let (tag, name) = tagged.split_once("}:").expect("a partition's key");
                tags_by_node.entry(node).or_default().insert(tag);
                if name.starts_with("r:") {
                    *records_by_node.entry(node).or_default() += 1;
                }
            }
        }
    }
    eprintln!("records by master ({CALLS} claims, {PARTITIONS} partitions): {records_by_node:?}");
    eprintln!("partition tags by master: {tags_by_node:?}");
    assert_eq!(
        records_by_node.values().sum::<usize>(),
        CALLS,
        "every claim is one record on some master"
    );
    assert_eq!(
        records_by_node.len(),
        nodes.len(),
        "every master holds records: {records_by_node:?}"
    );
    for n in records_by_node.values() {
        assert!(
            *n >= CALLS / nodes.len() / 2,
            "a master holds far less than its share: {records_by_node:?}"
        );
    }
    let mut seen = BTreeSet::new();
    for tags in tags_by_node.values() {
        for t in tags {
            assert!(
                seen.insert(*t),
                "partition {t} has keys on two masters: {tags_by_node:?}"
            );
        }
    }
    assert_eq!(seen.len(), usize::from(PARTITIONS));
    // And the store lists them all, merged across the partitions.
    let running = store
        .list(RecordState::Running, usize::MAX)
        .await
        .expect("list");
    assert_eq!(running.len(), CALLS / 2);
}

/// A one-partition store on a cluster without a hash tag in its prefix would send scripts
/// naming keys of several slots: refused at connect, with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_partition_without_a_hash_tag_is_refused_on_a_cluster() {
    let Some(nodes) = nodes() else {
        conformance::skip("this Redis Cluster check", &skip_reason());
        return;
    };
    let at = Prefix {
        nodes: nodes.clone(),
        prefix: unique_prefix("untagged"),
    };
    match RedisStore::cluster(nodes.clone())
        .prefix(at.prefix.as_str())
        .connect()
        .await
    {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("partitions"), "{msg}"),
        other => panic!("expected a Backend error, got {other:?}"),
    }
    // With its prefix in a hash tag, one partition works (the whole store in one slot).
    let tagged = format!("{{{}}}:", at.prefix.trim_end_matches(':'));
    let _clean = Prefix {
        nodes: nodes.clone(),
        prefix: tagged.clone(),
    };
    let store = RedisStore::cluster(nodes)
        .prefix(tagged.as_str())
        .connect()
        .await
        .expect("a tagged prefix connects");
    let req = request("tagged");
    assert!(matches!(
        store.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    assert_eq!(
        store.get(&req.key).await.expect("get").map(|r| r.state),
        Some(RecordState::Running)
    );
}

/// The partition count is recorded by the first store and a store built with another count
/// is refused (it would look for keys in the wrong partitions), as is a partitioned store
/// over an unpartitioned store's data. On a single Redis, where partitions work too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_count_is_fixed_for_a_stores_life() {
    let Some(url) = conformance::backend_url("IDEM_REDIS_URL", "this Redis partition check") else {
        return;
    };
    let at = Prefix {
        nodes: vec![url.clone()],
        prefix: unique_prefix("count"),
    };
    let open = |n: u16| {
        RedisStore::builder(url.as_str())
            .prefix(at.prefix.as_str())
            .partitions(n)
            .connect()
    };
    let four = open(4).await.expect("the first store sets the count");
    assert_eq!(four.partitions(), 4);
    let req = request("count");
    assert!(matches!(
        four.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    for n in [1, 3, 5] {
        match open(n).await {
            Err(StoreError::Backend(msg)) => assert!(msg.contains("fixed"), "{msg}"),
            other => panic!("{n} partitions over a 4-partition store: got {other:?}"),
        }
    }
    let again = open(4).await.expect("the same count connects");
    assert_eq!(
        again.get(&req.key).await.expect("get").map(|r| r.state),
        Some(RecordState::Running),
        "a second handle with the same count finds the record"
    );

    // An unpartitioned store written before the count was recorded (its marker deleted to
    // play an older version) is not silently hidden by a partitioned one.
    let old = Prefix {
        nodes: vec![url.clone()],
        prefix: unique_prefix("legacy"),
    };
    let one = RedisStore::builder(url.as_str())
        .prefix(old.prefix.as_str())
        .connect()
        .await
        .expect("connect");
    assert!(matches!(
        one.claim(&request("legacy")).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("{}partitions", old.prefix))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1, "a one-partition store records its count too");
    match RedisStore::builder(url.as_str())
        .prefix(old.prefix.as_str())
        .partitions(2)
        .connect()
        .await
    {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("unpartitioned"), "{msg}"),
        other => panic!("a partitioned store over unpartitioned data: got {other:?}"),
    }
    // Bad counts and braces in a partitioned prefix are configuration errors.
    for (n, prefix) in [(0, "idem-test:x:"), (1025, "idem-test:x:"), (2, "{x}:")] {
        match RedisStore::builder(url.as_str())
            .prefix(prefix)
            .partitions(n)
            .connect()
            .await
        {
            Err(StoreError::Backend(_)) => {}
            other => panic!("{n} partitions under {prefix}: got {other:?}"),
        }
    }
}

/// Every master's functions and script cache flushed (a restart, a failover, an
/// operator): the first call that misses the library loads it again on every master, and
/// nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_on_every_master_is_survived() {
    let Some(nodes) = nodes() else {
        conformance::skip("this Redis Cluster check", &skip_reason());
        return;
    };
    let at = Prefix {
        nodes: nodes.clone(),
        prefix: unique_prefix("flush"),
    };
    let store = Cluster::store(&at).await.expect("connect");
    let reqs: Vec<ClaimRequest> = (0..12).map(|i| request(&format!("flush-{i}"))).collect();
    let mut tokens = Vec::new();
    for req in &reqs {
        match store.claim(req).await.expect("claim") {
            ClaimOutcome::Claimed(t) => tokens.push(t),
            other => panic!("a fresh key must be claimed, got {other:?}"),
        }
    }
    for node in &nodes {
        let client = redis::Client::open(node.as_str()).expect("node URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let () = redis::pipe()
            .cmd("FUNCTION")
            .arg("FLUSH")
            .cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("FUNCTION FLUSH, SCRIPT FLUSH");
    }
    for (req, t) in reqs.iter().zip(tokens) {
        store
            .settle(&req.key, t, Settlement::new(RecordState::Completed))
            .await
            .expect("settle after the flush");
    }
    let done = store
        .list(RecordState::Completed, usize::MAX)
        .await
        .expect("list");
    assert_eq!(
        done.len(),
        reqs.len(),
        "every settle after the flush landed"
    );
    // Functions are per node: the reload put the library back on every master.
    let library = store.function_library().expect("Redis 7 has FUNCTION");
    for node in &nodes {
        let client = redis::Client::open(node.as_str()).expect("node URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(library)
            .query_async(&mut conn)
            .await
            .expect("FUNCTION LIST");
        assert_eq!(listed.len(), 1, "{library} is loaded on {node}");
    }
}
