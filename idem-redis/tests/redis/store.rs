//! `RedisStore` against the store conformance suite, plus its own fault checks.
//!
//! Needs a Redis: `IDEM_REDIS_URL=redis://127.0.0.1:6379/ cargo test --all-features`. Without
//! the variable every check prints why it is skipped. Each check works under its own
//! key prefix and deletes it afterwards, so runs never collide.

use std::time::Duration;

use crate::factory::{skip_reason, url, Redis};
use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, StoreError};
use idem_test::stores::RedisPrefix;

idem_runtime::store_conformance_tests!(Redis {
    read_before_claim: false
});

/// A Redis that is not there is `Unavailable` at connect time, quickly.
#[tokio::test]
async fn unreachable_redis_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let r = RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
        .connection_timeout(Duration::from_millis(500))
        .reconnect_retries(0)
        .connect()
        .await;
    match r {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("redis"), "{msg}"),
        other => panic!("connecting to a closed port must be Unavailable, got {other:?}"),
    }
}

/// A malformed URL is a configuration error, not "unavailable".
#[tokio::test]
async fn malformed_url_is_a_backend_error() {
    match RedisStore::connect("not a url").await {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("URL"), "{msg}"),
        other => panic!("a malformed URL must be a Backend error, got {other:?}"),
    }
}

/// Foreign data of the right type but the wrong shape (a hash someone else wrote under our
/// prefix) is corrupt too, and no claim is granted over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_hash_is_corrupt() {
    let Some(url) = url() else {
        conformance::skip("this Redis check", &skip_reason());
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let store = RedisStore::builder(url.as_str())
        .prefix(at.prefix.as_str())
        .connect()
        .await
        .expect("connect");
    let key = conformance::key("foreign-hash");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    redis::cmd("HSET")
        .arg(store.record_key(&key))
        .arg("st")
        .arg("running")
        .arg("owner")
        .arg("someone else")
        .query_async::<()>(&mut conn)
        .await
        .expect("hset");
    let req = idem_runtime::store::backend::ClaimRequest {
        key: key.clone(),
        fingerprint: conformance::fingerprint("x"),
        tool: "t".into(),
        lease: Duration::from_secs(10),
        operation: None,
    };
    assert!(matches!(
        store.claim(&req).await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(
        store.get(&key).await,
        Err(StoreError::Corrupt { .. })
    ));
}

/// An ACL user who may run scripts but not load functions (an ACL written for the
/// `EVALSHA` store): `connect` falls back to running its code as a script (the server's
/// ACL log shows the refused `FUNCTION LOAD`), and the store claims, settles and replays
/// as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_denied_functions_runs_the_script() {
    let Some(url) = url() else {
        conformance::skip("this Redis check", &skip_reason());
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let user = format!("idem-test-{}", std::process::id());
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">not-a-secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-function")
        .arg("-fcall")
        .arg("-fcall_ro")
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let addr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let as_user = format!("redis://{user}:not-a-secret@{addr}/");
    let result = async {
        let store = RedisStore::builder(as_user.as_str())
            .prefix(at.prefix.as_str())
            .connect()
            .await
            .expect("connect as a user without FUNCTION");
        assert_eq!(store.function_library(), None, "runs the script");
        let req = idem_runtime::store::backend::ClaimRequest {
            key: conformance::key("acl"),
            fingerprint: conformance::fingerprint("acl"),
            tool: "t".into(),
            lease: Duration::from_secs(10),
            operation: None,
        };
        let token = match store.claim(&req).await.expect("claim") {
            idem_runtime::store::backend::ClaimOutcome::Claimed(t) => t,
            other => panic!("a fresh key is claimed, got {other:?}"),
        };
        store
            .settle(
                &req.key,
                token,
                idem_runtime::store::backend::Settlement::new(
                    idem_runtime::store::RecordState::Completed,
                ),
            )
            .await
            .expect("settle");
        match store.claim(&req).await.expect("claim again") {
            idem_runtime::store::backend::ClaimOutcome::Existing(r) => {
                assert_eq!(r.state, idem_runtime::store::RecordState::Completed)
            }
            other => panic!("a settled key replays, got {other:?}"),
        }
        let info: String = redis::cmd("ACL")
            .arg("LOG")
            .query_async::<redis::Value>(&mut admin)
            .await
            .map(|v| format!("{v:?}"))
            .unwrap_or_default();
        info
    }
    .await;
    let () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut admin)
        .await
        .expect("ACL DELUSER");
    assert!(
        result.contains("function"),
        "the server refused this user FUNCTION LOAD (ACL LOG): {result}"
    );
}

