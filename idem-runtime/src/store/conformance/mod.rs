//! The store conformance suite: the [`IdemStore`] contract as executable checks.
//!
//! Every backend's tests call it — [`super::MemoryStore`] included — so "passes the suite"
//! means the same thing for all of them. Enabled by the `testing` feature.
//!
//! # How a backend test calls it
//!
//! Implement [`StoreFactory`] for your backend. It hands out *locations* (an empty place for
//! a store's data: a temp file, a Redis key prefix, a Postgres schema) and opens stores on
//! them with the suite's [`StoreOptions`] (a [`ManualClock`] the suite moves, so lease and
//! retention checks never sleep, and the retention windows to apply). A durable backend
//! opens the *same* data again when given the same location; that is how the suite checks
//! that records survive a restart.
//!
//! ```ignore
//! // idem-runtime/tests/store_mybackend.rs
//! use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
//! use idem_runtime::store::StoreError;
//!
//! struct Factory;
//!
//! impl StoreFactory for Factory {
//!     type Store = MyStore;
//!     type Location = MyNamespace;          // dropped at the end of each check: clean up there
//!
//!     fn durable(&self) -> bool { true }
//!     fn unavailable(&self) -> Option<String> {
//!         // e.g. Some("IDEM_MY_URL is not set".into()) to skip every check with that reason
//!         None
//!     }
//!     async fn location(&self) -> Result<MyNamespace, StoreError> { MyNamespace::fresh().await }
//!     async fn open(&self, at: &MyNamespace, o: &StoreOptions) -> Result<MyStore, StoreError> {
//!         MyStore::open(at).clock(o.clock()).retention(o.retention).await
//!     }
//!     // Optional: lets the suite check that foreign data is `StoreError::Corrupt`.
//!     async fn corrupt(&self, at: &MyNamespace, key: &IdemKey) -> Result<bool, StoreError> {
//!         at.write_raw(key, b"\xff not a record").await?;
//!         Ok(true)
//!     }
//! }
//!
//! // One `#[tokio::test]` per check (multi-thread runtime), named after the check:
//! idem_runtime::store_conformance_tests!(Factory);
//!
//! // Or all at once:
//! // #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
//! // async fn conformance() { conformance::run_all(&Factory).await }
//! ```
//!
//! Each check opens its own fresh location, so checks are independent and may run in
//! parallel. Checks panic (with a message naming the contract rule) when the store breaks
//! the contract, like any test assertion; they never sleep on the wall clock except where a
//! real concurrent wait is the thing under test, and they never assert on timings.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

mod durable;
mod inputs;
mod model;

pub use durable::{
    corruption_never_frees_a_key, every_state_round_trips_a_reopen,
    huge_lease_and_forever_retention, late_settle_races_takeover_across_handles,
    paging_while_settling_across_handles, skewed_workers_fence_each_other,
    wait_settled_sees_lease_expiry,
};
pub use inputs::arguments_round_trip;
pub use model::store_follows_the_model;

use super::{
    rules, AttemptKind, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore,
    ListCursor, ManualClock, OperationDraft, ReadBackRecord, Record, RecordState, ReleaseNote,
    Retention, Settlement, StoreError,
};
use crate::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
use crate::outcome::OutcomeClass;

/// What the suite asks a [`StoreFactory`] to open a store with.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// The clock the store must read time from. The suite moves it; clones share one time.
    pub clock: ManualClock,
    /// The retention windows the store must apply.
    pub retention: Retention,
    /// How often the store's background retention sweep runs (`sweep_every` on the
    /// durable stores' builders): [`Duration::ZERO`], the task off, for every check but
    /// [`sweep_task_enforces_retention`], which sets a short one. A factory whose store has
    /// such a task passes this to its builder.
    pub sweep_every: Duration,
    /// Set by the checks that count the store's reads of the time.
    watched: Option<durable::WatchedClock>,
}

impl StoreOptions {
    /// Options with `clock` and `retention`.
    pub fn new(clock: ManualClock, retention: Retention) -> StoreOptions {
        StoreOptions {
            clock,
            retention,
            sweep_every: Duration::ZERO,
            watched: None,
        }
    }

    /// Options whose [`clock`](StoreOptions::clock) counts the store's reads of `watched`.
    fn watched(watched: &durable::WatchedClock, retention: Retention) -> StoreOptions {
        StoreOptions {
            clock: watched.clock.clone(),
            retention,
            sweep_every: Duration::ZERO,
            watched: Some(watched.clone()),
        }
    }

    /// The clock as the `Arc<dyn Clock>` store builders take. Open stores with this rather
    /// than the `clock` field: some checks count how often the store reads the time.
    pub fn clock(&self) -> Arc<dyn Clock> {
        match &self.watched {
            Some(watched) => Arc::new(watched.clone()),
            None => Arc::new(self.clock.clone()),
        }
    }
}

/// Opens stores of one backend for the suite.
///
/// Methods return `impl Future + Send`; implement them with `async fn`.
pub trait StoreFactory: Send + Sync {
    /// The backend under test.
    type Store: IdemStore;

    /// Where one store's data lives (a temp file, a key prefix, a schema). Each check asks
    /// for a fresh one and drops it at the end: put clean-up in its `Drop` if needed.
    type Location: Send + Sync;

    /// True when a store opened again on the same location sees the records of the previous
    /// one (SQLite, Redis, Postgres). Enables [`survives_reopen`] and
    /// [`claim_is_atomic_across_handles`].
    fn durable(&self) -> bool;

    /// `Some(reason)` when the backend cannot be reached in this environment (e.g. no server
    /// URL configured): every check prints the reason and passes without running, or fails
    /// when `IDEM_REQUIRE_BACKENDS=1` (see [`skip`]). Never use it to hide a failure.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// A fresh, empty location.
    fn location(&self) -> impl Future<Output = Result<Self::Location, StoreError>> + Send;

    /// Opens a store on `location` with `options`. For a durable backend, opening twice on
    /// one location gives two handles onto the same data.
    fn open(
        &self,
        location: &Self::Location,
        options: &StoreOptions,
    ) -> impl Future<Output = Result<Self::Store, StoreError>> + Send;

    /// Overwrites (or creates) the stored record of `key` at `location` with data that does
    /// not decode as a record: bytes that are not the backend's format, a state name this
    /// version does not know, a malformed fingerprint… Returns `Ok(false)` when the backend
    /// cannot hold undecodable data (the default; [`corrupt_records_are_errors`] then skips).
    fn corrupt(
        &self,
        location: &Self::Location,
        key: &IdemKey,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (location, key);
        async { Ok(false) }
    }

    /// False when the backend cannot keep a NUL character in text and stores it replaced
    /// (Postgres): [`every_state_round_trips_a_reopen`] then writes none, and
    /// [`arguments_round_trip`] expects U+FFFD for NUL in an error text (arguments, which
    /// are JSON text, keep it everywhere). The default is true.
    fn keeps_nul(&self) -> bool {
        true
    }

    /// The ways [`StoreFactory::break_record`] can break a stored running record (names of
    /// the factory's choosing: a column, a field, a type). Empty (the default) skips
    /// [`corruption_never_frees_a_key`].
    fn corruptions(&self) -> &'static [&'static str] {
        &[]
    }

    /// Breaks the stored record of `key` at `location` (`store` is a handle on it) the way
    /// `how` names, below the store API (as another process would). Panics when it cannot.
    fn break_record(
        &self,
        location: &Self::Location,
        store: &Self::Store,
        key: &IdemKey,
        how: &str,
    ) -> impl Future<Output = ()> + Send {
        let _ = (location, store, key, how);
        async {}
    }

    /// The stored record of `key` at `location` exactly as the backend holds it, rendered
    /// as text (`None`: absent): what shows whether an operation touched it.
    fn raw_record(
        &self,
        location: &Self::Location,
        store: &Self::Store,
        key: &IdemKey,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (location, store, key);
        async { None }
    }
}

/// Generates one `#[tokio::test]` (multi-thread runtime) per conformance check, each named
/// after its check, for the [`StoreFactory`] that `$factory` evaluates to.
///
/// ```ignore
/// idem_runtime::store_conformance_tests!(MyFactory::new());
/// ```
///
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:expr) => {
        $crate::store_conformance_tests!(@each $factory;
            claim_is_atomic,
            claim_is_atomic_across_handles,
            fingerprint_mismatch_is_detected,
            stale_tokens_are_refused,
            settle_is_idempotent_for_its_holder,
            settle_cannot_return_to_running,
            lease_expiry_makes_unknown,
            expired_lease_cannot_be_renewed_or_released,
            renew_keeps_a_claim_alive,
            late_result_settles_unknown,
            late_result_refused_after_reclaim,
            results_expire_to_tombstones,
            tombstones_keep_no_arguments_or_outputs,
            sweep_enforces_retention_unread,
            sweep_task_enforces_retention,
            evidence_is_capped,
            short_tombstone_retention_is_raised,
            unsettled_records_never_expire,
            release_frees_the_key,
            release_keeps_a_trace,
            release_traced_frees_its_claim,
            releases_are_listed,
            reclaim_fences_the_old_token,
            list_by_state,
            list_after_pages_exactly_once,
            attempts_are_appended,
            records_round_trip,
            wait_settled_sees_settlement,
            survives_reopen,
            corrupt_records_are_errors,
            skewed_workers_fence_each_other,
            late_settle_races_takeover_across_handles,
            every_state_round_trips_a_reopen,
            wait_settled_sees_lease_expiry,
            paging_while_settling_across_handles,
            huge_lease_and_forever_retention,
            corruption_never_frees_a_key,
        );

        #[test]
        fn store_follows_the_model() {
            let factory = $factory;
            $crate::store::conformance::store_follows_the_model(&factory);
        }

        #[test]
        fn arguments_round_trip() {
            let factory = $factory;
            $crate::store::conformance::arguments_round_trip(&factory);
        }
    };
    (@each $factory:expr; $($check:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $check() {
                let factory = $factory;
                $crate::store::conformance::$check(&factory).await;
            }
        )+
    };
}

/// Runs every check, one after the other. Call it from a multi-thread tokio runtime.
pub async fn run_all<F: StoreFactory>(f: &F) {
    claim_is_atomic(f).await;
    claim_is_atomic_across_handles(f).await;
    fingerprint_mismatch_is_detected(f).await;
    stale_tokens_are_refused(f).await;
    settle_is_idempotent_for_its_holder(f).await;
    settle_cannot_return_to_running(f).await;
    lease_expiry_makes_unknown(f).await;
    expired_lease_cannot_be_renewed_or_released(f).await;
    renew_keeps_a_claim_alive(f).await;
    late_result_settles_unknown(f).await;
    late_result_refused_after_reclaim(f).await;
    results_expire_to_tombstones(f).await;
    tombstones_keep_no_arguments_or_outputs(f).await;
    sweep_enforces_retention_unread(f).await;
    sweep_task_enforces_retention(f).await;
    evidence_is_capped(f).await;
    short_tombstone_retention_is_raised(f).await;
    unsettled_records_never_expire(f).await;
    release_frees_the_key(f).await;
    release_keeps_a_trace(f).await;
    release_traced_frees_its_claim(f).await;
    releases_are_listed(f).await;
    reclaim_fences_the_old_token(f).await;
    list_by_state(f).await;
    list_after_pages_exactly_once(f).await;
    attempts_are_appended(f).await;
    records_round_trip(f).await;
    wait_settled_sees_settlement(f).await;
    survives_reopen(f).await;
    corrupt_records_are_errors(f).await;
    skewed_workers_fence_each_other(f).await;
    late_settle_races_takeover_across_handles(f).await;
    every_state_round_trips_a_reopen(f).await;
    wait_settled_sees_lease_expiry(f).await;
    paging_while_settling_across_handles(f).await;
    huge_lease_and_forever_retention(f).await;
    corruption_never_frees_a_key(f).await;
}

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// The lease the suite claims with.
const LEASE: Duration = Duration::from_secs(10);

