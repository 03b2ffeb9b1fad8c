//! `wait_for_replicas` against servers with no replica (the shared Redis and Redis Cluster):
//! no claim is ever confirmed, so each is released and refused before anything runs, on one
//! server and on the master of the key's slot of a cluster; a settle stands all the same.
//! The failover itself is in the `failover` test binary.

use std::time::Duration;

use idem_runtime::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, RecordState, StoreError};
use idem_test::stores::{unique_prefix, RedisPrefix};

const WAIT: Duration = Duration::from_millis(20);

fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: IdemKey::derive(
            &Scope::run("replica-wait"),
            "charge",
            KeyMaterial::Intent(name),
        ),
        fingerprint: Fingerprint::of_canonical(b"{}"),
        tool: "charge".into(),
        lease: Duration::from_secs(60),
        operation: None,
    }
}

/// Claims `req` on `store` (which waits for a replica that does not exist): refused as
/// unavailable, saying so, and the key is left free.
async fn refused(store: &dyn IdemStore, req: &ClaimRequest) {
    match store.claim(req).await {
        Err(StoreError::Unavailable(why)) => {
            assert!(
                why.contains("replicas") && why.contains("released"),
                "{why}"
            )
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(store.get(&req.key).await.unwrap(), None, "left claimed");
}

#[tokio::test]
async fn an_unconfirmed_claim_is_released_and_refused_and_a_settle_stands() {
    let Some(redis) = RedisPrefix::new("replica-wait", "replica wait") else {
        return;
    };
    let waiting = redis
        .builder()
        .wait_for_replicas(1, WAIT)
        .connect()
        .await
        .unwrap();
    refused(&waiting, &request("refused")).await;

    // A claim made without the wait, settled with it: no replica confirms the settle, and
    // the answer stands.
    let plain = redis.builder().connect().await.unwrap();
    let req = request("settled");
    let ClaimOutcome::Claimed(token) = plain.claim(&req).await.unwrap() else {
        panic!("not claimed");
    };
    waiting
        .settle(&req.key, token, Settlement::new(RecordState::Completed))
        .await
        .unwrap();
    let record = plain.get(&req.key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

#[tokio::test]
async fn a_wait_that_cannot_confirm_or_outlasts_the_reply_is_refused_at_connect() {
    let Some(redis) = RedisPrefix::new("replica-wait-config", "replica wait config") else {
        return;
    };
    for builder in [
        redis.builder().wait_for_replicas(0, WAIT),
        redis.builder().wait_for_replicas(1, Duration::ZERO),
        redis
            .builder()
            .response_timeout(Duration::from_secs(1))
            .wait_for_replicas(1, Duration::from_secs(1)),
    ] {
        match builder.connect().await {
            Err(StoreError::Backend(why)) => assert!(why.contains("wait_for_replicas"), "{why}"),
            other => panic!("connected: {other:?}"),
        }
    }
}

#[tokio::test]
async fn on_a_cluster_the_wait_is_the_key_masters() {
    let Some(urls) = conformance::backend_url("IDEM_REDIS_CLUSTER_URLS", "replica wait cluster")
    else {
        return;
    };
    let nodes: Vec<String> = urls.split(',').map(|s| s.trim().to_owned()).collect();
    let prefix = unique_prefix("replica-wait-cluster");
    let store = idem_redis::RedisStore::cluster(nodes.clone())
        .prefix(prefix.clone())
        .partitions(3)
        .wait_for_replicas(1, WAIT)
        .connect()
        .await
        .unwrap();
    // Keys of every partition, so of every master: each WAIT reaches the slot's master (a
    // misrouted one would answer for another node or fail as cross-slot).
    for i in 0..6 {
        refused(&store, &request(&format!("cluster-{i}"))).await;
    }
    for node in &nodes {
        let mut conn = redis::Client::open(node.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in keys {
            let _: redis::Value = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}
