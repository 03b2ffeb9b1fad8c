//! Identity through the public API: what goes into a key and what does not, checked on a
//! downstream's ledger. Each case calls a registry twice and asserts how many effects the
//! downstream holds: one when the two calls are one operation (same key, replayed), two when
//! they are two.

use std::sync::{Arc, Mutex};

use idem::{toolbox, CallError, IdemKey, MemoryStore, Registry, ToolCall, ToolError, WriteCtx};
use serde_json::Value;

#[idem::args]
struct Address {
    city: String,
    zip: String,
}

#[idem::args]
struct ShipArgs {
    order: String,
    to: Address,
    note: Option<String>,
    weight: f64,
    count: u64,
}

#[idem::args]
struct NoteArgs {
    /// Any JSON: the canonical form of the value itself is the identity.
    body: Value,
}

/// A warehouse that records every effect with the key it was given.
#[derive(Default)]
struct Warehouse {
    ledger: Mutex<Vec<(String, String)>>,
}

impl Warehouse {
    fn push(&self, key: &str, what: String) -> usize {
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((key.to_owned(), what));
        ledger.len()
    }

    fn effects(&self) -> usize {
        self.ledger.lock().unwrap().len()
    }
}

#[toolbox]
impl Warehouse {
    /// Ship an order: the whole arguments are the key material.
    #[tool(write)]
    async fn ship(&self, ctx: WriteCtx, args: ShipArgs) -> Result<usize, ToolError> {
        Ok(self.push(ctx.key().as_str(), args.order))
    }

    /// Ship an order, keyed by the order and the destination only.
    #[tool(write, key(order, to, note))]
    async fn ship_keyed(&self, ctx: WriteCtx, args: ShipArgs) -> Result<usize, ToolError> {
        Ok(self.push(ctx.key().as_str(), args.order))
    }

    /// Write a note holding any JSON.
    #[tool(write)]
    async fn note(&self, ctx: WriteCtx, args: NoteArgs) -> Result<usize, ToolError> {
        Ok(self.push(ctx.key().as_str(), args.body.to_string()))
    }
}

fn registry() -> (Arc<Warehouse>, Registry) {
    let warehouse = Arc::new(Warehouse::default());
    let registry = Registry::builder()
        .store(MemoryStore::new())
        .toolbox(warehouse.clone())
        .build()
        .unwrap();
    (warehouse, registry)
}

fn ship(text: &str) -> ToolCall {
    ToolCall::from_json("run-1", "ship", text)
}

const BASE: &str =
    r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"note":null,"weight":1.5,"count":2}"#;

/// Two calls that must be one operation: one effect, the second replayed, one key.
async fn assert_one_operation(tool: &str, first: &str, second: &str) {
    let (w, registry) = registry();
    let a = registry
        .call(ToolCall::from_json("run-1", tool, first))
        .await;
    let b = registry
        .call(ToolCall::from_json("run-1", tool, second).call_id("toolu_2"))
        .await;
    assert!(a.is_completed(), "{first}: {:?}", a.as_result());
    assert!(
        b.is_completed() && b.replayed(),
        "{second} after {first}: {:?}",
        b.as_result()
    );
    assert_eq!(a.key(), b.key());
    assert_eq!(w.effects(), 1, "{first} / {second}");
}

/// Two calls that must be two operations: two effects under two keys.
async fn assert_two_operations(tool: &str, first: &str, second: &str) {
    let (w, registry) = registry();
    let a = registry
        .call(ToolCall::from_json("run-1", tool, first))
        .await;
    let b = registry
        .call(ToolCall::from_json("run-1", tool, second).call_id("toolu_2"))
        .await;
    assert!(a.is_completed() && !a.replayed(), "{:?}", a.as_result());
    assert!(b.is_completed() && !b.replayed(), "{:?}", b.as_result());
    assert_ne!(a.key(), b.key());
    assert_eq!(w.effects(), 2, "{first} / {second}");
}

