//! The durable stores (SQLite, Redis, Postgres) beyond the conformance suite: two handles
//! ("workers") with skewed clocks on one location, records in every state surviving a
//! reopen, paging while records move, corrupt rows that must never free a key, and each
//! backend's own faults.
//!
//! Redis and Postgres checks need `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` (see
//! `.ci/services.sh`); without them they print why they skip, and fail when
//! `IDEM_REQUIRE_BACKENDS=1`. Every check works in its own temp file, key prefix or schema
//! and removes it afterwards.
#![cfg(all(
    feature = "testing",
    feature = "sqlite",
    feature = "redis",
    feature = "postgres"
))]

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::identity::Scope;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance;
use idem_runtime::store::{
    AttemptKind, AttemptRecord, ClaimToken, Clock, IdemStore, ListCursor, ManualClock, Operation,
    PostgresStore, ReadBackRecord, Record, RecordState, RedisStore, Retention, SqliteStore,
    StoreError, Timestamp,
};
use idem_runtime::{IdemKey, OutcomeClass};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------
// Locations and handles
// ---------------------------------------------------------------------------------------

fn redis_url(test: &str) -> Option<String> {
    conformance::backend_url("IDEM_REDIS_URL", test)
}

fn pg_url(test: &str) -> Option<String> {
    conformance::backend_url("IDEM_POSTGRES_URL", test)
}

fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A Redis key prefix of its own; everything under it is deleted on drop.
struct Prefix {
    url: String,
    prefix: String,
}

impl Prefix {
    fn fresh(url: &str) -> Prefix {
        Prefix {
            url: url.to_owned(),
            prefix: format!("idem-backends:{}:", unique()),
        }
    }

    async fn open(&self, clock: &(impl Clock + Clone), retention: Retention) -> RedisStore {
        RedisStore::builder(self.url.as_str())
            .prefix(self.prefix.as_str())
            .clock(Arc::new(clock.clone()))
            .retention(retention)
            .connect()
            .await
            .expect("connect to Redis")
    }

    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis")
    }

    async fn keys(&self) -> Vec<String> {
        let mut conn = self.conn().await;
        redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS")
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

#[path = "support/postgres_schema.rs"]
mod postgres_schema;
use postgres_schema::Schema;

impl Schema {
    async fn open(&self, clock: &(impl Clock + Clone), retention: Retention) -> PostgresStore {
        PostgresStore::builder(self.url.as_str())
            .schema(self.name.as_str())
            .clock(Arc::new(clock.clone()))
            .retention(retention)
            .max_connections(4)
            .connect()
            .await
            .expect("connect to Postgres")
    }

    async fn sql(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect to Postgres");
        tokio::spawn(conn);
        client
    }
}

async fn sqlite(
    path: &std::path::Path,
    clock: &(impl Clock + Clone),
    retention: Retention,
) -> SqliteStore {
    SqliteStore::builder(path)
        .clock(Arc::new(clock.clone()))
        .retention(retention)
        .open()
        .await
        .expect("open SQLite")
}

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

const LEASE: Duration = Duration::from_secs(10);

const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

/// Two workers' clocks: `b` runs `skew` ahead of `a`; `advance` moves both.
#[derive(Clone)]
struct Clocks {
    a: ManualClock,
    b: ManualClock,
}

impl Clocks {
    fn skewed(skew: Duration) -> Clocks {
        let a = ManualClock::starting_now();
        let b = ManualClock::new(a.now().plus(skew));
        Clocks { a, b }
    }

    fn advance(&self, d: Duration) {
        self.a.advance(d);
        self.b.advance(d);
    }
}

fn request(name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint("args"),
        tool: "backend_tool".into(),
        lease,
        operation: None,
    }
}

async fn claim(store: &impl IdemStore, req: &ClaimRequest) -> ClaimToken {
    match store.claim(req).await {
        Ok(ClaimOutcome::Claimed(t)) => t,
        other => panic!("claim of a free key must be granted, got {other:?}"),
    }
}

async fn get(store: &impl IdemStore, key: &IdemKey) -> Record {
    store
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get failed: {e}"))
        .unwrap_or_else(|| panic!("record {key} vanished"))
}

fn stale<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
    match r {
        Err(StoreError::StaleToken { .. }) => {}
        other => panic!("{what} must be refused as a stale token, got {other:?}"),
    }
}

fn attempt(n: u32, class: OutcomeClass, at: Timestamp, message: &str) -> AttemptRecord {
    AttemptRecord::new(
        n,
        at,
        at.plus(Duration::from_millis(250)),
        AttemptKind::Returned,
        class,
        Some(message.to_owned()),
    )
}

// ---------------------------------------------------------------------------------------
// Generic scenarios, run against every durable backend
// ---------------------------------------------------------------------------------------

/// Worker B's clock runs ahead, so it sees A's lease expire while A still thinks it holds
/// it. The claim must become unknown (never free), A's renew must be refused, and after B
/// takes over, A's late result must not overwrite B's decision. Both handles read the same
/// record throughout.
async fn skewed_workers_fence_each_other<S: IdemStore>(a: &S, b: &S, clocks: &Clocks) {
    let req = request("skew", LEASE);
    let t1 = claim(a, &req).await;
    match b.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => {
            assert_eq!(r.state, RecordState::Running);
            assert_eq!(r.token, t1);
        }
        other => panic!("B must see A's claim in flight, got {other:?}"),
    }
    // A renews while both agree the lease holds.
    clocks.advance(Duration::from_secs(5));
    a.renew(&req.key, t1, LEASE).await.expect("renew");
    clocks.advance(Duration::from_secs(9));
    // A's clock: 14 s after the claim, lease until 15 s. B's clock is 3 s ahead: expired.
    let seen_by_b = get(b, &req.key).await;
    assert_eq!(
        seen_by_b.state,
        RecordState::Unknown,
        "B's clock is past the lease: unknown"
    );
    assert_eq!(seen_by_b.token, t1, "expiry keeps the token");
    let seen_by_a = get(a, &req.key).await;
    assert_eq!(
        seen_by_a, seen_by_b,
        "both handles read one record: expiry is stored, not recomputed per clock"
    );
    stale(
        "A's renew after B saw the lease expire",
        a.renew(&req.key, t1, LEASE).await,
    );
    match a.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => assert_eq!(r.state, RecordState::Unknown),
        other => panic!("an expired lease must never free the key, got {other:?}"),
    }
    // B takes over; A's late result is fenced off.
    let t2 = b.reclaim(&req.key, t1, LEASE).await.expect("reclaim");
    assert_ne!(t1, t2);
    stale(
        "A's late completed settle after B's takeover",
        a.settle(
            &req.key,
            t1,
            Settlement::new(RecordState::Completed).payload(json!("from A")),
        )
        .await,
    );
    stale(
        "A's late unknown settle after B's takeover",
        a.settle(&req.key, t1, Settlement::new(RecordState::Unknown))
            .await,
    );
    stale("A's release after takeover", a.release(&req.key, t1).await);
    stale(
        "A's reclaim with its old token",
        a.reclaim(&req.key, t1, LEASE).await,
    );
    let r = get(a, &req.key).await;
    assert_eq!(r.state, RecordState::Running);
    assert_eq!(r.token, t2);
    assert_eq!(r.payload, None, "A's refused result left nothing behind");
    let at = clocks.b.now();
    b.settle(
        &req.key,
        t2,
        Settlement::new(RecordState::Completed)
            .payload(json!({"by": "B"}))
            .attempts(vec![attempt(2, OutcomeClass::Completed, at, "retried")]),
    )
    .await
    .expect("B settles");
    let r = get(a, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.payload, Some(json!({"by": "B"})));
    assert_eq!(r.attempts.len(), 1);
    assert_eq!(r, get(b, &req.key).await);
    stale(
        "A's settle after B completed",
        a.settle(&req.key, t1, Settlement::new(RecordState::Completed))
            .await,
    );
}

