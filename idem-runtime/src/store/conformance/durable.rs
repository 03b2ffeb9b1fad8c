//! Checks of the durable stores: what only a store that two handles (two workers, a
//! restart) can open on the same data has to get right. Two workers with skewed clocks,
//! a late result racing a takeover across handles, records in every state surviving a
//! reopen, a wait that sees a lease pass, paging while another handle settles, the largest
//! durations, and corrupt records that must never free a key.
//!
//! Each check skips a store that is not [durable](StoreFactory::durable) (an in-memory
//! store has no second handle), except the checks of the largest durations and of
//! `wait_settled`, which every store must pass.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{claim, get, request_leased, StoreFactory, StoreOptions};
use crate::identity::{IdemKey, Scope};
use crate::outcome::OutcomeClass;
use crate::store::{
    AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore,
    ListCursor, ManualClock, Operation, ReadBackRecord, Record, RecordState, ReleaseNote,
    Retention, Settlement, StoreError, Timestamp,
};

/// The lease these checks claim with.
const LEASE: Duration = Duration::from_secs(10);

/// Retention of the durable checks: results for a minute, tombstones for a day.
const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

/// "Keep forever".
const FOREVER: Retention = Retention {
    results: Duration::MAX,
    tombstones: Duration::MAX,
};

/// A fresh location for `check`, or `None` (after saying why) when the backend is
/// unavailable, or when `durable` is asked for and the store is not durable.
async fn place<F: StoreFactory>(f: &F, check: &str, durable: bool) -> Option<F::Location> {
    if durable && !f.durable() {
        eprintln!("conformance check `{check}` skipped: not durable");
        return None;
    }
    if let Some(reason) = f.unavailable() {
        super::skip(&format!("conformance check `{check}`"), &reason);
        return None;
    }
    Some(
        f.location()
            .await
            .unwrap_or_else(|e| panic!("`{check}`: creating a fresh location failed: {e}")),
    )
}

/// A handle on `at` reading time from `clock`.
async fn open<F: StoreFactory>(
    f: &F,
    at: &F::Location,
    clock: &ManualClock,
    retention: Retention,
) -> F::Store {
    open_with(f, at, StoreOptions::new(clock.clone(), retention)).await
}

async fn open_with<F: StoreFactory>(f: &F, at: &F::Location, options: StoreOptions) -> F::Store {
    f.open(at, &options)
        .await
        .unwrap_or_else(|e| panic!("opening the store failed: {e}"))
}

/// Two handles on one location whose clocks disagree (the second runs 3 s ahead): the
/// claim of the first becomes unknown, never free, once the second sees its lease pass;
/// the first's renew is refused; and after the second takes over, the first's late result
/// does not overwrite the second's decision. Durable stores only.
pub async fn skewed_workers_fence_each_other<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "skewed_workers_fence_each_other", true).await else {
        return;
    };
    let clocks = Clocks::skewed(Duration::from_secs(3));
    let a = open(f, &at, &clocks.a, RETENTION).await;
    let b = open(f, &at, &clocks.b, RETENTION).await;
    skewed_workers(&a, &b, &clocks).await;
}

/// A late settle by the first holder races a takeover through a second handle: exactly one
/// of them wins, and the record says which. Durable stores only.
pub async fn late_settle_races_takeover_across_handles<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "late_settle_races_takeover_across_handles", true).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let a = Arc::new(open(f, &at, &clock, RETENTION).await);
    let b = Arc::new(open(f, &at, &clock, RETENTION).await);
    late_settle_race(a, b).await;
}

/// Records in every state, with every field set (awkward text included), read back whole
/// by a store opened again on the same data, one by one and in listings. Durable stores
/// only.
pub async fn every_state_round_trips_a_reopen<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "every_state_round_trips_a_reopen", true).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let nul = f.keeps_nul();
    let before = {
        let s = open(f, &at, &clock, RETENTION).await;
        write_every_state(&s, &clock, nul).await
    };
    let s = open(f, &at, &clock, RETENTION).await;
    check_every_state(&s, &before, nul).await;
}

