//! The validator against `jsonschema` (the reference, a dev-dependency) on generated schemas
//! of the subset it understands, by hand on each keyword and its edge cases, and fail-closed
//! on what it does not understand.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{Validator, MAX_DEPTH};

fn compiled(schema: &Value) -> Validator {
    Validator::compile(schema).unwrap_or_else(|e| panic!("{schema} does not compile: {e}"))
}

/// Checks each instance against `schema` with both validators; they must agree with each
/// other and with `expected`.
fn check(schema: Value, cases: &[(Value, bool)]) {
    let ours = compiled(&schema);
    let reference = jsonschema::validator_for(&schema).unwrap();
    for (instance, expected) in cases {
        assert_eq!(
            reference.is_valid(instance),
            *expected,
            "the reference on {instance} against {schema}"
        );
        assert_eq!(
            ours.is_valid(instance),
            *expected,
            "{instance} against {schema}"
        );
    }
}

fn unverifiable(schema: Value) -> String {
    match Validator::compile(&schema) {
        Ok(_) => panic!("{schema} compiled, though it cannot be checked"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn types_and_integers_as_json_schema_counts_them() {
    check(
        json!({"type": "integer"}),
        &[
            (json!(1), true),
            (json!(1.0), true),
            (json!(-0.0), true),
            (json!(1e300), true),
            (json!(u64::MAX), true),
            (json!(i64::MIN), true),
            (json!(1.5), false),
            (json!("1"), false),
            (json!(null), false),
        ],
    );
    check(
        json!({"type": "number"}),
        &[(json!(1), true), (json!(0.5), true), (json!(true), false)],
    );
    check(
        json!({"type": ["string", "null"]}),
        &[
            (json!(null), true),
            (json!("x"), true),
            (json!(0), false),
            (json!([]), false),
        ],
    );
    check(
        json!({"type": ["object", "array", "boolean"]}),
        &[
            (json!({}), true),
            (json!([]), true),
            (json!(false), true),
            (json!(null), false),
        ],
    );
    check(json!(true), &[(json!(null), true), (json!({"a": 1}), true)]);
    check(json!(false), &[(json!(null), false), (json!({}), false)]);
    check(json!({}), &[(json!([1, {"a": null}]), true)]);
}

#[test]
fn number_bounds_are_exact() {
    // As f64, u64::MAX and u64::MAX - 1 are the same number; as JSON they are not.
    check(
        json!({"maximum": u64::MAX - 1}),
        &[
            (json!(u64::MAX - 1), true),
            (json!(u64::MAX), false),
            (json!(1.8446744073709552e19), false),
            (json!(-1e300), true),
        ],
    );
    check(
        json!({"minimum": 9_007_199_254_740_993_u64}),
        &[
            (json!(9_007_199_254_740_993_u64), true),
            (json!(9_007_199_254_740_992_u64), false),
            (json!(9_007_199_254_740_992.0), false),
            (json!(1e300), true),
        ],
    );
    check(
        json!({"exclusiveMinimum": 0, "exclusiveMaximum": 1.5}),
        &[
            (json!(0), false),
            (json!(-0.0), false),
            (json!(1e-300), true),
            (json!(1), true),
            (json!(1.5), false),
            (json!("2"), true),
        ],
    );
    check(
        json!({"minimum": -1.5, "maximum": -1}),
        &[
            (json!(-1), true),
            (json!(-1.5), true),
            (json!(-2), false),
            (json!(i64::MIN), false),
            (json!(-0.5), false),
        ],
    );
}

#[test]
fn multiple_of_on_exact_values() {
    check(
        json!({"multipleOf": 3}),
        &[
            (json!(9), true),
            (json!(-9), true),
            (json!(0), true),
            (json!(-0.0), true),
            (json!(9.0), true),
            (json!(10), false),
            (json!(9.5), false),
            // 18446744073709551615 = 3 * 6148914691236517205.
            (json!(u64::MAX), true),
            (json!(u64::MAX - 1), false),
            (json!("9"), true),
        ],
    );
    check(
        json!({"multipleOf": 0.5}),
        &[
            (json!(1.5), true),
            (json!(2), true),
            (json!(1.25), false),
            (json!(1e300), true),
        ],
    );
    // Exact where `jsonschema` is not: it rounds u64::MAX to 2^64, which 2.5 does not
    // divide; 18446744073709551615 = 2.5 * 7378697629483820646.
    let schema = json!({"multipleOf": 2.5});
    let reference = jsonschema::validator_for(&schema).unwrap();
    let ours = compiled(&schema);
    assert!(ours.is_valid(&json!(u64::MAX)));
    assert!(!reference.is_valid(&json!(u64::MAX)));
    assert!(!ours.is_valid(&json!(u64::MAX - 1)));
    check(
        schema,
        &[(json!(7.5), true), (json!(3), false), (json!(-5), true)],
    );
    // Decimal, as written: 0.3 is a multiple of 0.1 (though neither is exact in binary).
    check(
        json!({"multipleOf": 0.1}),
        &[
            (json!(0.3), true),
            (json!(1), true),
            (json!(0.25), false),
            (json!(1e-7), false),
            (json!(u64::MAX), true),
        ],
    );
    check(
        json!({"multipleOf": 0.0001}),
        &[
            (json!(1.2345), true),
            (json!(1.23455), false),
            (json!(1e300), true),
        ],
    );
    check(
        json!({"multipleOf": 2.0}),
        &[(json!(4), true), (json!(3), false), (json!(4.0), true)],
    );
    check(
        json!({"multipleOf": 1e300}),
        &[(json!(3), false), (json!(2e300), true)],
    );
}

#[test]
fn string_lengths_count_characters() {
    check(
        json!({"minLength": 2, "maxLength": 3}),
        &[
            (json!("ab"), true),
            (json!("abc"), true),
            (json!("a"), false),
            (json!("abcd"), false),
            // One character each, several bytes.
            (json!("\u{1F600}\u{1F600}"), true),
            (json!("\u{1F600}"), false),
            (json!("\u{e9}\u{e9}\u{e9}"), true),
            // `e` and a combining accent: two characters.
            (json!("e\u{301}"), true),
            (json!("\u{e9}\u{e9}\u{e9}\u{e9}"), false),
            (json!(12345), true),
        ],
    );
    check(
        json!({"maxLength": 1.0, "format": "email"}),
        &[(json!("x"), true), (json!(""), true), (json!("xy"), false)],
    );
}

#[test]
fn enum_and_const_compare_as_json_schema_does() {
    check(
        json!({"enum": [1, "a", null, [1, 2], {"k": 1.0}]}),
        &[
            (json!(1.0), true),
            (json!(1), true),
            (json!("a"), true),
            (json!(null), true),
            (json!([1.0, 2]), true),
            (json!([2, 1]), false),
            (json!({"k": 1}), true),
            (json!({"k": 1, "j": 2}), false),
            (json!(true), false),
            (json!("A"), false),
        ],
    );
    check(
        json!({"const": 0}),
        &[(json!(0), true), (json!(-0.0), true), (json!(false), false)],
    );
    check(
        json!({"const": {"a": [null]}}),
        &[(json!({"a": [null]}), true), (json!({"a": []}), false)],
    );
    check(json!({"enum": []}), &[(json!(null), false)]);
}

#[test]
fn arrays() {
    check(
        json!({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false}),
        &[
            (json!([]), true),
            (json!(["a"]), true),
            (json!(["a", 1]), true),
            (json!(["a", 1, 2]), false),
            (json!([1]), false),
            (json!({"0": 1}), true),
        ],
    );
    check(
        json!({"items": {"type": "integer"}, "minItems": 1, "maxItems": 2}),
        &[
            (json!([1]), true),
            (json!([1, 2.0]), true),
            (json!([]), false),
            (json!([1, 2, 3]), false),
            (json!([1.5]), false),
        ],
    );
    check(
        json!({"uniqueItems": true}),
        &[
            (json!([]), true),
            (json!([1, 2, "1"]), true),
            (json!([1, 1.0]), false),
            (json!([0, -0.0]), false),
            (json!([{"a": 1}, {"a": 2}]), true),
            (json!([[1], [1, 1]]), true),
            (json!([null, false, 0, "", [], {}]), true),
            (json!([u64::MAX, 1.8446744073709552e19]), true),
        ],
    );
    check(json!({"uniqueItems": false}), &[(json!([1, 1]), true)]);
    // Equal objects whose keys were written in another order are equal. Checked against the
    // rule alone: with serde_json's `preserve_order` on (feature unification turns it on in
    // the all-features build), the reference tells them apart by their order.
    let unique = compiled(&json!({"uniqueItems": true}));
    assert!(!unique.is_valid(&json!([{"a": 1, "b": 2}, {"b": 2, "a": 1}])));
    assert!(!unique.is_valid(&json!([[{"a": 1, "b": [2]}], [{"b": [2.0], "a": 1}]])));
}

#[test]
fn objects() {
    check(
        json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": false,
        }),
        &[
            (json!({"a": 1}), true),
            (json!({"a": 1, "b": "x"}), true),
            (json!({"b": "x"}), false),
            (json!({"a": "1"}), false),
            (json!({"a": 1, "c": 0}), false),
            (json!([]), false),
        ],
    );
    check(
        json!({"additionalProperties": {"type": "boolean"}, "properties": {"n": {}}}),
        &[
            (json!({"n": 1, "x": true}), true),
            (json!({"x": 1}), false),
            (json!("not an object"), true),
        ],
    );
    check(
        json!({"propertyNames": {"maxLength": 2}, "minProperties": 1, "maxProperties": 2}),
        &[
            (json!({"ab": 1}), true),
            (json!({"\u{1F600}\u{1F600}": 1}), true),
            (json!({"abc": 1}), false),
            (json!({}), false),
            (json!({"a": 1, "b": 2, "c": 3}), false),
        ],
    );
    check(
        json!({"required": ["a", "a~b/c"]}),
        &[
            (json!({"a": 0, "a~b/c": 0}), true),
            (json!({"a": 0}), false),
        ],
    );
}

#[test]
fn applicators() {
    check(
        json!({"anyOf": [{"type": "string"}, {"minimum": 3}]}),
        &[(json!("x"), true), (json!(4), true), (json!(2), false)],
    );
    check(
        json!({"oneOf": [{"type": "integer"}, {"minimum": 3}]}),
        &[
            (json!(1), true),
            (json!(3.5), true),
            (json!(4), false),
            (json!(2.5), false),
        ],
    );
    check(
        json!({"allOf": [{"type": "integer"}, {"minimum": 3}]}),
        &[(json!(3), true), (json!(2), false), (json!(3.5), false)],
    );
    check(
        json!({"not": {"type": "null"}}),
        &[(json!(null), false), (json!(0), true)],
    );
    check(
        json!({"if": {"type": "integer"}, "then": {"minimum": 10}, "else": {"type": "string"}}),
        &[
            (json!(10), true),
            (json!(9), false),
            (json!("x"), true),
            (json!(1.5), false),
        ],
    );
    check(
        json!({"if": {"type": "integer"}, "then": {"minimum": 10}}),
        &[(json!(9), false), (json!(null), true)],
    );
    check(json!({"then": false, "else": false}), &[(json!(1), true)]);
}

#[test]
fn references_resolve_in_the_document() {
    check(
        json!({
            "$defs": {"a/b~c": {"type": "integer"}, "d e": {"const": "x"}},
            "definitions": {"old": {"type": "boolean"}},
            "properties": {
                "escaped": {"$ref": "#/$defs/a~1b~0c"},
                "percent": {"$ref": "#/$defs/d%20e"},
                "old": {"$ref": "#/definitions/old"},
                "sibling": {"$ref": "#/$defs/a~1b~0c", "minimum": 5},
            },
        }),
        &[
            (
                json!({"escaped": 1, "percent": "x", "old": true, "sibling": 5}),
                true,
            ),
            (json!({"escaped": "1"}), false),
            (json!({"percent": "y"}), false),
            (json!({"old": 1}), false),
            (json!({"sibling": 4}), false),
        ],
    );
    // Recursion that consumes input: a list of lists, a linked list.
    check(
        json!({"$id": "https://example.com/lists", "type": "array", "items": {"$ref": "#"}}),
        &[(json!([[], [[]]]), true), (json!([[1]]), false)],
    );
    let linked = json!({
        "$ref": "#/$defs/Node",
        "$defs": {"Node": {
            "type": "object",
            "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}},
            "required": ["value"],
        }},
    });
    check(
        linked.clone(),
        &[
            (
                json!({"value": 1, "next": {"value": 2, "next": null}}),
                true,
            ),
            (json!({"value": 1, "next": {"value": "2"}}), false),
        ],
    );
    // Deeper than the bound: invalid, and no overflow, on half the stack of a tokio worker
    // (in a debug build too).
    std::thread::Builder::new()
        .stack_size(1 << 20)
        .spawn(move || {
            let mut deep = json!({"value": 0});
            for i in 0..MAX_DEPTH * 2 {
                deep = object([("value", json!(i)), ("next", deep)]);
            }
            assert!(!compiled(&linked).is_valid(&deep));
            let mut nested = json!([]);
            for _ in 0..MAX_DEPTH * 4 {
                nested = Value::Array(vec![nested]);
            }
            let lists = compiled(&json!({"items": {"$ref": "#"}}));
            assert!(!lists.is_valid(&nested));
            let unique = compiled(&json!({"uniqueItems": true}));
            assert!(!unique.is_valid(&Value::Array(vec![nested.clone(), json!(1)])));
            assert!(compiled(&json!({})).is_valid(&nested));
            let mut names = json!({});
            for _ in 0..MAX_DEPTH * 4 {
                names = object([("a", names)]);
            }
            let named = compiled(&json!({"$ref": "#/$defs/o", "$defs": {"o": {
                "propertyNames": {"maxLength": 1},
                "additionalProperties": {"$ref": "#/$defs/o"},
            }}}));
            assert!(!named.is_valid(&names));
        })
        .unwrap()
        .join()
        .unwrap();
}

/// An object built without `json!`, which serializes (recursively) what it is given.
fn object<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Object(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

#[test]
fn the_wrapper_schema_idem_builds_is_checked() {
    use idem_runtime::definitions::mcp_output_schema;
    use idem_runtime::tool::{output_schema_for, ToolSpec};

    #[derive(serde::Serialize, schemars::JsonSchema)]
    struct Tree {
        label: String,
        children: Vec<Tree>,
        weight: Option<u8>,
    }
    let spec = ToolSpec::new("trees").output_schema(output_schema_for::<Vec<Tree>>());
    let schema = mcp_output_schema(&spec).unwrap();
    check(
        schema,
        &[
            (json!({"result": []}), true),
            (
                json!({"result": [{"label": "a", "children": [{"label": "b", "children": [], "weight": 255}], "weight": null}]}),
                true,
            ),
            (
                json!({"result": [{"label": "a", "children": [], "weight": 256}]}),
                false,
            ),
            (json!({"result": [{"label": "a"}]}), false),
            (json!({"downstream_ref": "ch_1"}), false),
            (json!([]), false),
        ],
    );
}

#[test]
fn what_is_not_understood_is_unverifiable() {
    for (schema, why) in [
        (json!({"type": "string", "pattern": "^ch_"}), "pattern"),
        (
            json!({"properties": {"id": {"type": "string", "pattern": "^ch_"}}}),
            "pattern",
        ),
        (
            json!({"patternProperties": {"^a": {}}}),
            "patternProperties",
        ),
        (json!({"dependentSchemas": {"a": {}}}), "dependentSchemas"),
        (
            json!({"dependentRequired": {"a": ["b"]}}),
            "dependentRequired",
        ),
        (
            json!({"unevaluatedProperties": false}),
            "unevaluatedProperties",
        ),
        (json!({"unevaluatedItems": false}), "unevaluatedItems"),
        (json!({"contains": {"type": "integer"}}), "contains"),
        (json!({"$dynamicRef": "#meta"}), "$dynamicRef"),
        (
            json!({"$ref": "https://example.com/schema.json"}),
            "not in this document",
        ),
        (
            json!({"$ref": "other.json#/$defs/a"}),
            "not in this document",
        ),
        (
            json!({"$ref": "#anchor", "$defs": {"a": {"$anchor": "anchor"}}}),
            "anchor",
        ),
        (json!({"$ref": "#/$defs/missing"}), "names nothing"),
        (json!({"$ref": "#/$defs/a%zz"}), "JSON Pointer"),
        (
            json!({"properties": {"a": {"$id": "https://example.com/a", "type": "string"}}}),
            "$id",
        ),
        (
            json!({"$schema": "http://json-schema.org/draft-07/schema#"}),
            "$schema",
        ),
        (json!({"items": [{"type": "string"}]}), "items"),
        (json!({"minimum": "3"}), "minimum"),
        (json!({"exclusiveMinimum": true}), "exclusiveMinimum"),
        (json!({"multipleOf": 0}), "multipleOf"),
        (json!({"minLength": -1}), "minLength"),
        (json!({"maxItems": 1.5}), "maxItems"),
        (json!({"type": "int"}), "type"),
        (json!({"type": []}), "type"),
        (json!({"required": [1]}), "required"),
        (json!({"anyOf": []}), "anyOf"),
        (json!({"properties": {"a": 3}}), "not a schema"),
        (json!("string"), "not a schema"),
        (json!(null), "not a schema"),
        (json!({"items": "x".repeat(10_000)}), "not a schema"),
        (
            json!({"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}}),
            "cycle",
        ),
        (json!({"$ref": "#"}), "cycle"),
        (json!({"if": {"$ref": "#"}}), "cycle"),
    ] {
        let reason = unverifiable(schema.clone());
        assert!(
            reason.contains(why),
            "{schema}: {reason:?} does not say {why:?}"
        );
    }
    // Annotations constrain nothing; a pattern only under `$defs`, unreferenced, neither.
    let annotated = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/receipt",
        "$comment": "c", "title": "t", "description": "d", "default": 1, "examples": [1],
        "deprecated": true, "readOnly": true, "writeOnly": false, "format": "uuid",
        "contentMediaType": "application/json", "contentEncoding": "base64",
        "x-vendor": {"pattern": "a"}, "$defs": {"unused": {"pattern": "^a"}},
        "type": "string",
    });
    check(annotated, &[(json!("not-a-uuid"), true), (json!(1), false)]);
}

#[test]
fn a_schema_nested_past_the_bound_is_unverifiable() {
    let mut schema = json!({});
    for _ in 0..300 {
        schema = object([("items", schema)]);
    }
    assert!(unverifiable(schema).contains("deeper"));
    let mut value = json!(1);
    for _ in 0..300 {
        value = Value::Array(vec![value]);
    }
    assert!(unverifiable(object([("const", value)])).contains("deeper"));
}

/// Small numbers, strings and names, so that generated instances often meet generated
/// schemas, with the edge cases among them.
fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-4i64..12).prop_map(Value::from),
        prop::sample::select(vec![
            json!(0.5),
            json!(1.0),
            json!(-0.0),
            json!(2.5),
            json!(-1.5),
            json!(0.1),
            json!(0.3),
            json!(1e300),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(9_007_199_254_740_993_u64),
        ]),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "",
        "a",
        "b",
        "ab",
        "\u{e9}",
        "\u{1F600}\u{1F600}",
        "abc",
        "e\u{301}",
    ])
    .prop_map(str::to_owned)
}

