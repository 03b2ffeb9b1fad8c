//! The store contract as a state machine, checked against a reference model.
//!
//! Each proptest case is a random sequence of operations — claim (one client, or every
//! client at once), renew, settle, release, reclaim, get, list, list after a cursor, and
//! moves of the clock — by several clients on a few keys. Each client holds the tokens it
//! was handed (some go stale as the records move on) and, on the durable backends, a store
//! handle of its own. A small pure model below says what every operation must return and
//! how the record must change; every answer and every record the store shows is compared
//! with it, and at the end of the case every key and every listing is compared again.
//!
//! The model is written from the contract (`store/mod.rs`, `docs/ARCHITECTURE.md` §4), not
//! from `store/rules.rs`: atomic claim; lease expiry → unknown, never free; token fencing;
//! a late settle of an unknown record by the token that left it; results expiring into
//! tombstones that outlive them; tombstones expiring last; unknown, pending and escalated
//! records never expiring.
//!
//! Every backend runs it through its [`StoreFactory`]: a fresh location per case, and on a
//! durable store a handle of its own per client.
//!
//! Cases per backend: 64 by default (the whole file runs well under a minute in a debug
//! build); `PROPTEST_CASES=N` raises it. A failure prints the shrunk operation sequence.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde_json::{json, Value};

use super::{skip, StoreFactory, StoreOptions};
use crate::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
use crate::outcome::OutcomeClass;
use crate::store::{
    AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore,
    ListCursor, ManualClock, Operation, ReadBackRecord, Record, RecordState, Retention, Settlement,
    StoreError, Timestamp,
};

const KEYS: usize = 3;
const CLIENTS: usize = 3;
const FINGERPRINTS: usize = 2;
const DEFAULT_CASES: u32 = 64;
const TOOL: &str = "model_tool";

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// Which token a client presents.
#[derive(Clone, Copy, Debug)]
enum Tok {
    /// The i-th (mod how many) token this client was ever handed for the key; a token
    /// never minted when it holds none.
    Held(usize),
    /// A token nobody was ever handed.
    Forged,
}

#[derive(Clone, Debug)]
struct SettleSpec {
    state: RecordState,
    payload: Option<usize>,
    message: Option<usize>,
    downstream_ref: bool,
    attempts: usize,
    read_backs: usize,
}

#[derive(Clone, Debug)]
enum Op {
    Claim {
        client: usize,
        key: usize,
        fp: usize,
        lease_ms: u64,
        with_operation: bool,
    },
    /// Every client claims the key at once.
    ClaimAll {
        key: usize,
        fps: [usize; CLIENTS],
    },
    Renew {
        client: usize,
        key: usize,
        tok: Tok,
        lease_ms: u64,
    },
    Settle {
        client: usize,
        key: usize,
        tok: Tok,
        spec: SettleSpec,
    },
    Release {
        client: usize,
        key: usize,
        tok: Tok,
    },
    Reclaim {
        client: usize,
        key: usize,
        tok: Tok,
        lease_ms: u64,
    },
    Get {
        client: usize,
        key: usize,
    },
    List {
        client: usize,
        state: RecordState,
        limit: usize,
    },
    ListAfter {
        client: usize,
        state: RecordState,
        key: usize,
        shift_ms: i64,
        limit: usize,
    },
    Advance {
        ms: u64,
    },
}

/// Lease lengths: the advances below land before, on and after their ends.
fn lease() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_000u64), Just(2_500), Just(60_000)]
}

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![8 => (0usize..4).prop_map(Tok::Held), 1 => Just(Tok::Forged)]
}

fn state() -> impl Strategy<Value = RecordState> {
    prop::sample::select(RecordState::ALL.to_vec())
}

fn settle_state() -> impl Strategy<Value = RecordState> {
    prop_oneof![
        4 => Just(RecordState::Completed),
        3 => Just(RecordState::Failed),
        2 => Just(RecordState::Pending),
        3 => Just(RecordState::Unknown),
        1 => Just(RecordState::Escalated),
        1 => Just(RecordState::Running),
    ]
}

