//! `RegistryBuilder::require_tenant`: with one store shared by many tenants, a call whose
//! scope names no tenant is refused before anything runs or is claimed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_runtime::store::RecordState;
use idem_runtime::{
    call::{CallError, ToolCall},
    identity::Scope,
    registry::Registry,
    store::{IdemStore, MemoryStore},
    tool::{ReadCtx, ToolError, ToolSpec, WriteCtx},
};
use serde_json::json;

/// A write tool that counts the charges it makes.
struct Charge(Arc<AtomicUsize>);

impl idem_runtime::tool::WriteTool for Charge {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge")
    }
    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<&'static str, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok("ch_1")
    }
}

/// A read tool that counts its reads.
struct Lookup(Arc<AtomicUsize>);

impl idem_runtime::tool::ReadTool for Lookup {
    type Args = serde_json::Map<String, serde_json::Value>;
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("lookup")
    }
    async fn call(&self, _ctx: ReadCtx, _args: Self::Args) -> Result<&'static str, ToolError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok("found")
    }
}

fn registry(store: Arc<MemoryStore>, require: bool) -> (Registry, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let registry = Registry::builder()
        .shared_store(store)
        .tool(Charge(runs.clone()))
        .tool(Lookup(runs.clone()))
        .require_tenant(require)
        .build()
        .expect("build");
    (registry, runs)
}

async fn records(store: &MemoryStore) -> usize {
    let mut n = 0;
    for state in RecordState::ALL {
        n += store.list(state, usize::MAX).await.expect("list").len();
    }
    n
}

#[tokio::test]
async fn a_call_without_a_tenant_is_refused_and_nothing_runs() {
    let store = Arc::new(MemoryStore::new());
    let (registry, runs) = registry(store.clone(), true);
    let args = json!({"customer": "acme", "cents": 4900});
    for call in [
        ToolCall::new("run-1", "charge", args.clone()),
        ToolCall::new("run-1", "charge", args.clone()).tenant(""),
        ToolCall::new("run-1", "charge", args.clone()).principal("user-7"),
        ToolCall::new("run-1", "lookup", args.clone()),
    ] {
        let result = registry.call(call).await;
        match result.as_result() {
            Err(CallError::InvalidCall { message }) => {
                assert!(message.contains("tenant"), "{message}");
            }
            other => panic!("a call without a tenant must be refused, got {other:?}"),
        }
        assert!(result.key().is_none(), "no key was derived");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "no handler ran");
    assert_eq!(records(&store).await, 0, "nothing was claimed");

    // With a tenant, the same calls run; two tenants sharing a run id get two charges.
    for tenant in ["tenant-a", "tenant-b"] {
        let result = registry
            .call(ToolCall::new("run-1", "charge", args.clone()).tenant(tenant))
            .await;
        assert!(result.is_completed(), "{}", result.text());
    }
    let result = registry
        .call(
            ToolCall::new("run-1", "lookup", args.clone())
                .scope(Scope::run("run-1").with_tenant("tenant-a")),
        )
        .await;
    assert!(result.is_completed(), "{}", result.text());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(records(&store).await, 2, "one record per tenant");
}

/// The default stays as it was: a run id alone is a scope.
#[tokio::test]
async fn without_the_option_a_run_id_alone_is_enough() {
    let store = Arc::new(MemoryStore::new());
    let (registry, runs) = registry(store.clone(), false);
    let result = registry
        .call(ToolCall::new("run-1", "charge", json!({"cents": 1})))
        .await;
    assert!(result.is_completed(), "{}", result.text());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(records(&store).await, 1);
}
