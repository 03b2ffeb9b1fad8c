//! `identify` writes canonical JSON straight from the typed value. Its bytes (and so every key
//! and fingerprint) must equal the reference path, `identify_value(&to_value(x))`, for every
//! shape serde can produce: struct fields out of order, unsorted and non-string map keys,
//! every enum representation, floats, 128-bit integers, bytes, flattening with duplicate
//! keys, escaped keys, custom errors.

use std::collections::{BTreeMap, HashMap};

use idem_runtime::identity::{identify, identify_value, ArgsIdentity, IdentityError};
use proptest::prelude::*;
use serde::{Serialize, Serializer};
use serde_json::{json, Value};

/// The reference: build the `Value` tree, then canonicalize it.
fn reference<T: Serialize>(x: &T, fields: &[&str]) -> Result<ArgsIdentity, IdentityError> {
    let value = serde_json::to_value(x).map_err(|e| IdentityError::Serialize(e.to_string()))?;
    identify_value(&value, fields)
}

fn assert_same<T: Serialize>(x: &T, fields: &[&str]) {
    let fast = identify(x, fields);
    let slow = reference(x, fields);
    match (fast, slow) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                String::from_utf8_lossy(&a.canonical),
                String::from_utf8_lossy(&b.canonical)
            );
            assert_eq!(a.fingerprint, b.fingerprint);
            assert_eq!(
                a.key_fields.as_deref().map(String::from_utf8_lossy),
                b.key_fields.as_deref().map(String::from_utf8_lossy)
            );
        }
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(&a),
            std::mem::discriminant(&b),
            "{a} vs {b}"
        ),
        (a, b) => panic!("one path failed: fast {a:?}, reference {b:?}"),
    }
}

#[derive(Clone, Debug, Serialize)]
enum Kind {
    Unit,
    Newtype(u32),
    Tuple(i64, String),
    Struct { z: bool, a: Option<String> },
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type")]
enum Tagged {
    Card { last4: String, zed: u8 },
    Wire { iban: String },
}

#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
enum Untagged {
    Num(f64),
    Text(String),
}

struct Bytes(Vec<u8>);
impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}
impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bytes({:?})", self.0)
    }
}
impl Clone for Bytes {
    fn clone(&self) -> Self {
        Bytes(self.0.clone())
    }
}

#[derive(Clone, Debug, Serialize)]
struct Unit;

#[derive(Clone, Debug, Serialize)]
struct Wrapper(String);

#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
struct Id(String);

