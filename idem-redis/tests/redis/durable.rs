//! What only the Redis store has to get right beyond the conformance suite: TTLs only on
//! terminal records and keys only under the prefix, a flushed script, a killed connection,
//! foreign hashes, the largest durations on the server; and its hashes read and broken
//! directly (for the suite's corruption check).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, Settlement};
use idem_runtime::store::conformance::{self, claim, get, request_leased};
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ManualClock, RecordState, Retention, StoreError,
};
use idem_test::stores::RedisPrefix;
use serde_json::json;

pub(crate) fn redis_url(test: &str) -> Option<String> {
    conformance::backend_url("IDEM_REDIS_URL", test)
}

/// Every key under the prefix.
async fn keys(at: &RedisPrefix) -> Vec<String> {
    let mut conn = conn(&at.url).await;
    redis::cmd("KEYS")
        .arg(format!("{}*", at.prefix))
        .query_async(&mut conn)
        .await
        .expect("KEYS")
}

const LEASE: Duration = Duration::from_secs(10);

const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

async fn pttl(at: &RedisPrefix, key: &str) -> i64 {
    let mut conn = conn(&at.url).await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("PTTL")
}

/// A Redis key prefix, read and written with plain commands.
pub(crate) struct RedisRows<'a> {
    pub(crate) url: &'a str,
    pub(crate) store: &'a RedisStore,
}

/// A connection of its own, for plain commands beside the store's.
pub(crate) async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

impl RedisRows<'_> {
    pub(crate) async fn corrupt(&self, key: &IdemKey, how: &str) {
        let rk = self.store.record_key(key);
        let mut conn = conn(self.url).await;
        let cmd = match how {
            "fingerprint" => redis::cmd("HSET").arg(&rk).arg("fp").arg("garbage").clone(),
            "state" => redis::cmd("HSET")
                .arg(&rk)
                .arg("st")
                .arg("exploded")
                .clone(),
            "attempts" => redis::cmd("HSET")
                .arg(&rk)
                .arg("att")
                .arg("{not json")
                .clone(),
            "attempts-bracket" => redis::cmd("HSET")
                .arg(&rk)
                .arg("att")
                .arg("[not json")
                .clone(),
            // Valid JSON, but not attempts: the Rust decode refuses it all the same.
            "attempts-entry" => redis::cmd("HSET")
                .arg(&rk)
                .arg("att")
                .arg(r#"[{"attempt":1,"class":"exploded"}]"#)
                .clone(),
            "read-backs-entry" => redis::cmd("HSET")
                .arg(&rk)
                .arg("rb")
                .arg(r#"[{"result":7}]"#)
                .clone(),
            "operation" => redis::cmd("HSET")
                .arg(&rk)
                .arg("op")
                .arg("{not json")
                .clone(),
            "type" => {
                let _: () = redis::cmd("DEL")
                    .arg(&rk)
                    .query_async(&mut conn)
                    .await
                    .expect("DEL");
                redis::cmd("SET")
                    .arg(&rk)
                    .arg("\u{fffd} not a record")
                    .clone()
            }
            other => unreachable!("{other}"),
        };
        let _: () = cmd.query_async(&mut conn).await.expect("corrupt");
    }

    pub(crate) async fn raw(&self, key: &IdemKey) -> Option<String> {
        let rk = self.store.record_key(key);
        let mut conn = conn(self.url).await;
        let kind: String = redis::cmd("TYPE")
            .arg(&rk)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        match kind.as_str() {
            "none" => None,
            "hash" => {
                let fields: std::collections::BTreeMap<String, Vec<u8>> = redis::cmd("HGETALL")
                    .arg(&rk)
                    .query_async(&mut conn)
                    .await
                    .expect("HGETALL");
                // Values as text where they are (every field idem writes), so a check can
                // look for what a record still holds; as bytes otherwise.
                let fields: std::collections::BTreeMap<String, Result<String, Vec<u8>>> = fields
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8(v).map_err(|e| e.into_bytes())))
                    .collect();
                Some(format!("hash {fields:?}"))
            }
            "string" => {
                let value: Vec<u8> = redis::cmd("GET")
                    .arg(&rk)
                    .query_async(&mut conn)
                    .await
                    .expect("GET");
                Some(format!("string {value:?}"))
            }
            other => Some(format!("a {other}")),
        }
    }
}

