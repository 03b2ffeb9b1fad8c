//! Upgrading across a key-format change, mid-flight: an operation claimed by a build of the
//! previous format (running, completed, unknown) and repeated by a build of the next one must
//! be found, never run again.
//!
//! The "old build" here is a registry claiming under format v1 and honouring nothing, which
//! is what a v1 build did; the first test pins that its keys and fingerprints are v1's bytes,
//! recomputed without the library. Every test asserts on the downstream's ledger.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::identity::canonical::to_canonical_vec;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{ClaimToken, Record, StoreError};
use idem_runtime::{
    call::{CallError, ToolCall},
    identity::{IdemKey, KeyFormat, KeyMigration, Scope},
    outcome::OutcomeClass,
    registry::Registry,
    store::{IdemStore, MemoryStore, RecordState},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    amount_cents: u64,
}

/// The downstream: one line per charge that ran, with the key it was sent.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<(String, String, u64)>>>);

impl Ledger {
    fn charges_of(&self, customer: &str) -> usize {
        let ledger = self.0.lock().unwrap();
        ledger.iter().filter(|(_, c, _)| c == customer).count()
    }

    fn keys(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, ..)| k.clone())
            .collect()
    }
}

/// A charge whose handler may be held (by a semaphore with no permits) or never finish.
struct Charge {
    ledger: Ledger,
    hold: Option<Arc<Semaphore>>,
    spec: ToolSpec,
}

impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = Value;

    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    async fn call(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        self.ledger.0.lock().unwrap().push((
            ctx.key().as_str().to_owned(),
            args.customer.clone(),
            args.amount_cents,
        ));
        if let Some(hold) = &self.hold {
            // The effect is recorded; the reply waits (or never comes).
            let _permit = hold.acquire().await;
        }
        Ok(json!({ "charged": args.amount_cents }))
    }
}

fn spec() -> ToolSpec {
    ToolSpec::new("charge").description("Charges a customer.")
}

fn registry(
    store: Arc<dyn IdemStore>,
    ledger: &Ledger,
    hold: Option<Arc<Semaphore>>,
    tool_spec: ToolSpec,
    migration: KeyMigration,
) -> Registry {
    Registry::builder()
        .shared_store(store)
        .tool(Charge {
            ledger: ledger.clone(),
            hold,
            spec: tool_spec,
        })
        .in_flight_wait(Duration::from_millis(50))
        .key_migration(migration)
        .build()
        .unwrap()
}

/// What a build of format v1 did: claim under v1, look nowhere else.
fn old_build(store: Arc<dyn IdemStore>, ledger: &Ledger) -> Registry {
    old_build_of(store, ledger, spec())
}

fn old_build_of(store: Arc<dyn IdemStore>, ledger: &Ledger, tool: ToolSpec) -> Registry {
    registry(
        store,
        ledger,
        None,
        tool,
        KeyMigration::claim_under(KeyFormat::V1),
    )
}

/// Phase 2 of the upgrade: claim under v2, honour v1.
fn new_build(store: Arc<dyn IdemStore>, ledger: &Ledger) -> Registry {
    new_build_of(store, ledger, spec())
}

fn new_build_of(store: Arc<dyn IdemStore>, ledger: &Ledger, tool: ToolSpec) -> Registry {
    registry(
        store,
        ledger,
        None,
        tool,
        KeyMigration::honour_previous(KeyFormat::V1),
    )
}

fn charge(run: &str, customer: &str, amount_cents: u64) -> ToolCall {
    ToolCall::new(
        run,
        "charge",
        json!({ "customer": customer, "amount_cents": amount_cents }),
    )
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Format v1's key, from its documented layout (`docs/keys.md`, section 6.2), without the
/// library: tag, then each part as an 8-byte big-endian length and its bytes.
fn v1_key(run: &str, tool: &str, kind: &str, material: &[u8]) -> String {
    v1_scoped_key(None, None, run, tool, kind, material)
}

fn v1_scoped_key(
    tenant: Option<&str>,
    principal: Option<&str>,
    run: &str,
    tool: &str,
    kind: &str,
    material: &[u8],
) -> String {
    let mut input = b"idem-key/v1".to_vec();
    for part in [
        tenant.unwrap_or("").as_bytes(),
        &[u8::from(tenant.is_some())],
        principal.unwrap_or("").as_bytes(),
        &[u8::from(principal.is_some())],
        run.as_bytes(),
        tool.as_bytes(),
        kind.as_bytes(),
        material,
    ] {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part);
    }
    format!("idem:{}", hex(&sha256(&input)))
}