/// Retention short enough to walk through with the manual clock.
const RETENTION: Retention = Retention {
    results: Duration::from_secs(3600),
    tombstones: Duration::from_secs(10 * 3600),
};

/// One check's store, with its clock and location (kept alive for the check).
struct Harness<F: StoreFactory> {
    store: Arc<F::Store>,
    clock: ManualClock,
    location: F::Location,
    options: StoreOptions,
}

impl<F: StoreFactory> Harness<F> {
    /// Opens another handle on this check's location (a restart, or a second worker).
    async fn reopen(&self, f: &F) -> F::Store {
        f.open(&self.location, &self.options)
            .await
            .unwrap_or_else(|e| panic!("reopening the store failed: {e}"))
    }
}

/// Opens a store on a fresh location, or `None` (after printing why) when the backend is
/// unavailable.
async fn harness<F: StoreFactory>(f: &F, check: &str) -> Option<Harness<F>> {
    harness_with(f, check, RETENTION).await
}

/// [`harness`] with other retention windows.
async fn harness_with<F: StoreFactory>(
    f: &F,
    check: &str,
    retention: Retention,
) -> Option<Harness<F>> {
    harness_sweeping(f, check, retention, Duration::ZERO).await
}

/// [`harness_with`] whose store sweeps every `sweep_every` by itself.
async fn harness_sweeping<F: StoreFactory>(
    f: &F,
    check: &str,
    retention: Retention,
    sweep_every: Duration,
) -> Option<Harness<F>> {
    if let Some(reason) = f.unavailable() {
        skip(&format!("conformance check `{check}`"), &reason);
        return None;
    }
    let clock = ManualClock::starting_now();
    let mut options = StoreOptions::new(clock.clone(), retention);
    options.sweep_every = sweep_every;
    let location = f
        .location()
        .await
        .unwrap_or_else(|e| panic!("`{check}`: creating a fresh location failed: {e}"));
    let store = f
        .open(&location, &options)
        .await
        .unwrap_or_else(|e| panic!("`{check}`: opening the store failed: {e}"));
    Some(Harness {
        store: Arc::new(store),
        clock,
        location,
        options,
    })
}

// ---------------------------------------------------------------------------------------
// Backends that need a server
// ---------------------------------------------------------------------------------------

/// The environment variable that turns every backend skip into a failure: with
/// `IDEM_REQUIRE_BACKENDS=1` (CI sets it) a check that cannot reach its server fails instead
/// of passing without running, so a server that did not start cannot leave the run green.
pub const REQUIRE_BACKENDS: &str = "IDEM_REQUIRE_BACKENDS";

/// True when [`REQUIRE_BACKENDS`] is set to `1`.
pub fn backends_required() -> bool {
    std::env::var(REQUIRE_BACKENDS).is_ok_and(|v| v.trim() == "1")
}

/// Skips `check` for `reason`: prints why on a plain `cargo test`, and panics (failing the
/// test) when [`REQUIRE_BACKENDS`] is set. The caller returns right after.
pub fn skip(check: &str, reason: &str) {
    if backends_required() {
        panic!("{check} cannot run: {reason}; {REQUIRE_BACKENDS}=1 makes that a failure");
    }
    eprintln!("skipping {check}: {reason}");
}

/// The non-empty value of the environment variable `var` (a server URL such as
/// `IDEM_REDIS_URL`), or `None` after [`skip`]ping `check` with the reason (a panic when
/// [`REQUIRE_BACKENDS`] is set).
pub fn backend_url(var: &str, check: &str) -> Option<String> {
    let url = std::env::var(var).ok().filter(|s| !s.trim().is_empty());
    if url.is_none() {
        skip(
            check,
            &format!("{var} is not set (source .ci/services.sh and run idem_services_start)"),
        );
    }
    url
}

/// A key of its own for each name.
pub fn key(name: &str) -> IdemKey {
    IdemKey::derive(
        &Scope::run("idem-conformance"),
        "conformance_tool",
        KeyMaterial::Intent(name),
    )
}

/// A fingerprint of its own for each name.
pub fn fingerprint(name: &str) -> Fingerprint {
    Fingerprint::of_canonical(name.as_bytes())
}

/// A claim request for the key and fingerprint of `name`, with the suite's lease.
pub fn request(name: &str) -> ClaimRequest {
    ClaimRequest {
        key: key(name),
        fingerprint: fingerprint("args"),
        tool: "conformance_tool".into(),
        lease: LEASE,
        operation: None,
    }
}

/// [`request`] with a lease of its own (the durable checks expire leases on a clock).
pub fn request_leased(name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        lease,
        ..request(name)
    }
}

/// [`request`] carrying `operation`: what the store keeps of the call (scope, intent,
/// arguments), which retention drops and redaction hides.
pub fn request_with_operation(name: &str, operation: crate::store::Operation) -> ClaimRequest {
    ClaimRequest {
        operation: Some(operation.into()),
        ..request(name)
    }
}

/// Claims `req`, which must be granted (panics otherwise).
pub async fn claim(store: &impl IdemStore, req: &ClaimRequest) -> ClaimToken {
    match store.claim(req).await {
        Ok(ClaimOutcome::Claimed(t)) => t,
        other => panic!("claiming a free key must grant it, got {other:?}"),
    }
}

/// Claims `req`, which must find a record with the same fingerprint (panics otherwise).
pub async fn claim_finds(store: &impl IdemStore, req: &ClaimRequest) -> Record {
    match store.claim(req).await {
        Ok(ClaimOutcome::Existing(r)) => Record::clone(&r),
        other => panic!("claiming a held key must report its record, got {other:?}"),
    }
}

/// The record of `key`, which must exist (panics otherwise).
pub async fn get(store: &impl IdemStore, key: &IdemKey) -> Record {
    match store.get(key).await {
        Ok(Some(r)) => r,
        other => panic!("get({key}) must find the record, got {other:?}"),
    }
}

/// Settles `key` with `token`, which must succeed (panics otherwise).
pub async fn settle(store: &impl IdemStore, key: &IdemKey, token: ClaimToken, s: Settlement) {
    store
        .settle(key, token, s)
        .await
        .unwrap_or_else(|e| panic!("settling {key} with its own token must succeed: {e}"));
}

/// Asserts that `r` is [`StoreError::StaleToken`]; `what` names the operation.
pub fn assert_stale<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
    match r {
        Err(StoreError::StaleToken { .. }) => {}
        other => panic!("{what}: must be refused with StoreError::StaleToken, got {other:?}"),
    }
}

/// Attempt `n`, ending in `class`, stamped by `at`.
pub fn attempt(n: u32, class: OutcomeClass, at: &ManualClock) -> AttemptRecord {
    let now = at.now();
    AttemptRecord::new(
        n,
        now,
        now.plus(Duration::from_millis(250)),
        AttemptKind::Returned,
        class,
        Some(format!("attempt {n}")),
    )
}

/// A completed settlement with `output`.
pub fn completed(output: Value) -> Settlement {
    Settlement::new(RecordState::Completed).payload(output)
}

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// Of 32 concurrent claimers of one key (spawned on a multi-thread runtime, released at
/// once by a barrier), exactly one gets a token; the others see the running record.
pub async fn claim_is_atomic<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "claim_is_atomic").await else {
        return;
    };
    assert_eq!(
        tokio::runtime::Handle::current().runtime_flavor(),
        tokio::runtime::RuntimeFlavor::MultiThread,
        "claim_is_atomic must run on a multi-thread runtime to race for real"
    );
    let stores = vec![h.store.clone(); 32];
    let winners = race(stores, &request("atomic")).await;
    assert_eq!(winners, 1, "exactly one of 32 concurrent claimers must win");
}

/// Like [`claim_is_atomic`], but the 32 claimers go through two store handles on one
/// location (two processes on one SQLite file, two workers on one Redis). Durable backends
/// only.
pub async fn claim_is_atomic_across_handles<F: StoreFactory>(f: &F) {
    if !f.durable() {
        eprintln!("conformance check `claim_is_atomic_across_handles` skipped: not durable");
        return;
    }
    let Some(h) = harness(f, "claim_is_atomic_across_handles").await else {
        return;
    };
    let other = Arc::new(h.reopen(f).await);
    let stores = (0..32)
        .map(|i| {
            if i % 2 == 0 {
                h.store.clone()
            } else {
                other.clone()
            }
        })
        .collect();
    let winners = race(stores, &request("atomic-handles")).await;
    assert_eq!(
        winners, 1,
        "exactly one of 32 claimers across two handles must win"
    );
}

async fn race<S: IdemStore>(stores: Vec<Arc<S>>, req: &ClaimRequest) -> usize {
    let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
    let tasks: Vec<_> = stores
        .into_iter()
        .map(|store| {
            let barrier = barrier.clone();
            let req = req.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                store.claim(&req).await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(ClaimOutcome::Claimed(t))) => winners.push(t),
            Ok(Ok(ClaimOutcome::Existing(r))) => assert!(
                matches!(r.state, RecordState::Running),
                "a losing claimer must see the running claim, saw {:?}",
                r.state
            ),
            Ok(other) => panic!("a concurrent claim must win or see the claim, got {other:?}"),
            Err(e) => panic!("a claiming task panicked: {e}"),
        }
    }
    winners.len()
}

/// Same key, other fingerprint: [`ClaimOutcome::Mismatch`] carrying the original record,
/// whether it is running or settled, and the record is left untouched.
pub async fn fingerprint_mismatch_is_detected<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "fingerprint_mismatch_is_detected").await else {
        return;
    };
    let s = &*h.store;
    let req = request("mismatch");
    let changed = ClaimRequest {
        fingerprint: fingerprint("other args"),
        ..req.clone()
    };
    let token = claim(s, &req).await;
    match s.claim(&changed).await {
        Ok(ClaimOutcome::Mismatch(r)) => {
            assert_eq!(
                r.fingerprint, req.fingerprint,
                "Mismatch carries the original"
            );
            assert_eq!(r.state, RecordState::Running);
        }
        other => panic!("changed parameters on a running key must be Mismatch, got {other:?}"),
    }
    settle(s, &req.key, token, completed(json!({"ok": true}))).await;
    match s.claim(&changed).await {
        Ok(ClaimOutcome::Mismatch(r)) => {
            assert_eq!(r.fingerprint, req.fingerprint);
            assert_eq!(r.state, RecordState::Completed);
        }
        other => panic!("changed parameters on a settled key must be Mismatch, got {other:?}"),
    }
    let r = get(s, &req.key).await;
    assert_eq!(
        r.fingerprint, req.fingerprint,
        "a mismatch must not rewrite"
    );
    assert_eq!(r.payload, Some(json!({"ok": true})));
    assert_eq!(r.token, token);
}