fn settle_spec() -> impl Strategy<Value = SettleSpec> {
    (
        settle_state(),
        prop::option::of(0..payloads().len()),
        prop::option::of(0..messages().len()),
        any::<bool>(),
        0usize..3,
        0usize..2,
    )
        .prop_map(
            |(state, payload, message, downstream_ref, attempts, read_backs)| SettleSpec {
                state,
                payload,
                message,
                downstream_ref,
                attempts,
                read_backs,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    let k = 0..KEYS;
    prop_oneof![
        6 => (c.clone(), k.clone(), 0..FINGERPRINTS, lease(), any::<bool>()).prop_map(
            |(client, key, fp, lease_ms, with_operation)| Op::Claim {
                client, key, fp, lease_ms, with_operation
            }
        ),
        2 => (k.clone(), prop::array::uniform3(0..FINGERPRINTS))
            .prop_map(|(key, fps)| Op::ClaimAll { key, fps }),
        3 => (c.clone(), k.clone(), tok(), lease()).prop_map(|(client, key, tok, lease_ms)| {
            Op::Renew { client, key, tok, lease_ms }
        }),
        7 => (c.clone(), k.clone(), tok(), settle_spec())
            .prop_map(|(client, key, tok, spec)| Op::Settle { client, key, tok, spec }),
        2 => (c.clone(), k.clone(), tok()).prop_map(|(client, key, tok)| Op::Release {
            client, key, tok
        }),
        3 => (c.clone(), k.clone(), tok(), lease()).prop_map(|(client, key, tok, lease_ms)| {
            Op::Reclaim { client, key, tok, lease_ms }
        }),
        3 => (c.clone(), k.clone()).prop_map(|(client, key)| Op::Get { client, key }),
        2 => (c.clone(), state(), 0usize..4)
            .prop_map(|(client, state, limit)| Op::List { client, state, limit }),
        1 => (c, state(), k, -1i64..=1, 0usize..4).prop_map(
            |(client, state, key, shift_ms, limit)| Op::ListAfter {
                client, state, key, shift_ms, limit
            }
        ),
        5 => prop::sample::select(vec![
            1u64, 500, 999, 1_000, 1_500, 2_500, 5_000, 10_000, 20_000, 30_000, 60_000
        ])
        .prop_map(|ms| Op::Advance { ms }),
    ]
}

/// Retention for a case: results 10 s, tombstones 30 s; or tombstones configured shorter
/// than results, which the store must raise to the results window.
fn retention() -> impl Strategy<Value = Retention> {
    prop_oneof![
        Just(Retention {
            results: Duration::from_secs(10),
            tombstones: Duration::from_secs(30),
        }),
        Just(Retention {
            results: Duration::from_secs(10),
            tombstones: Duration::from_secs(4),
        }),
    ]
}

fn case() -> impl Strategy<Value = (Retention, Vec<Op>)> {
    (retention(), prop::collection::vec(op(), 1..40))
}

/// Payloads a settle saves: edge numbers, a NUL, non-ASCII, nesting, a long string.
fn payloads() -> Vec<Value> {
    vec![
        json!({"id": "ch_1", "amount": 4900, "nested": {"list": [1, 2.5, null, true]}}),
        json!(null),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e308),
        json!(0.1),
        json!("caf\u{e9} \u{1F600} \u{2028}"),
        json!("nul \u{0} inside"),
        json!("x".repeat(20_000)),
        json!([[[[[[[[[[["deep"]]]]]]]]]]]),
        json!({"": "", "a\"b": "\\"}),
    ]
}

fn messages() -> Vec<String> {
    vec![
        "card declined".to_owned(),
        "nul \u{0} byte".to_owned(),
        "caf\u{e9} \u{1F600}".to_owned(),
        "m".repeat(5_000),
        String::new(),
    ]
}

fn operation() -> Operation {
    Operation {
        scope: Scope::run("run-\u{e9}").with_tenant("tenant-1"),
        intent: Some("order-\u{0}-1".to_owned()),
        args: json!({"cents": 4900, "memo": null, "big": u64::MAX, "f": 0.30000000000000004})
            .into(),
    }
}

fn key(i: usize) -> IdemKey {
    IdemKey::derive(
        &Scope::run("idem-store-model"),
        TOOL,
        KeyMaterial::Intent(&format!("key-{i}")),
    )
}

fn fingerprint(i: usize) -> Fingerprint {
    Fingerprint::of_canonical(format!("args-{i}").as_bytes())
}

const FORGED: ClaimToken = ClaimToken(0x0bad_0bad_0bad_0bad_0bad_0bad_0bad_0bad);

// ---------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------

/// `updated_at` of a record: exact, or — after a lease expiry — any time from the lease's
/// end to the moment a store first looked (stores apply expiry when they look).
#[derive(Clone, Copy, Debug)]
enum Updated {
    Exact(u64),
    LeaseExpiredSince(u64),
}

#[derive(Clone, Debug)]
enum Message {
    Exact(Option<String>),
    /// Written by the store on lease expiry: some text saying so.
    LeaseExpired,
}

#[derive(Clone, Debug)]
struct MRecord {
    fp: usize,
    state: RecordState,
    token: ClaimToken,
    lease_until: Option<u64>,
    created_at: u64,
    updated_at: Updated,
    payload: Option<Value>,
    message: Message,
    downstream_ref: Option<String>,
    result_expired: bool,
    attempts: Vec<AttemptRecord>,
    read_backs: Vec<ReadBackRecord>,
    operation: Option<Operation>,
}

impl MRecord {
    /// The time retention counts from. A terminal record's `updated_at` is always exact:
    /// only a settle makes a record terminal.
    fn updated_exact(&self) -> u64 {
        match self.updated_at {
            Updated::Exact(t) | Updated::LeaseExpiredSince(t) => t,
        }
    }
}

/// What an operation must fail with.
#[derive(Clone, Debug, PartialEq)]
enum Refusal {
    /// `StaleToken` naming the record's state (`absent` for no record).
    Stale(String),
    NotFound,
    /// Some other error (settling to `running`).
    Invalid,
}

struct Model {
    records: BTreeMap<usize, MRecord>,
    retention: Retention,
    /// Every token each client was handed, per key, oldest first.
    held: Vec<Vec<Vec<ClaimToken>>>,
    /// Every token any store handed out in this case.
    minted: Vec<ClaimToken>,
    /// The backend keeps a NUL in a message as U+FFFD (documented for Postgres, whose
    /// text cannot hold one).
    nul_as_replacement: bool,
}

impl Model {
    fn new(retention: Retention) -> Model {
        Model {
            records: BTreeMap::new(),
            retention,
            held: vec![vec![Vec::new(); KEYS]; CLIENTS],
            minted: Vec::new(),
            nul_as_replacement: false,
        }
    }

    fn token(&self, client: usize, key: usize, tok: Tok) -> ClaimToken {
        match tok {
            Tok::Held(i) => {
                let held = &self.held[client][key];
                if held.is_empty() {
                    FORGED
                } else {
                    held[i % held.len()]
                }
            }
            Tok::Forged => FORGED,
        }
    }

    /// Time's effect on one record as of `now`: lease expiry, then retention.
    fn age(&mut self, key: usize, now: u64) {
        let results = self.retention.results.as_millis() as u64;
        let tombstones = self.retention.tombstones.as_millis().max(results as u128) as u64;
        let Some(r) = self.records.get_mut(&key) else {
            return;
        };
        match r.state {
            RecordState::Running => {
                if let Some(until) = r.lease_until.filter(|u| *u <= now) {
                    r.state = RecordState::Unknown;
                    r.message = Message::LeaseExpired;
                    r.updated_at = Updated::LeaseExpiredSince(until);
                }
            }
            RecordState::Completed | RecordState::Failed => {
                let settled = r.updated_exact();
                if settled + tombstones <= now {
                    self.records.remove(&key);
                } else if settled + results <= now && !r.result_expired {
                    // Only the tombstone stays: key, fingerprint, state, times and the
                    // attempts' numbers, times, kinds and classes. Arguments, outputs and
                    // every message go with the result.
                    r.result_expired = true;
                    r.payload = None;
                    r.message = Message::Exact(None);
                    r.operation = None;
                    for attempt in &mut r.attempts {
                        attempt.message = None;
                    }
                    r.read_backs.clear();
                }
            }
            RecordState::Pending | RecordState::Unknown | RecordState::Escalated => {}
        }
    }

    fn age_all(&mut self, now: u64) {
        for k in 0..KEYS {
            self.age(k, now);
        }
    }

    fn stale(&self, key: usize) -> Refusal {
        Refusal::Stale(
            self.records
                .get(&key)
                .map_or("absent", |r| r.state.as_str())
                .to_owned(),
        )
    }

    fn new_claim(
        &mut self,
        key: usize,
        fp: usize,
        lease_ms: u64,
        op: bool,
        token: ClaimToken,
        now: u64,
    ) {
        self.records.insert(
            key,
            MRecord {
                fp,
                state: RecordState::Running,
                token,
                lease_until: Some(now + lease_ms),
                created_at: now,
                updated_at: Updated::Exact(now),
                payload: None,
                message: Message::Exact(None),
                downstream_ref: None,
                result_expired: false,
                attempts: Vec::new(),
                read_backs: Vec::new(),
                operation: op.then(operation),
            },
        );
    }

    fn renew(
        &mut self,
        key: usize,
        token: ClaimToken,
        lease_ms: u64,
        now: u64,
    ) -> Result<(), Refusal> {
        self.age(key, now);
        match self.records.get_mut(&key) {
            Some(r) if r.state == RecordState::Running && r.token == token => {
                r.lease_until = Some(now + lease_ms);
                r.updated_at = Updated::Exact(now);
                Ok(())
            }
            _ => Err(self.stale(key)),
        }
    }

    fn settle(
        &mut self,
        key: usize,
        token: ClaimToken,
        s: &Settlement,
        now: u64,
    ) -> Result<(), Refusal> {
        self.age(key, now);
        // A settlement to `running` is no settlement: refused whatever the record holds.
        if s.state == RecordState::Running {
            return Err(Refusal::Invalid);
        }
        let stale = self.stale(key);
        let Some(r) = self.records.get_mut(&key) else {
            return Err(stale);
        };
        if r.token != token {
            return Err(stale);
        }
        let evidence_only = match (r.state, s.state) {
            (RecordState::Running, _) => false,
            // A late result: the token that left an unknown record behind may settle it;
            // an unknown report only adds its evidence.
            (RecordState::Unknown, RecordState::Unknown) => true,
            (RecordState::Unknown, _) => false,
            // The holder settling to the same state again (a retried settle): evidence only.
            (now_state, new_state) if now_state == new_state => true,
            _ => return Err(stale),
        };
        r.attempts.extend(s.attempts.iter().cloned());
        r.read_backs.extend(s.read_backs.iter().cloned());
        r.updated_at = Updated::Exact(now);
        if evidence_only {
            return Ok(());
        }
        r.state = s.state;
        r.lease_until = None;
        r.payload = s.payload.clone();
        r.message = Message::Exact(s.message.clone());
        if s.downstream_ref.is_some() {
            r.downstream_ref = s.downstream_ref.clone();
        }
        r.result_expired = false;
        Ok(())
    }

    fn release(&mut self, key: usize, token: ClaimToken, now: u64) -> Result<(), Refusal> {
        self.age(key, now);
        match self.records.get(&key) {
            Some(r) if r.state == RecordState::Running && r.token == token => {
                self.records.remove(&key);
                Ok(())
            }
            _ => Err(self.stale(key)),
        }
    }

    /// Checks a reclaim; on success the caller applies it with the store's fresh token.
    fn may_reclaim(&mut self, key: usize, token: ClaimToken, now: u64) -> Result<(), Refusal> {
        self.age(key, now);
        match self.records.get(&key) {
            None => Err(Refusal::NotFound),
            Some(r)
                if matches!(
                    r.state,
                    RecordState::Pending | RecordState::Unknown | RecordState::Escalated
                ) && r.token == token =>
            {
                Ok(())
            }
            Some(_) => Err(self.stale(key)),
        }
    }

    fn reclaimed(&mut self, key: usize, fresh: ClaimToken, lease_ms: u64, now: u64) {
        let r = self.records.get_mut(&key).expect("checked by may_reclaim");
        r.state = RecordState::Running;
        r.token = fresh;
        r.lease_until = Some(now + lease_ms);
        r.updated_at = Updated::Exact(now);
    }

    /// The records a listing must return, in order (aging applied to every record first).
    fn listing(
        &mut self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
        now: u64,
    ) -> Vec<usize> {
        self.age_all(now);
        let mut keys: Vec<usize> = self
            .records
            .iter()
            .filter(|(_, r)| r.state == state)
            .filter(|(k, r)| {
                after.is_none_or(|c| (Timestamp(r.created_at), &key(**k)) > (c.created_at, &c.key))
            })
            .map(|(k, _)| *k)
            .collect();
        keys.sort_by_key(|k| (self.records[k].created_at, key(*k)));
        keys.truncate(limit);
        keys
    }
}

// ---------------------------------------------------------------------------------------
// Comparing the store with the model
// ---------------------------------------------------------------------------------------

fn fail(what: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(what.to_string())
}

/// Compares a record the store showed with the model's, pinning a lease-expiry time the
/// model only knew a range of.
fn check_record(
    m: &mut Model,
    k: usize,
    got: &Record,
    now: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let Some(want) = m.records.get_mut(&k) else {
        return Err(fail(format!(
            "{ctx}: the store shows a record for key {k}, the model has none: {got:?}"
        )));
    };
    let mismatch = |field: &str, w: &dyn std::fmt::Debug, g: &dyn std::fmt::Debug| {
        fail(format!(
            "{ctx}: key {k}: {field}: model {w:?}, store {g:?}\n  store record: {got:?}"
        ))
    };
    if got.key != key(k) {
        return Err(mismatch("key", &key(k), &got.key));
    }
    if got.fingerprint != fingerprint(want.fp) {
        return Err(mismatch("fingerprint", &want.fp, &got.fingerprint));
    }
    if &*got.tool != TOOL {
        return Err(mismatch("tool", &TOOL, &got.tool));
    }
    if got.state != want.state {
        return Err(mismatch("state", &want.state, &got.state));
    }
    if got.token != want.token {
        return Err(mismatch("token", &want.token, &got.token));
    }
    if got.lease_until != want.lease_until.map(Timestamp) {
        return Err(mismatch("lease_until", &want.lease_until, &got.lease_until));
    }
    if got.created_at != Timestamp(want.created_at) {
        return Err(mismatch("created_at", &want.created_at, &got.created_at));
    }
    match want.updated_at {
        Updated::Exact(t) if got.updated_at != Timestamp(t) => {
            return Err(mismatch("updated_at", &t, &got.updated_at));
        }
        Updated::LeaseExpiredSince(lo) => {
            if got.updated_at.0 < lo || got.updated_at.0 > now {
                return Err(mismatch(
                    "updated_at (lease expiry)",
                    &(lo..=now),
                    &got.updated_at,
                ));
            }
            want.updated_at = Updated::Exact(got.updated_at.0);
        }
        Updated::Exact(_) => {}
    }
    if got.payload != want.payload {
        return Err(mismatch("payload", &want.payload, &got.payload));
    }
    let nul = m.nul_as_replacement;
    let want = m.records.get_mut(&k).expect("checked above");
    match &want.message {
        Message::Exact(msg)
            if got.message
                != msg.as_ref().map(|s| {
                    if nul {
                        s.replace('\0', "\u{FFFD}")
                    } else {
                        s.clone()
                    }
                }) =>
        {
            return Err(mismatch("message", msg, &got.message));
        }
        Message::LeaseExpired
            if !got
                .message
                .as_deref()
                .is_some_and(|m| m.contains("lease expired")) =>
        {
            return Err(mismatch("message", &"lease expired …", &got.message));
        }
        _ => {}
    }
    if got.downstream_ref != want.downstream_ref {
        return Err(mismatch(
            "downstream_ref",
            &want.downstream_ref,
            &got.downstream_ref,
        ));
    }
    if got.result_expired != want.result_expired {
        return Err(mismatch(
            "result_expired",
            &want.result_expired,
            &got.result_expired,
        ));
    }
    if got.attempts != want.attempts {
        return Err(mismatch("attempts", &want.attempts, &got.attempts));
    }
    if got.read_backs != want.read_backs {
        return Err(mismatch("read_backs", &want.read_backs, &got.read_backs));
    }
    if got.operation != want.operation {
        return Err(mismatch("operation", &want.operation, &got.operation));
    }
    Ok(())
}

fn check_refusal<T: std::fmt::Debug>(
    k: usize,
    want: Result<(), Refusal>,
    got: &Result<T, StoreError>,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let ok = match (&want, got) {
        (Ok(()), Ok(_)) => true,
        (Err(Refusal::Stale(state)), Err(StoreError::StaleToken { key: gk, state: gs })) => {
            *gk == key(k) && gs == state
        }
        (Err(Refusal::NotFound), Err(StoreError::NotFound(gk))) => *gk == key(k),
        (Err(Refusal::Invalid), Err(e @ (StoreError::Backend(_) | StoreError::Corrupt { .. }))) => {
            !matches!(e, StoreError::Corrupt { .. })
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(fail(format!(
            "{ctx}: key {k}: model says {want:?}, store said {got:?}"
        )))
    }
}

// ---------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------

/// The clients' store handles for one case, and what must stay alive while they are used.
struct Stores {
    clients: Vec<Arc<dyn IdemStore>>,
    _keep: Box<dyn std::any::Any + Send>,
}

/// Opens a backend's stores for one case on a fresh location.
trait Backend: Sync {
    fn open(
        &self,
        clock: &ManualClock,
        retention: Retention,
    ) -> impl std::future::Future<Output = Stores> + Send;

    /// True when the backend keeps a NUL in a message as U+FFFD.
    fn nul_as_replacement(&self) -> bool {
        false
    }
}

fn settlement(spec: &SettleSpec, now: u64, n: &mut u32) -> Settlement {
    let mut s = Settlement::new(spec.state);
    if let Some(p) = spec.payload {
        s = s.payload(payloads()[p].clone());
    }
    if let Some(m) = spec.message {
        s = s.message(messages()[m].clone());
    }
    if spec.downstream_ref {
        *n += 1;
        s = s.downstream_ref(format!("ref_{n}"));
    }
    let kinds = [
        AttemptKind::Returned,
        AttemptKind::TimedOut,
        AttemptKind::Late,
    ];
    let classes = [
        OutcomeClass::Completed,
        OutcomeClass::Unknown,
        OutcomeClass::Failed,
    ];
    let attempts = (0..spec.attempts)
        .map(|i| {
            *n += 1;
            AttemptRecord::new(
                *n,
                Timestamp(now.saturating_sub(5)),
                Timestamp(now),
                kinds[i % kinds.len()],
                classes[(i + *n as usize) % classes.len()],
                (i % 2 == 0).then(|| format!("attempt {n} \u{e9}")),
            )
        })
        .collect();
    let read_backs = (0..spec.read_backs)
        .map(|_| {
            *n += 1;
            ReadBackRecord {
                at: Timestamp(now),
                result: format!("not found ({n})"),
            }
        })
        .collect();
    s.attempts(attempts).read_backs(read_backs)
}

fn claim_request(k: usize, fp: usize, lease_ms: u64, with_operation: bool) -> ClaimRequest {
    ClaimRequest {
        key: key(k),
        fingerprint: fingerprint(fp),
        tool: TOOL.into(),
        lease: Duration::from_millis(lease_ms),
        operation: with_operation.then(|| operation().into()),
    }
}

/// Checks a claim that found a record against the model.
fn check_found(
    m: &mut Model,
    k: usize,
    fp: usize,
    got: &ClaimOutcome,
    now: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let want_fp = m.records[&k].fp;
    match got {
        ClaimOutcome::Existing(r) if want_fp == fp => check_record(m, k, r, now, ctx),
        ClaimOutcome::Mismatch(r) if want_fp != fp => check_record(m, k, r, now, ctx),
        other => Err(fail(format!(
            "{ctx}: key {k} is held (fingerprint {want_fp}), a claim with fingerprint {fp} \
             got {other:?}"
        ))),
    }
}

fn fresh_token(m: &mut Model, t: ClaimToken, ctx: &str) -> Result<(), TestCaseError> {
    if t == FORGED || m.minted.contains(&t) {
        return Err(fail(format!(
            "{ctx}: the store handed out a token twice: {t:?}"
        )));
    }
    m.minted.push(t);
    Ok(())
}

async fn run_case<B: Backend>(
    backend: &B,
    retention: Retention,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::starting_now();
    let stores = backend.open(&clock, retention).await;
    let s = &stores.clients;
    let mut m = Model::new(retention);
    m.nul_as_replacement = backend.nul_as_replacement();
    let mut n = 0u32;
    let lease_default = 60_000;
    for (i, op) in ops.iter().enumerate() {
        let now = clock.now().0;
        let ctx = format!("op #{i} {op:?}");
        match op {
            Op::Advance { ms } => clock.advance(Duration::from_millis(*ms)),
            Op::Claim {
                client,
                key: k,
                fp,
                lease_ms,
                with_operation,
            } => {
                let req = claim_request(*k, *fp, *lease_ms, *with_operation);
                let got = s[*client]
                    .claim(&req)
                    .await
                    .map_err(|e| fail(format!("{ctx}: {e}")))?;
                m.age(*k, now);
                if m.records.contains_key(k) {
                    check_found(&mut m, *k, *fp, &got, now, &ctx)?;
                } else {
                    let ClaimOutcome::Claimed(t) = got else {
                        return Err(fail(format!(
                            "{ctx}: the key is free, the claim got {got:?}"
                        )));
                    };
                    fresh_token(&mut m, t, &ctx)?;
                    m.held[*client][*k].push(t);
                    m.new_claim(*k, *fp, *lease_ms, *with_operation, t, now);
                }
            }
            Op::ClaimAll { key: k, fps } => {
                let reqs: Vec<ClaimRequest> = fps
                    .iter()
                    .map(|fp| claim_request(*k, *fp, lease_default, false))
                    .collect();
                let got = futures_util::future::join_all(
                    reqs.iter().enumerate().map(|(c, req)| s[c].claim(req)),
                )
                .await;
                let got: Vec<ClaimOutcome> = got
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .map_err(|e| fail(format!("{ctx}: {e}")))?;
                m.age(*k, now);
                if !m.records.contains_key(k) {
                    let winners: Vec<usize> = (0..CLIENTS)
                        .filter(|c| matches!(got[*c], ClaimOutcome::Claimed(_)))
                        .collect();
                    let [w] = winners[..] else {
                        return Err(fail(format!(
                            "{ctx}: concurrent claims of a free key: exactly one must win, got {got:?}"
                        )));
                    };
                    let ClaimOutcome::Claimed(t) = got[w] else {
                        unreachable!()
                    };
                    fresh_token(&mut m, t, &ctx)?;
                    m.held[w][*k].push(t);
                    m.new_claim(*k, fps[w], lease_default, false, t, now);
                }
                for c in 0..CLIENTS {
                    if !matches!(got[c], ClaimOutcome::Claimed(_)) {
                        check_found(
                            &mut m,
                            *k,
                            fps[c],
                            &got[c],
                            now,
                            &format!("{ctx} client {c}"),
                        )?;
                    }
                }
            }
            Op::Renew {
                client,
                key: k,
                tok,
                lease_ms,
            } => {
                let t = m.token(*client, *k, *tok);
                let got = s[*client]
                    .renew(&key(*k), t, Duration::from_millis(*lease_ms))
                    .await;
                let want = m.renew(*k, t, *lease_ms, now);
                check_refusal(*k, want, &got, &ctx)?;
            }
            Op::Settle {
                client,
                key: k,
                tok,
                spec,
            } => {
                let t = m.token(*client, *k, *tok);
                let settlement = settlement(spec, now, &mut n);
                let got = s[*client].settle(&key(*k), t, settlement.clone()).await;
                let absent = {
                    m.age(*k, now);
                    !m.records.contains_key(k)
                };
                let want = m.settle(*k, t, &settlement, now);
                // Settling to `running` with no record at all: "invalid" and "stale, absent"
                // are both right (backends differ in which they check first).
                let stale_absent =
                    matches!(&got, Err(StoreError::StaleToken { state, .. }) if state == "absent");
                if !(spec.state == RecordState::Running && absent && stale_absent) {
                    check_refusal(*k, want, &got, &ctx)?;
                }
            }
            Op::Release {
                client,
                key: k,
                tok,
            } => {
                let t = m.token(*client, *k, *tok);
                let got = s[*client].release(&key(*k), t).await;
                let want = m.release(*k, t, now);
                check_refusal(*k, want, &got, &ctx)?;
            }
            Op::Reclaim {
                client,
                key: k,
                tok,
                lease_ms,
            } => {
                let t = m.token(*client, *k, *tok);
                let got = s[*client]
                    .reclaim(&key(*k), t, Duration::from_millis(*lease_ms))
                    .await;
                let want = m.may_reclaim(*k, t, now);
                check_refusal(*k, want.clone(), &got, &ctx)?;
                if let Ok(fresh) = got {
                    fresh_token(&mut m, fresh, &ctx)?;
                    m.held[*client][*k].push(fresh);
                    m.reclaimed(*k, fresh, *lease_ms, now);
                }
            }
            Op::Get { client, key: k } => {
                let got = s[*client]
                    .get(&key(*k))
                    .await
                    .map_err(|e| fail(format!("{ctx}: {e}")))?;
                m.age(*k, now);
                match got {
                    Some(r) => check_record(&mut m, *k, &r, now, &ctx)?,
                    None if m.records.contains_key(k) => {
                        return Err(fail(format!(
                            "{ctx}: the store has no record, the model has {:?}",
                            m.records[k]
                        )));
                    }
                    None => {}
                }
            }
            Op::List {
                client,
                state,
                limit,
            } => {
                let got = s[*client]
                    .list(*state, *limit)
                    .await
                    .map_err(|e| fail(format!("{ctx}: {e}")))?;
                let want = m.listing(*state, None, *limit, now);
                check_listing(&mut m, &want, &got, now, &ctx)?;
            }
            Op::ListAfter {
                client,
                state,
                key: k,
                shift_ms,
                limit,
            } => {
                let base = m.records.get(k).map_or(now, |r| r.created_at);
                let cursor = ListCursor {
                    created_at: Timestamp(base.saturating_add_signed(*shift_ms)),
                    key: key(*k),
                };
                let got = s[*client]
                    .list_after(*state, Some(&cursor), *limit)
                    .await
                    .map_err(|e| fail(format!("{ctx}: {e}")))?;
                let want = m.listing(*state, Some(&cursor), *limit, now);
                check_listing(&mut m, &want, &got, now, &ctx)?;
            }
        }
    }
    // The end state, through every client's handle: every key, every listing.
    let now = clock.now().0;
    for (c, store) in s.iter().enumerate() {
        for k in 0..KEYS {
            let ctx = format!("final get by client {c}");
            let got = store
                .get(&key(k))
                .await
                .map_err(|e| fail(format!("{ctx}: {e}")))?;
            m.age(k, now);
            match got {
                Some(r) => check_record(&mut m, k, &r, now, &ctx)?,
                None if m.records.contains_key(&k) => {
                    return Err(fail(format!(
                        "{ctx}: key {k}: the store has no record, the model has {:?}",
                        m.records[&k]
                    )));
                }
                None => {}
            }
        }
        for state in RecordState::ALL {
            let ctx = format!("final list {state} by client {c}");
            let got = store
                .list(state, usize::MAX)
                .await
                .map_err(|e| fail(format!("{ctx}: {e}")))?;
            let want = m.listing(state, None, usize::MAX, now);
            check_listing(&mut m, &want, &got, now, &ctx)?;
        }
    }
    drop(stores);
    Ok(())
}

fn check_listing(
    m: &mut Model,
    want: &[usize],
    got: &[Record],
    now: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let got_keys: Vec<&IdemKey> = got.iter().map(|r| &r.key).collect();
    let want_keys: Vec<IdemKey> = want.iter().map(|k| key(*k)).collect();
    if got_keys != want_keys.iter().collect::<Vec<_>>() {
        return Err(fail(format!(
            "{ctx}: listing: model keys {want:?} ({want_keys:?}), store {got_keys:?}"
        )));
    }
    for (k, r) in want.iter().zip(got) {
        check_record(m, *k, r, now, ctx)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn run<B: Backend>(name: &str, backend: B) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let result = runner.run(&case(), |(retention, ops)| {
        rt.block_on(run_case(&backend, retention, &ops))
    });
    match result {
        Ok(()) => eprintln!("{name}: {cases} cases passed in {:.1?}", started.elapsed()),
        Err(TestError::Fail(why, (retention, ops))) => panic!(
            "{name}: the store departs from the model: {why}\nminimal case: retention \
             {retention:?}\n{}",
            ops.iter()
                .enumerate()
                .map(|(i, op)| format!("  #{i} {op:?}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The model's stores opened through a [`StoreFactory`].
struct ThroughFactory<'f, F>(&'f F);

impl<F: StoreFactory> Backend for ThroughFactory<'_, F>
where
    F::Location: 'static,
{
    async fn open(&self, clock: &ManualClock, retention: Retention) -> Stores {
        let f = self.0;
        let at = f
            .location()
            .await
            .unwrap_or_else(|e| panic!("creating a fresh location failed: {e}"));
        let options = StoreOptions::new(clock.clone(), retention);
        let mut clients: Vec<Arc<dyn IdemStore>> = Vec::new();
        for i in 0..CLIENTS {
            // A store that is not durable has one handle, shared by every client.
            if i > 0 && !f.durable() {
                clients.push(clients[0].clone());
                continue;
            }
            let store = f
                .open(&at, &options)
                .await
                .unwrap_or_else(|e| panic!("opening the store failed: {e}"));
            clients.push(Arc::new(store));
        }
        Stores {
            clients,
            _keep: Box::new(at),
        }
    }

    fn nul_as_replacement(&self) -> bool {
        !self.0.keeps_nul()
    }
}

/// The store against a reference model of the contract: random sequences of claims (one
/// client, or every client at once), renewals, settlements, releases, takeovers, reads,
/// listings and moves of the clock, by several clients on a few keys, each answer and
/// every record compared with what the model says (see the module docs). A failure panics
/// with the shrunk operation sequence. 64 cases; `PROPTEST_CASES=N` sets another number.
///
/// Builds a runtime of its own: call it from a plain `#[test]`, not from inside a runtime.
pub fn store_follows_the_model<F: StoreFactory>(f: &F)
where
    F::Location: 'static,
{
    if let Some(reason) = f.unavailable() {
        skip("conformance check `store_follows_the_model`", &reason);
        return;
    }
    run(std::any::type_name::<F::Store>(), ThroughFactory(f));
}
