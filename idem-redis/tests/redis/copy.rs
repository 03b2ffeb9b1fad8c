//! `RedisStore::copy_into`: a store copied into another layout (a new partition count, a new
//! prefix) answers every key as the old one did — asked of both stores through the store
//! contract, not of the copy's own report — and a copy that could lose or mix up records
//! refuses before writing.
//!
//! Needs a Redis (`IDEM_REDIS_URL`) and, for the cluster check, a Redis Cluster
//! (`IDEM_REDIS_CLUSTER_URLS`); `.ci/run` starts both. Without them every check prints why it
//! is skipped, and fails when `IDEM_REQUIRE_BACKENDS=1`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance;
use idem_runtime::store::{
    IdemStore, ManualClock, RecordState, ReleaseNote, Retention, StoreError, Timestamp,
};

const LEASE: Duration = Duration::from_secs(10);

/// Every key under a prefix of its own on each of `urls`, deleted when dropped.
struct Prefixes {
    urls: Vec<String>,
    prefixes: Vec<String>,
}

impl Prefixes {
    fn new(urls: &[String]) -> Prefixes {
        Prefixes {
            urls: urls.to_vec(),
            prefixes: Vec::new(),
        }
    }

    /// A fresh prefix, in a hash tag when `tagged` (a one-partition store on a cluster).
    fn fresh(&mut self, tagged: bool) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "idem-test-copy-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let prefix = if tagged {
            format!("{{{name}}}:")
        } else {
            format!("{name}:")
        };
        self.prefixes.push(prefix.clone());
        prefix
    }
}

impl Drop for Prefixes {
    fn drop(&mut self) {
        for url in &self.urls {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                continue;
            };
            let Ok(mut conn) = client.get_connection() else {
                continue;
            };
            for prefix in &self.prefixes {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{prefix}*"))
                    .query(&mut conn)
                    .unwrap_or_default();
                // One DEL per key: a cluster node refuses a DEL naming keys of several slots.
                for k in keys {
                    let _: Result<(), _> = redis::cmd("DEL").arg(k).query(&mut conn);
                }
            }
        }
    }
}

fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint(name),
        tool: "copied_tool".into(),
        lease: LEASE,
        operation: None,
    }
}

async fn claimed(store: &RedisStore, req: &ClaimRequest) -> idem_runtime::store::ClaimToken {
    match store.claim(req).await.expect("claim") {
        ClaimOutcome::Claimed(t) => t,
        other => panic!("a fresh key must be claimed, got {other:?}"),
    }
}

/// What the source holds after [`populate`]: every key with a record, and the keys freed
/// with a trace.
struct Population {
    records: Vec<IdemKey>,
    released: Vec<IdemKey>,
}

/// Records in every state a copy may meet, with evidence: completed (with results), failed,
/// pending (with a downstream ref), unknown, escalated, a claim whose lease lapses (it must
/// arrive *unknown*), and keys released with a trace.
async fn populate(store: &RedisStore, clock: &ManualClock, n: usize) -> Population {
    let mut records = Vec::new();
    let mut released = Vec::new();
    let lapsing = request("lapsing");
    claimed(store, &lapsing).await;
    records.push(lapsing.key.clone());
    for i in 0..n {
        let req = request(&format!("record-{i}"));
        let token = claimed(store, &req).await;
        let mut s = match i % 6 {
            0 | 1 => {
                let mut s = Settlement::new(RecordState::Completed);
                s.payload = Some(serde_json::json!({ "charge": i, "note": "ünïcode ✓" }));
                s
            }
            2 => {
                let mut s = Settlement::new(RecordState::Failed);
                s.message = Some(format!("card {i} declined"));
                s
            }
            3 => {
                let mut s = Settlement::new(RecordState::Pending);
                s.downstream_ref = Some(format!("ch_{i}"));
                s
            }
            4 => Settlement::new(RecordState::Unknown),
            _ => Settlement::new(RecordState::Escalated),
        };
        s.message.get_or_insert_with(|| format!("settled {i}"));
        if i % 9 == 8 {
            // Freed with a trace: the key is free, the trace says who freed it and why.
            let mut s = Settlement::new(RecordState::Unknown);
            s.message = Some("nothing was sent".into());
            let note = ReleaseNote {
                by: "a person".into(),
                note: format!("release {i}"),
            };
            store
                .release_traced(&req.key, token, s, &note)
                .await
                .expect("release_traced");
            released.push(req.key.clone());
        } else {
            store.settle(&req.key, token, s).await.expect("settle");
            records.push(req.key.clone());
        }
        clock.advance(Duration::from_millis(3));
    }
    // The first claim's lease passes: a copy meets it as unknown.
    clock.advance(LEASE * 2);
    Population { records, released }
}