/// Every key the store writes is under its prefix; no unsettled record (running, unknown —
/// by expiry or by settlement —, pending, escalated, taken over) and no index ever carries a
/// Redis TTL; completed and failed records carry one no shorter than the tombstone window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ttls_only_on_terminal_records_and_keys_only_under_the_prefix() {
    let Some(url) = redis_url("redis_ttls_only_on_terminal_records") else {
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let clock = ManualClock::starting_now();
    let s = at.open_on(Arc::new(clock.clone()), RETENTION).await;
    let mut by_state: HashMap<&str, IdemKey> = HashMap::new();
    let running = request_leased("ttl-running", Duration::from_secs(3600));
    claim(&s, &running).await;
    by_state.insert("running", running.key.clone());
    let expiring = request_leased("ttl-expired", Duration::from_secs(1));
    claim(&s, &expiring).await;
    by_state.insert("expired", expiring.key.clone());
    for (name, state) in [
        ("completed", RecordState::Completed),
        ("failed", RecordState::Failed),
        ("pending", RecordState::Pending),
        ("unknown", RecordState::Unknown),
    ] {
        let req = request_leased(&format!("ttl-{name}"), LEASE);
        let t = claim(&s, &req).await;
        s.settle(&req.key, t, Settlement::new(state).payload(json!(name)))
            .await
            .expect("settle");
        by_state.insert(name, req.key.clone());
    }
    // Escalated via a takeover of an unknown record, and a takeover left running.
    for name in ["escalated", "taken-over"] {
        let req = request_leased(&format!("ttl-{name}"), LEASE);
        let t = claim(&s, &req).await;
        s.settle(&req.key, t, Settlement::new(RecordState::Unknown))
            .await
            .expect("settle");
        let t2 = s
            .reclaim(&req.key, t, Duration::from_secs(3600))
            .await
            .expect("reclaim");
        if name == "escalated" {
            s.settle(&req.key, t2, Settlement::new(RecordState::Escalated))
                .await
                .expect("settle");
        }
        by_state.insert(name, req.key.clone());
    }
    // A completed record settled again by its holder keeps its TTL.
    let again = request_leased("ttl-again", LEASE);
    let t = claim(&s, &again).await;
    s.settle(&again.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle");
    s.settle(&again.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle again");
    by_state.insert("again", again.key.clone());
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        get(&s, &expiring.key).await.state,
        RecordState::Unknown,
        "expired lease"
    );
    for state in RecordState::ALL {
        s.list(state, 100).await.expect("list");
    }
    for (name, key) in &by_state {
        let ttl = pttl(&at, &s.record_key(key)).await;
        let terminal = matches!(*name, "completed" | "failed" | "again");
        if terminal {
            assert!(
                ttl > 0 && ttl as u128 >= RETENTION.tombstones.as_millis(),
                "{name}: a terminal record expires no sooner than its tombstone, PTTL {ttl}"
            );
        } else {
            assert_eq!(
                ttl, -1,
                "{name}: an unsettled record must never carry a TTL"
            );
        }
    }
    let keys = keys(&at).await;
    assert!(keys.len() >= by_state.len());
    for k in &keys {
        assert!(k.starts_with(&at.prefix));
        if !k.starts_with(&format!("{}r:", at.prefix)) {
            assert_eq!(pttl(&at, k).await, -1, "index {k} must not expire");
        }
    }
    // Nothing was written outside the prefix: every record key is one of ours.
    let records = keys
        .iter()
        .filter(|k| k.starts_with(&format!("{}r:", at.prefix)))
        .count();
    assert_eq!(records, by_state.len());
}

/// The store's connection is killed by the server between calls (a proxy restart, an
/// idle-connection reaper): calls fail as `Unavailable` or succeed after reconnecting —
/// never panic, never a second grant — and the store works again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_connection_is_an_error_then_recovers() {
    let Some(url) = redis_url("redis_killed_connection_is_an_error_then_recovers") else {
        return;
    };
    // A database index of its own, so the kill below hits no other test's connection.
    let base = match url.rsplit_once('/') {
        Some((b, _)) if url.matches('/').count() >= 3 => b,
        _ => url.as_str(),
    };
    let at = RedisPrefix::on(format!("{base}/9"), "redis");
    let clock = ManualClock::starting_now();
    let s = at.open_on(Arc::new(clock.clone()), RETENTION).await;
    let req = request_leased("killed", LEASE);
    let t = claim(&s, &req).await;
    let mut admin = conn(&at.url).await;
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut admin)
        .await
        .expect("CLIENT ID");
    // Kill every other client on this database index: the store's connection.
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut admin)
        .await
        .expect("CLIENT LIST");
    let victims: Vec<i64> = list
        .lines()
        .filter(|l| l.split(' ').any(|f| f == "db=9"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|id| id.parse().ok())
        })
        .filter(|id| *id != me)
        .collect();
    assert!(!victims.is_empty(), "found the store's connection");
    for id in victims {
        let _: Result<i64, _> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut admin)
            .await;
    }
    match s.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => assert_eq!(r.token, t),
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("after a dropped connection: Existing or Unavailable, got {other:?}"),
    }
    let mut settled = false;
    for _ in 0..20 {
        match s
            .settle(
                &req.key,
                t,
                Settlement::new(RecordState::Completed).payload(json!(1)),
            )
            .await
        {
            Ok(()) => {
                settled = true;
                break;
            }
            Err(StoreError::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("settle after reconnect: {e}"),
        }
    }
    assert!(settled, "the store reconnects");
    assert_eq!(get(&s, &req.key).await.state, RecordState::Completed);
}