fn v1_fingerprint(canonical: &[u8]) -> String {
    let mut input = b"idem-fingerprint/v1\0".to_vec();
    input.extend_from_slice(canonical);
    hex(&sha256(&input))
}

#[tokio::test]
async fn the_old_build_claims_under_format_v1s_documented_bytes() {
    let store = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let old = old_build(store.clone(), &ledger);
    let args = json!({ "customer": "acme", "amount_cents": 4900 });
    let canonical = to_canonical_vec(&args);
    let result = old.call(ToolCall::new("run-1", "charge", args)).await;
    assert!(result.is_completed(), "{}", result.text());

    let expected = v1_key("run-1", "charge", "args", &canonical);
    assert_eq!(
        ledger.keys(),
        std::slice::from_ref(&expected),
        "the handler was sent the v1 key"
    );
    let record = store
        .get(&IdemKey::parse(&expected).unwrap())
        .await
        .unwrap()
        .expect("the record lives under the v1 key");
    assert_eq!(record.fingerprint.to_hex(), v1_fingerprint(&canonical));
    assert_eq!(record.state, RecordState::Completed);

    let intent = old
        .call(charge("run-1", "globex", 100).intent("order-7"))
        .await;
    assert!(intent.is_completed());
    assert_eq!(
        ledger.keys()[1],
        v1_key("run-1", "charge", "intent", b"order-7")
    );
}

/// The control: without a migration, the new build does not see the old claim. If this
/// stopped running twice, the tests below would prove nothing.
#[tokio::test]
async fn without_a_migration_the_new_build_misses_an_old_claim() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let old = old_build(store.clone(), &ledger);
    let plain = registry(store, &ledger, None, spec(), KeyMigration::none());
    assert!(old.call(charge("run-1", "acme", 4900)).await.is_completed());
    assert!(plain
        .call(charge("run-1", "acme", 4900))
        .await
        .is_completed());
    assert_eq!(ledger.charges_of("acme"), 2);
}

#[tokio::test]
async fn a_completed_operation_is_replayed_after_the_upgrade() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    // Whole arguments, an intent id, and key fields: the three kinds of key material.
    let keyed_by_customer = spec().key_fields(["customer"]);
    let cases = [
        ("acme", charge("run-1", "acme", 4900), spec()),
        (
            "globex",
            charge("run-1", "globex", 100).intent("order-7"),
            spec(),
        ),
        (
            "initech",
            charge("run-1", "initech", 250),
            keyed_by_customer,
        ),
    ];
    for (customer, call, tool_spec) in cases {
        let old = old_build_of(store.clone(), &ledger, tool_spec.clone());
        let new = new_build_of(store.clone(), &ledger, tool_spec);
        let first = old.call(call.clone()).await;
        assert!(first.is_completed(), "{customer}: {}", first.text());
        let repeat = new.call(call.clone().call_id("a-new-tool-use-id")).await;
        assert!(repeat.is_completed(), "{customer}: {}", repeat.text());
        assert!(repeat.replayed(), "{customer}: the saved result answers");
        assert_eq!(repeat.output(), first.output());
        assert_eq!(
            repeat.key(),
            first.key(),
            "{customer}: the repeat reports the key the operation was claimed under"
        );
        assert_eq!(ledger.charges_of(customer), 1, "{customer}");
    }
    // Nothing was claimed under a v2 key.
    for state in RecordState::ALL {
        for record in store.list(state, 100).await.unwrap() {
            assert!(
                ledger.keys().contains(&record.key.as_str().to_owned()),
                "a record under a key no charge was sent with: {}",
                record.key
            );
        }
    }
}

