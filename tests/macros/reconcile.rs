//! `#[tool(write, reconcile = …, in_flight = …)]`: the macro wires a read-back into the tool,
//! and the reconciler uses it to settle an unknown call — asserted on the downstream ledger.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::reconcile::Action;
use idem::{
    store::RecordState, tool, toolbox, IdemStore, MemoryStore, OutcomeClass, ReadBack, ReadBackCtx,
    Reconciler, Registry, ToolCall, ToolError, WriteCtx,
};
use serde_json::json;

/// Charges by idempotency key; the first response is always lost.
static LEDGER: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SENDS: AtomicU32 = AtomicU32::new(0);

#[idem::args]
struct ChargeArgs {
    cents: u64,
}

/// Charge a card.
#[tool(write, reconcile = find_charge, in_flight = "2m")]
async fn charge(ctx: WriteCtx, _args: ChargeArgs) -> Result<String, ToolError> {
    SENDS.fetch_add(1, Ordering::SeqCst);
    LEDGER.lock().unwrap().push(ctx.key().to_string());
    Err(ToolError::unknown("response lost"))
}

/// The read-back: look the charge up by the key the handler sent.
async fn find_charge(ctx: ReadBackCtx, args: ChargeArgs) -> Result<ReadBack, ToolError> {
    let found = LEDGER
        .lock()
        .unwrap()
        .iter()
        .any(|k| k == ctx.key().as_str());
    Ok(if found {
        ReadBack::Completed {
            downstream_ref: Some("ch_1".into()),
            output: json!({"charged": args.cents}),
        }
    } else {
        ReadBack::NotFound
    })
}

#[tokio::test]
async fn a_free_fn_tool_declares_its_read_back() {
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store.clone())
        .tool(charge)
        .build()
        .unwrap();
    assert_eq!(
        registry
            .get("charge")
            .unwrap()
            .spec()
            .in_flight_bound_duration(),
        Some(Duration::from_secs(120))
    );
    let call = || ToolCall::new("run-1", "charge", json!({"cents": 4900}));
    let first = registry.call(call()).await;
    assert_eq!(first.class(), Some(OutcomeClass::Unknown));
    let decisions = Reconciler::new(&registry).run_once().await.unwrap();
    assert_eq!(
        decisions.iter().map(|d| d.action).collect::<Vec<_>>(),
        [Action::Settled]
    );
    let rec = store.get(first.key().unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RecordState::Completed);
    let again = registry.call(call()).await;
    assert_eq!(again.output(), Some(&json!({"charged": 4900})));
    assert_eq!(
        (SENDS.load(Ordering::SeqCst), LEDGER.lock().unwrap().len()),
        (1, 1)
    );
}

/// Refunds with state: the read-back is a method of the same toolbox.
#[derive(Default)]
struct Refunds {
    issued: Mutex<Vec<String>>,
}

#[toolbox]
impl Refunds {
    /// Refund a charge.
    #[tool(write, reconcile = find_refund)]
    async fn refund(&self, ctx: WriteCtx, _args: ChargeArgs) -> Result<String, ToolError> {
        self.issued.lock().unwrap().push(ctx.key().to_string());
        Err(ToolError::pending("re_1"))
    }

    /// Not a tool: the read-back the attribute names.
    async fn find_refund(
        &self,
        ctx: ReadBackCtx,
        _args: ChargeArgs,
    ) -> Result<ReadBack, ToolError> {
        let found = self
            .issued
            .lock()
            .unwrap()
            .iter()
            .any(|k| k == ctx.key().as_str());
        Ok(match (found, ctx.downstream_ref()) {
            (true, Some(r)) => ReadBack::Completed {
                downstream_ref: Some(r.to_owned()),
                output: json!({"refund": r, "status": "succeeded"}),
            },
            _ => ReadBack::NotFound,
        })
    }
}

#[tokio::test]
async fn a_toolbox_method_names_a_read_back_method() {
    let refunds = Arc::new(Refunds::default());
    let registry = Registry::builder()
        .toolbox(refunds.clone())
        .build()
        .unwrap();
    let call = || ToolCall::new("run-1", "refund", json!({"cents": 100}));
    assert_eq!(
        registry.call(call()).await.class(),
        Some(OutcomeClass::Pending)
    );
    let decisions = Reconciler::new(&registry).run_once().await.unwrap();
    assert_eq!(decisions[0].action, Action::Settled);
    let done = registry.call(call()).await;
    assert_eq!(
        done.output(),
        Some(&json!({"refund": "re_1", "status": "succeeded"}))
    );
    assert_eq!(refunds.issued.lock().unwrap().len(), 1);
}