/// Hashes someone else wrote under the prefix, each a little wrong: a newer layout, a key
/// field naming another key, attempts that are not JSON. Each is `Corrupt` (never Claimed,
/// never a panic) from claim and get; a listing leaves it out or says corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_foreign_hashes_are_corrupt_never_free() {
    let Some(url) = redis_url("redis_foreign_hashes_are_corrupt_never_free") else {
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let clock = ManualClock::starting_now();
    let s = at.open_on(Arc::new(clock.clone()), RETENTION).await;
    let mut conn = conn(&at.url).await;
    let now = clock.now().as_millis().to_string();
    let fp = conformance::fingerprint("args").to_hex();
    let tok = ClaimToken::fresh().to_hex();
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("newer-layout", vec![("v", "2".into())]),
        ("bad-attempts", vec![("att", "[not json".into())]),
        (
            "bad-payload",
            vec![("pl", "{not json".into()), ("st", "completed".into())],
        ),
        ("bad-state", vec![("st", "exploded".into())]),
        ("no-tool", vec![]),
    ];
    for (name, overrides) in cases {
        let req = request_leased(&format!("foreign-{name}"), LEASE);
        let rk = s.record_key(&req.key);
        let mut fields: Vec<(&str, String)> = vec![
            ("v", "1".into()),
            ("k", req.key.as_str().to_owned()),
            ("fp", fp.clone()),
            ("tool", "t".into()),
            ("st", "unknown".into()),
            ("tok", tok.clone()),
            ("ca", now.clone()),
            ("ua", now.clone()),
            ("rx", "0".into()),
            ("att", "[]".into()),
            ("rb", "[]".into()),
        ];
        for (f, v) in overrides {
            fields.retain(|(g, _)| *g != f);
            fields.push((f, v));
        }
        if name == "no-tool" {
            fields.retain(|(g, _)| *g != "tool");
        }
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&rk);
        for (f, v) in &fields {
            cmd.arg(*f).arg(v);
        }
        let _: i64 = cmd.query_async(&mut conn).await.expect("HSET");
        match s.claim(&req).await {
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("{name}: claim over a foreign hash must be Corrupt, got {other:?}"),
        }
        match s.get(&req.key).await {
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("{name}: get of a foreign hash must be Corrupt, got {other:?}"),
        }
        for state in RecordState::ALL {
            match s.list(state, 10).await {
                Ok(rs) => assert!(rs.iter().all(|r| r.key != req.key)),
                Err(StoreError::Corrupt { .. }) => {}
                Err(e) => panic!("{name}: list must be Ok or Corrupt, got {e}"),
            }
        }
    }
}

/// A tool whose timeout is `Duration::MAX` gets a lease of `Duration::MAX` (the executor
/// saturates `timeout + 30 s`; `huge_durations_do_not_panic` covers it on the memory store).
/// Its running record must still read back: duplicates must see it in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_huge_lease_reads_back() {
    let Some(url) = redis_url("redis_huge_lease_reads_back") else {
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let clock = ManualClock::starting_now();
    let s = at.open_on(Arc::new(clock.clone()), RETENTION).await;
    let req = request_leased("huge-lease", Duration::MAX);
    let t = claim(&s, &req).await;
    match s.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => {
            assert_eq!(r.state, RecordState::Running);
            assert_eq!(r.token, t);
        }
        other => panic!("a duplicate must see the running claim, got {other:?}"),
    }
    let r = get(&s, &req.key).await;
    assert!(r.lease_until.is_some_and(|l| l > clock.now()));
}

/// Retention "forever" (`Duration::MAX`, accepted by every builder; SQLite and Postgres
/// saturate it) must let a settle through — and a settle that reports an error must not
/// have been applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_forever_retention_settles() {
    let Some(url) = redis_url("redis_forever_retention_settles") else {
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let clock = ManualClock::starting_now();
    let forever = Retention {
        results: Duration::MAX,
        tombstones: Duration::MAX,
    };
    let s = at.open_on(Arc::new(clock.clone()), forever).await;
    let req = request_leased("forever", LEASE);
    let t = claim(&s, &req).await;
    let settled = s
        .settle(
            &req.key,
            t,
            Settlement::new(RecordState::Completed).payload(json!("kept")),
        )
        .await;
    let r = get(&s, &req.key).await;
    assert!(
        settled.is_ok(),
        "settle with forever retention failed ({settled:?}) — yet the record reads {:?}",
        r.state
    );
    assert_eq!(r.state, RecordState::Completed);
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert_eq!(get(&s, &req.key).await.payload, Some(json!("kept")));
}

/// The ways the suite's corruption check breaks a Redis record: a field that does not
/// decode, a hash of another type, evidence that starts like JSON and does not parse.
pub(crate) const CORRUPTIONS: &[&str] = &[
    "fingerprint",
    "state",
    "attempts",
    "type",
    "attempts-bracket",
    "attempts-entry",
    "read-backs-entry",
    "operation",
];
