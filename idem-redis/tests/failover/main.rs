//! A failover does not forget a claim made with `wait_for_replicas`: against a real primary
//! and replica on loopback (`.ci/services.sh` starts them: IDEM_REDIS_PRIMARY_URL,
//! IDEM_REDIS_REPLICA_URL and their pids), the replica is stalled (SIGSTOP) and cut off, the
//! primary killed right after the claims and the replica promoted (`REPLICAOF NO ONE`).
//!
//! With the option, a claim the replica does not confirm is refused as a store error and
//! nothing runs, and no claim it confirmed is lost: every call repeated on the promoted
//! replica runs its handler at most once in all. Without it, the test counts the calls
//! whose claim the failover forgot (their repeat ran the handler a second time) and prints
//! the figures, with the median claim latency with and without the wait.
//!
//! It kills the primary, so it runs in a binary of its own, on servers nothing else uses,
//! and once per start of the pair.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_redis::RedisStore;
use idem_runtime::call::ToolCall;
use idem_runtime::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
use idem_runtime::registry::{Registry, RetryPolicy};
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance;
use idem_runtime::store::IdemStore;
use idem_runtime::tool::{ToolError, ToolSpec, WriteCtx, WriteTool};
use serde_json::json;

/// Calls per set.
const N: u64 = 100;
/// Calls per set with the option while the replica cannot confirm (each waits `WAIT_FOR`).
const REFUSED: u64 = 20;
const WAIT_FOR: Duration = Duration::from_millis(100);
/// Claims timed for the latency figures, per store.
const TIMED: usize = 400;

/// The downstream: how many times each (set, id) was charged.
#[derive(Default)]
struct Ledger(Mutex<BTreeMap<(String, u64), u32>>);

impl Ledger {
    fn charges(&self, set: &str) -> u32 {
        let l = self.0.lock().unwrap();
        l.iter()
            .filter(|((s, _), _)| s == set)
            .map(|(_, n)| n)
            .sum()
    }
    /// Ids of `set` charged more than once.
    fn duplicates(&self, set: &str) -> usize {
        let l = self.0.lock().unwrap();
        l.iter().filter(|((s, _), n)| s == set && **n > 1).count()
    }
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    set: String,
    id: u64,
}

struct Charge(Arc<Ledger>);

impl WriteTool for Charge {
    type Args = Args;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<u64, ToolError> {
        *self
            .0
             .0
            .lock()
            .unwrap()
            .entry((args.set, args.id))
            .or_default() += 1;
        Ok(args.id)
    }
}

fn registry(store: RedisStore, ledger: &Arc<Ledger>) -> Registry {
    Registry::builder()
        .store(store)
        .retry_policy(RetryPolicy::never())
        .tool(Charge(ledger.clone()))
        .build()
        .unwrap()
}

fn call(set: &str, id: u64) -> ToolCall {
    ToolCall::new("failover-run", "charge", json!({"set": set, "id": id}))
        .intent(format!("{set}-{id}"))
}

/// Calls every id of `set` once; returns how many completed.
async fn call_all(registry: &Registry, set: &str, n: u64) -> u64 {
    let mut done = 0;
    for id in 0..n {
        if registry.call(call(set, id)).await.is_completed() {
            done += 1;
        }
    }
    done
}

fn signal(sig: &str, pid: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn info_replication(url: &str) -> String {
    redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut raw(url).await)
        .await
        .unwrap()
}