#[tokio::test]
async fn an_operation_still_running_under_v1_is_not_run_again() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let hold = Arc::new(Semaphore::new(0));
    let old = registry(
        store.clone(),
        &ledger,
        Some(hold.clone()),
        spec().timeout(Duration::from_secs(30)),
        KeyMigration::claim_under(KeyFormat::V1),
    );
    let new = new_build(store, &ledger);

    let running = tokio::spawn(async move { old.call(charge("run-1", "acme", 4900)).await });
    while ledger.charges_of("acme") == 0 {
        tokio::task::yield_now().await;
    }
    // Mid-flight: the old build's handler has charged and not yet returned.
    let during = new.call(charge("run-1", "acme", 4900)).await;
    assert!(
        matches!(during.error(), Some(CallError::InFlight { .. })),
        "{}",
        during.text()
    );
    hold.add_permits(1);
    let first = running.await.unwrap();
    assert!(first.is_completed(), "{}", first.text());

    let after = new.call(charge("run-1", "acme", 4900)).await;
    assert!(after.replayed() && after.is_completed(), "{}", after.text());
    assert_eq!(ledger.charges_of("acme"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_operation_under_v1_stays_unknown() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let never = Arc::new(Semaphore::new(0));
    let old = registry(
        store.clone(),
        &ledger,
        Some(never),
        spec().timeout(Duration::from_millis(100)),
        KeyMigration::claim_under(KeyFormat::V1),
    );
    let new = new_build(store, &ledger);
    let first = old.call(charge("run-1", "acme", 4900)).await;
    assert_eq!(
        first.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        first.text()
    );

    let repeat = new.call(charge("run-1", "acme", 4900)).await;
    assert_eq!(
        repeat.class(),
        Some(OutcomeClass::Unknown),
        "{}",
        repeat.text()
    );
    assert!(repeat.replayed());
    assert_eq!(ledger.charges_of("acme"), 1);
}

#[tokio::test]
async fn changed_parameters_under_a_v1_claim_are_refused() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let old = old_build(store.clone(), &ledger);
    let new = new_build(store, &ledger);
    let first = old
        .call(charge("run-1", "acme", 4900).intent("order-1"))
        .await;
    assert!(first.is_completed());
    // Same intent, other amount: v1's fingerprint of these arguments differs from the
    // record's, and the same amount's would match (compared under the record's format).
    let changed = new
        .call(charge("run-1", "acme", 9900).intent("order-1"))
        .await;
    assert!(
        matches!(changed.error(), Some(CallError::ChangedParams { .. })),
        "{}",
        changed.text()
    );
    let same = new
        .call(charge("run-1", "acme", 4900).intent("order-1"))
        .await;
    assert!(same.replayed() && same.is_completed(), "{}", same.text());
    assert_eq!(ledger.0.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn phase_one_builds_share_claims_with_old_builds_and_with_phase_two() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let old = old_build(store.clone(), &ledger);
    let phase_one = registry(
        store.clone(),
        &ledger,
        None,
        spec(),
        KeyMigration::claim_previous(KeyFormat::V1),
    );
    let phase_two = new_build(store, &ledger);

    // An old build and a phase-one build contend for one key.
    assert!(phase_one
        .call(charge("run-1", "acme", 1))
        .await
        .is_completed());
    let old_repeat = old.call(charge("run-1", "acme", 1)).await;
    assert!(old_repeat.replayed(), "{}", old_repeat.text());
    // A phase-two claim (under v2) is honoured by a phase-one build still running.
    assert!(phase_two
        .call(charge("run-2", "globex", 2))
        .await
        .is_completed());
    let phase_one_repeat = phase_one.call(charge("run-2", "globex", 2)).await;
    assert!(phase_one_repeat.replayed(), "{}", phase_one_repeat.text());
    assert_eq!(ledger.charges_of("acme"), 1);
    assert_eq!(ledger.charges_of("globex"), 1);
}

/// Workers of both phases racing on the same operations: the look-up after a won claim is
/// what keeps this at one effect each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_formats_racing_never_run_an_operation_twice() {
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let ledger = Ledger::default();
    let phase_one = registry(
        store.clone(),
        &ledger,
        None,
        spec(),
        KeyMigration::claim_previous(KeyFormat::V1),
    );
    let phase_two = new_build(store, &ledger);
    const OPS: usize = 300;
    let mut tasks = Vec::new();
    for i in 0..OPS {
        for registry in [phase_one.clone(), phase_two.clone()] {
            tasks.push(tokio::spawn(async move {
                registry.call(charge("run-1", &format!("c{i}"), 1)).await
            }));
        }
    }
    for task in tasks {
        let result = task.await.unwrap();
        // Each answer is the effect, its replay, or "in flight"; never a second effect.
        assert!(
            result.is_completed() || matches!(result.error(), Some(CallError::InFlight { .. })),
            "{}",
            result.text()
        );
    }
    // Every operation not yet run (both stood back) runs now, once.
    for i in 0..OPS {
        let result = phase_two.call(charge("run-1", &format!("c{i}"), 1)).await;
        assert!(result.is_completed(), "{}", result.text());
    }
    let mut per_customer: HashMap<String, usize> = HashMap::new();
    for (_, customer, _) in ledger.0.lock().unwrap().iter() {
        *per_customer.entry(customer.clone()).or_default() += 1;
    }
    assert_eq!(per_customer.len(), OPS);
    assert!(
        per_customer.values().all(|&n| n == 1),
        "an operation ran twice: {:?}",
        per_customer
            .iter()
            .filter(|(_, &n)| n > 1)
            .collect::<Vec<_>>()
    );
}