#[tokio::test]
async fn every_key_is_idem_and_64_lowercase_hex_digits_whatever_the_scope() {
    let (w, registry) = registry();
    let long = "r".repeat(1024);
    let calls = [
        ship(BASE),
        ToolCall::from_json(long.clone(), "ship", BASE)
            .tenant("t".repeat(1024))
            .principal("p".repeat(1024)),
        ship(BASE).intent("i".repeat(1024)),
        ToolCall::from_json("运行-😀", "ship", BASE).tenant("租户"),
    ];
    for call in calls {
        let r = registry.call(call).await;
        let key = r.key().expect("a write has a key").as_str().to_owned();
        assert!(key.len() <= 255 && key.len() == 69, "{key}");
        let hex = key.strip_prefix("idem:").expect("prefixed");
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{key}"
        );
        assert_eq!(IdemKey::parse(&key).unwrap().as_str(), key);
        // The key the handler passed downstream is the key the result names.
        assert_eq!(w.ledger.lock().unwrap().last().unwrap().0, key);
    }
    assert_eq!(w.effects(), 4);
}

#[tokio::test]
async fn spelling_of_the_arguments_never_changes_the_operation() {
    let same = [
        // Member order, at the top and nested.
        r#"{"count":2,"weight":1.5,"note":null,"to":{"zip":"0150","city":"Oslo"},"order":"o-1"}"#,
        // Whitespace.
        "{ \"order\" : \"o-1\",\n \"to\" : { \"city\" : \"Oslo\", \"zip\" : \"0150\" },\n \"note\" : null, \"weight\" : 1.5, \"count\" : 2 }",
        // Escapes for plain characters.
        r#"{"order":"\u006f-1","to":{"city":"\u004Fslo","zip":"0150"},"note":null,"weight":1.5,"count":2}"#,
        // An absent Option is the same as an explicit null.
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"weight":1.5,"count":2}"#,
        // Other spellings of the same float.
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"note":null,"weight":15e-1,"count":2}"#,
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"note":null,"weight":1.50,"count":2}"#,
    ];
    for text in same {
        assert_one_operation("ship", BASE, text).await;
    }
    // An f64 field given as an integer is the same float.
    assert_one_operation(
        "ship",
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"weight":2,"count":2}"#,
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"weight":2.0,"count":2}"#,
    )
    .await;
    // An integer field given as a whole float (JSON Schema's "integer" allows it): the
    // same integer.
    for count in ["2.0", "2e0", "20e-1"] {
        assert_one_operation(
            "ship",
            BASE,
            &BASE.replace(r#""count":2"#, &format!(r#""count":{count}"#)),
        )
        .await;
    }
    // Unicode escapes, including a surrogate pair, are the characters they stand for.
    assert_one_operation(
        "note",
        r#"{"body":"caf\u00e9 \ud83d\ude00"}"#,
        r#"{"body":"café 😀"}"#,
    )
    .await;
    assert_one_operation(
        "note",
        r#"{"body":{"b":[1,{"y":2,"x":1}],"a":null}}"#,
        r#"{"body":{"a":null,"b":[1,{"x":1,"y":2}]}}"#,
    )
    .await;
}