/// A token that is not the current claim's cannot settle, renew or release; nor can any
/// token act on a key without a record. The record is unchanged by the attempts.
pub async fn stale_tokens_are_refused<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "stale_tokens_are_refused").await else {
        return;
    };
    let s = &*h.store;
    let req = request("stale");
    let token = claim(s, &req).await;
    let stranger = ClaimToken(token.0 ^ 0x5a5a_5a5a);
    assert_stale(
        "settle with a foreign token",
        s.settle(&req.key, stranger, completed(json!(1))).await,
    );
    assert_stale(
        "renew with a foreign token",
        s.renew(&req.key, stranger, LEASE).await,
    );
    assert_stale(
        "release with a foreign token",
        s.release(&req.key, stranger).await,
    );
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Running, "refusals must not change it");
    assert_eq!(r.token, token);

    // Once settled, the holder's own token cannot change the decision or free the key.
    settle(s, &req.key, token, completed(json!(1))).await;
    assert_stale(
        "settling a completed record to another state",
        s.settle(
            &req.key,
            token,
            Settlement::new(RecordState::Failed).message("x"),
        )
        .await,
    );
    assert_stale(
        "renewing a settled record",
        s.renew(&req.key, token, LEASE).await,
    );
    assert_stale(
        "releasing a settled record",
        s.release(&req.key, token).await,
    );
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.payload, Some(json!(1)));

    let absent = key("stale-absent");
    assert_stale(
        "settle on a key without a record",
        s.settle(&absent, token, completed(json!(1))).await,
    );
    assert_stale(
        "renew on a key without a record",
        s.renew(&absent, token, LEASE).await,
    );
    assert_stale(
        "release on a key without a record",
        s.release(&absent, token).await,
    );
    assert_eq!(
        s.get(&absent).await.ok().flatten(),
        None,
        "refusals must not create records"
    );
}

/// The holder settling to the same state again (a retried settle whose first reply was
/// lost) succeeds and keeps the first result.
pub async fn settle_is_idempotent_for_its_holder<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "settle_is_idempotent_for_its_holder").await else {
        return;
    };
    let s = &*h.store;
    let req = request("settle-twice");
    let token = claim(s, &req).await;
    settle(s, &req.key, token, completed(json!({"charge": "ch_1"}))).await;
    settle(s, &req.key, token, completed(json!({"charge": "ch_2"}))).await;
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(
        r.payload,
        Some(json!({"charge": "ch_1"})),
        "a repeated settle must not replace the saved result"
    );
}

/// A settlement to `Running` is refused and changes nothing.
pub async fn settle_cannot_return_to_running<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "settle_cannot_return_to_running").await else {
        return;
    };
    let s = &*h.store;
    let req = request("settle-running");
    let token = claim(s, &req).await;
    let r = s
        .settle(&req.key, token, Settlement::new(RecordState::Running))
        .await;
    assert!(r.is_err(), "settling to running must fail, got {r:?}");
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Running);
    assert_eq!(r.token, token);
}

/// A running claim whose lease has passed reads as *unknown* — never free — whichever
/// operation looks first (claim, get or list), and a later claim gets no token.
pub async fn lease_expiry_makes_unknown<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "lease_expiry_makes_unknown").await else {
        return;
    };
    let s = &*h.store;
    let (by_claim, by_get, by_list) = (
        request("lease-claim"),
        request("lease-get"),
        request("lease-list"),
    );
    let lapses_at = h.clock.now().plus(LEASE);
    for req in [&by_claim, &by_get, &by_list] {
        claim(s, req).await;
    }

    h.clock.advance(LEASE - Duration::from_millis(1));
    let r = claim_finds(s, &by_claim).await;
    assert_eq!(r.state, RecordState::Running, "a live lease is in flight");

    h.clock.advance(Duration::from_millis(1));
    // Seen first by claim.
    let r = claim_finds(s, &by_claim).await;
    assert_eq!(
        r.state,
        RecordState::Unknown,
        "an expired lease must make the record unknown, never free"
    );
    assert_eq!(
        r.lease_until,
        Some(lapses_at),
        "an unknown record keeps when its lapsed lease ran out (its holder may have sent until \
         then)"
    );
    // Seen first by get.
    let r = get(s, &by_get.key).await;
    assert_eq!(r.state, RecordState::Unknown, "get must apply lease expiry");
    assert_eq!(r.lease_until, Some(lapses_at));
    // Seen first by list.
    let unknown = s
        .list(RecordState::Unknown, 100)
        .await
        .unwrap_or_else(|e| panic!("list failed: {e}"));
    let running = s
        .list(RecordState::Running, 100)
        .await
        .unwrap_or_else(|e| panic!("list failed: {e}"));
    assert!(
        unknown.iter().any(|r| r.key == by_list.key),
        "list(Unknown) must include an expired claim"
    );
    assert!(
        running.is_empty(),
        "list(Running) must not include expired claims, got {running:?}"
    );

    // Still unknown long after: nothing frees it.
    h.clock.advance(Duration::from_secs(400 * 24 * 3600));
    for req in [&by_claim, &by_get, &by_list] {
        let r = claim_finds(s, req).await;
        assert_eq!(r.state, RecordState::Unknown, "unknown must never expire");
    }
}

/// The holder of an expired lease can neither renew it (it might revive a claim someone
/// has already reported as unknown) nor release it (the handler may have committed).
pub async fn expired_lease_cannot_be_renewed_or_released<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "expired_lease_cannot_be_renewed_or_released").await else {
        return;
    };
    let s = &*h.store;
    let req = request("expired-release");
    let token = claim(s, &req).await;
    h.clock.advance(LEASE);
    assert_stale(
        "renewing an expired lease",
        s.renew(&req.key, token, LEASE).await,
    );
    assert_stale(
        "releasing an expired lease",
        s.release(&req.key, token).await,
    );
    let r = claim_finds(s, &req).await;
    assert_eq!(r.state, RecordState::Unknown, "the key must stay blocked");
}

/// Renewing moves the lease to now + lease: the claim outlives its first lease, and
/// expires only when the renewed one passes.
pub async fn renew_keeps_a_claim_alive<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "renew_keeps_a_claim_alive").await else {
        return;
    };
    let s = &*h.store;
    let req = request("renew");
    let token = claim(s, &req).await;
    h.clock.advance(Duration::from_secs(8));
    s.renew(&req.key, token, LEASE)
        .await
        .unwrap_or_else(|e| panic!("renewing a live claim must succeed: {e}"));
    h.clock.advance(Duration::from_secs(8)); // 16 s: past the first lease, inside the renewed
    let r = claim_finds(s, &req).await;
    assert_eq!(
        r.state,
        RecordState::Running,
        "a renewed claim stays running"
    );
    assert_eq!(r.token, token);
    s.renew(&req.key, token, LEASE)
        .await
        .unwrap_or_else(|e| panic!("renewing again must succeed: {e}"));
    h.clock.advance(LEASE);
    let r = get(s, &req.key).await;
    assert_eq!(
        r.state,
        RecordState::Unknown,
        "a lapsed renewal expires too"
    );
}

/// The original holder's token may settle the *unknown* record its expired lease left (a
/// late result is the best evidence there is); a late *unknown* only adds evidence.
pub async fn late_result_settles_unknown<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "late_result_settles_unknown").await else {
        return;
    };
    let s = &*h.store;
    let req = request("late");
    let token = claim(s, &req).await;
    h.clock.advance(LEASE);
    assert_eq!(get(s, &req.key).await.state, RecordState::Unknown);

    let a1 = attempt(1, OutcomeClass::Unknown, &h.clock);
    settle(
        s,
        &req.key,
        token,
        Settlement::new(RecordState::Unknown)
            .message("still no answer")
            .attempts(vec![a1.clone()]),
    )
    .await;
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Unknown);
    assert_eq!(r.attempts, vec![a1.clone()], "late evidence is kept");

    let a2 = attempt(1, OutcomeClass::Completed, &h.clock);
    settle(
        s,
        &req.key,
        token,
        completed(json!({"late": true})).attempts(vec![a2.clone()]),
    )
    .await;
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed, "a late result settles it");
    assert_eq!(r.payload, Some(json!({"late": true})));
    assert_eq!(r.attempts, vec![a1, a2]);
    assert_eq!(claim_finds(s, &req).await.state, RecordState::Completed);
}

/// Once someone has taken over the unknown record (reclaim), the original token's late
/// result is refused: it cannot overwrite the newer decision.
pub async fn late_result_refused_after_reclaim<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "late_result_refused_after_reclaim").await else {
        return;
    };
    let s = &*h.store;
    let req = request("late-reclaimed");
    let old = claim(s, &req).await;
    h.clock.advance(LEASE);
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Unknown);
    let new = s
        .reclaim(&req.key, r.token, LEASE)
        .await
        .unwrap_or_else(|e| panic!("reclaiming an unknown record must succeed: {e}"));
    assert_ne!(new, old, "a takeover gets a fresh token");
    assert_stale(
        "a late result after a reclaim",
        s.settle(&req.key, old, completed(json!("late"))).await,
    );
    settle(
        s,
        &req.key,
        new,
        Settlement::new(RecordState::Escalated).message("ask a person"),
    )
    .await;
    assert_stale(
        "a late result after the takeover settled",
        s.settle(&req.key, old, completed(json!("late"))).await,
    );
    let r = get(s, &req.key).await;
    assert_eq!(r.state, RecordState::Escalated);
    assert_eq!(r.token, new);
}

/// A tombstone retention shorter than the result retention is raised to it
/// ([`Retention::normalized`]): a tombstone that lapsed before its result expired would let
/// a repeat inside the result window find nothing and run again.
pub async fn short_tombstone_retention_is_raised<F: StoreFactory>(f: &F) {
    let inverted = Retention {
        results: Duration::from_secs(2 * 3600),
        tombstones: Duration::from_secs(3600),
    };
    let Some(h) = harness_with(f, "short_tombstone_retention_is_raised", inverted).await else {
        return;
    };
    let s = &*h.store;
    let req = request("inverted-retention");
    let t = claim(s, &req).await;
    settle(s, &req.key, t, completed(json!({"receipt": 8}))).await;
    h.clock.advance(Duration::from_secs(90 * 60));
    let r = claim_finds(s, &req).await;
    assert!(
        !r.result_expired,
        "inside the result window the result is kept"
    );
    assert_eq!(r.payload, Some(json!({"receipt": 8})));
    h.clock.advance(Duration::from_secs(60 * 60));
    assert!(
        matches!(s.claim(&req).await, Ok(ClaimOutcome::Claimed(_))),
        "past both windows the key is free again"
    );
}