/// A store that holds the first two claims until both arrive: both workers have looked
/// under the other format's key (and found nothing) before either claims. Without the
/// look-up after a won claim, both would run.
#[derive(Debug)]
struct ClaimsMeet {
    inner: MemoryStore,
    meet: tokio::sync::Barrier,
    held: std::sync::atomic::AtomicUsize,
    /// Releases fail (a store outage that begins after the claims).
    refuse_releases: bool,
}

#[async_trait::async_trait]
impl IdemStore for ClaimsMeet {
    // A test double that keeps no release traces: a release takes the record over and frees
    // it, a traced release settles and then releases, and no trace is listed.
    async fn release_unsettled(
        &self,
        key: &idem_runtime::identity::IdemKey,
        expected: idem_runtime::store::ClaimToken,
        _note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        let token = self
            .reclaim(key, expected, std::time::Duration::from_secs(60))
            .await?;
        self.release(key, token).await
    }

    async fn release_traced(
        &self,
        key: &idem_runtime::identity::IdemKey,
        token: idem_runtime::store::ClaimToken,
        settlement: idem_runtime::store::backend::Settlement,
        note: &idem_runtime::store::ReleaseNote,
    ) -> Result<(), idem_runtime::store::StoreError> {
        idem_runtime::store::backend::rules::releasable_settlement(key, &settlement)?;
        self.settle(key, token, settlement).await?;
        self.release_unsettled(key, token, note).await
    }

    async fn releases(
        &self,
        _key: &idem_runtime::identity::IdemKey,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    async fn list_releases(
        &self,
        _after: Option<&idem_runtime::store::ListCursor>,
        _limit: usize,
    ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError> {
        Ok(Vec::new())
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        if self.held.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
            self.meet.wait().await;
        }
        self.inner.claim(req).await
    }
    async fn renew(&self, key: &IdemKey, token: ClaimToken, lease: Duration) -> StoreResult<()> {
        self.inner.renew(key, token, lease).await
    }
    async fn settle(&self, key: &IdemKey, token: ClaimToken, s: Settlement) -> StoreResult<()> {
        self.inner.settle(key, token, s).await
    }
    async fn release(&self, key: &IdemKey, token: ClaimToken) -> StoreResult<()> {
        if self.refuse_releases {
            return Err(StoreError::Unavailable("connection reset".into()));
        }
        self.inner.release(key, token).await
    }
    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> StoreResult<ClaimToken> {
        self.inner.reclaim(key, expected, lease).await
    }
    async fn get(&self, key: &IdemKey) -> StoreResult<Option<Record>> {
        self.inner.get(key).await
    }
    async fn list(&self, state: RecordState, limit: usize) -> StoreResult<Vec<Record>> {
        self.inner.list(state, limit).await
    }
}

type StoreResult<T> = Result<T, StoreError>;

/// A phase-one and a phase-two build over one [`ClaimsMeet`] store, each sent the same
/// charge at once.
struct Race {
    store: Arc<ClaimsMeet>,
    ledger: Ledger,
    phase_one: Registry,
    phase_two: Registry,
}

impl Race {
    fn new(refuse_releases: bool) -> Race {
        let store = Arc::new(ClaimsMeet {
            inner: MemoryStore::new(),
            meet: tokio::sync::Barrier::new(2),
            held: Default::default(),
            refuse_releases,
        });
        let shared: Arc<dyn IdemStore> = store.clone();
        let ledger = Ledger::default();
        let phase_one = registry(
            shared.clone(),
            &ledger,
            None,
            spec(),
            KeyMigration::claim_previous(KeyFormat::V1),
        );
        let phase_two = new_build(shared, &ledger);
        Race {
            store,
            ledger,
            phase_one,
            phase_two,
        }
    }