/// Both stores answer every key, listing and release listing the same way.
async fn assert_same_answers(old: &RedisStore, new: &RedisStore, population: &Population) {
    for key in &population.records {
        let before = old.get(key).await.expect("get from the old store");
        let after = new.get(key).await.expect("get from the copy");
        assert!(before.is_some(), "{key} has a record in the old store");
        assert_eq!(before, after, "{key} reads differently after the copy");
    }
    for key in &population.released {
        assert_eq!(old.get(key).await.expect("get"), None);
        assert_eq!(new.get(key).await.expect("get"), None);
        let before = old.releases(key).await.expect("releases");
        assert_eq!(before.len(), 1, "{key} has one release in the old store");
        assert_eq!(before, new.releases(key).await.expect("releases"));
    }
    for state in RecordState::ALL {
        let before = old.list(state, 10_000).await.expect("list");
        let after = new.list(state, 10_000).await.expect("list");
        assert_eq!(before, after, "the {state:?} listing changed");
    }
    let before = old
        .list_releases(None, 10_000)
        .await
        .expect("list_releases");
    assert_eq!(before.len(), population.released.len());
    assert_eq!(
        before,
        new.list_releases(None, 10_000)
            .await
            .expect("list_releases")
    );
}

/// Repeats on the copy: a completed key replays its result, a lapsed claim is unknown
/// (never free), a released key may run again.
async fn assert_repeats_are_answered(new: &RedisStore, population: &Population) {
    let completed = request("record-0");
    match new.claim(&completed).await.expect("claim") {
        ClaimOutcome::Existing(r) => {
            assert_eq!(r.state, RecordState::Completed);
            assert_eq!(
                r.payload,
                Some(serde_json::json!({ "charge": 0, "note": "ünïcode ✓" }))
            );
        }
        other => panic!("a completed key must replay on the copy, got {other:?}"),
    }
    match new.claim(&request("lapsing")).await.expect("claim") {
        ClaimOutcome::Existing(r) => assert_eq!(r.state, RecordState::Unknown),
        other => panic!("a lapsed claim must stay unknown on the copy, got {other:?}"),
    }
    let freed = population.released.first().expect("a released key");
    let req = ClaimRequest {
        key: freed.clone(),
        ..request("record-8")
    };
    assert!(matches!(
        new.claim(&req).await.expect("claim"),
        ClaimOutcome::Claimed(_)
    ));
}

fn single_url(check: &str) -> Option<String> {
    conformance::backend_url("IDEM_REDIS_URL", check)
}

async fn store(url: &str, prefix: &str, partitions: u16, clock: &ManualClock) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .partitions(partitions)
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect")
}

fn clock() -> ManualClock {
    ManualClock::new(Timestamp(1_800_000_000_000))
}

/// One partition copied into three: every record, listing and trace reads the same, the
/// keys spread over the three, and a second copy changes nothing.
#[tokio::test]
async fn a_copy_into_more_partitions_answers_every_key_as_before() {
    let Some(url) = single_url("copying a Redis store") else {
        return;
    };
    let mut prefixes = Prefixes::new(std::slice::from_ref(&url));
    let clock = clock();
    let old = store(&url, &prefixes.fresh(false), 1, &clock).await;
    let new = store(&url, &prefixes.fresh(false), 3, &clock).await;
    let population = populate(&old, &clock, 60).await;

    let copied = old.copy_into(&new).await.expect("copy");
    assert_eq!(copied.records, population.records.len());
    assert_eq!(copied.traces, population.released.len());
    assert_eq!(copied.lapsed, 0);
    assert_eq!(copied.per_partition.len(), 3);
    assert_eq!(
        copied.per_partition.iter().sum::<usize>(),
        population.records.len()
    );
    assert!(
        copied.per_partition.iter().all(|&n| n > 0),
        "{:?}",
        copied.per_partition
    );
    assert_same_answers(&old, &new, &population).await;

    // Again (a copy cut off half-way is run again): the same, and nothing doubles.
    let again = old.copy_into(&new).await.expect("copy again");
    assert_eq!(again, copied);
    assert_same_answers(&old, &new, &population).await;

    assert_repeats_are_answered(&new, &population).await;
}

