//! The optimized canonical writer (sorted-map fast path, numbers without a heap string,
//! unescaped strings copied as is) must give exactly the bytes of the straightforward one
//! it replaced: every stored key and fingerprint depends on them.

use idem_runtime::identity::canonical::{to_canonical_vec, write_canonical};
use idem_runtime::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The reference: collect and sort every object's entries, `to_string` every number, escape
/// every string through serde_json.
fn reference(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => serde_json::to_writer(&mut *out, s).unwrap(),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                reference(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k).unwrap();
                out.push(b':');
                reference(v, out);
            }
            out.push(b'}');
        }
    }
}

fn arb_string() -> impl Strategy<Value = String> {
    // Control characters, quotes, backslashes, DEL, non-ASCII: every escaping branch.
    "[a-zA-Z0-9 _\\-\u{0}-\u{1f}\u{7f}\u{e9}\u{2028}\u{1F600}\"\\\\/]{0,12}"
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_string(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn optimized_writer_matches_reference(v in arb_json()) {
        let mut expected = Vec::new();
        reference(&v, &mut expected);
        prop_assert_eq!(&to_canonical_vec(&v), &expected);
        // Appending after existing bytes changes nothing either.
        let mut out = b"prefix".to_vec();
        write_canonical(&v, &mut out);
        prop_assert_eq!(&out[6..], &expected[..]);
        let back: Value = serde_json::from_slice(&expected).unwrap();
        prop_assert_eq!(back, v);
    }
}

#[test]
fn key_format_is_pinned() {
    // A change here re-keys every stored operation: a repeat after an upgrade would run again.
    let canonical = br#"{"amount_cents":4900,"customer":"cus_1"}"#;
    let fingerprint = Fingerprint::of_canonical(canonical);
    assert_eq!(fingerprint.to_hex(), PINNED_FINGERPRINT);
    let scope = Scope::run("run-1").with_tenant("acme");
    let key = IdemKey::derive(&scope, "charge", KeyMaterial::Args(canonical));
    assert_eq!(key.as_str(), PINNED_KEY);
    let by_fingerprint =
        IdemKey::derive(&scope, "charge", KeyMaterial::ArgsFingerprint(&fingerprint));
    assert_eq!(by_fingerprint, key);
}

/// Computed independently (Python `hashlib`) from the documented derivation:
/// `sha256(canonical)`, and `sha256("idem-key/v2" ‖ part(tenant) ‖ part([1]) ‖ part(principal)
/// ‖ part([0]) ‖ part(run) ‖ part(tool) ‖ part("args") ‖ part(fingerprint))`, where
/// `part(b) = leb128(len(b)) ‖ b`.
const PINNED_FINGERPRINT: &str = "3bff0617259cbe1dddb9d1f4d09fe155a372f28ddc775966102bcf6f629b1eb4";
const PINNED_KEY: &str = "idem:ef2290b7db7b11a8a8d15d0f3b879344284fdf3334d9a2eb9df57e3099f2b91c";