/// Completed and failed results expire after the retention window, leaving a tombstone
/// (same key, fingerprint and state, `result_expired`, no payload) that still refuses a
/// claim; the tombstone vanishes after its own window, and then the key is free.
pub async fn results_expire_to_tombstones<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "results_expire_to_tombstones").await else {
        return;
    };
    let s = &*h.store;
    let done = request("retained-completed");
    let failed = request("retained-failed");
    let t = claim(s, &done).await;
    settle(s, &done.key, t, completed(json!({"receipt": 7}))).await;
    let t = claim(s, &failed).await;
    settle(
        s,
        &failed.key,
        t,
        Settlement::new(RecordState::Failed)
            .message("card declined")
            .downstream_ref("ch_9"),
    )
    .await;

    h.clock
        .advance(RETENTION.results - Duration::from_millis(1));
    let r = claim_finds(s, &done).await;
    assert!(!r.result_expired, "inside the window the result is kept");
    assert_eq!(r.payload, Some(json!({"receipt": 7})));

    h.clock.advance(Duration::from_millis(1));
    for (req, state) in [
        (&done, RecordState::Completed),
        (&failed, RecordState::Failed),
    ] {
        let r = claim_finds(s, req).await;
        assert_eq!(r.state, state, "a tombstone keeps the class");
        assert!(
            r.result_expired,
            "past the window only the tombstone is left"
        );
        assert_eq!(r.payload, None, "the result itself is dropped");
        assert_eq!(
            r.fingerprint, req.fingerprint,
            "the tombstone keeps the fingerprint"
        );
        let changed = ClaimRequest {
            fingerprint: fingerprint("changed"),
            ..req.clone()
        };
        assert!(
            matches!(s.claim(&changed).await, Ok(ClaimOutcome::Mismatch(_))),
            "a tombstone still detects changed parameters"
        );
        let listed = s
            .list(state, 10)
            .await
            .unwrap_or_else(|e| panic!("list failed: {e}"));
        assert!(
            listed.iter().any(|r| r.key == req.key && r.result_expired),
            "list shows the tombstone"
        );
    }

    h.clock
        .advance(RETENTION.tombstones - RETENTION.results - Duration::from_millis(1));
    assert!(
        get(s, &done.key).await.result_expired,
        "tombstone still held"
    );

    h.clock.advance(Duration::from_millis(1));
    assert_eq!(
        s.get(&done.key).await.ok().flatten(),
        None,
        "a lapsed tombstone is gone"
    );
    let listed = s
        .list(RecordState::Failed, 10)
        .await
        .unwrap_or_else(|e| panic!("list failed: {e}"));
    assert!(listed.is_empty(), "list must not show lapsed tombstones");
    claim(s, &done).await;
    claim(s, &failed).await;
}

/// When a result expires, its tombstone keeps what identifies the operation and nothing of
/// what was asked or answered: no arguments (the saved operation, with its scope and intent
/// id), no payload, no message, no read-backs, no attempt messages. The fingerprint, state,
/// tool, times, downstream reference and the attempts' numbers, kinds and classes stay. Checked
/// on a record aged by `get` and on one first seen by a listing (which ages in bulk on some
/// backends).
pub async fn tombstones_keep_no_arguments_or_outputs<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "tombstones_keep_no_arguments_or_outputs").await else {
        return;
    };
    let s = &*h.store;
    let with_op = |name: &str| {
        request_with_operation(
            name,
            crate::store::Operation {
                scope: Scope::run("run-secret").with_tenant("tenant-secret"),
                intent: Some(format!("intent-{name}")),
                args: json!({"card": "4242 4242 4242 4242", "cents": 4900}).into(),
            },
        )
    };
    let done = with_op("scrub-completed");
    let failed = with_op("scrub-failed");
    let mut expected_attempts = Vec::new();
    for (req, settlement) in [
        (&done, completed(json!({"receipt": "secret-output"}))),
        (
            &failed,
            Settlement::new(RecordState::Failed).message("declined: secret reason"),
        ),
    ] {
        let t = claim(s, req).await;
        let a = attempt(1, OutcomeClass::Completed, &h.clock);
        expected_attempts.push(AttemptRecord {
            message: None,
            ..a.clone()
        });
        let rb = ReadBackRecord {
            at: h.clock.now(),
            result: "found completed: secret detail".to_owned(),
        };
        settle(
            s,
            &req.key,
            t,
            settlement
                .downstream_ref("ch_42")
                .attempts(vec![a])
                .read_backs(vec![rb]),
        )
        .await;
        assert!(
            get(s, &req.key).await.operation.is_some(),
            "inside the window the operation is kept"
        );
    }
    h.clock.advance(RETENTION.results);

    let by_get = get(s, &done.key).await;
    let listed = s
        .list(RecordState::Failed, 10)
        .await
        .unwrap_or_else(|e| panic!("list failed: {e}"));
    let by_list = listed
        .into_iter()
        .find(|r| r.key == failed.key)
        .unwrap_or_else(|| panic!("list(failed) must show the tombstone"));
    let by_get_after_list = get(s, &failed.key).await;
    for (how, r, req, state, attempt) in [
        (
            "get",
            by_get,
            &done,
            RecordState::Completed,
            &expected_attempts[0],
        ),
        (
            "list",
            by_list,
            &failed,
            RecordState::Failed,
            &expected_attempts[1],
        ),
        (
            "get after list",
            by_get_after_list,
            &failed,
            RecordState::Failed,
            &expected_attempts[1],
        ),
    ] {
        assert!(r.result_expired, "{how}: the result has expired");
        assert_eq!(r.state, state, "{how}: a tombstone keeps the class");
        assert_eq!(
            r.fingerprint, req.fingerprint,
            "{how}: it keeps the fingerprint"
        );
        assert_eq!(r.tool, req.tool, "{how}: it keeps the tool");
        assert_eq!(r.payload, None, "{how}: the output is dropped");
        assert_eq!(r.message, None, "{how}: the message is dropped");
        assert_eq!(
            r.operation, None,
            "{how}: the arguments, scope and intent are dropped"
        );
        assert!(
            r.read_backs.is_empty(),
            "{how}: read-backs are dropped: {:?}",
            r.read_backs
        );
        assert_eq!(
            r.attempts,
            vec![attempt.clone()],
            "{how}: attempts keep their numbers, times, kinds and classes, not their messages"
        );
        assert_eq!(
            r.downstream_ref.as_deref(),
            Some("ch_42"),
            "{how}: the downstream's id for the effect stays"
        );
        let text = format!("{r:?}");
        assert!(
            !text.contains("secret"),
            "{how}: nothing saved from the call remains: {text}"
        );
    }
    let changed = ClaimRequest {
        fingerprint: fingerprint("changed"),
        ..done.clone()
    };
    assert!(
        matches!(s.claim(&changed).await, Ok(ClaimOutcome::Mismatch(_))),
        "a scrubbed tombstone still detects changed parameters"
    );
}

/// [`IdemStore::sweep_expired`] enforces retention on records nobody reads: past the result
/// window the *stored* record of a completed or failed call holds no arguments, output,
/// message or read-back (checked on the backend's raw record,
/// [`StoreFactory::raw_record`], before anything reads it through the store), a repeat is
/// still refused by the tombstone, and past the tombstone window the stored record is gone.
/// A result still inside its window, and unknown, pending and escalated records, are left
/// exactly as stored, however long the clock runs.
pub async fn sweep_enforces_retention_unread<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "sweep_enforces_retention_unread").await else {
        return;
    };
    let s = &*h.store;
    let at = &h.location;
    let with_op = |name: &str| {
        request_with_operation(
            name,
            crate::store::Operation {
                scope: Scope::run("run-secret"),
                intent: Some(format!("intent-secret-{name}")),
                args: json!({"card": "secret-card 4242", "cents": 4900}).into(),
            },
        )
    };
    let done = with_op("swept-completed");
    let failed = with_op("swept-failed");
    for (req, settlement) in [
        (&done, completed(json!({"receipt": "secret-output"}))),
        (
            &failed,
            Settlement::new(RecordState::Failed).message("declined: secret reason"),
        ),
    ] {
        let t = claim(s, req).await;
        let rb = ReadBackRecord {
            at: h.clock.now(),
            result: "found completed: secret detail".to_owned(),
        };
        settle(
            s,
            &req.key,
            t,
            settlement
                .attempts(vec![
                    attempt(1, OutcomeClass::Completed, &h.clock),
                    // Caller text reaches attempt messages, NUL included (which Postgres's
                    // `jsonb` refuses): the sweep must still age the record.
                    AttemptRecord::new(
                        2,
                        h.clock.now(),
                        h.clock.now(),
                        AttemptKind::Returned,
                        OutcomeClass::Completed,
                        Some("secret attempt \u{0} text".to_owned()),
                    ),
                ])
                .read_backs(vec![rb]),
        )
        .await;
    }
    let unsettled = [
        (
            with_op("swept-unknown"),
            Settlement::new(RecordState::Unknown).message("timed out: secret kept"),
        ),
        (
            with_op("swept-pending"),
            Settlement::new(RecordState::Pending).payload(json!({"status": "secret-kept"})),
        ),
        (
            with_op("swept-escalated"),
            Settlement::new(RecordState::Escalated).message("needs a person: secret kept"),
        ),
    ];
    for (req, settlement) in &unsettled {
        let t = claim(s, req).await;
        settle(s, &req.key, t, settlement.clone()).await;
    }
    // Settled half a window later: still inside its window when the first two expire.
    h.clock.advance(RETENTION.results / 2);
    let fresh = with_op("swept-fresh");
    let t = claim(s, &fresh).await;
    settle(
        s,
        &fresh.key,
        t,
        completed(json!({"receipt": "secret-fresh"})),
    )
    .await;

    let raw = |key: IdemKey| async move { f.raw_record(at, s, &key).await };
    let stored_before = raw(done.key.clone()).await;
    // A backend without a raw view (MemoryStore) is checked through the API alone.
    let has_raw = stored_before.is_some();
    if has_raw {
        assert!(
            stored_before
                .as_deref()
                .is_some_and(|r| r.contains("secret-output")),
            "the raw view shows the saved result inside its window: {stored_before:?}"
        );
    }
    let mut unsettled_before = Vec::new();
    for (req, _) in &unsettled {
        unsettled_before.push(raw(req.key.clone()).await);
    }
    let fresh_before = raw(fresh.key.clone()).await;

    h.clock.advance(RETENTION.results / 2);
    let swept = s
        .sweep_expired()
        .await
        .unwrap_or_else(|e| panic!("sweep_expired failed: {e}"));
    if has_raw {
        for req in [&done, &failed] {
            let stored = raw(req.key.clone())
                .await
                .unwrap_or_else(|| panic!("the tombstone of {} must stay stored", req.key));
            assert!(
                !stored.contains("secret"),
                "past the result window the stored record keeps no arguments, output, \
                 message or read-back, unread: {stored}"
            );
        }
        assert_eq!(
            raw(fresh.key.clone()).await,
            fresh_before,
            "a result inside its window is left as stored"
        );
    } else {
        assert_eq!(
            swept.results, 2,
            "the two results past their window are swept"
        );
    }
    for req in [&done, &failed] {
        let r = claim_finds(s, req).await;
        assert!(r.result_expired, "a repeat finds the tombstone");
        assert_eq!(r.payload, None);
        assert_eq!(r.operation, None);
        assert!(!format!("{r:?}").contains("secret"), "{r:?}");
    }
    assert_eq!(
        claim_finds(s, &fresh).await.payload,
        Some(json!({"receipt": "secret-fresh"})),
        "a result inside its window is still replayed"
    );

    h.clock.advance(RETENTION.tombstones);
    s.sweep_expired()
        .await
        .unwrap_or_else(|e| panic!("sweep_expired failed: {e}"));
    if has_raw {
        for req in [&done, &failed, &fresh] {
            assert_eq!(
                raw(req.key.clone()).await,
                None,
                "past the tombstone window the stored record is deleted, unread"
            );
        }
    }
    for ((req, settlement), before) in unsettled.iter().zip(&unsettled_before) {
        if has_raw {
            assert_eq!(
                &raw(req.key.clone()).await,
                before,
                "a sweep leaves a {} record exactly as stored",
                settlement.state
            );
        }
        let r = claim_finds(s, req).await;
        assert_eq!(
            r.state, settlement.state,
            "{} never expires",
            settlement.state
        );
        assert_eq!(r.payload, settlement.payload);
        assert_eq!(r.message, settlement.message);
        assert!(r.operation.is_some(), "its arguments are kept");
    }
    claim(s, &done).await;
}