/// Fields deliberately out of alphabetical order, with renames that need escaping.
#[derive(Clone, Debug, Serialize)]
struct Args {
    zeta: String,
    amount: u64,
    #[serde(rename = "quote\"d")]
    quoted: i32,
    #[serde(rename = "ctrl\u{1}")]
    ctrl: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    memo: Option<String>,
    ratio: f64,
    small: f32,
    big: u128,
    signed: i128,
    kind: Kind,
    tagged: Tagged,
    untagged: Untagged,
    tags: Vec<String>,
    by_name: HashMap<String, i16>,
    by_id: HashMap<u32, String>,
    by_char: BTreeMap<char, bool>,
    bytes: Bytes,
    pair: (u8, char),
    unit: Unit,
    wrapper: Wrapper,
    raw: Value,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

fn arb_string() -> impl Strategy<Value = String> {
    "[a-z\"\\\\\u{0}-\u{1f}\u{e9}\u{1F600}]{0,6}"
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((arb_string(), inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Unit),
        any::<u32>().prop_map(Kind::Newtype),
        (any::<i64>(), arb_string()).prop_map(|(a, b)| Kind::Tuple(a, b)),
        (any::<bool>(), proptest::option::of(arb_string()))
            .prop_map(|(z, a)| Kind::Struct { z, a }),
    ]
}

fn arb_args() -> impl Strategy<Value = Args> {
    let scalars = (
        arb_string(),
        any::<u64>(),
        any::<i32>(),
        any::<bool>(),
        proptest::option::of(arb_string()),
        // NaN and infinities included: `to_value` turns them into null.
        any::<f64>(),
        any::<f32>(),
        // Mostly within u64 (accepted), sometimes beyond (refused by both paths).
        prop_oneof![any::<u64>().prop_map(u128::from), any::<u128>()],
        prop_oneof![any::<i64>().prop_map(i128::from), any::<i128>()],
    );
    let shapes = (
        arb_kind(),
        prop_oneof![
            (arb_string(), any::<u8>()).prop_map(|(last4, zed)| Tagged::Card { last4, zed }),
            arb_string().prop_map(|iban| Tagged::Wire { iban }),
        ],
        prop_oneof![
            any::<f64>().prop_map(Untagged::Num),
            arb_string().prop_map(Untagged::Text),
        ],
        prop::collection::vec(arb_string(), 0..4),
        prop::collection::hash_map(arb_string(), any::<i16>(), 0..5),
        prop::collection::hash_map(any::<u32>(), arb_string(), 0..5),
        prop::collection::btree_map(any::<char>(), any::<bool>(), 0..4),
    );
    let rest = (
        prop::collection::vec(any::<u8>(), 0..5),
        (any::<u8>(), any::<char>()),
        arb_string(),
        arb_value(),
        // Keys that may collide with the struct's own fields (`zeta`, `amount`, `memo`).
        prop::collection::btree_map(
            prop_oneof![
                Just("zeta".to_owned()),
                Just("memo".to_owned()),
                "[a-z]{1,3}"
            ],
            arb_value(),
            0..3,
        ),
    );
    (scalars, shapes, rest).prop_map(
        |(
            (zeta, amount, quoted, ctrl, memo, ratio, small, big, signed),
            (kind, tagged, untagged, tags, by_name, by_id, by_char),
            (bytes, pair, wrapper, raw, extra),
        )| Args {
            zeta,
            amount,
            quoted,
            ctrl,
            memo,
            ratio,
            small,
            big,
            signed,
            kind,
            tagged,
            untagged,
            tags,
            by_name,
            by_id,
            by_char,
            bytes: Bytes(bytes),
            pair,
            unit: Unit,
            wrapper: Wrapper(wrapper),
            raw,
            extra,
        },
    )
}

const FIELD_NAMES: [&str; 8] = [
    "zeta",
    "amount",
    "memo",
    "quote\"d",
    "ctrl\u{1}",
    "kind",
    "absent",
    "a",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn typed_args_match_the_value_path(
        args in arb_args(),
        picks in prop::collection::vec(0..FIELD_NAMES.len(), 0..4),
    ) {
        let fields: Vec<&str> = picks.iter().map(|&i| FIELD_NAMES[i]).collect();
        assert_same(&args, &fields);
    }

    #[test]
    fn any_json_value_matches_the_value_path(
        v in arb_value(),
        picks in prop::collection::vec(0..FIELD_NAMES.len(), 0..3),
    ) {
        let fields: Vec<&str> = picks.iter().map(|&i| FIELD_NAMES[i]).collect();
        assert_same(&v, &fields);
    }

    #[test]
    fn every_enum_shape_at_top_level_matches(kind in arb_kind()) {
        assert_same(&kind, &[]);
        assert_same(&kind, &["Struct", "Newtype"]);
    }
}

#[test]
fn non_object_arguments_refuse_key_fields_on_both_paths() {
    assert_same(&vec![1, 2, 3], &["a"]);
    assert_same(&"text", &["a"]);
    assert!(matches!(
        identify(&(1, 2), &["a"]),
        Err(IdentityError::NotAnObject { .. })
    ));
}

#[test]
fn a_failing_serialize_is_an_error_on_both_paths() {
    struct Broken;
    impl Serialize for Broken {
        fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no JSON form"))
        }
    }
    #[derive(Serialize)]
    struct Holder {
        ok: u8,
        broken: Broken,
    }
    let err = identify(
        &Holder {
            ok: 1,
            broken: Broken,
        },
        &[] as &[&str],
    )
    .unwrap_err();
    assert_eq!(
        err,
        IdentityError::Serialize("no JSON form".to_owned()),
        "the handler's own message reaches the caller"
    );
    assert_same(
        &Holder {
            ok: 1,
            broken: Broken,
        },
        &[],
    );
}

#[test]
fn map_keys_to_value_refuses_are_refused_here_too() {
    let mut by_pair = BTreeMap::new();
    by_pair.insert((1, 2), "x");
    assert_same(&by_pair, &[]);
    let mut by_newtype = BTreeMap::new();
    by_newtype.insert(Id("k".into()), 1);
    assert_same(&by_newtype, &[]);
    let mut by_option = BTreeMap::new();
    by_option.insert(Some(3), 1);
    assert_same(&by_option, &[]);
}

#[test]
fn struct_fields_are_sorted_and_key_fields_selected() {
    #[derive(Serialize)]
    struct Charge {
        customer: String,
        amount_cents: u64,
        note: Option<String>,
    }
    let c = Charge {
        customer: "cus_1".into(),
        amount_cents: 4900,
        note: None,
    };
    let id = identify(&c, &["customer", "amount_cents"]).unwrap();
    assert_eq!(
        std::str::from_utf8(&id.canonical).unwrap(),
        r#"{"amount_cents":4900,"customer":"cus_1","note":null}"#
    );
    assert_eq!(
        std::str::from_utf8(id.key_fields.as_deref().unwrap()).unwrap(),
        r#"{"amount_cents":4900,"customer":"cus_1"}"#
    );
}

/// `Serialize` impls that misuse the serializer: a key without a value, two keys in a row,
/// an error swallowed (best-effort serialization), an error wrapped by `serialize_with`.
/// Bytes written around a failure are never trusted: the reference path decides.
mod misbehaving {
    use super::*;
    use serde::ser::{SerializeMap, SerializeStruct};