/// On an unknown record, the original holder's late settle and a takeover race from two
/// handles: exactly one wins, and the record shows that one. Several takeovers racing each
/// other: exactly one wins.
async fn late_settle_races_takeover<S: IdemStore + 'static>(a: Arc<S>, b: Arc<S>) {
    for i in 0..12 {
        let req = request(&format!("race-{i}"), LEASE);
        let t = claim(&*a, &req).await;
        a.settle(
            &req.key,
            t,
            Settlement::new(RecordState::Unknown).message("timed out"),
        )
        .await
        .expect("settle unknown");
        let barrier = Arc::new(tokio::sync::Barrier::new(4));
        let settle = {
            let (a, k, barrier) = (a.clone(), req.key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                a.settle(
                    &k,
                    t,
                    Settlement::new(RecordState::Completed).payload(json!("late")),
                )
                .await
            })
        };
        let takeovers: Vec<_> = (0..3)
            .map(|j| {
                let s = if j % 2 == 0 { b.clone() } else { a.clone() };
                let (k, barrier) = (req.key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    s.reclaim(&k, t, LEASE).await
                })
            })
            .collect();
        let settled = match settle.await.expect("task") {
            Ok(()) => true,
            Err(StoreError::StaleToken { .. }) => false,
            Err(e) => panic!("late settle failed oddly: {e}"),
        };
        let mut winners = Vec::new();
        for task in takeovers {
            match task.await.expect("task") {
                Ok(token) => winners.push(token),
                Err(StoreError::StaleToken { .. }) => {}
                Err(e) => panic!("reclaim failed oddly: {e}"),
            }
        }
        let r = get(&*b, &req.key).await;
        if settled {
            assert!(winners.is_empty(), "a settled record cannot be taken over");
            assert_eq!(r.state, RecordState::Completed);
            assert_eq!(r.token, t);
            assert_eq!(r.payload, Some(json!("late")));
        } else {
            assert_eq!(winners.len(), 1, "exactly one takeover wins: {winners:?}");
            assert_eq!(r.state, RecordState::Running);
            assert_eq!(r.token, winners[0]);
            assert_eq!(r.payload, None);
        }
    }
}

/// One record in every state (and a tombstone), with operations, evidence and awkward text.
/// Returns them as read back, for comparison after a reopen.
async fn write_every_state<S: IdemStore>(s: &S, clock: &ManualClock, nul: bool) -> Vec<Record> {
    let weird = if nul {
        "quote \" apostrophe ' back\\slash\nnewline\ttab \u{0} nul 東京 \u{1F4B8}"
    } else {
        "quote \" apostrophe ' back\\slash\nnewline\ttab 東京 \u{1F4B8}"
    };
    let big = "x".repeat(300_000) + "\u{e9}\u{1F4B8}";
    let op = |intent: Option<&str>| Operation {
        scope: Scope::run("run-\u{fc}")
            .with_tenant("tenant \"1\"")
            .with_principal("user\n2"),
        intent: intent.map(str::to_owned),
        args: json!({
            "blob": big,
            "nul": "a\u{0}b",
            "n": [u64::MAX, i64::MIN, 0.5, -0.0, 1e300],
            "nested": {"z": 1, "a": [{"b": null}]},
        })
        .into(),
    };
    let with_op = |name: &str, lease: Duration| ClaimRequest {
        operation: Some(op(Some(&format!("intent-{name}-\u{2603}"))).into()),
        tool: format!("tool-{name}").into(),
        ..request(name, lease)
    };
    let long = Duration::from_secs(12 * 3600);
    let mut keys = Vec::new();

    // A tombstone: completed, then past the result window.
    let req = with_op("tombstone", long);
    let t = claim(s, &req).await;
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed).payload(json!({"gone": big})),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());
    clock.advance(RETENTION.results + Duration::from_secs(1));
    assert!(get(s, &req.key).await.result_expired, "tombstoned");

    let req = with_op("running", long);
    claim(s, &req).await;
    keys.push(req.key.clone());

    let req = with_op("completed-null", long);
    let t = claim(s, &req).await;
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed)
            .payload(Value::Null)
            .message("")
            .downstream_ref(""),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    let req = with_op("completed-big", long);
    let t = claim(s, &req).await;
    let at = clock.now();
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed)
            .payload(json!({"receipt": big, "weird": weird}))
            .downstream_ref("ch_\u{1F4B8} \"1\"")
            .attempts(vec![attempt(1, OutcomeClass::Completed, at, weird)]),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    clock.advance(Duration::from_millis(7));
    let req = with_op("failed", long);
    let t = claim(s, &req).await;
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Failed)
            .message(weird)
            .downstream_ref(weird),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    let req = with_op("pending", long);
    let t = claim(s, &req).await;
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Pending)
            .payload(json!({"status": "processing"}))
            .downstream_ref("po_123"),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    let req = ClaimRequest {
        operation: Some(op(None).into()),
        ..with_op("unknown", long)
    };
    let t = claim(s, &req).await;
    let at = clock.now();
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Unknown)
            .message("timed out after 30s")
            .attempts(vec![
                attempt(1, OutcomeClass::Unknown, at, "timeout \u{0} nul"),
                attempt(2, OutcomeClass::Unknown, at, weird),
            ]),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    let req = with_op("escalated", long);
    let t = claim(s, &req).await;
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Unknown).message("timed out"),
    )
    .await
    .expect("settle");
    let t2 = s.reclaim(&req.key, t, LEASE).await.expect("reclaim");
    let at = clock.now();
    s.settle(
        &req.key,
        t2,
        Settlement::new(RecordState::Escalated)
            .message(weird)
            .read_backs(vec![
                ReadBackRecord {
                    at,
                    result: "not found".into(),
                },
                ReadBackRecord {
                    at,
                    result: weird.into(),
                },
            ]),
    )
    .await
    .expect("settle");
    keys.push(req.key.clone());

    let mut out = Vec::new();
    for k in &keys {
        out.push(get(s, k).await);
    }
    let states: Vec<RecordState> = out.iter().map(|r| r.state).collect();
    assert_eq!(
        states,
        vec![
            RecordState::Completed,
            RecordState::Running,
            RecordState::Completed,
            RecordState::Completed,
            RecordState::Failed,
            RecordState::Pending,
            RecordState::Unknown,
            RecordState::Escalated,
        ]
    );
    out
}