/// The durable stores' own background task enforces retention: with a short cadence
/// (`sweep_every`), past the result window the stored record of a completed call loses its
/// arguments and output and past the tombstone window it is deleted, while nothing calls
/// the store at all; an unknown record is left exactly as stored. Checked on the raw record
/// ([`StoreFactory::raw_record`]); a backend without a raw view (MemoryStore, which has no
/// task) skips it.
pub async fn sweep_task_enforces_retention<F: StoreFactory>(f: &F) {
    let Some(h) = harness_sweeping(
        f,
        "sweep_task_enforces_retention",
        RETENTION,
        Duration::from_millis(20),
    )
    .await
    else {
        return;
    };
    let s = &*h.store;
    let at = &h.location;
    let with_op = |name: &str| {
        request_with_operation(
            name,
            crate::store::Operation {
                scope: Scope::run("run-secret"),
                intent: None,
                args: json!({"card": "secret-card"}).into(),
            },
        )
    };
    let done = with_op("task-completed");
    let unknown = with_op("task-unknown");
    let t = claim(s, &done).await;
    settle(
        s,
        &done.key,
        t,
        completed(json!({"receipt": "secret-output"})),
    )
    .await;
    let t = claim(s, &unknown).await;
    settle(
        s,
        &unknown.key,
        t,
        Settlement::new(RecordState::Unknown).message("timed out: secret kept"),
    )
    .await;
    let raw = |key: IdemKey| async move { f.raw_record(at, s, &key).await };
    let Some(before) = raw(done.key.clone()).await else {
        eprintln!("skipping sweep_task_enforces_retention: the factory has no raw view");
        return;
    };
    assert!(before.contains("secret-output"), "{before}");
    let unknown_before = raw(unknown.key.clone()).await;

    /// Reads the raw record until `done` says so; a bound only against hanging.
    async fn until<Fut: Future<Output = Option<String>>>(
        read: impl Fn() -> Fut,
        done: impl Fn(&Option<String>) -> bool,
        what: &str,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let stored = read().await;
            if done(&stored) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the store's sweep task never {what}; the stored record is {stored:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    h.clock.advance(RETENTION.results);
    until(
        || raw(done.key.clone()),
        |r| r.as_deref().is_some_and(|r| !r.contains("secret")),
        "dropped the expired result's arguments and output",
    )
    .await;
    assert_eq!(
        raw(unknown.key.clone()).await,
        unknown_before,
        "the sweep leaves an unknown record as stored"
    );
    let r = claim_finds(s, &done).await;
    assert!(r.result_expired, "a repeat finds the tombstone");

    h.clock.advance(RETENTION.tombstones);
    until(
        || raw(done.key.clone()),
        Option::is_none,
        "deleted the lapsed tombstone",
    )
    .await;
    assert_eq!(
        raw(unknown.key.clone()).await,
        unknown_before,
        "an unknown record never expires"
    );
}

/// Evidence is capped: a record keeps the first and the last
/// [`EVIDENCE_KEPT`](super::rules::EVIDENCE_KEPT) attempts and read-backs, and one marker
/// read-back counts what was dropped between them, across many settles.
pub async fn evidence_is_capped<F: StoreFactory>(f: &F) {
    use super::rules::{EVIDENCE_KEPT as N, EVIDENCE_MARKER};
    let Some(h) = harness(f, "evidence_is_capped").await else {
        return;
    };
    let s = &*h.store;
    let req = request("capped");
    let token = claim(s, &req).await;
    let mut all_attempts = Vec::new();
    let mut all_read_backs = Vec::new();
    // One settle far over the cap, then many small ones (a reconciler pass each).
    let mut batches = vec![3 * N];
    batches.extend(std::iter::repeat_n(1, 2 * N + 3));
    for (i, n) in batches.into_iter().enumerate() {
        let mut attempts = Vec::new();
        let mut read_backs = Vec::new();
        for _ in 0..n {
            h.clock.advance(Duration::from_millis(7));
            let k = u32::try_from(all_attempts.len() + 1).unwrap_or(u32::MAX);
            attempts.push(attempt(k, OutcomeClass::Unknown, &h.clock));
            read_backs.push(ReadBackRecord {
                at: h.clock.now(),
                result: format!("error: read-back {k} failed"),
            });
        }
        all_attempts.extend(attempts.clone());
        all_read_backs.extend(read_backs.clone());
        let mut settlement = Settlement::new(RecordState::Unknown)
            .attempts(attempts)
            .read_backs(read_backs);
        if i == 0 {
            settlement = settlement.message("timed out");
        }
        settle(s, &req.key, token, settlement).await;
    }
    let total = all_attempts.len();
    let dropped = total - 2 * N;
    let r = get(s, &req.key).await;
    let mut expected_attempts = all_attempts[..N].to_vec();
    expected_attempts.extend_from_slice(&all_attempts[total - N..]);
    assert_eq!(
        r.attempts, expected_attempts,
        "the first and last {N} attempts are kept, in order"
    );
    assert_eq!(
        r.read_backs.len(),
        2 * N + 1,
        "2×{N} read-backs and one marker"
    );
    assert_eq!(
        &r.read_backs[..N],
        &all_read_backs[..N],
        "the first read-backs stay"
    );
    assert_eq!(
        &r.read_backs[N + 1..],
        &all_read_backs[total - N..],
        "the last read-backs stay"
    );
    assert_eq!(
        r.read_backs[N].result,
        format!("{EVIDENCE_MARKER}{dropped} attempts and {dropped} read-backs dropped"),
        "the marker counts everything dropped, over every settle"
    );
    assert_eq!(r.state, RecordState::Unknown);
    assert_eq!(r.message.as_deref(), Some("timed out"));
}

/// Unknown, pending and escalated records never expire: they keep their payload and block
/// the key however much time passes.
pub async fn unsettled_records_never_expire<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "unsettled_records_never_expire").await else {
        return;
    };
    let s = &*h.store;
    let cases = [
        (
            request("forever-unknown"),
            Settlement::new(RecordState::Unknown).message("timed out"),
        ),
        (
            request("forever-pending"),
            Settlement::new(RecordState::Pending)
                .downstream_ref("po_1")
                .payload(json!({"status": "processing"})),
        ),
        (
            request("forever-escalated"),
            Settlement::new(RecordState::Escalated).message("needs a person"),
        ),
    ];
    for (req, s8t) in &cases {
        let t = claim(s, req).await;
        settle(s, &req.key, t, s8t.clone()).await;
    }
    h.clock
        .advance(RETENTION.tombstones + Duration::from_secs(365 * 24 * 3600));
    for (req, s8t) in &cases {
        let r = claim_finds(s, req).await;
        assert_eq!(r.state, s8t.state, "{} must never expire", s8t.state);
        assert!(!r.result_expired);
        assert_eq!(r.payload, s8t.payload);
        assert_eq!(r.message, s8t.message);
        let listed = s
            .list(s8t.state, 10)
            .await
            .unwrap_or_else(|e| panic!("list failed: {e}"));
        assert_eq!(listed.len(), 1, "list({}) keeps it", s8t.state);
    }
}

/// Releasing (rejected before execution) frees the key: the next claim wins with a new
/// token, and the old token is dead.
pub async fn release_frees_the_key<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "release_frees_the_key").await else {
        return;
    };
    let s = &*h.store;
    let req = request("release");
    let old = claim(s, &req).await;
    s.release(&req.key, old)
        .await
        .unwrap_or_else(|e| panic!("the holder must be able to release: {e}"));
    assert_eq!(
        s.get(&req.key).await.ok().flatten(),
        None,
        "a released key has no record"
    );
    let new = claim(s, &req).await;
    assert_ne!(new, old, "a new claim gets a new token");
    assert_stale(
        "settling with the released token",
        s.settle(&req.key, old, completed(json!(1))).await,
    );
    assert_stale(
        "releasing with the released token",
        s.release(&req.key, old).await,
    );
    assert_eq!(get(s, &req.key).await.token, new);
    // A released key may even be claimed with other parameters: nothing ran.
    s.release(&req.key, new)
        .await
        .unwrap_or_else(|e| panic!("release failed: {e}"));
    let changed = ClaimRequest {
        fingerprint: fingerprint("corrected args"),
        ..req.clone()
    };
    claim(s, &changed).await;
}