const NAMES: [&str; 4] = ["a", "b", "next", "\u{e9}"];

fn arb_instance() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(NAMES.to_vec()), inner, 0..4)
                .prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
        ]
    })
}

fn arb_type() -> impl Strategy<Value = Value> {
    let names = vec![
        "null", "boolean", "object", "array", "number", "string", "integer",
    ];
    prop_oneof![
        prop::sample::select(names.clone()).prop_map(Value::from),
        prop::sample::subsequence(names, 1..4).prop_map(Value::from),
    ]
}

/// One keyword of the subset with a leaf value.
fn arb_leaf_keyword() -> impl Strategy<Value = (String, Value)> {
    let count = || (0u64..4).prop_map(Value::from);
    prop_oneof![
        arb_type().prop_map(|t| ("type".to_owned(), t)),
        prop::collection::vec(arb_instance(), 0..4)
            .prop_map(|v| ("enum".to_owned(), Value::Array(v))),
        arb_instance().prop_map(|v| ("const".to_owned(), v)),
        arb_number().prop_map(|n| ("minimum".to_owned(), n)),
        arb_number().prop_map(|n| ("maximum".to_owned(), n)),
        arb_number().prop_map(|n| ("exclusiveMinimum".to_owned(), n)),
        arb_number().prop_map(|n| ("exclusiveMaximum".to_owned(), n)),
        // `jsonschema` rounds an integer beyond 2^53 to an `f64` before a fractional
        // division, where the validator here is exact (`multiple_of_on_exact_values`). So the
        // fractional divisors are ones the rounding cannot sway on the numbers drawn: 0.5 and
        // 0.1 divide every integer, and 0.7 neither u64::MAX nor 2^53 + 1 nor their roundings
        // (7 divides none of them), while it still refuses most small integers.
        prop::sample::select(vec![
            json!(1),
            json!(2),
            json!(3),
            json!(0.5),
            json!(0.7),
            json!(0.1),
            json!(1e300)
        ])
        .prop_map(|n| ("multipleOf".to_owned(), n)),
        count().prop_map(|n| ("minLength".to_owned(), n)),
        count().prop_map(|n| ("maxLength".to_owned(), n)),
        count().prop_map(|n| ("minItems".to_owned(), n)),
        count().prop_map(|n| ("maxItems".to_owned(), n)),
        count().prop_map(|n| ("minProperties".to_owned(), n)),
        count().prop_map(|n| ("maxProperties".to_owned(), n)),
        any::<bool>().prop_map(|b| ("uniqueItems".to_owned(), Value::Bool(b))),
        prop::sample::subsequence(NAMES.to_vec(), 0..3)
            .prop_map(|r| ("required".to_owned(), json!(r))),
        prop::sample::select(vec!["email", "date-time", "uuid"])
            .prop_map(|f| ("format".to_owned(), json!(f))),
        prop::sample::select(vec![
            "#/$defs/int",
            "#/$defs/a~1b",
            "#/definitions/Node",
            "#/$defs/d%20e"
        ])
        .prop_map(|r| ("$ref".to_owned(), json!(r))),
    ]
}