#[tokio::test]
async fn different_values_are_different_operations() {
    let different = [
        // Another nested value.
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0151"},"note":null,"weight":1.5,"count":2}"#,
        // A note instead of none.
        r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"note":"","weight":1.5,"count":2}"#,
        // Case matters.
        r#"{"order":"O-1","to":{"city":"Oslo","zip":"0150"},"note":null,"weight":1.5,"count":2}"#,
    ];
    for text in different {
        assert_two_operations("ship", BASE, text).await;
    }
    // Arrays keep their order; strings keep their boundaries.
    assert_two_operations("note", r#"{"body":[1,2]}"#, r#"{"body":[2,1]}"#).await;
    assert_two_operations("note", r#"{"body":["ab","c"]}"#, r#"{"body":["a","bc"]}"#).await;
    assert_two_operations("note", r#"{"body":{"ab":"c"}}"#, r#"{"body":{"a":"bc"}}"#).await;
    // Big integers are kept digit for digit, not rounded through a float.
    assert_two_operations(
        "note",
        r#"{"body":9007199254740993}"#,
        r#"{"body":9007199254740992}"#,
    )
    .await;
    assert_two_operations(
        "note",
        r#"{"body":18446744073709551615}"#,
        r#"{"body":18446744073709551614}"#,
    )
    .await;
}

#[tokio::test]
async fn key_fields_ignore_other_fields_and_refuse_them_changed() {
    let (w, registry) = registry();
    let call = |text: &str| ToolCall::from_json("run-1", "ship_keyed", text);
    let first = registry.call(call(BASE)).await;
    assert!(first.is_completed());

    // The key fields in another spelling (order, nested order, absent null): one operation.
    let same_key = registry
        .call(call(
            r#"{"count":2,"weight":1.5,"to":{"zip":"0150","city":"Oslo"},"order":"o-1"}"#,
        ))
        .await;
    assert!(same_key.replayed(), "{:?}", same_key.as_result());
    assert_eq!(same_key.key(), first.key());

    // Same key fields, another weight: the same operation with changed parameters.
    let changed = registry
        .call(call(
            r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"weight":9.5,"count":2}"#,
        ))
        .await;
    assert!(
        matches!(changed.error(), Some(CallError::ChangedParams { key }) if Some(key) == first.key()),
        "{:?}",
        changed.as_result()
    );

    // Another value in a nested key field: another operation.
    let other = registry
        .call(call(
            r#"{"order":"o-1","to":{"city":"Oslo","zip":"9999"},"weight":1.5,"count":2}"#,
        ))
        .await;
    assert!(other.is_completed() && !other.replayed());
    assert_ne!(other.key(), first.key());
    // A null key field and a present one differ.
    let noted = registry
        .call(call(
            r#"{"order":"o-1","to":{"city":"Oslo","zip":"0150"},"note":"x","weight":1.5,"count":2}"#,
        ))
        .await;
    assert!(noted.is_completed() && !noted.replayed());
    assert_eq!(w.effects(), 3);
}

#[tokio::test]
async fn an_intent_id_outranks_key_fields_and_arguments() {
    let (w, registry) = registry();
    let keyed = |text: &str| ToolCall::from_json("run-1", "ship_keyed", text);
    let other_order =
        r#"{"order":"o-2","to":{"city":"Rome","zip":"00100"},"note":null,"weight":1.5,"count":2}"#;

    // The same intent with other key fields: the same key (the intent decides), and so a
    // change of parameters, refused with nothing run.
    let a = registry.call(keyed(BASE).intent("order-1")).await;
    let b = registry.call(keyed(other_order).intent("order-1")).await;
    assert!(a.is_completed());
    assert!(
        matches!(b.error(), Some(CallError::ChangedParams { .. })),
        "{:?}",
        b.as_result()
    );
    // Equal arguments, two intents: two operations.
    let c = registry.call(keyed(BASE).intent("order-2")).await;
    assert!(c.is_completed() && !c.replayed());
    assert_ne!(c.key(), a.key());
    // No intent: the key fields decide, and that is a third key.
    let d = registry.call(keyed(BASE)).await;
    assert!(d.is_completed() && !d.replayed());
    assert_ne!(d.key(), a.key());
    assert_ne!(d.key(), c.key());
    // The tool is part of the identity: the same intent on another tool is another key.
    let e = registry.call(ship(BASE).intent("order-1")).await;
    assert!(e.is_completed() && !e.replayed());
    assert_ne!(e.key(), a.key());
    assert_eq!(w.effects(), 4);
}

#[tokio::test]
async fn the_tool_use_id_is_never_part_of_the_key() {
    let (w, registry) = registry();
    let a = registry.call(ship(BASE).call_id("toolu_1")).await;
    let b = registry.call(ship(BASE).call_id("call_XYZ")).await;
    let c = registry.call(ship(BASE)).await;
    assert_eq!(a.key(), b.key());
    assert_eq!(a.key(), c.key());
    assert!(b.replayed() && c.replayed());
    assert_eq!(w.effects(), 1);
}

#[tokio::test]
async fn numbers_a_typed_field_cannot_hold_are_refused_and_nothing_runs() {
    let (w, registry) = registry();
    for count in [
        "1.5",
        "-1",
        "-1.0",
        "18446744073709551616",
        "1e400",
        "\"2\"",
        "2.5e0",
    ] {
        let text = format!(
            r#"{{"order":"o-1","to":{{"city":"Oslo","zip":"0150"}},"weight":1.5,"count":{count}}}"#
        );
        let r = registry.call(ship(&text)).await;
        assert!(
            matches!(
                r.error(),
                Some(CallError::InvalidArgs { .. } | CallError::MalformedJson { .. })
            ),
            "count {count}: {:?}",
            r.as_result()
        );
    }
    assert_eq!(w.effects(), 0);
}