/// The holder of a running claim settles and frees it in one step
/// ([`IdemStore::release_traced`]): the key is free, the trace holds the record as settled
/// (unknown, with the attempts and the operation), and a duplicate waiting on the claim
/// wakes to the free key, never to the settled record in between. Only the holder's token
/// works (also on the unknown record its lapsed lease left); a stranger's token, a settled
/// record, an absent key or a terminal settlement free nothing.
pub async fn release_traced_frees_its_claim<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "release_traced_frees_its_claim").await else {
        return;
    };
    let s = &*h.store;
    let req = request_with_operation(
        "traced",
        crate::store::Operation {
            scope: Scope::run("run-traced"),
            intent: None,
            args: json!({"cents": 900}).into(),
        },
    );
    let note = ReleaseNote::new(ReleaseNote::EXECUTOR, "unavailable, not executed");
    let parked = |n: u32| {
        Settlement::new(RecordState::Unknown)
            .message("every attempt was refused as unavailable")
            .attempts(vec![attempt(n, OutcomeClass::Unavailable, &h.clock)])
    };

    assert_stale(
        "release_traced of an absent key",
        s.release_traced(&req.key, ClaimToken(1), parked(1), &note)
            .await,
    );
    let t = claim(s, &req).await;
    let running = get(s, &req.key).await;
    assert_stale(
        "release_traced with a stranger's token",
        s.release_traced(&req.key, ClaimToken(7), parked(1), &note)
            .await,
    );
    match s
        .release_traced(&req.key, t, completed(json!("done")), &note)
        .await
    {
        Err(StoreError::Backend(_)) => {}
        other => {
            panic!("a traced release with a terminal settlement must be refused, got {other:?}")
        }
    }
    assert_eq!(
        get(s, &req.key).await,
        running,
        "a refused traced release leaves the claim as it was"
    );
    assert!(s.releases(&req.key).await.expect("releases").is_empty());

    // A duplicate waits on the claim; the release wakes it to a free key.
    let waiter = {
        let store = h.store.clone();
        let key = req.key.clone();
        tokio::spawn(async move { store.wait_settled(&key, Duration::from_secs(60)).await })
    };
    // A real pause (the wait is the thing under test): the waiter is waiting by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.clock.advance(Duration::from_secs(1));
    let released_at = h.clock.now();
    let a = attempt(1, OutcomeClass::Unavailable, &h.clock);
    s.release_traced(&req.key, t, parked(1), &note)
        .await
        .unwrap_or_else(|e| panic!("the holder's traced release must succeed: {e}"));
    match waiter.await {
        Ok(Ok(None)) => {}
        other => panic!(
            "a duplicate waiting on the claim must wake to a free key, not to the record \
             between settle and release; got {other:?}"
        ),
    }
    assert_eq!(
        s.get(&req.key).await.ok().flatten(),
        None,
        "the key is free"
    );
    let trace = s.releases(&req.key).await.expect("releases");
    assert_eq!(trace.len(), 1, "one release, one trace entry: {trace:?}");
    let entry = &trace[0];
    assert_eq!(
        (entry.by.as_str(), entry.note.as_str(), entry.at),
        (
            ReleaseNote::EXECUTOR,
            "unavailable, not executed",
            released_at
        ),
    );
    assert_eq!(entry.record.state, RecordState::Unknown);
    assert_eq!(entry.record.token, t);
    assert_eq!(entry.record.attempts, vec![a]);
    assert_eq!(
        entry.record.message.as_deref(),
        Some("every attempt was refused as unavailable")
    );
    assert_eq!(entry.record.lease_until, None);
    assert_eq!(
        entry.record.operation,
        req.operation.as_ref().map(OperationDraft::to_operation),
        "the trace keeps the arguments, for the reconciler's read-back"
    );
    let listed = s.list_releases(None, 10).await.expect("list_releases");
    assert_eq!(listed, trace, "the release is listed");
    for state in RecordState::ALL {
        let records = s.list(state, 10).await.expect("list");
        assert!(
            records.iter().all(|r| r.key != req.key),
            "a released key is in no {state} listing"
        );
    }

    // Free: the next claim wins; the old token can no longer release anything.
    let again = claim(s, &req).await;
    assert_ne!(again, t);
    assert_stale(
        "release_traced with the released token",
        s.release_traced(&req.key, t, parked(2), &note).await,
    );

    // A settled record is not the holder's to release.
    settle(s, &req.key, again, completed(json!("ok"))).await;
    assert_stale(
        "release_traced of a completed record",
        s.release_traced(&req.key, again, parked(2), &note).await,
    );
    assert_eq!(get(s, &req.key).await.state, RecordState::Completed);

    // Nobody reading the key ever sees the record between its settle and its release: a
    // reader polls while the key is claimed and released again and again.
    let polled = request("traced-polled");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, key, stop) = (h.store.clone(), polled.key.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match store.get(&key).await {
                    Ok(Some(r)) if r.state != RecordState::Running => seen.push(r.state),
                    Ok(_) => {}
                    Err(e) => panic!("get failed while polling: {e}"),
                }
                tokio::task::yield_now().await;
            }
            seen
        })
    };
    for n in 1..=200 {
        let token = claim(s, &polled).await;
        s.release_traced(&polled.key, token, parked(n), &note)
            .await
            .unwrap_or_else(|e| panic!("traced release {n}: {e}"));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.await.expect("the polling task panicked");
    assert!(
        seen.is_empty(),
        "a traced release is one atomic step, yet a reader saw the record in between: {seen:?}"
    );

    // The unknown record a lapsed lease left is still its holder's to release.
    let lapsed = request("traced-lapsed");
    let lt = claim(s, &lapsed).await;
    h.clock.advance(LEASE + Duration::from_secs(1));
    s.release_traced(&lapsed.key, lt, parked(1), &note)
        .await
        .unwrap_or_else(|e| panic!("the holder's traced release after its lease: {e}"));
    assert_eq!(s.get(&lapsed.key).await.ok().flatten(), None);
    let trace = s.releases(&lapsed.key).await.expect("releases");
    assert_eq!(trace.len(), 1);
    assert_eq!(trace[0].record.state, RecordState::Unknown);
    assert_eq!(trace[0].record.attempts.len(), 1);
}

/// A release of an unsettled record ([`IdemStore::release_unsettled`]) frees the key and
/// keeps a trace: who, when, why, and the record as it was (state, message, operation,
/// attempts, read-backs). The trace survives the key being claimed again (and a reopen, on
/// a durable store); a stale token, a running record or an absent key frees nothing; a key
/// keeps its last [`rules::RELEASES_KEPT`] releases; and the trace lapses with the tombstone
/// window.
pub async fn release_keeps_a_trace<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "release_keeps_a_trace").await else {
        return;
    };
    let s = &*h.store;
    let req = request_with_operation(
        "released",
        crate::store::Operation {
            scope: Scope::run("run-released"),
            intent: Some("refund-7".to_owned()),
            args: json!({"cents": 700}).into(),
        },
    );
    let note = |n: usize| ReleaseNote::new("alice", format!("not in the ledger (release {n})"));

    // Nothing to release: absent, running, or a stale token.
    match s.release_unsettled(&req.key, ClaimToken(1), &note(0)).await {
        Err(StoreError::NotFound(_)) => {}
        other => panic!("releasing an absent key must be NotFound, got {other:?}"),
    }
    let t = claim(s, &req).await;
    assert_stale(
        "release_unsettled of a running claim",
        s.release_unsettled(&req.key, t, &note(0)).await,
    );
    let a = attempt(1, OutcomeClass::Unknown, &h.clock);
    let rb = ReadBackRecord {
        at: h.clock.now(),
        result: "not found".to_owned(),
    };
    settle(
        s,
        &req.key,
        t,
        Settlement::new(RecordState::Unknown)
            .message("timed out after 30s")
            .attempts(vec![a.clone()])
            .read_backs(vec![rb.clone()]),
    )
    .await;
    assert_stale(
        "release_unsettled with a stranger's token",
        s.release_unsettled(&req.key, ClaimToken(7), &note(0)).await,
    );
    assert_eq!(
        get(s, &req.key).await.state,
        RecordState::Unknown,
        "a refused release leaves the record as it was"
    );
    let before = get(s, &req.key).await;
    assert!(
        s.releases(&req.key).await.expect("releases").is_empty(),
        "no release, no trace"
    );

    h.clock.advance(Duration::from_secs(5));
    let released_at = h.clock.now();
    s.release_unsettled(&req.key, t, &note(0))
        .await
        .unwrap_or_else(|e| panic!("releasing an unknown record with its token: {e}"));
    assert_eq!(
        s.get(&req.key).await.ok().flatten(),
        None,
        "a released key has no record"
    );
    let trace = s.releases(&req.key).await.expect("releases");
    assert_eq!(trace.len(), 1, "one release, one trace entry: {trace:?}");
    let entry = &trace[0];
    assert_eq!(
        (entry.by.as_str(), entry.note.as_str(), entry.at),
        ("alice", "not in the ledger (release 0)", released_at),
        "the trace says who, why and when"
    );
    assert_eq!(
        entry.record, before,
        "the trace keeps the record exactly as it stood before the release"
    );
    assert_eq!(entry.record.attempts, vec![a]);
    assert_eq!(entry.record.read_backs, vec![rb]);
    assert_eq!(
        entry.record.operation,
        req.operation.as_ref().map(OperationDraft::to_operation)
    );

    // The key is free: the next claim wins, and the trace stays beside the new record.
    let again = claim(s, &req).await;
    assert_ne!(again, t);
    assert_stale(
        "release_unsettled with the released token",
        s.release_unsettled(&req.key, t, &note(0)).await,
    );
    assert_eq!(s.releases(&req.key).await.expect("releases"), trace);
    if f.durable() {
        let reopened = h.reopen(f).await;
        assert_eq!(
            reopened.releases(&req.key).await.expect("releases"),
            trace,
            "the trace survives a restart"
        );
    }

    // Released again and again: the last RELEASES_KEPT are kept, oldest first.
    let rounds = rules::RELEASES_KEPT + 2;
    let mut token = again;
    for n in 1..=rounds {
        settle(
            s,
            &req.key,
            token,
            Settlement::new(RecordState::Escalated).message(format!("escalated {n}")),
        )
        .await;
        h.clock.advance(Duration::from_secs(1));
        s.release_unsettled(&req.key, token, &note(n))
            .await
            .unwrap_or_else(|e| panic!("release {n}: {e}"));
        if n < rounds {
            token = claim(s, &req).await;
        }
    }
    let trace = s.releases(&req.key).await.expect("releases");
    let notes: Vec<&str> = trace.iter().map(|r| r.note.as_str()).collect();
    let expected: Vec<String> = (rounds + 1 - rules::RELEASES_KEPT..=rounds)
        .map(|n| format!("not in the ledger (release {n})"))
        .collect();
    assert_eq!(
        notes, expected,
        "the last RELEASES_KEPT releases, oldest first"
    );
    assert!(trace
        .iter()
        .all(|r| r.record.state == RecordState::Escalated));

    // Another key's trace is its own.
    let other = request("released-neighbour");
    assert!(s.releases(&other.key).await.expect("releases").is_empty());

    // The trace lapses with the tombstone window, counted from each release.
    let first_kept = trace[0].at;
    let last = trace[trace.len() - 1].at;
    h.clock.set(first_kept.plus(RETENTION.tombstones));
    let trace = s.releases(&req.key).await.expect("releases");
    assert_eq!(
        trace.len(),
        rules::RELEASES_KEPT - 1,
        "a release past the tombstone window is dropped"
    );
    h.clock.set(last.plus(RETENTION.tombstones));
    assert!(
        s.releases(&req.key).await.expect("releases").is_empty(),
        "every release past the tombstone window is dropped"
    );
}

/// Claims `req`, leaves it unknown and releases it with `note`.
async fn release_once(s: &impl IdemStore, req: &ClaimRequest, note: &str) {
    let t = claim(s, req).await;
    settle(
        s,
        &req.key,
        t,
        Settlement::new(RecordState::Unknown).message("lost"),
    )
    .await;
    s.release_unsettled(&req.key, t, &ReleaseNote::new("bob", note))
        .await
        .unwrap_or_else(|e| panic!("releasing {}: {e}", req.key));
}