fn arb_schema() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        prop::collection::vec(arb_leaf_keyword(), 0..3)
            .prop_map(|kws| Value::Object(kws.into_iter().collect())),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let list = || prop::collection::vec(inner.clone(), 1..3).prop_map(Value::Array);
        let keyword = prop_oneof![
            prop::collection::btree_map(prop::sample::select(NAMES.to_vec()), inner.clone(), 0..3)
                .prop_map(|m| ("properties".to_owned(), json!(m))),
            inner
                .clone()
                .prop_map(|s| ("additionalProperties".to_owned(), s)),
            inner.clone().prop_map(|s| ("propertyNames".to_owned(), s)),
            inner.clone().prop_map(|s| ("items".to_owned(), s)),
            list().prop_map(|v| ("prefixItems".to_owned(), v)),
            list().prop_map(|v| ("anyOf".to_owned(), v)),
            list().prop_map(|v| ("oneOf".to_owned(), v)),
            list().prop_map(|v| ("allOf".to_owned(), v)),
            inner.clone().prop_map(|s| ("not".to_owned(), s)),
            inner.clone().prop_map(|s| ("if".to_owned(), s)),
            inner.clone().prop_map(|s| ("then".to_owned(), s)),
            inner.clone().prop_map(|s| ("else".to_owned(), s)),
            arb_leaf_keyword(),
        ];
        prop::collection::vec(keyword, 1..4)
            .prop_map(|kws| Value::Object(kws.into_iter().collect()))
    })
}