/// What [`write_every_state`] wrote, read through another handle: every field equal, and
/// every state's listing holds exactly its records.
async fn check_every_state<S: IdemStore>(s: &S, before: &[Record], nul: bool) {
    for b in before {
        let r = get(s, &b.key).await;
        assert_eq!(&r, b, "record {} must round-trip a reopen", b.tool);
        if let Some(op) = &r.operation {
            assert_eq!(op.args["nul"], json!("a\u{0}b"));
            assert_eq!(op.args["n"][0], json!(u64::MAX));
        }
    }
    let failed = before
        .iter()
        .find(|r| r.state == RecordState::Failed)
        .expect("failed");
    assert_eq!(
        failed.message.as_deref().map(|m| m.contains('\u{0}')),
        Some(nul),
        "a message keeps its NUL where the backend can hold one"
    );
    let completed = before
        .iter()
        .find(|r| &*r.tool == "tool-completed-null")
        .expect("completed-null");
    assert_eq!(
        completed.payload,
        Some(Value::Null),
        "a null payload is kept"
    );
    assert_eq!(
        completed.message.as_deref(),
        Some(""),
        "empty is not absent"
    );
    assert_eq!(completed.downstream_ref.as_deref(), Some(""));
    for state in RecordState::ALL {
        let mut expected: Vec<&Record> = before.iter().filter(|r| r.state == state).collect();
        expected.sort_by_key(|r| ListCursor::of(r));
        let listed = s.list(state, 100).await.expect("list");
        let listed_keys: Vec<&IdemKey> = listed.iter().map(|r| &r.key).collect();
        let expected_keys: Vec<&IdemKey> = expected.iter().map(|r| &r.key).collect();
        assert_eq!(listed_keys, expected_keys, "list({state}) after a reopen");
        for (l, e) in listed.iter().zip(expected) {
            assert_eq!(l, e, "a listed record is whole");
        }
    }
}

/// `wait_settled` notices a lease that expires while it waits (unknown, not running), and
/// returns the running record itself when its timeout passes.
async fn wait_settled_sees_expiry<S: IdemStore + 'static>(s: Arc<S>, clock: WatchedClock) {
    let req = request("wait-expiry", Duration::from_secs(2));
    let token = claim(&*s, &req).await;
    let r = s
        .wait_settled(&req.key, Duration::from_millis(30))
        .await
        .expect("wait");
    assert_eq!(
        r.map(|r| (r.state, r.token)),
        Some((RecordState::Running, token))
    );
    let before = clock.reads();
    let waiter = {
        let (s, key) = (s.clone(), req.key.clone());
        tokio::spawn(async move { s.wait_settled(&key, Duration::from_secs(60)).await })
    };
    // The lease passes only once the waiter has read the time, i.e. has looked at the record
    // while it was still running: the expiry is seen while waiting, not before.
    let started = std::time::Instant::now();
    while clock.reads() == before {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "wait_settled never read the store's clock"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        !waiter.is_finished(),
        "the wait returned with the record running"
    );
    clock.clock.advance(Duration::from_secs(3));
    let r = waiter.await.expect("task").expect("wait").expect("record");
    assert_eq!(
        r.state,
        RecordState::Unknown,
        "the lease passed while waiting"
    );
    assert_eq!(get(&*s, &req.key).await.state, RecordState::Unknown);
}

/// A [`ManualClock`] that counts how often a store read it.
#[derive(Clone, Debug)]
struct WatchedClock {
    clock: ManualClock,
    reads: Arc<AtomicU64>,
}

impl WatchedClock {
    fn new() -> WatchedClock {
        WatchedClock {
            clock: ManualClock::starting_now(),
            reads: Arc::default(),
        }
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Clock for WatchedClock {
    fn now(&self) -> Timestamp {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.clock.now()
    }
}

/// A walk through `unknown` with small pages while another task settles half of the
/// records concurrently: no record is listed twice or out of state, and every record that
/// stays unknown is listed exactly once.
async fn paging_while_settling<S: IdemStore + 'static>(a: Arc<S>, b: Arc<S>, clock: &ManualClock) {
    let mut tokens = Vec::new();
    for i in 0..30 {
        let req = request(&format!("walk-{i:02}"), LEASE);
        let t = claim(&*a, &req).await;
        a.settle(&req.key, t, Settlement::new(RecordState::Unknown))
            .await
            .expect("settle");
        tokens.push((req.key, t));
        if i % 3 == 2 {
            clock.advance(Duration::from_millis(1));
        }
    }
    let settler = {
        let a = a.clone();
        let moving: Vec<_> = tokens.iter().step_by(2).cloned().collect();
        tokio::spawn(async move {
            for (k, t) in moving {
                a.settle(
                    &k,
                    t,
                    Settlement::new(RecordState::Completed).payload(json!(1)),
                )
                .await
                .expect("late settle");
                tokio::task::yield_now().await;
            }
        })
    };
    let mut seen: Vec<ListCursor> = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let page = b
            .list_after(RecordState::Unknown, after.as_ref(), 3)
            .await
            .expect("page");
        for r in &page {
            assert_eq!(r.state, RecordState::Unknown);
            assert!(after.as_ref().is_none_or(|c| ListCursor::of(r) > *c));
        }
        seen.extend(page.iter().map(ListCursor::of));
        after = seen.last().cloned();
        if page.len() < 3 {
            break;
        }
        assert!(seen.len() <= 30, "the walk must end");
        tokio::task::yield_now().await;
    }
    settler.await.expect("settler");
    let unique: BTreeSet<&IdemKey> = seen.iter().map(|c| &c.key).collect();
    assert_eq!(unique.len(), seen.len(), "no record listed twice");
    for (k, _) in tokens.iter().skip(1).step_by(2) {
        assert!(
            unique.contains(k),
            "a record that stayed unknown was skipped"
        );
    }
    let listed = b.list(RecordState::Unknown, 100).await.expect("list");
    assert_eq!(listed.len(), 15);
    assert_eq!(
        b.list(RecordState::Completed, 100)
            .await
            .expect("list")
            .len(),
        15
    );
}

