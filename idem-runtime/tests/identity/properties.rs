//! Identity properties: canonical JSON ignores field order at every depth, keys separate
//! their parts, and distinct arguments never share a key.

use std::collections::HashSet;

use idem_runtime::identity::canonical::to_canonical_vec;
use idem_runtime::identity::{identify, identify_value, IdemKey, KeyMaterial, Scope};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Map, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-zA-Z0-9 _\\-\u{e9}\u{1F600}\"\\\\]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z\u{e9}]{0,5}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Rebuilds every object at every depth with its entries in a shuffled order.
fn permute(v: &Value, seed: &mut u64) -> Value {
    match v {
        Value::Array(a) => Value::Array(a.iter().map(|x| permute(x, seed)).collect()),
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m
                .iter()
                .map(|(k, v)| (k.clone(), permute(v, seed)))
                .collect();
            // Fisher–Yates with a xorshift: deterministic per seed, different per depth.
            for i in (1..entries.len()).rev() {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                let j = (*seed % (i as u64 + 1)) as usize;
                entries.swap(i, j);
            }
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k, v);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

proptest! {
    #[test]
    fn permuted_keys_give_identical_bytes_and_key(v in arb_json(), seed in 1u64..u64::MAX) {
        let mut s = seed;
        let p = permute(&v, &mut s);
        prop_assert_eq!(to_canonical_vec(&v), to_canonical_vec(&p));
        let a = identify_value(&v, &[] as &[&str]).unwrap();
        let b = identify_value(&p, &[] as &[&str]).unwrap();
        prop_assert_eq!(a.fingerprint, b.fingerprint);
        let scope = Scope::run("run");
        prop_assert_eq!(
            IdemKey::derive(&scope, "t", KeyMaterial::Args(&a.canonical)),
            IdemKey::derive(&scope, "t", KeyMaterial::ArgsFingerprint(&b.fingerprint))
        );
    }

    #[test]
    fn canonical_bytes_parse_back_to_the_same_value(v in arb_json()) {
        let bytes = to_canonical_vec(&v);
        let back: Value = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(back, v);
    }

    #[test]
    fn moving_a_boundary_between_parts_changes_the_key(a in "[a-z]{1,6}", b in "[a-z]{1,6}", c in "[a-z]{1,6}") {
        // ("a"+"b", "c") vs ("a", "b"+"c") in every pair of adjacent parts.
        let ab = format!("{a}{b}");
        let bc = format!("{b}{c}");
        let m = |s: &str| s.as_bytes().to_vec();
        let k = |run: &str, tool: &str, mat: &[u8]| IdemKey::derive(&Scope::run(run), tool, KeyMaterial::Fields(mat));
        prop_assert_ne!(k(&ab, &c, &m("x")), k(&a, &bc, &m("x")));
        prop_assert_ne!(k("r", &ab, &m(&c)), k("r", &a, &m(&bc)));
        prop_assert_ne!(k(&ab, "t", &m(&c)), k(&a, "t", &m(&bc)));
        let t = |tenant: &str, run: &str| IdemKey::derive(&Scope::run(run).with_tenant(tenant), "t", KeyMaterial::Intent("{}"));
        prop_assert_ne!(t(&ab, &c), t(&a, &bc));
    }
}

#[test]
fn ten_thousand_distinct_args_give_ten_thousand_keys() {
    let scope = Scope::run("run-1");
    let mut keys = HashSet::new();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (any::<u64>(), "[a-z]{0,12}", any::<i32>());
    let mut seen_args = HashSet::new();
    while seen_args.len() < 10_000 {
        let (n, s, i) = strategy.new_tree(&mut runner).unwrap().current();
        let args = json!({"amount": n, "customer": s, "delta": i});
        let canonical = to_canonical_vec(&args);
        if seen_args.insert(canonical.clone()) {
            keys.insert(IdemKey::derive(
                &scope,
                "charge",
                KeyMaterial::Args(&canonical),
            ));
        }
    }
    assert_eq!(keys.len(), 10_000);
}

#[test]
fn typed_reserialization_erases_spelling() {
    #[derive(serde::Deserialize, serde::Serialize)]
    struct Charge {
        customer: String,
        amount: f64,
    }
    let spellings = [
        r#"{"customer":"acme","amount":49}"#,
        r#"{ "amount" : 49.0, "customer" : "acme" }"#,
        r#"{"amount":4.9e1,"customer":"acme","ignored":"by the type"}"#,
    ];
    let ids: Vec<_> = spellings
        .iter()
        .map(|s| identify(&serde_json::from_str::<Charge>(s).unwrap(), &[] as &[&str]).unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0].canonical == w[1].canonical));
    assert!(ids.windows(2).all(|w| w[0].fingerprint == w[1].fingerprint));
}

#[test]
fn key_fields_select_material_and_absent_means_null() {
    let with_memo = json!({"customer": "acme", "amount": 4900, "memo": "hi"});
    let other_memo = json!({"customer": "acme", "amount": 4900, "memo": "bye"});
    let a = identify_value(&with_memo, &["customer", "amount"]).unwrap();
    let b = identify_value(&other_memo, &["customer", "amount"]).unwrap();
    assert_eq!(a.key_fields, b.key_fields, "memo is not key material");
    assert_ne!(
        a.fingerprint, b.fingerprint,
        "but it is part of the fingerprint"
    );

    let absent = identify_value(&json!({"customer": "acme"}), &["customer", "note"]).unwrap();
    let null = identify_value(
        &json!({"customer": "acme", "note": null}),
        &["customer", "note"],
    )
    .unwrap();
    assert_eq!(absent.key_fields, null.key_fields);
    assert!(identify_value(&json!([1, 2]), &["customer"]).is_err());
}