/// A generated schema with the definitions its `$ref`s may name (a recursive one among them,
/// whose recursion consumes input).
fn with_defs(mut schema: Value, extra: Value) -> Value {
    let defs = json!({
        "int": {"type": "integer"},
        "a/b": extra,
        "d e": {"enum": ["a", 1, null]},
    });
    let definitions = json!({"Node": {
        "type": "object",
        "properties": {"next": {"$ref": "#/definitions/Node"}, "a": {"$ref": "#/$defs/int"}},
    }});
    match &mut schema {
        Value::Object(map) => {
            map.insert("$defs".to_owned(), defs);
            map.insert("definitions".to_owned(), definitions);
            schema
        }
        other => json!({"allOf": [other.clone()], "$defs": defs, "definitions": definitions}),
    }
}

/// A leaf schema without `$ref`: the target of `#/$defs/a~1b`, so that no cycle arises.
fn arb_ref_free() -> impl Strategy<Value = Value> {
    prop::collection::vec(arb_leaf_keyword(), 0..3)
        .prop_map(|kws| Value::Object(kws.into_iter().filter(|(k, _)| k != "$ref").collect()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// On every schema of the subset, and every instance, the validator says what
    /// `jsonschema` says.
    #[test]
    fn agrees_with_jsonschema(
        schema in arb_schema(),
        extra in arb_ref_free(),
        instances in prop::collection::vec(arb_instance(), 1..8),
    ) {
        let schema = with_defs(schema, extra);
        let reference = jsonschema::validator_for(&schema)
            .map_err(|e| TestCaseError::fail(format!("the reference refuses {schema}: {e}")))?;
        let ours = Validator::compile(&schema)
            .map_err(|e| TestCaseError::fail(format!("{schema}: {e}")))?;
        for instance in &instances {
            prop_assert_eq!(
                ours.is_valid(instance),
                reference.is_valid(instance),
                "{} against {}", instance, schema
            );
        }
    }

    /// Any JSON as a schema and as an instance: compiling and checking never panic.
    #[test]
    fn never_panics(schema in any_json(), instance in any_json()) {
        if let Ok(v) = Validator::compile(&schema) {
            let _ = v.is_valid(&instance);
        }
        if let Ok(v) = Validator::compile(&json!({"$defs": {"x": schema.clone()}, "$ref": "#/$defs/x", "items": schema})) {
            let _ = v.is_valid(&instance);
        }
    }
}

/// Arbitrary JSON, keywords of the subset among its keys.
fn any_json() -> impl Strategy<Value = Value> {
    let keys = vec![
        "type",
        "enum",
        "const",
        "minimum",
        "multipleOf",
        "maxLength",
        "items",
        "prefixItems",
        "properties",
        "required",
        "additionalProperties",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "$ref",
        "uniqueItems",
        "propertyNames",
        "x",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(vec![
            "#",
            "#/",
            "#/$defs/x",
            "#/items",
            "#/0",
            "%",
            "#/$defs/x/items",
            "integer",
            "string"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(keys.clone()), inner, 0..4).prop_map(
                |m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            ),
        ]
    })
}

/// The generated cases are worth comparing: with a fixed seed, a fair share of instances
/// meets its schema and a fair share does not (a generator that made only one verdict would
/// let the differential test pass on a validator that always answers it).
#[test]
fn generated_cases_reach_both_verdicts() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = (
        arb_schema(),
        arb_ref_free(),
        prop::collection::vec(arb_instance(), 1..8),
    );
    let (mut valid, mut invalid) = (0usize, 0usize);
    for _ in 0..500 {
        let (schema, extra, instances) = strategy.new_tree(&mut runner).unwrap().current();
        let schema = with_defs(schema, extra);
        let ours = compiled(&schema);
        for instance in &instances {
            if ours.is_valid(instance) {
                valid += 1;
            } else {
                invalid += 1;
            }
        }
    }
    let total = valid + invalid;
    assert!(
        valid * 5 > total && invalid * 5 > total,
        "{valid} valid, {invalid} invalid"
    );
}