/// [`IdemStore::list_releases`] lists every key's kept releases in `(at, key)` order, and
/// paging with [`ListCursor::of_release`] visits each once; releases dropped from a trace
/// (beyond the last [`rules::RELEASES_KEPT`], or past the tombstone window) are not listed.
pub async fn releases_are_listed<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "releases_are_listed").await else {
        return;
    };
    let s = &*h.store;
    let (a, b, c, d) = (
        request("listed-a"),
        request("listed-b"),
        request("listed-c"),
        request("listed-d"),
    );
    assert!(s.list_releases(None, 10).await.expect("list").is_empty());
    release_once(s, &a, "a1").await;
    let first = h.clock.now();
    h.clock.advance(Duration::from_secs(1));
    release_once(s, &b, "b1").await;
    h.clock.advance(Duration::from_secs(1));
    // Two keys released in the same millisecond: ordered by key.
    release_once(s, &a, "a2").await;
    release_once(s, &c, "c1").await;
    h.clock.advance(Duration::from_secs(1));
    // One key released more often than its trace keeps.
    for n in 0..=rules::RELEASES_KEPT {
        release_once(s, &d, &format!("d{n}")).await;
        h.clock.advance(Duration::from_millis(10));
    }
    let mut expected: Vec<(crate::store::Timestamp, IdemKey, String)> = Vec::new();
    for key in [&a.key, &b.key, &c.key, &d.key] {
        for r in s.releases(key).await.expect("releases") {
            expected.push((r.at, r.record.key.clone(), r.note.clone()));
        }
    }
    expected.sort_by(|x, y| (x.0, &x.1).cmp(&(y.0, &y.1)));
    assert_eq!(expected.len(), 4 + rules::RELEASES_KEPT);
    let seen =
        |page: &[crate::store::ReleaseRecord]| -> Vec<(crate::store::Timestamp, IdemKey, String)> {
            page.iter()
                .map(|r| (r.at, r.record.key.clone(), r.note.clone()))
                .collect()
        };
    let all = s.list_releases(None, 100).await.expect("list_releases");
    assert_eq!(
        seen(&all),
        expected,
        "every kept release, in (at, key) order"
    );
    assert!(
        !all.iter().any(|r| r.note == "d0"),
        "a release dropped from its trace is not listed"
    );
    // Page by page, one at a time: each release exactly once.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = s
            .list_releases(after.as_ref(), 1)
            .await
            .expect("list_releases");
        let Some(last) = page.last() else { break };
        after = Some(ListCursor::of_release(last));
        paged.extend(seen(&page));
        assert!(paged.len() <= expected.len(), "paging must end");
    }
    assert_eq!(paged, expected, "paging visits each release once");
    // Past the tombstone window of the first release, it is no longer listed.
    h.clock.set(first.plus(RETENTION.tombstones));
    let later = s.list_releases(None, 100).await.expect("list_releases");
    assert_eq!(seen(&later), expected[1..].to_vec());
}

/// Reclaim takes over pending, unknown and escalated records whose current token is the
/// expected one, and fences the old token; anything else is refused.
pub async fn reclaim_fences_the_old_token<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "reclaim_fences_the_old_token").await else {
        return;
    };
    let s = &*h.store;
    for state in [
        RecordState::Pending,
        RecordState::Unknown,
        RecordState::Escalated,
    ] {
        let req = request(&format!("reclaim-{state}"));
        let old = claim(s, &req).await;
        settle(
            s,
            &req.key,
            old,
            Settlement::new(state).downstream_ref("ref"),
        )
        .await;
        let new = s
            .reclaim(&req.key, old, LEASE)
            .await
            .unwrap_or_else(|e| panic!("reclaiming a {state} record must succeed: {e}"));
        assert_ne!(new, old);
        let r = get(s, &req.key).await;
        assert_eq!(r.state, RecordState::Running, "a takeover runs again");
        assert_eq!(r.token, new);
        assert_eq!(r.lease_until, Some(h.clock.now().plus(LEASE)));
        assert_stale(
            "settling with the fenced token",
            s.settle(&req.key, old, completed(json!(1))).await,
        );
        assert_stale(
            "renewing with the fenced token",
            s.renew(&req.key, old, LEASE).await,
        );
        assert_stale(
            "releasing with the fenced token",
            s.release(&req.key, old).await,
        );
        assert_stale(
            "reclaiming twice with the same expected token",
            s.reclaim(&req.key, old, LEASE).await,
        );
        assert_stale(
            "reclaiming a running record",
            s.reclaim(&req.key, new, LEASE).await,
        );
        s.renew(&req.key, new, LEASE)
            .await
            .unwrap_or_else(|e| panic!("the new holder renews: {e}"));
        settle(s, &req.key, new, completed(json!("reconciled"))).await;
        assert_eq!(get(s, &req.key).await.state, RecordState::Completed);
        assert_stale(
            "reclaiming a completed record",
            s.reclaim(&req.key, new, LEASE).await,
        );
    }
    match s
        .reclaim(&key("reclaim-absent"), ClaimToken(1), LEASE)
        .await
    {
        Err(StoreError::NotFound(_)) => {}
        other => panic!("reclaiming a key without a record must be NotFound, got {other:?}"),
    }
}

/// `list` returns the records in one state, oldest claim first, at most `limit`.
pub async fn list_by_state<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "list_by_state").await else {
        return;
    };
    let s = &*h.store;
    let mut completed_keys = Vec::new();
    for i in 0..5 {
        let req = request(&format!("list-completed-{i}"));
        let t = claim(s, &req).await;
        // Settle out of creation order: the listing orders by claim time, not update time.
        completed_keys.push((req.key.clone(), t));
        h.clock.advance(Duration::from_secs(1));
    }
    for (k, t) in completed_keys.iter().rev() {
        settle(s, k, *t, completed(json!(k.as_str()))).await;
        h.clock.advance(Duration::from_secs(1));
    }
    let mut failed_keys = Vec::new();
    for i in 0..2 {
        let req = request(&format!("list-failed-{i}"));
        let t = claim(s, &req).await;
        settle(
            s,
            &req.key,
            t,
            Settlement::new(RecordState::Failed).message("no"),
        )
        .await;
        failed_keys.push(req.key);
        h.clock.advance(Duration::from_secs(1));
    }
    let running = request("list-running");
    claim(s, &running).await;

    let keys = |v: Vec<Record>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    let list = |state, limit| async move {
        s.list(state, limit)
            .await
            .unwrap_or_else(|e| panic!("list({state}, {limit}) failed: {e}"))
    };
    let all: Vec<IdemKey> = completed_keys.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(
        keys(list(RecordState::Completed, 10).await),
        all,
        "list returns exactly the records in the state, oldest claim first"
    );
    assert_eq!(
        keys(list(RecordState::Completed, 3).await),
        all[..3].to_vec(),
        "list honours the limit, keeping the oldest"
    );
    assert_eq!(keys(list(RecordState::Failed, 10).await), failed_keys);
    assert_eq!(
        keys(list(RecordState::Running, 10).await),
        vec![running.key]
    );
    assert!(list(RecordState::Escalated, 10).await.is_empty());
    assert!(list(RecordState::Completed, 0).await.is_empty(), "limit 0");
    for r in list(RecordState::Completed, 10).await {
        assert_eq!(r.state, RecordState::Completed);
        assert_eq!(
            r.payload,
            Some(json!(r.key.as_str())),
            "listed records are whole"
        );
    }
}

/// `list_after` pages through one state in `(created_at, key)` order: a walk with a small
/// limit visits every record that stays in the state exactly once, in order, also where a
/// page ends among records claimed in the same millisecond and where the record the cursor
/// was taken from has since left the state. A record settled before its page is not listed
/// in its old state; a lease that expires mid-walk is listed as unknown in its place; a
/// record that enters the state during the walk, newer than the cursor, is listed at the end.
pub async fn list_after_pages_exactly_once<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "list_after_pages_exactly_once").await else {
        return;
    };
    let s = &*h.store;
    let unknown = || Settlement::new(RecordState::Unknown).message("timed out");
    // Three claim times with 3, 1 and 4 unknown records each: the key breaks the ties. A
    // completed record at each time is in the way of no page.
    let mut tokens = std::collections::HashMap::new();
    for (group, size) in [3, 1, 4].into_iter().enumerate() {
        for i in 0..size {
            let req = request(&format!("page-{group}-{i}"));
            let t = claim(s, &req).await;
            settle(s, &req.key, t, unknown()).await;
            tokens.insert(req.key, t);
        }
        let other = request(&format!("page-{group}-completed"));
        let t = claim(s, &other).await;
        settle(s, &other.key, t, completed(json!(group))).await;
        h.clock.advance(Duration::from_secs(1));
    }
    // Running now; its lease expires in the middle of the walk.
    let expiring = request("page-expiring");
    claim(s, &expiring).await;

    let mut order = Vec::new();
    for k in tokens.keys().chain([&expiring.key]) {
        order.push(ListCursor::of(&get(s, k).await));
    }
    order.sort();
    assert!(
        order.windows(2).any(|w| w[0].created_at == w[1].created_at),
        "the check needs records claimed in the same millisecond"
    );
    let page = |after: Option<ListCursor>, limit: usize| async move {
        let records = s
            .list_after(RecordState::Unknown, after.as_ref(), limit)
            .await
            .unwrap_or_else(|e| panic!("list_after(unknown, {after:?}, {limit}) failed: {e}"));
        assert!(
            records.len() <= limit,
            "a page holds at most `limit` records"
        );
        for r in &records {
            assert_eq!(r.state, RecordState::Unknown, "a page lists only its state");
            assert!(
                after.as_ref().is_none_or(|c| ListCursor::of(r) > *c),
                "a page lists only records strictly after its cursor"
            );
        }
        records
    };

    let first = page(None, 2).await;
    let listed: Vec<ListCursor> = first.iter().map(ListCursor::of).collect();
    assert_eq!(
        listed,
        order[..2],
        "the first page is the oldest records, ties broken by key"
    );
    assert_eq!(
        first,
        s.list(RecordState::Unknown, 2)
            .await
            .unwrap_or_else(|e| panic!("list failed: {e}")),
        "list is list_after from the start"
    );
    // Between pages: the record the cursor comes from is settled (the walk must find its
    // place without it), so is one that no page has listed yet (it must not be listed as
    // unknown any more), the running claim's lease passes (it must be listed as unknown),
    // and a new unknown record appears (newer than every cursor: listed at the end).
    let cursor = listed[1].clone();
    settle(
        s,
        &cursor.key,
        tokens[&cursor.key],
        completed(json!("late")),
    )
    .await;
    let gone = order[4].clone();
    assert_ne!(gone.key, expiring.key);
    settle(s, &gone.key, tokens[&gone.key], completed(json!("late"))).await;
    h.clock.advance(LEASE + Duration::from_secs(1));
    let newcomer = request("page-newcomer");
    let t = claim(s, &newcomer).await;
    settle(s, &newcomer.key, t, unknown()).await;

    let mut seen = listed;
    let mut after = Some(cursor);
    loop {
        let records = page(after.clone(), 2).await;
        seen.extend(records.iter().map(ListCursor::of));
        after = seen.last().cloned();
        if records.len() < 2 {
            break;
        }
        assert!(seen.len() <= order.len() + 1, "the walk must end");
    }
    let mut expected: Vec<ListCursor> = order.into_iter().filter(|c| *c != gone).collect();
    expected.push(ListCursor::of(&get(s, &newcomer.key).await));
    assert_eq!(
        seen, expected,
        "paging visits each record once, in order; the settled one is left out, the expired \
         lease is listed as unknown in its place, the newcomer at the end"
    );
    assert!(page(after, 2).await.is_empty(), "nothing after the last");
    assert!(page(None, 0).await.is_empty(), "limit 0");
}