/// A live claim (its lease not passed) refuses the copy before anything is written: its
/// worker would settle it in the old store.
#[tokio::test]
async fn a_running_claim_refuses_the_copy() {
    let Some(url) = single_url("copying a Redis store") else {
        return;
    };
    let mut prefixes = Prefixes::new(std::slice::from_ref(&url));
    let clock = clock();
    let old = store(&url, &prefixes.fresh(false), 1, &clock).await;
    let new = store(&url, &prefixes.fresh(false), 2, &clock).await;
    let done = request("done");
    let t = claimed(&old, &done).await;
    old.settle(&done.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    let live = request("live");
    let token = claimed(&old, &live).await;

    let err = old.copy_into(&new).await.expect_err("a live claim");
    assert!(
        matches!(&err, StoreError::Backend(m) if m.contains("running")),
        "{err:?}"
    );
    assert_eq!(
        new.get(&done.key).await.expect("get"),
        None,
        "nothing copied"
    );

    // Settled, the copy goes through.
    old.settle(&live.key, token, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    let copied = old.copy_into(&new).await.expect("copy");
    assert_eq!(copied.records, 2);
    assert_eq!(
        old.get(&live.key).await.expect("get"),
        new.get(&live.key).await.expect("get")
    );
}

/// A target holding another record for a key fails the copy, and keeps its own record.
#[tokio::test]
async fn a_target_holding_another_record_is_a_conflict() {
    let Some(url) = single_url("copying a Redis store") else {
        return;
    };
    let mut prefixes = Prefixes::new(std::slice::from_ref(&url));
    let clock = clock();
    let old = store(&url, &prefixes.fresh(false), 1, &clock).await;
    let new = store(&url, &prefixes.fresh(false), 1, &clock).await;
    let req = request("shared");
    let t = claimed(&old, &req).await;
    old.settle(&req.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    // The target ran the same key with other arguments.
    let other = ClaimRequest {
        fingerprint: conformance::fingerprint("other arguments"),
        ..req.clone()
    };
    let t = claimed(&new, &other).await;
    new.settle(&other.key, t, Settlement::new(RecordState::Failed))
        .await
        .expect("settle");
    let theirs = new.get(&req.key).await.expect("get");

    let err = old.copy_into(&new).await.expect_err("a conflict");
    assert!(
        matches!(&err, StoreError::Backend(m) if m.contains("another record")),
        "{err:?}"
    );
    assert_eq!(new.get(&req.key).await.expect("get"), theirs);
}

/// A completed record whose tombstone window (the target's) has passed is not copied: both
/// stores answer for it as for a key never claimed.
#[tokio::test]
async fn lapsed_tombstones_are_left_behind() {
    let Some(url) = single_url("copying a Redis store") else {
        return;
    };
    let mut prefixes = Prefixes::new(std::slice::from_ref(&url));
    let clock = clock();
    let old = store(&url, &prefixes.fresh(false), 1, &clock).await;
    let short = Retention {
        results: Duration::from_secs(600),
        tombstones: Duration::from_secs(3600),
    };
    let new = RedisStore::builder(url.as_str())
        .prefix(prefixes.fresh(false))
        .partitions(2)
        .clock(Arc::new(clock.clone()))
        .retention(short)
        .connect()
        .await
        .expect("connect");
    let req = request("old news");
    let t = claimed(&old, &req).await;
    old.settle(&req.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    clock.advance(Duration::from_secs(7200));

    let copied = old.copy_into(&new).await.expect("copy");
    assert_eq!((copied.records, copied.lapsed), (0, 1));
    assert_eq!(new.get(&req.key).await.expect("get"), None);
    assert!(old.get(&req.key).await.expect("get").is_some());
}

/// On a Redis Cluster: a one-partition store (one slot, one master) copied into three
/// partitions lands on every master, and reads the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_spreads_over_its_masters() {
    let Some(urls) = conformance::backend_url("IDEM_REDIS_CLUSTER_URLS", "copying on a cluster")
    else {
        return;
    };
    let nodes: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let mut prefixes = Prefixes::new(&nodes);
    let clock = clock();
    let connect = |prefix: String, partitions: u16| {
        RedisStore::cluster(nodes.clone())
            .prefix(prefix)
            .partitions(partitions)
            .clock(Arc::new(clock.clone()))
            .connect()
    };
    let old = connect(prefixes.fresh(true), 1).await.expect("connect");
    let new = connect(prefixes.fresh(false), 3).await.expect("connect");
    let population = populate(&old, &clock, 45).await;

    let copied = old.copy_into(&new).await.expect("copy");
    assert_eq!(copied.records, population.records.len());
    assert_same_answers(&old, &new, &population).await;

    // Asked of the servers: every master holds some of the copy's records.
    let new_prefix = prefixes.prefixes[1].clone();
    for node in &nodes {
        let client = redis::Client::open(node.as_str()).expect("node URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to a node");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{new_prefix}*r:*"))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        assert!(!keys.is_empty(), "master {node} holds none of the copy");
    }
}
