//! Scopes on every backend (memory, SQLite, Redis, Postgres): a tenant or a principal in
//! the scope keeps saved results apart (same run id and arguments, another tenant → runs
//! again; the same tenant → replays), `require_tenant` refuses a call before anything is
//! claimed, a record never answers a call from another scope even under the same intent
//! id, and the reconciler's retry runs in the scope the operation was claimed in.
//!
//! Assertions are on the downstream's ledger (with the scope each request ran in) and the
//! store's records.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    registry::RetryPolicy,
    store::RecordState,
    tool::{Downstream, ToolSpec, WriteTool},
    CallError, IdemStore, MemoryStore, OutcomeClass, Reconciler, Registry, Scope, ToolCall,
    ToolError, WriteCtx,
};
use idem_test::stores::durables;
use serde_json::{json, Value};

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct PayArgs {
    order: String,
    cents: u64,
}

/// Effects, each with the scope it ran in and the key it was sent with.
#[derive(Default)]
struct Ledger(Mutex<Vec<(Scope, String, String)>>);

impl Ledger {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn scopes(&self) -> Vec<Scope> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(s, ..)| s.clone())
            .collect()
    }
}

struct Pay {
    ledger: Arc<Ledger>,
    /// Lose the answer to the first request of each key (keyed: the retry is harmless).
    lose_first: bool,
}

impl WriteTool for Pay {
    type Args = PayArgs;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("pay")
            .description("Pays an order.")
            .downstream(Downstream::Keyed)
            .timeout(Duration::from_secs(5))
    }
    async fn call(&self, ctx: WriteCtx, args: PayArgs) -> Result<Value, ToolError> {
        let key = ctx.key().as_str().to_owned();
        let first = {
            let mut l = self.ledger.0.lock().unwrap();
            let first = !l.iter().any(|(_, k, _)| *k == key);
            l.push((ctx.scope().clone(), key, args.order.clone()));
            first
        };
        if first && self.lose_first {
            return Err(ToolError::unknown("answer lost"));
        }
        Ok(json!({"paid": args.cents, "tenant": ctx.scope().tenant()}))
    }
}

fn registry(
    store: Arc<dyn IdemStore>,
    ledger: &Arc<Ledger>,
    require: bool,
    lose: bool,
) -> Registry {
    Registry::builder()
        .shared_store(store)
        .require_tenant(require)
        .retry_policy(RetryPolicy::never())
        .tool(Pay {
            ledger: ledger.clone(),
            lose_first: lose,
        })
        .build()
        .expect("valid tools")
}

fn pay(order: &str, cents: u64) -> ToolCall {
    ToolCall::new("run-1", "pay", json!({"order": order, "cents": cents}))
}

async fn record_count(store: &Arc<dyn IdemStore>) -> usize {
    let mut n = 0;
    for state in [
        RecordState::Running,
        RecordState::Completed,
        RecordState::Failed,
        RecordState::Pending,
        RecordState::Unknown,
        RecordState::Escalated,
    ] {
        n += store
            .list(state, 1000)
            .await
            .expect("the store lists")
            .len();
    }
    n
}