    struct DanglingKey;
    impl Serialize for DanglingKey {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("a", &1)?;
            m.serialize_key("k")?;
            m.end()
        }
    }

    struct TwoKeys;
    impl Serialize for TwoKeys {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            m.serialize_key("x")?;
            m.serialize_key("y")?;
            m.serialize_value(&1)?;
            m.end()
        }
    }

    /// Skips an entry whose value this writer leaves to `to_value` (a newtype map key).
    struct BestEffort;
    impl Serialize for BestEffort {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_map(None)?;
            let mut inner = BTreeMap::new();
            inner.insert(Id("k".into()), 1);
            if m.serialize_entry("a", &inner).is_err() {
                // best effort: leave it out
            }
            m.serialize_entry("b", &2)?;
            m.end()
        }
    }

    struct Broken;
    impl Serialize for Broken {
        fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }

    /// Ignores a field whose own `Serialize` fails.
    struct SkipBroken;
    impl Serialize for SkipBroken {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut m = s.serialize_struct("SkipBroken", 2)?;
            let _ = m.serialize_field("a", &Broken);
            m.serialize_field("b", &2)?;
            m.end()
        }
    }

    fn with_context<T: Serialize, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
            .map_err(|e| serde::ser::Error::custom(format!("limits: {e}")))
    }

    #[derive(Serialize)]
    struct Payout {
        #[serde(serialize_with = "with_context")]
        limits: BTreeMap<Id, u32>,
        to: String,
    }

    #[test]
    fn a_key_without_its_value_is_dropped_as_to_value_drops_it() {
        assert_same(&DanglingKey, &[]);
        assert_same(&DanglingKey, &["a", "k"]);
        #[derive(Serialize)]
        struct Outer {
            b: DanglingKey,
            c: u8,
        }
        assert_same(
            &Outer {
                b: DanglingKey,
                c: 1,
            },
            &["c"],
        );
        assert_same(&TwoKeys, &[]);
    }

    #[test]
    fn swallowed_errors_leave_no_half_written_bytes() {
        assert_same(&BestEffort, &[]);
        assert_same(&BestEffort, &["b"]);
        assert_same(&SkipBroken, &[]);
        assert_same(&SkipBroken, &["b"]);
        let id = identify(&BestEffort, &["b"]).unwrap();
        assert_eq!(
            std::str::from_utf8(&id.canonical).unwrap(),
            r#"{"a":{"k":1},"b":2}"#
        );
    }

    #[test]
    fn an_error_wrapped_by_serialize_with_does_not_refuse_valid_arguments() {
        let mut limits = BTreeMap::new();
        limits.insert(Id("cus_1".into()), 100);
        let p = Payout {
            limits,
            to: "acme".into(),
        };
        assert_same(&p, &["to"]);
        let id = identify(&p, &[] as &[&str]).expect("valid arguments");
        assert_eq!(
            std::str::from_utf8(&id.canonical).unwrap(),
            r#"{"limits":{"cus_1":100},"to":"acme"}"#
        );
    }

    #[test]
    fn identify_nested_inside_a_serialize_impl_keeps_both_results_right() {
        struct Nested;
        impl Serialize for Nested {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                // A failing inner identify must not mark the outer one failed, nor the reverse.
                assert!(identify(&SkipBroken, &[] as &[&str]).is_ok());
                let inner = identify(&json!({"z": 1, "a": 2}), &[] as &[&str]).unwrap();
                let mut m = s.serialize_struct("Nested", 1)?;
                m.serialize_field("inner", std::str::from_utf8(&inner.canonical).unwrap())?;
                m.end()
            }
        }
        assert_same(&Nested, &[]);
    }

    #[test]
    fn identify_works_from_a_thread_local_destructor() {
        use std::sync::atomic::{AtomicBool, Ordering};
        static IDENTIFIED: AtomicBool = AtomicBool::new(false);
        struct OnExit;
        impl Drop for OnExit {
            fn drop(&mut self) {
                let id = identify(&json!({"b": 1, "a": [true]}), &["a"]).unwrap();
                IDENTIFIED.store(id.canonical == br#"{"a":[true],"b":1}"#, Ordering::SeqCst);
            }
        }
        thread_local! {
            static ON_EXIT: std::cell::RefCell<Option<OnExit>> = const { std::cell::RefCell::new(None) };
        }
        std::thread::spawn(|| {
            // Registered before the serializer's own thread-locals, so (destructors run in
            // reverse order) those are gone by the time this one runs.
            ON_EXIT.with(|slot| *slot.borrow_mut() = Some(OnExit));
            identify(&json!({"x": 1}), &[] as &[&str]).unwrap();
        })
        .join()
        .expect("the thread ran");
        // Thread-local destructors run after `join` has its result; give them a moment.
        for _ in 0..200 {
            if IDENTIFIED.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("identify from a thread-local destructor did not finish");
    }
}