/// `Duration::MAX` as a lease (a tool with `timeout = Duration::MAX`) and as retention
/// ("keep forever"): the claim reads back as running, is renewed, settles, and the result is
/// still replayed ten years on.
async fn huge_durations_work<S: IdemStore>(s: &S, clock: &ManualClock) {
    let req = request("huge", Duration::MAX);
    let t = claim(s, &req).await;
    match s.claim(&req).await {
        Ok(ClaimOutcome::Existing(r)) => {
            assert_eq!(r.state, RecordState::Running);
            assert_eq!(r.token, t);
        }
        other => panic!("a duplicate must see the running claim, got {other:?}"),
    }
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    s.renew(&req.key, t, Duration::MAX).await.expect("renew");
    assert_eq!(get(s, &req.key).await.state, RecordState::Running);
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed).payload(json!("kept")),
    )
    .await
    .expect("settle");
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(
        r.payload,
        Some(json!("kept")),
        "forever retention keeps the result"
    );
    assert_eq!(s.list(RecordState::Completed, 10).await.expect("list"), [r]);
}

const FOREVER: Retention = Retention {
    results: Duration::MAX,
    tombstones: Duration::MAX,
};

// ---------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_skewed_workers_fence_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.sqlite3");
    let clocks = Clocks::skewed(Duration::from_secs(3));
    let a = sqlite(&path, &clocks.a, RETENTION).await;
    let b = sqlite(&path, &clocks.b, RETENTION).await;
    skewed_workers_fence_each_other(&a, &b, &clocks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_late_settle_races_takeover_across_handles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.sqlite3");
    let clock = ManualClock::starting_now();
    let a = Arc::new(sqlite(&path, &clock, RETENTION).await);
    let b = Arc::new(sqlite(&path, &clock, RETENTION).await);
    late_settle_races_takeover(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_state_round_trips_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.sqlite3");
    let clock = ManualClock::starting_now();
    let before = {
        let s = sqlite(&path, &clock, RETENTION).await;
        write_every_state(&s, &clock, true).await
    };
    let s = sqlite(&path, &clock, RETENTION).await;
    check_every_state(&s, &before, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_wait_settled_sees_lease_expiry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = WatchedClock::new();
    let s = Arc::new(sqlite(&dir.path().join("idem.sqlite3"), &clock, RETENTION).await);
    wait_settled_sees_expiry(s, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_paging_while_settling_across_handles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.sqlite3");
    let clock = ManualClock::starting_now();
    let a = Arc::new(sqlite(&path, &clock, RETENTION).await);
    let b = Arc::new(sqlite(&path, &clock, RETENTION).await);
    paging_while_settling(a, b, &clock).await;
}

/// Several processes starting at once on a file that does not exist yet (a fresh machine,
/// a fleet of agent processes): every one of them opens the store, the schema is created
/// once, and their claims exclude each other. (Racy by nature: many rounds of 8 openers
/// released by a barrier make the failure near-certain; the failing open returns within a
/// millisecond, not after the 5 s busy timeout its message claims.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_many_handles_open_a_fresh_file_at_once() {
    for round in 0..150 {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("idem.sqlite3");
        let clock = ManualClock::starting_now();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let (path, clock, barrier) = (path.clone(), clock.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::builder(path)
                        .clock(Arc::new(clock))
                        .sync(idem_runtime::SqliteSync::Normal)
                        .open_blocking()
                })
            })
            .collect();
        let mut stores = Vec::new();
        for o in opens {
            match o.join().expect("thread") {
                Ok(s) => stores.push(s),
                Err(e) => panic!("round {round}: concurrent first open failed: {e}"),
            }
        }
        let req = request("fresh-file", LEASE);
        let mut winners = 0;
        for s in &stores {
            if let ClaimOutcome::Claimed(_) = s.claim(&req).await.expect("claim") {
                winners += 1;
            }
        }
        assert_eq!(winners, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_huge_lease_and_forever_retention() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::starting_now();
    let s = sqlite(&dir.path().join("idem.sqlite3"), &clock, FOREVER).await;
    huge_durations_work(&s, &clock).await;
}

// ---------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_skewed_workers_fence_each_other() {
    let Some(url) = redis_url("redis_skewed_workers_fence_each_other") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clocks = Clocks::skewed(Duration::from_secs(3));
    let a = at.open(&clocks.a, RETENTION).await;
    let b = at.open(&clocks.b, RETENTION).await;
    skewed_workers_fence_each_other(&a, &b, &clocks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_late_settle_races_takeover_across_handles() {
    let Some(url) = redis_url("redis_late_settle_races_takeover_across_handles") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let a = Arc::new(at.open(&clock, RETENTION).await);
    let b = Arc::new(at.open(&clock, RETENTION).await);
    late_settle_races_takeover(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_every_state_round_trips_a_reopen() {
    let Some(url) = redis_url("redis_every_state_round_trips_a_reopen") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let before = {
        let s = at.open(&clock, RETENTION).await;
        write_every_state(&s, &clock, true).await
    };
    let s = at.open(&clock, RETENTION).await;
    check_every_state(&s, &before, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_wait_settled_sees_lease_expiry() {
    let Some(url) = redis_url("redis_wait_settled_sees_lease_expiry") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = WatchedClock::new();
    let s = Arc::new(at.open(&clock, RETENTION).await);
    wait_settled_sees_expiry(s, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paging_while_settling_across_handles() {
    let Some(url) = redis_url("redis_paging_while_settling_across_handles") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let a = Arc::new(at.open(&clock, RETENTION).await);
    let b = Arc::new(at.open(&clock, RETENTION).await);
    paging_while_settling(a, b, &clock).await;
}

async fn pttl(at: &Prefix, key: &str) -> i64 {
    let mut conn = at.conn().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .expect("PTTL")
}

/// Every key the store writes is under its prefix; no unsettled record (running, unknown —
/// by expiry or by settlement —, pending, escalated, taken over) and no index ever carries a
/// Redis TTL; completed and failed records carry one no shorter than the tombstone window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ttls_only_on_terminal_records_and_keys_only_under_the_prefix() {
    let Some(url) = redis_url("redis_ttls_only_on_terminal_records") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let mut by_state: HashMap<&str, IdemKey> = HashMap::new();
    let running = request("ttl-running", Duration::from_secs(3600));
    claim(&s, &running).await;
    by_state.insert("running", running.key.clone());
    let expiring = request("ttl-expired", Duration::from_secs(1));
    claim(&s, &expiring).await;
    by_state.insert("expired", expiring.key.clone());
    for (name, state) in [
        ("completed", RecordState::Completed),
        ("failed", RecordState::Failed),
        ("pending", RecordState::Pending),
        ("unknown", RecordState::Unknown),
    ] {
        let req = request(&format!("ttl-{name}"), LEASE);
        let t = claim(&s, &req).await;
        s.settle(&req.key, t, Settlement::new(state).payload(json!(name)))
            .await
            .expect("settle");
        by_state.insert(name, req.key.clone());
    }
    // Escalated via a takeover of an unknown record, and a takeover left running.
    for name in ["escalated", "taken-over"] {
        let req = request(&format!("ttl-{name}"), LEASE);
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
    let again = request("ttl-again", LEASE);
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
    let keys = at.keys().await;
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

/// The server's functions and script cache are flushed (a restart without persistence, a
/// failover to a node that never had them, an operator's FUNCTION FLUSH or SCRIPT FLUSH):
/// the next call loads the library again and works; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_script_flush_is_survived() {
    let Some(url) = redis_url("redis_script_flush_is_survived") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let library = s
        .function_library()
        .expect("Redis 7 has FUNCTION")
        .to_owned();
    let req = request("flush", LEASE);
    let t = claim(&s, &req).await;
    let mut conn = at.conn().await;
    let flush = || {
        let mut pipe = redis::pipe();
        pipe.cmd("FUNCTION").arg("FLUSH").cmd("SCRIPT").arg("FLUSH");
        pipe
    };
    let loaded = |conn: &mut redis::aio::MultiplexedConnection| {
        let library = library.clone();
        let mut conn = conn.clone();
        async move {
            let listed: redis::Value = redis::cmd("FUNCTION")
                .arg("LIST")
                .arg("LIBRARYNAME")
                .arg(&library)
                .query_async(&mut conn)
                .await
                .expect("FUNCTION LIST");
            matches!(listed, redis::Value::Array(ref libs) if libs.len() == 1)
        }
    };
    // (Other checks share this server and may load the library again at any moment, so
    // only what follows the store's own calls is asserted; tests/crash_redis.rs counts the
    // reload on a server of its own.)
    let () = flush().query_async(&mut conn).await.expect("FLUSH");
    s.renew(&req.key, t, LEASE)
        .await
        .expect("renew after flush");
    assert!(loaded(&mut conn).await, "the renew loaded it again");
    let () = flush().query_async(&mut conn).await.expect("FLUSH");
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed).payload(json!("ok")),
    )
    .await
    .expect("settle after flush");
    let r = get(&s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.payload, Some(json!("ok")));
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
    let at = Prefix::fresh(&format!("{base}/9"));
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let req = request("killed", LEASE);
    let t = claim(&s, &req).await;
    let mut admin = at.conn().await;
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
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let mut conn = at.conn().await;
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
        let req = request(&format!("foreign-{name}"), LEASE);
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
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let req = request("huge-lease", Duration::MAX);
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
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let forever = Retention {
        results: Duration::MAX,
        tombstones: Duration::MAX,
    };
    let s = at.open(&clock, forever).await;
    let req = request("forever", LEASE);
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

// ---------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_skewed_workers_fence_each_other() {
    let Some(url) = pg_url("postgres_skewed_workers_fence_each_other") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clocks = Clocks::skewed(Duration::from_secs(3));
    let a = at.open(&clocks.a, RETENTION).await;
    let b = at.open(&clocks.b, RETENTION).await;
    skewed_workers_fence_each_other(&a, &b, &clocks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_late_settle_races_takeover_across_handles() {
    let Some(url) = pg_url("postgres_late_settle_races_takeover_across_handles") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let a = Arc::new(at.open(&clock, RETENTION).await);
    let b = Arc::new(at.open(&clock, RETENTION).await);
    late_settle_races_takeover(a, b).await;
}

/// PostgreSQL text cannot hold NUL: messages are checked without one here (the backend
/// documents replacing it with U+FFFD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_state_round_trips_a_reopen() {
    let Some(url) = pg_url("postgres_every_state_round_trips_a_reopen") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let before = {
        let s = at.open(&clock, RETENTION).await;
        write_every_state(&s, &clock, false).await
    };
    let s = at.open(&clock, RETENTION).await;
    check_every_state(&s, &before, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wait_settled_sees_lease_expiry() {
    let Some(url) = pg_url("postgres_wait_settled_sees_lease_expiry") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = WatchedClock::new();
    let s = Arc::new(at.open(&clock, RETENTION).await);
    wait_settled_sees_expiry(s, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_paging_while_settling_across_handles() {
    let Some(url) = pg_url("postgres_paging_while_settling_across_handles") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let a = Arc::new(at.open(&clock, RETENTION).await);
    let b = Arc::new(at.open(&clock, RETENTION).await);
    paging_while_settling(a, b, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_huge_lease_and_forever_retention() {
    let Some(url) = pg_url("postgres_huge_lease_and_forever_retention") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, FOREVER).await;
    huge_durations_work(&s, &clock).await;
}

/// Two stores in two schemas of one database share nothing: the same key is free in each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schemas_are_isolated() {
    let Some(url) = pg_url("postgres_schemas_are_isolated") else {
        return;
    };
    let (x, y) = (Schema::fresh(&url), Schema::fresh(&url));
    let clock = ManualClock::starting_now();
    let sx = x.open(&clock, RETENTION).await;
    let sy = y.open(&clock, RETENTION).await;
    let req = request("isolated", LEASE);
    let tx = claim(&sx, &req).await;
    let ty = claim(&sy, &req).await;
    sx.settle(
        &req.key,
        tx,
        Settlement::new(RecordState::Completed).payload(json!("x")),
    )
    .await
    .expect("settle");
    stale(
        "y's token in x",
        sx.settle(&req.key, ty, Settlement::new(RecordState::Completed))
            .await,
    );
    assert_eq!(get(&sy, &req.key).await.state, RecordState::Running);
    assert_eq!(sy.list(RecordState::Completed, 10).await.expect("list"), []);
    assert_eq!(sx.list(RecordState::Running, 10).await.expect("list"), []);
}

/// Every connection of the pool is busy: store calls fail as `Unavailable` within the
/// pool's wait timeout (the executor then refuses before running a handler), never hang
/// or panic, and work again once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exhausted_pool_is_unavailable() {
    let Some(url) = pg_url("postgres_exhausted_pool_is_unavailable") else {
        return;
    };
    let at = Schema::fresh(&url);
    let config: tokio_postgres::Config = url.parse().expect("url");
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(1)
        .wait_timeout(Some(Duration::from_millis(200)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .expect("pool");
    let clock = ManualClock::starting_now();
    let s = PostgresStore::with_pool(pool.clone())
        .schema(at.name.as_str())
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect");
    let req = request("pool", LEASE);
    let held = pool.get().await.expect("the only connection");
    let r = tokio::time::timeout(Duration::from_secs(20), s.claim(&req))
        .await
        .expect("a claim on an exhausted pool must not hang");
    assert!(
        matches!(r, Err(StoreError::Unavailable(_))),
        "exhausted pool: {r:?}"
    );
    drop(held);
    let t = claim(&s, &req).await;
    let held = pool.get().await.expect("the only connection");
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        s.settle(&req.key, t, Settlement::new(RecordState::Completed)),
    )
    .await
    .expect("no hang");
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    drop(held);
    assert_eq!(get(&s, &req.key).await.state, RecordState::Running);
    s.settle(&req.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle once a connection is free");
    assert_eq!(get(&s, &req.key).await.state, RecordState::Completed);
}

/// After a crash of many workers (or one worker with many calls in flight) more than a
/// thousand claims' leases have passed. The store contract: listings apply lease expiry
/// first, so every one of them is listed as unknown and none as running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lists_every_expired_lease_as_unknown() {
    let Some(url) = pg_url("postgres_lists_every_expired_lease_as_unknown") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    const N: usize = 1010;
    let keys: Vec<String> = (0..N)
        .map(|i| {
            conformance::key(&format!("crashed-{i}"))
                .as_str()
                .to_owned()
        })
        .collect();
    let now = i64::try_from(clock.now().as_millis()).expect("ms");
    let fp = conformance::fingerprint("args").to_hex();
    // As claims written by workers that then died: running, lease end in the future.
    at.sql()
        .await
        .execute(
            &format!(
                "INSERT INTO \"{}\".idem_records \
                   (key, fingerprint, tool, state, token, lease_until, created_at, updated_at) \
                 SELECT k, $2, 't', 'running', md5(k), $3::bigint + 10000, $3::bigint, $3::bigint \
                 FROM unnest($1::text[]) AS k",
                at.name
            ),
            &[&keys, &fp, &now],
        )
        .await
        .expect("insert claims");
    clock.advance(Duration::from_secs(11));
    let unknown = s
        .list(RecordState::Unknown, 5000)
        .await
        .expect("list unknown");
    let running = s
        .list(RecordState::Running, 5000)
        .await
        .expect("list running");
    assert_eq!(
        (unknown.len(), running.len()),
        (N, 0),
        "every expired lease is listed as unknown, none as running"
    );
}

/// Claims `name` in a fresh schema, then breaks the row's fingerprint by hand (what
/// `store_postgres.rs`'s conformance hook does). Returns the store, the token, the key,
/// and a way to read the row's raw state.
async fn corrupt_running_row(
    at: &Schema,
    name: &str,
) -> (PostgresStore, ClaimToken, IdemKey, tokio_postgres::Client) {
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let req = request(name, LEASE);
    let t = claim(&s, &req).await;
    let sql = at.sql().await;
    let n = sql
        .execute(
            &format!(
                "UPDATE \"{}\".idem_records SET fingerprint = 'garbage' WHERE key = $1",
                at.name
            ),
            &[&req.key.as_str()],
        )
        .await
        .expect("corrupt");
    assert_eq!(n, 1);
    (s, t, req.key, sql)
}

async fn raw_state(at: &Schema, sql: &tokio_postgres::Client, key: &IdemKey) -> Option<String> {
    sql.query_opt(
        &format!(
            "SELECT state FROM \"{}\".idem_records WHERE key = $1",
            at.name
        ),
        &[&key.as_str()],
    )
    .await
    .expect("select")
    .map(|r| r.get::<_, String>(0))
}

/// A running row that does not decode is `Corrupt` from settle (the conformance suite
/// checks that much) — and a settle that reports an error must not have been applied: the
/// executor treats a failed settle as "not recorded".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_settle_of_a_corrupt_row_reports_error_and_applies_nothing() {
    let Some(url) = pg_url("postgres_settle_of_a_corrupt_row") else {
        return;
    };
    let at = Schema::fresh(&url);
    let (s, t, key, sql) = corrupt_running_row(&at, "corrupt-settle").await;
    let r = s
        .settle(&key, t, Settlement::new(RecordState::Completed))
        .await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    assert_eq!(
        raw_state(&at, &sql, &key).await.as_deref(),
        Some("running"),
        "settle returned {r:?} but changed the row"
    );
}

/// Release of a running row that does not decode must be `Corrupt` (the conformance
/// suite's rule: every operation on a corrupt key), keeping the row for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_of_a_corrupt_row_is_corrupt() {
    let Some(url) = pg_url("postgres_release_of_a_corrupt_row") else {
        return;
    };
    let at = Schema::fresh(&url);
    let (s, t, key, sql) = corrupt_running_row(&at, "corrupt-release").await;
    let r = s.release(&key, t).await;
    let state = raw_state(&at, &sql, &key).await;
    assert!(
        matches!(r, Err(StoreError::Corrupt { .. })) && state.as_deref() == Some("running"),
        "release of a corrupt row: {r:?}, row now {state:?} (must be Corrupt and kept)"
    );
}

// ---------------------------------------------------------------------------------------
// Corruption never frees a key
// ---------------------------------------------------------------------------------------

/// Access to one backend's stored record below the store API: what the corruption check
/// needs to break a row and to see whether an operation touched it.
trait RawRecord {
    /// Breaks the stored record of `key` the way `how` names.
    async fn corrupt(&self, key: &IdemKey, how: &str);

    /// The stored record of `key` exactly as the backend holds it (`None`: absent).
    async fn raw(&self, key: &IdemKey) -> Option<String>;
}

/// Every operation the corruption check runs against a corrupt record.
const OPERATIONS: [&str; 11] = [
    "claim",
    "claim after the lease",
    "get",
    "list",
    "renew",
    "settle completed",
    "settle unknown",
    "settle failed",
    "release",
    "reclaim",
    "release unsettled",
];

/// Runs `op` on the corrupt record of `req.key` (claimed with `token`); `Err` says how the
/// store broke the rule "every operation on a corrupt record is `Corrupt`".
async fn on_corrupt<S: IdemStore>(
    s: &S,
    clock: &ManualClock,
    op: &str,
    req: &ClaimRequest,
    token: ClaimToken,
) -> Result<(), String> {
    fn corrupt<T: std::fmt::Debug>(r: Result<T, StoreError>) -> Result<(), String> {
        match r {
            Err(StoreError::Corrupt { .. }) => Ok(()),
            other => Err(format!("returned {other:?}, not Corrupt")),
        }
    }
    let key = &req.key;
    match op {
        "claim" => corrupt(s.claim(req).await),
        "claim after the lease" => {
            clock.advance(LEASE * 2);
            corrupt(s.claim(req).await)
        }
        "get" => corrupt(s.get(key).await),
        "list" => {
            for state in RecordState::ALL {
                match s.list(state, 100).await {
                    Ok(rs) if rs.iter().any(|r| &r.key == key) => {
                        return Err(format!("listed it as a healthy {state:?} record"));
                    }
                    Ok(_) | Err(StoreError::Corrupt { .. }) => {}
                    Err(e) => return Err(format!("list {state:?}: {e}")),
                }
            }
            Ok(())
        }
        "renew" => corrupt(s.renew(key, token, LEASE).await),
        "settle completed" => corrupt(
            s.settle(
                key,
                token,
                Settlement::new(RecordState::Completed).payload(json!({"charge": "ch_1"})),
            )
            .await,
        ),
        "settle unknown" => corrupt(
            s.settle(
                key,
                token,
                Settlement::new(RecordState::Unknown).message("timed out"),
            )
            .await,
        ),
        "settle failed" => corrupt(
            s.settle(key, token, Settlement::new(RecordState::Failed))
                .await,
        ),
        "release" => corrupt(s.release(key, token).await),
        "reclaim" => corrupt(s.reclaim(key, token, LEASE).await),
        "release unsettled" => corrupt(
            s.release_unsettled(
                key,
                token,
                &idem_runtime::store::ReleaseNote::new("op", "not in the ledger"),
            )
            .await,
        ),
        other => unreachable!("no operation {other}"),
    }
}

/// A running record that does not decode is `Corrupt` from every operation, and no
/// operation changes it: the raw stored record is byte-for-byte what it was, and a new
/// claim is still refused. A store that settled, released or reclaimed it would free the
/// key (or record an outcome nobody can read), and the effect could run a second time.
///
/// Each (corruption, operation) pair works on a fresh running record; every broken pair is
/// reported at once.
/// `corruptions` names the ways the record is broken (see each backend's
/// [`RawRecord::corrupt`]).
async fn corruption_never_frees_a_key<S: IdemStore, R: RawRecord>(
    s: &S,
    raw: &R,
    clock: &ManualClock,
    corruptions: &[&str],
) {
    let mut broken = Vec::new();
    for how in corruptions {
        for op in OPERATIONS {
            let req = request(&format!("corrupt-{how}-{op}"), LEASE);
            let token = claim(s, &req).await;
            raw.corrupt(&req.key, how).await;
            let before = raw.raw(&req.key).await;
            assert!(before.is_some(), "{how}: the corrupt record must exist");
            // Time moves (within the lease), so a write that only refreshes timestamps or
            // the lease would show in the raw record too.
            clock.advance(Duration::from_secs(1));
            let mut problems = Vec::new();
            if let Err(e) = on_corrupt(s, clock, op, &req, token).await {
                problems.push(e);
            }
            let after = raw.raw(&req.key).await;
            if after != before {
                problems.push(format!("changed the stored record to {after:?}"));
            }
            match s.claim(&req).await {
                Err(StoreError::Corrupt { .. }) => {}
                other => problems.push(format!("a new claim then got {other:?}")),
            }
            if !problems.is_empty() {
                broken.push(format!("{how} / {op}: {}", problems.join("; ")));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "operations on a corrupt running record must be Corrupt and change nothing:\n{}",
        broken.join("\n")
    );
}

/// An SQLite file, read and written directly (another process, in effect).
struct SqliteRows(std::path::PathBuf);

impl SqliteRows {
    fn conn(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(&self.0).expect("open the file directly");
        conn.busy_timeout(Duration::from_secs(5))
            .expect("busy timeout");
        conn
    }
}

/// The ways the SQL backends' running record is broken: a column that does not decode.
const SQL_CORRUPTIONS: &[&str] = &["fingerprint", "state", "attempts"];

impl RawRecord for SqliteRows {
    async fn corrupt(&self, key: &IdemKey, how: &str) {
        let set = match how {
            "fingerprint" => "fingerprint = 'garbage'",
            "state" => "state = 'exploded'",
            "attempts" => "attempts = '[not json'",
            other => unreachable!("{other}"),
        };
        let n = self
            .conn()
            .execute(
                &format!("UPDATE idem_records SET {set} WHERE key = ?1"),
                [key.as_str()],
            )
            .expect("corrupt");
        assert_eq!(n, 1, "the record to corrupt must exist");
    }

    async fn raw(&self, key: &IdemKey) -> Option<String> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT * FROM idem_records WHERE key = ?1")
            .expect("prepare");
        let n = stmt.column_count();
        let mut rows = stmt.query([key.as_str()]).expect("select");
        let row = rows.next().expect("read a row")?;
        let values: Vec<rusqlite::types::Value> =
            (0..n).map(|i| row.get(i).expect("a column")).collect();
        Some(format!("{values:?}"))
    }
}

/// A Redis key prefix, read and written with plain commands.
struct RedisRows<'a> {
    at: &'a Prefix,
    store: &'a RedisStore,
}

impl RawRecord for RedisRows<'_> {
    async fn corrupt(&self, key: &IdemKey, how: &str) {
        let rk = self.store.record_key(key);
        let mut conn = self.at.conn().await;
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

    async fn raw(&self, key: &IdemKey) -> Option<String> {
        let rk = self.store.record_key(key);
        let mut conn = self.at.conn().await;
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

/// A Postgres schema, read and written with plain SQL.
struct PostgresRows<'a> {
    at: &'a Schema,
    sql: tokio_postgres::Client,
}

impl RawRecord for PostgresRows<'_> {
    async fn corrupt(&self, key: &IdemKey, how: &str) {
        let set = match how {
            "fingerprint" => "fingerprint = 'garbage'",
            "state" => "state = 'exploded'",
            "attempts" => "attempts = '[not json'",
            other => unreachable!("{other}"),
        };
        let n = self
            .sql
            .execute(
                &format!(
                    "UPDATE \"{}\".idem_records SET {set} WHERE key = $1",
                    self.at.name
                ),
                &[&key.as_str()],
            )
            .await
            .expect("corrupt");
        assert_eq!(n, 1, "the record to corrupt must exist");
    }

    async fn raw(&self, key: &IdemKey) -> Option<String> {
        self.sql
            .query_opt(
                &format!(
                    "SELECT row_to_json(r)::text FROM \"{}\".idem_records r WHERE key = $1",
                    self.at.name
                ),
                &[&key.as_str()],
            )
            .await
            .expect("select")
            .map(|r| r.get::<_, String>(0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_corruption_never_frees_a_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.db");
    let clock = ManualClock::starting_now();
    let s = sqlite(&path, &clock, RETENTION).await;
    corruption_never_frees_a_key(&s, &SqliteRows(path), &clock, SQL_CORRUPTIONS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_corruption_never_frees_a_key() {
    let Some(url) = redis_url("redis_corruption_never_frees_a_key") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let raw = RedisRows { at: &at, store: &s };
    let corruptions = ["fingerprint", "state", "attempts", "type"];
    corruption_never_frees_a_key(&s, &raw, &clock, &corruptions).await;
}

/// Attempts text that starts like a JSON array but does not parse: the Lua scripts decode
/// the evidence in full, so renew, settle and release are refused as corrupt and change
/// nothing, as on the other backends (a release that went through would free the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unparsable_attempts_never_free_a_key() {
    let Some(url) = redis_url("redis_unparsable_attempts_never_free_a_key") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let raw = RedisRows { at: &at, store: &s };
    corruption_never_frees_a_key(
        &s,
        &raw,
        &clock,
        &[
            "attempts-bracket",
            "attempts-entry",
            "read-backs-entry",
            "operation",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_corruption_never_frees_a_key() {
    let Some(url) = pg_url("postgres_corruption_never_frees_a_key") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let s = at.open(&clock, RETENTION).await;
    let raw = PostgresRows {
        sql: at.sql().await,
        at: &at,
    };
    corruption_never_frees_a_key(&s, &raw, &clock, SQL_CORRUPTIONS).await;
}

// ---------------------------------------------------------------------------------------
// Two reconcilers, one durable store
// ---------------------------------------------------------------------------------------

/// A keyed downstream: counts every request, keeps one charge per key. Its first request
/// commits and loses the response (the call ends unknown); every later request waits at
/// `gate` before it answers, so a retry is held inside the handler while the other
/// reconciler makes its pass.
struct KeyedCharge {
    requests: Arc<AtomicU64>,
    charges: Arc<std::sync::Mutex<BTreeSet<String>>>,
    gate: Arc<tokio::sync::Semaphore>,
    entered: Arc<tokio::sync::Notify>,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct RaceArgs {
    cents: u64,
}

impl idem_runtime::WriteTool for KeyedCharge {
    type Args = RaceArgs;
    type Output = Value;

    fn spec(&self) -> idem_runtime::ToolSpec {
        idem_runtime::ToolSpec::new("charge").downstream(idem_runtime::Downstream::Keyed)
    }

    async fn call(
        &self,
        ctx: idem_runtime::WriteCtx,
        _args: RaceArgs,
    ) -> Result<Value, idem_runtime::ToolError> {
        let n = self.requests.fetch_add(1, Ordering::SeqCst);
        self.charges
            .lock()
            .unwrap()
            .insert(ctx.key().as_str().to_owned());
        if n == 0 {
            return Err(idem_runtime::ToolError::unknown("response lost"));
        }
        self.entered.notify_one();
        let _permit = self.gate.acquire().await.expect("the gate stays open");
        Ok(json!({"charge": "ch_1"}))
    }
}

/// Two workers' reconcilers (each a registry on its own handle onto one location) race for
/// the same unknown record of a keyed downstream. Exactly one takes it over and retries:
/// two requests in all (the original and one retry), one charge, the record completed. The
/// retry is held inside the handler until the other reconciler's pass is over, so the two
/// passes certainly overlap.
async fn two_reconcilers_retry_once<S: IdemStore + 'static>(a: S, b: S, clock: &ManualClock) {
    let requests = Arc::new(AtomicU64::new(0));
    let charges = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let tool = || KeyedCharge {
        requests: requests.clone(),
        charges: charges.clone(),
        gate: gate.clone(),
        entered: entered.clone(),
    };
    let registry = |store: S| {
        idem_runtime::Registry::builder()
            .store(store)
            .clock(Arc::new(clock.clone()))
            .retry_policy(idem_runtime::RetryPolicy::never())
            .tool(tool())
            .build()
            .expect("a registry")
    };
    let (ra, rb) = (registry(a), registry(b));
    let call = idem_runtime::ToolCall::new("run-race", "charge", json!({"cents": 4900}));
    let first = ra.call(call.clone()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let key = first.key().expect("a key").clone();

    let pass = |r: &idem_runtime::Registry| {
        let r = r.clone();
        tokio::spawn(async move {
            idem_runtime::Reconciler::new(&r)
                .run_once()
                .await
                .expect("a reconciliation pass")
        })
    };
    let (mut pa, mut pb) = (pass(&ra), pass(&rb));
    // The pass that retries is held inside the handler, so the first pass to finish is the
    // other one, and it ran while the retry was in flight. If both took the record over,
    // both retries are held, and the third request says so.
    let both_inside = async {
        loop {
            entered.notified().await;
            if requests.load(Ordering::SeqCst) >= 3 {
                break;
            }
        }
    };
    let (first, d) = tokio::select! {
        d = &mut pa => ("a", d),
        d = &mut pb => ("b", d),
        () = both_inside => panic!("both reconcilers took the record over and retried"),
    };
    let mut done = vec![d.expect("a pass")];
    gate.add_permits(2);
    let other = if first == "a" { pb.await } else { pa.await };
    done.push(other.expect("the other pass"));
    let retried: usize = done
        .iter()
        .flatten()
        .filter(|d| d.key == key && d.action == idem_runtime::reconcile::Action::Retried)
        .count();
    assert_eq!(retried, 1, "exactly one reconciler retried: {done:?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "the original request and one retry reached the downstream"
    );
    assert_eq!(charges.lock().unwrap().len(), 1, "one charge");
    let record = a_record(&ra, &key).await;
    assert_eq!(record.state, RecordState::Completed);
}

async fn a_record(r: &idem_runtime::Registry, key: &IdemKey) -> Record {
    r.store().get(key).await.expect("get").expect("the record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_two_reconcilers_retry_an_unknown_record_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.db");
    let clock = ManualClock::starting_now();
    let a = sqlite(&path, &clock, RETENTION).await;
    let b = sqlite(&path, &clock, RETENTION).await;
    two_reconcilers_retry_once(a, b, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_two_reconcilers_retry_an_unknown_record_once() {
    let Some(url) = redis_url("redis_two_reconcilers_retry_an_unknown_record_once") else {
        return;
    };
    let at = Prefix::fresh(&url);
    let clock = ManualClock::starting_now();
    let (a, b) = (
        at.open(&clock, RETENTION).await,
        at.open(&clock, RETENTION).await,
    );
    two_reconcilers_retry_once(a, b, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_reconcilers_retry_an_unknown_record_once() {
    let Some(url) = pg_url("postgres_two_reconcilers_retry_an_unknown_record_once") else {
        return;
    };
    let at = Schema::fresh(&url);
    let clock = ManualClock::starting_now();
    let (a, b) = (
        at.open(&clock, RETENTION).await,
        at.open(&clock, RETENTION).await,
    );
    two_reconcilers_retry_once(a, b, &clock).await;
}