    /// Both calls, concurrently; their answers in the order (phase one, phase two).
    async fn run(
        &self,
    ) -> (
        idem_runtime::call::ToolResult,
        idem_runtime::call::ToolResult,
    ) {
        let call = |registry: &Registry| {
            let registry = registry.clone();
            tokio::spawn(async move { registry.call(charge("run-1", "acme", 1)).await })
        };
        let (a, b) = tokio::join!(call(&self.phase_one), call(&self.phase_two));
        (a.unwrap(), b.unwrap())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_made_in_the_same_instant_under_two_formats_run_once() {
    let race = Race::new(false);
    let (a, b) = race.run().await;
    let Race {
        ledger,
        phase_one,
        phase_two,
        ..
    } = race;
    assert!(
        ledger.charges_of("acme") <= 1,
        "both formats ran the operation: {} / {}",
        a.text(),
        b.text()
    );
    // Whatever the race left (one ran, or both stood back), a repeat completes it once.
    let repeat = phase_two.call(charge("run-1", "acme", 1)).await;
    assert!(repeat.is_completed(), "{}", repeat.text());
    let again = phase_one.call(charge("run-1", "acme", 1)).await;
    assert!(again.replayed(), "{}", again.text());
    assert_eq!(ledger.charges_of("acme"), 1);
}

#[test]
fn a_repeat_in_another_scope_is_still_another_operation() {
    // Honouring v1 must not widen what counts as one operation: v1 keys are scoped too.
    let m = idem_runtime::identity::KeyMaterial::Intent("order-1");
    let a = KeyFormat::V1.key(&Scope::run("run-1"), "charge", m);
    let b = KeyFormat::V1.key(&Scope::run("run-2"), "charge", m);
    let c = KeyFormat::V1.key(&Scope::run("run-1").with_tenant("acme"), "charge", m);
    assert_ne!(a, b);
    assert_ne!(a, c);
}

/// The format-v1 vectors of `docs/keys.md` (section 6.2): each is one of section 5's
/// vectors under v1, recomputed here by the library and by the layout without it.
#[test]
fn the_documented_v1_vectors_hold() {
    use idem_runtime::identity::{identify_value, KeyMaterial};

    #[derive(Deserialize)]
    struct V2Vector {
        name: String,
        run: String,
        tenant: Option<String>,
        principal: Option<String>,
        tool: String,
        intent: Option<String>,
        key_fields: Option<Vec<String>>,
        args: Value,
        canonical: String,
    }
    #[derive(Deserialize)]
    struct V1Vector {
        name: String,
        fingerprint: String,
        key: String,
    }
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/keys.md")).unwrap();
    let json_after = |marker: &str| -> &str {
        let at = doc
            .find(marker)
            .unwrap_or_else(|| panic!("{marker} is in docs/keys.md"));
        let open = at + doc[at..].find("```json\n").unwrap() + "```json\n".len();
        let close = open + doc[open..].find("```").unwrap();
        &doc[open..close]
    };
    let v2: Vec<V2Vector> = serde_json::from_str(json_after("<!-- key-vectors:json -->")).unwrap();
    let v1: Vec<V1Vector> =
        serde_json::from_str(json_after("<!-- key-vectors-v1:json -->")).unwrap();
    assert!(v1.len() >= 8, "the v1 table lists at least 8 vectors");
    let kinds: std::collections::BTreeSet<_> = v1
        .iter()
        .map(|w| {
            let v = v2
                .iter()
                .find(|v| v.name == w.name)
                .expect("a section 5 vector");
            (v.intent.is_some(), v.key_fields.is_some())
        })
        .collect();
    assert_eq!(
        kinds.len(),
        3,
        "v1 vectors cover args, intent and key-field material"
    );

    for w in &v1 {
        let v = v2.iter().find(|v| v.name == w.name).unwrap();
        let mut scope = Scope::run(v.run.as_str());
        if let Some(t) = &v.tenant {
            scope = scope.with_tenant(t.as_str());
        }
        if let Some(p) = &v.principal {
            scope = scope.with_principal(p.as_str());
        }
        let identity = identify_value(&v.args, &v.key_fields.clone().unwrap_or_default()).unwrap();
        assert_eq!(identity.canonical, v.canonical.as_bytes(), "{}", v.name);
        let (kind, material) = match (&v.intent, &identity.key_fields) {
            (Some(i), _) => ("intent", KeyMaterial::Intent(i)),
            (None, Some(f)) => ("fields", KeyMaterial::Fields(f)),
            (None, None) => ("args", KeyMaterial::Args(&identity.canonical)),
        };
        let library = KeyFormat::V1.key(&scope, &v.tool, material).unwrap();
        assert_eq!(library.as_str(), w.key, "{}: library", v.name);
        assert_eq!(
            KeyFormat::V1.fingerprint(&identity.canonical).to_hex(),
            w.fingerprint,
            "{}: library fingerprint",
            v.name
        );
        assert_eq!(
            v1_fingerprint(&identity.canonical),
            w.fingerprint,
            "{}",
            v.name
        );
        let bytes: &[u8] = match material {
            KeyMaterial::Intent(i) => i.as_bytes(),
            KeyMaterial::Fields(b) | KeyMaterial::Args(b) => b,
            KeyMaterial::ArgsFingerprint(_) => unreachable!("not built above"),
        };
        let layout = v1_scoped_key(
            v.tenant.as_deref(),
            v.principal.as_deref(),
            &v.run,
            &v.tool,
            kind,
            bytes,
        );
        assert_eq!(layout, w.key, "{}: layout", v.name);
    }
}

/// A worker of the new build claimed an operation under v2 and died before it looked under
/// v1, where an old build had already run it: two claims of one operation. The v2 claim
/// lapses to unknown with nothing sent; a reconciler that sent it again (the keyed
/// downstream would see a new key) or freed it would let a second charge in. It escalates.
#[tokio::test]
async fn a_reconciler_never_resends_an_operation_claimed_under_both_formats() {
    use idem_runtime::identity::CanonicalJson;
    use idem_runtime::store::{ManualClock, Operation, Timestamp};
    use idem_runtime::{identity::Fingerprint, reconcile::Reconciler, tool::Downstream};

    let clock = ManualClock::new(Timestamp(1_800_000_000_000));
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    let ledger = Ledger::default();
    let keyed = spec()
        .downstream(Downstream::Keyed)
        .lease(Duration::from_secs(5));
    let old = old_build_of(store.clone(), &ledger, keyed.clone());
    let new = new_build_of(store.clone(), &ledger, keyed);
    assert!(old.call(charge("run-1", "acme", 4900)).await.is_completed());

    let args = json!({ "customer": "acme", "amount_cents": 4900 });
    let canonical = to_canonical_vec(&args);
    let v2 = KeyFormat::V2
        .key(
            &Scope::run("run-1"),
            "charge",
            idem_runtime::identity::KeyMaterial::Args(&canonical),
        )
        .unwrap();
    let claimed = store
        .claim(&ClaimRequest {
            key: v2.clone(),
            fingerprint: Fingerprint::of_canonical(&canonical),
            tool: "charge".into(),
            lease: Duration::from_secs(5),
            operation: Some(
                Operation {
                    scope: Scope::run("run-1"),
                    intent: None,
                    args: CanonicalJson::from_value(&args),
                }
                .into(),
            ),
        })
        .await
        .unwrap();
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)));
    clock.advance(Duration::from_secs(10)); // the dead worker's lease lapses: unknown