/// `wait_settled` notices a lease that passes while it waits (the record is unknown, not
/// running), and returns the running record itself when its timeout passes. Needs the
/// store to read time from [`StoreOptions::clock`].
pub async fn wait_settled_sees_lease_expiry<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "wait_settled_sees_lease_expiry", false).await else {
        return;
    };
    let clock = WatchedClock::new();
    let s = Arc::new(open_with(f, &at, StoreOptions::watched(&clock, RETENTION)).await);
    wait_expiry(s, clock).await;
}

/// A walk through `unknown` in small pages on one handle while another settles half of the
/// records: no record is listed twice or out of state, and every record that stays unknown
/// is listed once. Durable stores only.
pub async fn paging_while_settling_across_handles<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "paging_while_settling_across_handles", true).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let a = Arc::new(open(f, &at, &clock, RETENTION).await);
    let b = Arc::new(open(f, &at, &clock, RETENTION).await);
    paging_while(a, b, &clock).await;
}

/// `Duration::MAX` as a lease and as retention ("keep forever"): the claim reads back as
/// running, is renewed, settles, and the result is still replayed ten years on.
pub async fn huge_lease_and_forever_retention<F: StoreFactory>(f: &F) {
    let Some(at) = place(f, "huge_lease_and_forever_retention", false).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let s = open(f, &at, &clock, FOREVER).await;
    huge_durations(&s, &clock).await;
}

/// A running record broken in each of the factory's ways ([`StoreFactory::corruptions`])
/// is `Corrupt` from every operation, and no operation changes it: the stored record is
/// byte for byte what it was, and a new claim is still refused. A store that settled,
/// released or reclaimed it would free the key, and the effect could run a second time.
/// Skipped when the factory names no corruption.
pub async fn corruption_never_frees_a_key<F: StoreFactory>(f: &F) {
    let corruptions = f.corruptions();
    if corruptions.is_empty() {
        eprintln!("conformance check `corruption_never_frees_a_key` skipped: no corruptions");
        return;
    }
    let Some(at) = place(f, "corruption_never_frees_a_key", false).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let s = open(f, &at, &clock, RETENTION).await;
    corruption_checks(f, &at, &s, &clock, corruptions).await;
}

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
async fn skewed_workers<S: IdemStore>(a: &S, b: &S, clocks: &Clocks) {
    let req = request_leased("skew", LEASE);
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
async fn late_settle_race<S: IdemStore + 'static>(a: Arc<S>, b: Arc<S>) {
    for i in 0..12 {
        let req = request_leased(&format!("race-{i}"), LEASE);
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
        ..request_leased(name, lease)
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
async fn wait_expiry<S: IdemStore + 'static>(s: Arc<S>, clock: WatchedClock) {
    let req = request_leased("wait-expiry", Duration::from_secs(2));
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
pub(super) struct WatchedClock {
    pub(super) clock: ManualClock,
    pub(super) reads: Arc<AtomicU64>,
}

impl WatchedClock {
    pub(super) fn new() -> WatchedClock {
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
async fn paging_while<S: IdemStore + 'static>(a: Arc<S>, b: Arc<S>, clock: &ManualClock) {
    let mut tokens = Vec::new();
    for i in 0..30 {
        let req = request_leased(&format!("walk-{i:02}"), LEASE);
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
async fn huge_durations<S: IdemStore>(s: &S, clock: &ManualClock) {
    let req = request_leased("huge", Duration::MAX);
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
            s.release_unsettled(key, token, &ReleaseNote::new("op", "not in the ledger"))
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
/// `corruptions` names the ways the record is broken ([`StoreFactory::corruptions`]).
async fn corruption_checks<F: StoreFactory>(
    f: &F,
    at: &F::Location,
    s: &F::Store,
    clock: &ManualClock,
    corruptions: &[&str],
) {
    let mut broken = Vec::new();
    for how in corruptions {
        for op in OPERATIONS {
            let req = request_leased(&format!("corrupt-{how}-{op}"), LEASE);
            let token = claim(s, &req).await;
            f.break_record(at, s, &req.key, how).await;
            let before = f.raw_record(at, s, &req.key).await;
            assert!(before.is_some(), "{how}: the corrupt record must exist");
            // Time moves (within the lease), so a write that only refreshes timestamps or
            // the lease would show in the raw record too.
            clock.advance(Duration::from_secs(1));
            let mut problems = Vec::new();
            if let Err(e) = on_corrupt(s, clock, op, &req, token).await {
                problems.push(e);
            }
            let after = f.raw_record(at, s, &req.key).await;
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
