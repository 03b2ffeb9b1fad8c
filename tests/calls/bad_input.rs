//! Ambiguous arguments: a field given twice in the model's JSON text. Parsers disagree on
//! which one counts (the first, the last, or an error), so a write must not guess which
//! amount to charge: the call is refused as invalid arguments, nothing is claimed or run,
//! and the model is told which field it repeated.

use std::sync::{Arc, Mutex};

use idem::{toolbox, CallError, MemoryStore, Registry, ToolCall, ToolError, WriteCtx};
use serde_json::json;

#[idem::args]
struct Address {
    city: String,
    zip: String,
}

#[idem::args]
struct ShipArgs {
    order: String,
    cents: u64,
    to: Address,
}

#[derive(Default)]
struct Warehouse {
    shipped: Mutex<Vec<(String, u64, String)>>,
}

#[toolbox]
impl Warehouse {
    /// Ship an order.
    #[tool(write)]
    async fn ship(&self, _ctx: WriteCtx, args: ShipArgs) -> Result<String, ToolError> {
        let mut shipped = self.shipped.lock().unwrap();
        shipped.push((args.order, args.cents, args.to.city));
        Ok(format!("shipment {}", shipped.len()))
    }
}

#[tokio::test]
async fn a_field_given_twice_is_refused_and_nothing_runs() {
    let warehouse = Arc::new(Warehouse::default());
    let store = Arc::new(MemoryStore::new());
    let registry = Registry::builder()
        .shared_store(store.clone())
        .toolbox(warehouse.clone())
        .build()
        .unwrap();
    let cases = [
        (
            r#"{"order": "o-1", "cents": 100, "cents": 9900, "to": {"city": "Oslo", "zip": "0150"}}"#,
            "cents",
        ),
        (
            r#"{"order": "o-1", "cents": 100, "to": {"city": "Oslo", "city": "Rome", "zip": "0150"}}"#,
            "city",
        ),
        (
            r#"{"order": "o-1", "to": {"city": "Oslo", "zip": "0150"}, "cents": 100, "order": "o-2"}"#,
            "order",
        ),
    ];
    for (text, field) in cases {
        let r = registry
            .call(ToolCall::from_json("run-1", "ship", text))
            .await;
        match r.error() {
            Some(CallError::InvalidArgs { message, .. }) => {
                assert!(
                    message.contains(&format!("duplicate field `{field}`")),
                    "{message}"
                )
            }
            other => panic!(
                "{text}: expected invalid arguments, got {other:?} / {:?}",
                r.outcome()
            ),
        }
        assert!(r.is_error());
        assert!(
            r.text().contains(field),
            "the model is told which: {}",
            r.text()
        );
        assert!(r.key().is_none(), "refused before a key was derived");
    }
    assert!(
        warehouse.shipped.lock().unwrap().is_empty(),
        "nothing shipped"
    );
    assert!(store.is_empty(), "nothing claimed");

    // The same call without the repeat runs once, as text or as a value, and replays.
    let text = r#"{"order": "o-1", "cents": 100, "to": {"city": "Oslo", "zip": "0150"}}"#;
    let first = registry
        .call(ToolCall::from_json("run-1", "ship", text))
        .await;
    assert!(first.is_completed(), "{}", first.text());
    let value = json!({"to": {"zip": "0150", "city": "Oslo"}, "cents": 100, "order": "o-1"});
    let again = registry.call(ToolCall::new("run-1", "ship", value)).await;
    assert!(again.replayed(), "{}", again.text());
    assert_eq!(
        *warehouse.shipped.lock().unwrap(),
        vec![("o-1".to_owned(), 100, "Oslo".to_owned())]
    );
}
