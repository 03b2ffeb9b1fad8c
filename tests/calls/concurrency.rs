//! Concurrent duplicates on a multi-thread runtime, through the facade and the default
//! in-memory store: many operations, each asked for many times at once, some repeats with
//! changed parameters. The downstream's ledger must hold exactly one effect per operation,
//! with the parameters of the call that ran.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{toolbox, CallError, Registry, ToolCall, ToolError, WriteCtx};
use serde_json::json;

#[idem::args]
struct PayArgs {
    order: String,
    cents: u64,
}

/// A payee that ignores idempotency keys: every request it gets is an effect.
#[derive(Default)]
struct Payee {
    ledger: Mutex<Vec<(String, String, u64)>>,
}

#[toolbox]
impl Payee {
    /// Pay for an order.
    #[tool(write, key(order))]
    async fn pay(&self, ctx: WriteCtx, args: PayArgs) -> Result<String, ToolError> {
        // Long enough for every duplicate to arrive while it runs.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((ctx.key().as_str().to_owned(), args.order, args.cents));
        Ok(format!("payment {}", ledger.len()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_operations_each_asked_many_times_at_once_execute_once_each() {
    let payee = Arc::new(Payee::default());
    let registry = Registry::builder()
        .toolbox(payee.clone())
        .in_flight_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    const OPS: usize = 8;
    const COPIES: usize = 8;
    let mut set = tokio::task::JoinSet::new();
    for copy in 0..COPIES {
        for op in 0..OPS {
            let registry = registry.clone();
            // Every other copy asks for another amount under the same key: changed params.
            let cents = if copy % 2 == 0 { 100 } else { 999 };
            set.spawn(async move {
                let call = ToolCall::new(
                    "run-1",
                    "pay",
                    json!({"order": format!("o-{op}"), "cents": cents}),
                )
                .call_id(format!("toolu_{op}_{copy}"));
                (op, cents, registry.call(call).await)
            });
        }
    }
    let results = set.join_all().await;

    let ledger = payee.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), OPS, "one effect per operation: {ledger:?}");
    let ran: HashMap<String, u64> = ledger
        .iter()
        .map(|(_, order, cents)| (order.clone(), *cents))
        .collect();
    assert_eq!(ran.len(), OPS, "no operation ran twice");
    for (op, cents, r) in &results {
        let order = format!("o-{op}");
        let ran_with = ran[&order];
        match r.as_result() {
            Ok(_) => {
                assert!(r.is_completed(), "{r:?}");
                assert_eq!(
                    *cents, ran_with,
                    "only the parameters that ran are replayed"
                );
            }
            Err(CallError::ChangedParams { key }) => {
                assert_ne!(*cents, ran_with, "refused although its parameters ran");
                assert_eq!(
                    key.as_str(),
                    ledger.iter().find(|(_, o, _)| *o == order).unwrap().0
                );
            }
            Err(e) => panic!("{order} {cents}: {e:?}"),
        }
    }
    // Each operation's key is the one passed downstream, and keys differ by operation.
    let mut keys: Vec<&str> = ledger.iter().map(|(k, _, _)| k.as_str()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), OPS);
}