    let decisions = Reconciler::new(&new).run_once().await.unwrap();
    let on_v2: Vec<_> = decisions.iter().filter(|d| d.key == v2).collect();
    assert_eq!(on_v2.len(), 1, "{decisions:?}");
    assert_eq!(
        on_v2[0].action,
        idem_runtime::reconcile::Action::Escalated,
        "{decisions:?}"
    );
    assert_eq!(
        store.get(&v2).await.unwrap().unwrap().state,
        RecordState::Escalated
    );
    assert_eq!(ledger.charges_of("acme"), 1, "not sent again");
}

/// Both workers of the race above stand back, and neither claim can be released: each is
/// parked as escalated (nothing ran under it), both callers are told so, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_stand_back_and_cannot_be_released_are_parked_for_a_person() {
    let race = Race::new(true);
    let (a, b) = race.run().await;
    let escalated = race
        .store
        .inner
        .list(RecordState::Escalated, 10)
        .await
        .unwrap();
    let ran = race.ledger.charges_of("acme");
    if ran == 0 {
        // Both stood back: both claims are parked, and neither caller was told "completed".
        assert_eq!(escalated.len(), 2, "{escalated:?}");
        assert!(escalated.iter().all(|r| r
            .message
            .as_deref()
            .unwrap_or("")
            .contains("two key formats")));
        assert!(
            !a.is_completed() && !b.is_completed(),
            "{} / {}",
            a.text(),
            b.text()
        );
    } else {
        // One saw the other first: it stood back (parked), the other ran once.
        assert_eq!(ran, 1);
        assert_eq!(escalated.len(), 1, "{escalated:?}");
    }
}