/// The record of a running claim carries no Redis TTL (its lease is inside the value); a
/// completed one expires with its tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_terminal_records_have_a_ttl() {
    let Some(url) = url() else {
        conformance::skip("this Redis check", &skip_reason());
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let store = RedisStore::builder(url.as_str())
        .prefix(at.prefix.as_str())
        .connect()
        .await
        .expect("connect");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let key = conformance::key("ttl");
    let req = idem_runtime::store::backend::ClaimRequest {
        key: key.clone(),
        fingerprint: conformance::fingerprint("x"),
        tool: "t".into(),
        lease: Duration::from_millis(50),
        operation: None,
    };
    let token = match store.claim(&req).await.expect("claim") {
        idem_runtime::store::backend::ClaimOutcome::Claimed(t) => t,
        other => panic!("{other:?}"),
    };
    let ttl: i64 = redis::cmd("PTTL")
        .arg(store.record_key(&key))
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert_eq!(ttl, -1, "a running claim must never carry a Redis TTL");
    store
        .settle(
            &key,
            token,
            idem_runtime::store::backend::Settlement::new(
                idem_runtime::store::RecordState::Completed,
            ),
        )
        .await
        .expect("settle");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(store.record_key(&key))
        .query_async(&mut conn)
        .await
        .expect("pttl");
    let tombstones = idem_runtime::store::Retention::default().tombstones;
    assert!(
        ttl > 0 && ttl as u128 > tombstones.as_millis() - 60_000,
        "a completed record expires with its tombstone window, got PTTL {ttl}"
    );
}

/// Times and scores are written as whole decimal text, the digits a reader of any idem
/// version parses: the record's `ca`, `ua` and `lease`, and the index scores, at a time
/// and lease chosen here, and for the longest lease the store takes (2^52 ms: its end is
/// still a whole number a double holds exactly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_are_written_as_whole_decimal_text() {
    let Some(url) = url() else {
        conformance::skip("this Redis check", &skip_reason());
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let now: u64 = 1_796_092_353_026;
    let clock = idem_runtime::store::ManualClock::new(idem_runtime::store::Timestamp(now));
    let store = RedisStore::builder(url.as_str())
        .prefix(at.prefix.as_str())
        .clock(std::sync::Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect");
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let claim = |name: &str, lease_ms: u64| idem_runtime::store::backend::ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint(name),
        tool: "t".into(),
        lease: Duration::from_millis(lease_ms),
        operation: None,
    };
    let token = |outcome| match outcome {
        idem_runtime::store::backend::ClaimOutcome::Claimed(t) => t,
        other => panic!("a fresh key is claimed, got {other:?}"),
    };
    let fields = |key: &IdemKey| {
        redis::cmd("HMGET")
            .arg(store.record_key(key))
            .arg(&["ca", "ua", "lease"])
            .to_owned()
    };
    let score = |index: &str, key: &IdemKey| {
        redis::cmd("ZSCORE")
            .arg(format!("{}{index}", at.prefix))
            .arg(key.as_str())
            .to_owned()
    };

    let short = claim("times-short", 30_000);
    let t = token(store.claim(&short).await.expect("claim"));
    let got: Vec<Option<String>> = fields(&short.key)
        .query_async(&mut conn)
        .await
        .expect("hmget");
    let (n, end) = (now.to_string(), (now + 30_000).to_string());
    assert_eq!(got, [Some(n.clone()), Some(n.clone()), Some(end.clone())]);
    let running: String = score("s:running", &short.key)
        .query_async(&mut conn)
        .await
        .expect("zscore");
    let lease: String = score("leases", &short.key)
        .query_async(&mut conn)
        .await
        .expect("zscore");
    assert_eq!((running, lease), (n.clone(), end));

    let long = claim("times-long", 1 << 60);
    token(store.claim(&long).await.expect("claim"));
    let got: Vec<Option<String>> = fields(&long.key)
        .query_async(&mut conn)
        .await
        .expect("hmget");
    let far = (now + (1 << 52)).to_string();
    assert_eq!(got, [Some(n.clone()), Some(n.clone()), Some(far)]);

    clock.advance(Duration::from_millis(7));
    let later = (now + 7).to_string();
    store
        .settle(
            &short.key,
            t,
            idem_runtime::store::backend::Settlement::new(
                idem_runtime::store::RecordState::Completed,
            ),
        )
        .await
        .expect("settle");
    let got: Vec<Option<String>> = fields(&short.key)
        .query_async(&mut conn)
        .await
        .expect("hmget");
    assert_eq!(got, [Some(n.clone()), Some(later), None]);
    let completed: String = score("s:completed", &short.key)
        .query_async(&mut conn)
        .await
        .expect("zscore");
    let expiry: String = score("expiry", &short.key)
        .query_async(&mut conn)
        .await
        .expect("zscore");
    // The expiry index holds the record's next retention step: its result's end.
    let results = idem_runtime::store::Retention::default()
        .results
        .as_millis() as u64;
    assert_eq!((completed, expiry), (n, (now + 7 + results).to_string()));
}