/// Attempt and read-back evidence accumulates across settles, late results and takeovers,
/// in order.
pub async fn attempts_are_appended<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "attempts_are_appended").await else {
        return;
    };
    let s = &*h.store;
    let req = request("attempts");
    let t1 = claim(s, &req).await;
    let a1 = attempt(1, OutcomeClass::Unknown, &h.clock);
    let a2 = attempt(2, OutcomeClass::Unknown, &h.clock);
    settle(
        s,
        &req.key,
        t1,
        Settlement::new(RecordState::Unknown)
            .message("timed out")
            .attempts(vec![a1.clone(), a2.clone()]),
    )
    .await;
    h.clock.advance(Duration::from_secs(5));
    let a3 = attempt(2, OutcomeClass::Unknown, &h.clock);
    settle(
        s,
        &req.key,
        t1,
        Settlement::new(RecordState::Unknown).attempts(vec![a3.clone()]),
    )
    .await;
    let t2 = s
        .reclaim(&req.key, t1, LEASE)
        .await
        .unwrap_or_else(|e| panic!("reclaim failed: {e}"));
    let rb1 = ReadBackRecord {
        at: h.clock.now(),
        result: "not found".to_owned(),
    };
    settle(
        s,
        &req.key,
        t2,
        Settlement::new(RecordState::Unknown).read_backs(vec![rb1.clone()]),
    )
    .await;
    let t3 = s
        .reclaim(&req.key, t2, LEASE)
        .await
        .unwrap_or_else(|e| panic!("reclaim failed: {e}"));
    h.clock.advance(Duration::from_secs(5));
    let rb2 = ReadBackRecord {
        at: h.clock.now(),
        result: "found completed ch_123".to_owned(),
    };
    let a4 = attempt(3, OutcomeClass::Completed, &h.clock);
    settle(
        s,
        &req.key,
        t3,
        completed(json!("ok"))
            .attempts(vec![a4.clone()])
            .read_backs(vec![rb2.clone()]),
    )
    .await;
    let r = get(s, &req.key).await;
    assert_eq!(
        r.attempts,
        vec![a1, a2, a3, a4],
        "every attempt is kept, in order"
    );
    assert_eq!(
        r.read_backs,
        vec![rb1, rb2],
        "every read-back is kept, in order"
    );
}

/// What is settled is what is read back: every field, exactly (unicode, large and
/// fractional numbers, nested JSON, messages, refs, times).
pub async fn records_round_trip<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "records_round_trip").await else {
        return;
    };
    let s = &*h.store;
    let req = ClaimRequest {
        tool: "refund_payment-v2".into(),
        lease: Duration::from_millis(12_345),
        // As the executor drafts it: the canonical bytes its key was derived from.
        operation: Some(OperationDraft::from_canonical_bytes(
            crate::identity::Scope::run("run-7").with_tenant("tenant-\u{e9}"),
            Some("order-1234".to_owned()),
            crate::identity::canonical::to_canonical_vec(
                &json!({"customer": "acme", "cents": 4900, "memo": null, "tags": ["a", "b"]}),
            ),
        )),
        ..request("round-trip")
    };
    let claimed_at = h.clock.now();
    let token = claim(s, &req).await;
    let r = get(s, &req.key).await;
    let expected_running = Record {
        key: req.key.clone(),
        fingerprint: req.fingerprint,
        tool: req.tool.clone(),
        state: RecordState::Running,
        token,
        lease_until: Some(claimed_at.plus(req.lease)),
        created_at: claimed_at,
        updated_at: claimed_at,
        payload: None,
        message: None,
        downstream_ref: None,
        result_expired: false,
        attempts: Vec::new(),
        operation: req.operation.as_ref().map(OperationDraft::to_operation),
        read_backs: Vec::new(),
    };
    assert_eq!(r, expected_running, "a fresh claim reads back exactly");

    h.clock.advance(Duration::from_millis(1500));
    let payload = json!({
        "amount": {"cents": 4900, "currency": "EUR"},
        "big": u64::MAX,
        "negative": i64::MIN,
        "ratio": 0.1,
        "text": "zürich — 東京 \u{1F4B8} \"quoted\" \\ \n line",
        "nested": [[], {}, null, true, [1, [2, [3]]]],
    });
    let a1 = attempt(1, OutcomeClass::Completed, &h.clock);
    let rb = ReadBackRecord {
        at: h.clock.now(),
        result: "found completed re_3Nq ✓".to_owned(),
    };
    let settled_at = h.clock.now();
    settle(
        s,
        &req.key,
        token,
        completed(payload.clone())
            .message("note: ünïcode")
            .downstream_ref("re_3Nq ✓")
            .attempts(vec![a1.clone()])
            .read_backs(vec![rb.clone()]),
    )
    .await;
    let r = get(s, &req.key).await;
    let expected = Record {
        state: RecordState::Completed,
        lease_until: None,
        updated_at: settled_at,
        payload: Some(payload),
        message: Some("note: ünïcode".to_owned()),
        downstream_ref: Some("re_3Nq ✓".to_owned()),
        attempts: vec![a1],
        read_backs: vec![rb],
        ..expected_running
    };
    assert_eq!(r, expected, "a settled record reads back exactly");
    assert_eq!(
        claim_finds(s, &req).await,
        expected,
        "claim reports it whole"
    );
}

/// `wait_settled` returns at once for settled and absent keys, returns the running record
/// when its timeout passes, and sees a settlement made while it waits.
pub async fn wait_settled_sees_settlement<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "wait_settled_sees_settlement").await else {
        return;
    };
    let s = h.store.clone();
    let wait = |key: IdemKey, timeout| {
        let s = s.clone();
        async move {
            s.wait_settled(&key, timeout)
                .await
                .unwrap_or_else(|e| panic!("wait_settled failed: {e}"))
        }
    };
    assert_eq!(
        wait(key("wait-absent"), Duration::from_secs(60)).await,
        None
    );
    let req = request("wait");
    let token = claim(&*s, &req).await;
    let r = wait(req.key.clone(), Duration::ZERO).await;
    assert_eq!(r.map(|r| r.state), Some(RecordState::Running));

    let settler = {
        let s = s.clone();
        let k = req.key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.settle(&k, token, completed(json!("done"))).await
        })
    };
    // Generous bound: only a store that never notices the settlement runs into it.
    let r = wait(req.key.clone(), Duration::from_secs(60)).await;
    match settler.await {
        Ok(Ok(())) => {}
        other => panic!("the settling task failed: {other:?}"),
    }
    let r = r.unwrap_or_else(|| panic!("the record vanished while waiting"));
    assert_eq!(
        r.state,
        RecordState::Completed,
        "wait_settled sees the result"
    );
    assert_eq!(r.payload, Some(json!("done")));
    let r = wait(req.key.clone(), Duration::from_secs(60)).await;
    assert_eq!(r.map(|r| r.state), Some(RecordState::Completed));
}

/// Records survive closing the store and opening it again: running claims (still held by
/// their token), results, evidence. Durable backends only.
pub async fn survives_reopen<F: StoreFactory>(f: &F) {
    if !f.durable() {
        eprintln!("conformance check `survives_reopen` skipped: not durable");
        return;
    }
    let Some(h) = harness(f, "survives_reopen").await else {
        return;
    };
    let running = request("reopen-running");
    let done = request("reopen-completed");
    let unknown = request("reopen-unknown");
    let running_token = claim(&*h.store, &running).await;
    let t = claim(&*h.store, &done).await;
    settle(&*h.store, &done.key, t, completed(json!({"id": 1}))).await;
    let t = claim(&*h.store, &unknown).await;
    settle(
        &*h.store,
        &unknown.key,
        t,
        Settlement::new(RecordState::Unknown)
            .message("crashed")
            .attempts(vec![attempt(1, OutcomeClass::Unknown, &h.clock)]),
    )
    .await;
    let before = [
        get(&*h.store, &running.key).await,
        get(&*h.store, &done.key).await,
        get(&*h.store, &unknown.key).await,
    ];

    let Harness {
        store,
        clock,
        location,
        options,
    } = h;
    drop(store);
    let h = Harness::<F> {
        store: Arc::new(
            f.open(&location, &options)
                .await
                .unwrap_or_else(|e| panic!("reopening the store failed: {e}")),
        ),
        clock,
        location,
        options,
    };
    let s = &*h.store;
    for b in &before {
        assert_eq!(&get(s, &b.key).await, b, "a record must survive a reopen");
    }
    assert_eq!(claim_finds(s, &running).await.state, RecordState::Running);
    assert_eq!(claim_finds(s, &done).await.payload, Some(json!({"id": 1})));
    let keys: Vec<_> = s
        .list(RecordState::Unknown, 10)
        .await
        .unwrap_or_else(|e| panic!("list failed: {e}"))
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(keys, vec![unknown.key.clone()]);
    // A worker that outlived the store's restart still holds its claim.
    s.renew(&running.key, running_token, LEASE)
        .await
        .unwrap_or_else(|e| panic!("renewing after a reopen failed: {e}"));
    settle(s, &running.key, running_token, completed(json!("after"))).await;
    assert_eq!(get(s, &running.key).await.state, RecordState::Completed);
}

/// A stored record that does not decode is [`StoreError::Corrupt`] from every operation on
/// its key — never a panic, and never a claim granted over it (that could run the effect a
/// second time). `list` either reports it as corrupt or leaves it out. Needs the factory's
/// [`StoreFactory::corrupt`] hook.
pub async fn corrupt_records_are_errors<F: StoreFactory>(f: &F) {
    let Some(h) = harness(f, "corrupt_records_are_errors").await else {
        return;
    };
    let s = &*h.store;
    let req = request("corrupt");
    let token = claim(s, &req).await;
    let healthy = request("corrupt-neighbour");
    let healthy_token = claim(s, &healthy).await;
    let supported = f
        .corrupt(&h.location, &req.key)
        .await
        .unwrap_or_else(|e| panic!("corrupting a record failed: {e}"));
    if !supported {
        eprintln!("conformance check `corrupt_records_are_errors` skipped: no corrupt hook");
        return;
    }
    fn corrupt<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
        match r {
            Err(StoreError::Corrupt { .. }) => {}
            other => {
                panic!("{what} of a corrupt record must be StoreError::Corrupt, got {other:?}")
            }
        }
    }
    corrupt("claim", s.claim(&req).await);
    corrupt("get", s.get(&req.key).await);
    corrupt("renew", s.renew(&req.key, token, LEASE).await);
    corrupt(
        "settle",
        s.settle(&req.key, token, completed(json!(1))).await,
    );
    corrupt("release", s.release(&req.key, token).await);
    corrupt("reclaim", s.reclaim(&req.key, token, LEASE).await);
    corrupt(
        "release_unsettled",
        s.release_unsettled(&req.key, token, &ReleaseNote::new("op", "corrupt"))
            .await,
    );
    corrupt(
        "release_traced",
        s.release_traced(
            &req.key,
            token,
            Settlement::new(RecordState::Unknown),
            &ReleaseNote::new("op", "corrupt"),
        )
        .await,
    );
    for state in RecordState::ALL {
        match s.list(state, 10).await {
            Ok(records) => assert!(
                records.iter().all(|r| r.key != req.key),
                "list must not report a corrupt record as healthy"
            ),
            Err(StoreError::Corrupt { .. }) => {}
            Err(e) => panic!("list over a corrupt record must be Ok or Corrupt, got {e}"),
        }
    }
    // Other keys are unaffected.
    settle(s, &healthy.key, healthy_token, completed(json!("fine"))).await;
    assert_eq!(get(s, &healthy.key).await.state, RecordState::Completed);
}