/// The stores of this run: a fresh memory store, and each durable one (opened twice, so
/// the second call comes from another worker's handle).
async fn each_backend(
    test: &str,
    mut body: impl AsyncFnMut(&str, Arc<dyn IdemStore>, Arc<dyn IdemStore>),
) {
    let memory: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    body("memory", memory.clone(), memory).await;
    for d in durables(test) {
        body(d.name, d.open().await, d.open().await).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_principals_keep_saved_results_apart() {
    each_backend("scopes_apart", async |name, a, b| {
        let ledger = Arc::new(Ledger::default());
        let (wa, wb) = (
            registry(a, &ledger, false, false),
            registry(b.clone(), &ledger, false, false),
        );
        // One run id and one set of arguments, many scopes.
        let scopes = [
            Scope::run("run-1"),
            Scope::run("run-1").with_tenant("acme"),
            Scope::run("run-1").with_tenant("globex"),
            Scope::run("run-1").with_principal("acme"),
            Scope::run("run-1")
                .with_tenant("acme")
                .with_principal("alice"),
            Scope::run("run-1")
                .with_tenant("acme")
                .with_principal("bob"),
            Scope::run("run-1").with_tenant(""),
        ];
        let mut keys = Vec::new();
        for s in &scopes {
            let r = wa.call(pay("o-1", 4900).scope(s.clone())).await;
            assert!(
                r.is_completed() && !r.replayed(),
                "{name}: {s:?}: {:?}",
                r.as_result()
            );
            assert_eq!(r.output().unwrap()["tenant"], json!(s.tenant()), "{name}");
            keys.push(r.key().unwrap().clone());
        }
        assert_eq!(ledger.len(), scopes.len(), "{name}: each scope ran once");
        // Each scope's repeat, from the other worker, replays its own result.
        for (s, key) in scopes.iter().zip(&keys) {
            let r = wb
                .call(pay("o-1", 4900).scope(s.clone()).call_id("toolu_2"))
                .await;
            assert!(r.replayed(), "{name}: {s:?}");
            assert_eq!(r.key(), Some(key), "{name}");
            assert_eq!(r.output().unwrap()["tenant"], json!(s.tenant()), "{name}");
        }
        assert_eq!(ledger.len(), scopes.len(), "{name}: nothing ran again");
        let mut distinct = keys.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), scopes.len(), "{name}");
        // The builder form and the scope form name the same scope.
        let r = wb
            .call(
                pay("o-1", 4900)
                    .tenant("acme")
                    .principal("alice")
                    .call_id("toolu_3"),
            )
            .await;
        assert!(r.replayed(), "{name}");
        assert_eq!(r.key(), Some(&keys[4]), "{name}");
        let stored = b.get(&keys[2]).await.unwrap().expect("globex's record");
        let op = stored.operation.expect("the saved operation");
        assert_eq!(op.scope.tenant(), Some("globex"), "{name}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_intent_id_in_another_scope_is_another_operation() {
    each_backend("scopes_intent", async |name, a, b| {
        let ledger = Arc::new(Ledger::default());
        let (wa, wb) = (
            registry(a, &ledger, false, false),
            registry(b, &ledger, false, false),
        );
        let first = wa
            .call(pay("o-1", 4900).tenant("acme").intent("order-1"))
            .await;
        assert!(first.is_completed(), "{name}");
        // Another tenant, same intent id: other arguments are not "changed parameters"...
        let other = wb
            .call(pay("o-2", 100).tenant("globex").intent("order-1"))
            .await;
        assert!(
            other.is_completed() && !other.replayed(),
            "{name}: {:?}",
            other.as_result()
        );
        // ... and the same arguments are not a replay.
        let same = wb
            .call(pay("o-1", 4900).tenant("initech").intent("order-1"))
            .await;
        assert!(
            same.is_completed() && !same.replayed(),
            "{name}: {:?}",
            same.as_result()
        );
        // Another run id, same tenant and intent: another operation too.
        let run = wb
            .call(
                ToolCall::new("run-2", "pay", json!({"order": "o-1", "cents": 4900}))
                    .tenant("acme")
                    .intent("order-1"),
            )
            .await;
        assert!(run.is_completed() && !run.replayed(), "{name}");
        assert_eq!(ledger.len(), 4, "{name}");
        // Within acme's run-1 scope the intent still holds: changed arguments are refused.
        let changed = wb
            .call(pay("o-9", 1).tenant("acme").intent("order-1"))
            .await;
        assert!(
            matches!(changed.error(), Some(CallError::ChangedParams { .. })),
            "{name}: {:?}",
            changed.as_result()
        );
        let tenants: Vec<_> = ledger
            .scopes()
            .iter()
            .map(|s| s.tenant().map(str::to_owned))
            .collect();
        assert_eq!(
            tenants,
            [Some("acme"), Some("globex"), Some("initech"), Some("acme")]
                .map(|t| t.map(str::to_owned)),
            "{name}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_tenant_refuses_before_any_claim() {
    each_backend("scopes_require", async |name, a, b| {
        let ledger = Arc::new(Ledger::default());
        let w = registry(a, &ledger, true, false);
        for call in [
            pay("o-1", 4900),
            pay("o-1", 4900).principal("alice"),
            pay("o-1", 4900).tenant(""),
            pay("o-1", 4900).intent("order-1"),
            pay("o-1", 4900).scope(Scope::run("run-1").with_principal("alice")),
        ] {
            let r = w.call(call).await;
            assert!(
                matches!(r.error(), Some(CallError::InvalidCall { .. })),
                "{name}: {:?}",
                r.as_result()
            );
        }
        assert_eq!(ledger.len(), 0, "{name}: nothing ran");
        assert_eq!(record_count(&b).await, 0, "{name}: nothing was claimed");
        let ok = w.call(pay("o-1", 4900).tenant("acme")).await;
        assert!(ok.is_completed(), "{name}");
        assert_eq!(record_count(&b).await, 1, "{name}");
    })
    .await;
}

/// An unknown operation of tenant `acme`, principal `alice`, retried by the reconciler of
/// another worker: the retry runs in acme's scope (the handler sees the tenant and
/// principal it was first called with) and under the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcilers_retry_runs_in_the_operations_scope() {
    each_backend("scopes_retry", async |name, a, b| {
        let ledger = Arc::new(Ledger::default());
        let wa = registry(a, &ledger, true, true);
        let wb = registry(b, &ledger, true, true);
        let scope = Scope::run("run-1")
            .with_tenant("acme")
            .with_principal("alice");
        let lost = wa.call(pay("o-1", 4900).scope(scope.clone())).await;
        assert_eq!(lost.class(), Some(OutcomeClass::Unknown), "{name}");
        Reconciler::new(&wb).run_all().await.expect("a pass");
        let requests = ledger.0.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "{name}: the original and one retry");
        for (s, key, _) in &requests {
            assert_eq!(s, &scope, "{name}: the retry's scope");
            assert_eq!(Some(key.as_str()), lost.key().map(|k| k.as_str()), "{name}");
        }
        let after = wb.call(pay("o-1", 4900).scope(scope.clone())).await;
        assert!(
            after.replayed() && after.is_completed(),
            "{name}: {:?}",
            after.as_result()
        );
        assert_eq!(after.output().unwrap()["tenant"], json!("acme"), "{name}");
    })
    .await;
}
