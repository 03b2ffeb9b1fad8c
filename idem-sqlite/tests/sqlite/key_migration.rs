//! A key-format upgrade across a restart over one SQLite file: the new build finds and
//! replays the records the old build left.

use idem_sqlite::SqliteStore;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    call::ToolCall,
    identity::{KeyFormat, KeyMigration},
    registry::Registry,
    store::IdemStore,
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
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

#[tokio::test]
async fn an_upgrade_across_a_restart_finds_the_records_of_the_old_build() {
    let dir = idem_test::stores::TempDir::new("sqlite");
    let path = dir.path().join("idem.db");
    let ledger = Ledger::default();
    {
        let store: Arc<dyn IdemStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
        let old = old_build(store, &ledger);
        assert!(old.call(charge("run-1", "acme", 4900)).await.is_completed());
        assert!(old
            .call(charge("run-1", "globex", 100).intent("order-7"))
            .await
            .is_completed());
    }
    // The process restarts on the new build, over the same database.
    let store: Arc<dyn IdemStore> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let new = new_build(store, &ledger);
    let acme = new.call(charge("run-1", "acme", 4900)).await;
    let globex = new
        .call(charge("run-1", "globex", 100).intent("order-7"))
        .await;
    assert!(acme.replayed() && globex.replayed());
    assert_eq!(ledger.charges_of("acme"), 1);
    assert_eq!(ledger.charges_of("globex"), 1);
}
