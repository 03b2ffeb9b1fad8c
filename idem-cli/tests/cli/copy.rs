//! `idem copy`: a Redis store copied into another prefix and partition count, through the
//! binary; the new store is then asked (through the binary again) what it holds.
//!
//! Needs a Redis (`IDEM_REDIS_URL`); without it the check prints why it skips, and fails
//! when `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::{idem, stderr, stdout, unique, unknown_record, RecordText};
use idem_redis::RedisStore;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance::backend_url;
use idem_runtime::{
    identity::{Fingerprint, IdemKey, Scope},
    store::IdemStore,
};

/// `idem … list --state unknown --json`'s keys.
fn unknown_keys(url: &str, store_args: &[&str]) -> Vec<String> {
    let out = idem()
        .args(["--store", url])
        .args(store_args)
        .args(["--json", "list", "--state", "unknown", "--limit", "1000"])
        .output()
        .expect("run idem");
    assert!(out.status.success(), "{}", stderr(&out));
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut keys: Vec<String> = page["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_is_copied_into_more_partitions() {
    let Some(url) = backend_url("IDEM_REDIS_URL", "idem copy") else {
        return;
    };
    let old_prefix = format!("{}:", unique("idem-cli-copy-old"));
    let new_prefix = format!("{}:", unique("idem-cli-copy-new"));
    let old = RedisStore::builder(url.as_str())
        .prefix(old_prefix.as_str())
        .connect()
        .await
        .expect("connect");
    let mut made = Vec::new();
    for i in 0..12 {
        let key = unknown_record(&old, &RecordText::plain(&format!("run-{i}"), "lost")).await;
        made.push(key.to_string());
    }
    made.sort();

    let copy = |extra: &[&str]| {
        idem()
            .args(["--store", url.as_str(), "--prefix", old_prefix.as_str()])
            .args(["--json", "copy", "--to", url.as_str()])
            .args(["--to-prefix", new_prefix.as_str(), "--to-partitions", "3"])
            .args(extra)
            .output()
            .expect("run idem")
    };
    let out = copy(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let copied: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(copied["records"], 12, "{}", stdout(&out));
    let spread: Vec<u64> = copied["per_partition"]
        .as_array()
        .expect("per_partition")
        .iter()
        .map(|n| n.as_u64().expect("a count"))
        .collect();
    assert_eq!(spread.len(), 3);
    assert_eq!(spread.iter().sum::<u64>(), 12);

    // Asked of the new store: the same keys, under its own prefix and partitions.
    let new_args = ["--prefix", new_prefix.as_str(), "--partitions", "3"];
    assert_eq!(unknown_keys(&url, &new_args), made);
    assert_eq!(
        unknown_keys(&url, &["--prefix", old_prefix.as_str()]),
        made,
        "the old store is only read"
    );

    // A live claim in the old store stops a second copy, which says why.
    let key = IdemKey::derive(
        &Scope::run("live"),
        "charge",
        idem_runtime::identity::KeyMaterial::Intent("live"),
    );
    let req = ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_canonical(b"{}"),
        tool: "charge".into(),
        lease: Duration::from_secs(600),
        operation: None,
    };
    assert!(matches!(
        old.claim(&req).await.expect("claim"),
        ClaimOutcome::Claimed(_)
    ));
    let refused = copy(&[]);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    assert!(stderr(&refused).contains("running"), "{}", stderr(&refused));
}

#[test]
fn only_redis_stores_are_copied() {
    let out = idem()
        .args(["--store", "sqlite:///nonexistent/idem.db"])
        .args(["copy", "--to", "redis://127.0.0.1:9/"])
        .output()
        .expect("run idem");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("copies a Redis store into a Redis store"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
}