/// Waits until the replica has caught up with the primary (its link is up and the primary
/// says the replica acknowledged its whole offset).
async fn caught_up(primary: &str) {
    for _ in 0..300 {
        let info = info_replication(primary).await;
        let offset = info
            .lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .unwrap_or("x")
            .trim()
            .to_owned();
        if info.contains("state=online") && info.contains(&format!("offset={offset},")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the replica did not catch up:\n{}",
        info_replication(primary).await
    );
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median claim latency of `store`, claiming fresh keys.
async fn claim_latency(store: &RedisStore, tag: &str) -> Duration {
    let mut times = Vec::with_capacity(TIMED);
    for i in 0..TIMED {
        let key = IdemKey::derive(
            &Scope::run("failover-latency"),
            "charge",
            KeyMaterial::Intent(&format!("{tag}-{i}")),
        );
        let req = ClaimRequest {
            key,
            fingerprint: Fingerprint::of_canonical(b"{}"),
            tool: "charge".into(),
            lease: Duration::from_secs(60),
            operation: None,
        };
        let t = Instant::now();
        let out = store.claim(&req).await.unwrap();
        times.push(t.elapsed());
        assert!(matches!(out, ClaimOutcome::Claimed(_)));
    }
    median(times)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_forgets_no_claim_the_replicas_confirmed() {
    let test = "redis failover";
    let (Some(primary), Some(replica), Some(primary_pid), Some(replica_pid)) = (
        conformance::backend_url("IDEM_REDIS_PRIMARY_URL", test),
        conformance::backend_url("IDEM_REDIS_REPLICA_URL", test),
        conformance::backend_url("IDEM_REDIS_PRIMARY_PID", test),
        conformance::backend_url("IDEM_REDIS_REPLICA_PID", test),
    ) else {
        return;
    };
    let prefix = idem_test::stores::unique_prefix("failover");
    let waiting = |url: &str| {
        RedisStore::builder(url)
            .prefix(prefix.clone())
            .wait_for_replicas(1, WAIT_FOR)
    };
    let plain = |url: &str| RedisStore::builder(url).prefix(prefix.clone());
    let ledger = Arc::new(Ledger::default());
    let with = registry(waiting(&primary).connect().await.unwrap(), &ledger);
    let without = registry(plain(&primary).connect().await.unwrap(), &ledger);
    caught_up(&primary).await;

    // A replica that answers: the price of the wait, measured side by side.
    let timed_with = waiting(&primary)
        .prefix(format!("{prefix}lat-w:"))
        .connect()
        .await
        .unwrap();
    let timed_without = plain(&primary)
        .prefix(format!("{prefix}lat-p:"))
        .connect()
        .await
        .unwrap();
    let (lat_with, lat_without) = (
        claim_latency(&timed_with, "with").await,
        claim_latency(&timed_without, "without").await,
    );

    // Confirmed claims, settled, while the replica answers.
    assert_eq!(call_all(&with, "confirmed", N).await, N);

    // The replica stalls. With the option: refused, nothing run, nothing left claimed.
    signal("-STOP", &replica_pid);
    for id in 0..REFUSED {
        let out = with.call(call("refused-stalled", id)).await;
        assert!(!out.is_completed(), "{}", out.text());
        let why = format!("{:?}", out.error());
        assert!(why.contains("replicas"), "{why}");
        let key = out.key().expect("a key").clone();
        let rec = with.store().get(&key).await.unwrap();
        assert_eq!(rec, None, "an unconfirmed claim is released");
    }
    assert_eq!(ledger.charges("refused-stalled"), 0, "nothing ran");
    // Without it: acknowledged by the primary alone.
    assert_eq!(call_all(&without, "stalled", N).await, N);

    // Its link drops while it is stalled (as Redis drops a replica whose output buffer
    // overflows, or a partition): what follows never reaches it.
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut raw(&primary).await)
        .await
        .unwrap();
    for id in 0..REFUSED {
        let out = with.call(call("refused-cut", id)).await;
        assert!(!out.is_completed(), "{}", out.text());
    }
    assert_eq!(ledger.charges("refused-cut"), 0, "nothing ran");
    assert_eq!(call_all(&without, "cut", N).await, N);

    // The primary dies right after; the replica resumes, reads what reached it, and is
    // promoted.
    signal("-KILL", &primary_pid);
    signal("-CONT", &replica_pid);
    for _ in 0..300 {
        if info_replication(&replica)
            .await
            .contains("master_link_status:down")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: redis::Value = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut raw(&replica).await)
        .await
        .unwrap();

    // The agents repeat every call on the promoted replica (a primary with no replica
    // left, so without the wait).
    let after = registry(plain(&replica).connect().await.unwrap(), &ledger);
    for (set, n) in [
        ("confirmed", N),
        ("refused-stalled", REFUSED),
        ("refused-cut", REFUSED),
        ("stalled", N),
        ("cut", N),
    ] {
        call_all(&after, set, n).await;
    }
    let lost = |set: &str| ledger.duplicates(set);
    eprintln!(
        "failover figures: with wait_for_replicas(1, {WAIT_FOR:?}): {} of {N} confirmed claims \
         lost, {} + {} of {REFUSED} refused claims run twice; without: {} of {N} lost with \
         the replica stalled, {} of {N} with its link cut; median claim {lat_with:?} with the \
         wait, {lat_without:?} without ({TIMED} claims each, replica answering)",
        lost("confirmed"),
        lost("refused-stalled"),
        lost("refused-cut"),
        lost("stalled"),
        lost("cut"),
    );
    assert_eq!(lost("confirmed"), 0, "a confirmed claim was forgotten");
    assert_eq!(ledger.charges("confirmed"), N as u32);
    for set in ["refused-stalled", "refused-cut"] {
        assert_eq!(lost(set), 0, "{set}: run twice");
        assert_eq!(
            ledger.charges(set),
            REFUSED as u32,
            "{set}: run once, after"
        );
    }
    // The failover was real: without the wait, claims the replica never got were lost.
    assert!(lost("cut") > 0, "nothing was lost without the wait");
}
