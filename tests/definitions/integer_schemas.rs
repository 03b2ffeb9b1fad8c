//! Integer fields: what the input schema advertises for a bounded integer type is what the
//! call accepts. A model (or an MCP client that validates before it sends) builds arguments
//! from the schema; a value the schema allows must run, and a value the type cannot hold must
//! be refused by the schema too, and by the call before anything is claimed, with an error
//! that says what is wrong.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{
    definitions::DefinitionOptions, toolbox, CallError, Format, Registry, ToolCall, ToolError,
    WriteCtx,
};
use serde_json::{json, Value};

#[idem::args]
struct Sizes {
    small: u8,
    port: u16,
    delta: i32,
    count: u32,
    offset: i64,
    cents: u64,
    /// Optional: absent is fine, but a present value must fit.
    limit: Option<u32>,
    /// Fields named like schema keywords are fields all the same.
    default: Option<i32>,
    #[serde(rename = "const")]
    constant: Option<u32>,
    /// Nested: a list of counts.
    counts: Option<Vec<u32>>,
}

#[derive(Default)]
struct Counter {
    runs: AtomicU32,
}

#[toolbox]
impl Counter {
    /// Record some sizes.
    #[tool(write)]
    async fn record(&self, _ctx: WriteCtx, args: Sizes) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{} {}", args.count, args.delta))
    }
}

fn registry() -> (Arc<Counter>, Registry) {
    let counter = Arc::new(Counter::default());
    let registry = Registry::builder()
        .toolbox(counter.clone())
        .build()
        .unwrap();
    (counter, registry)
}

fn schemas(registry: &Registry) -> Vec<(String, Value)> {
    let strict = DefinitionOptions::default().strict(true);
    vec![
        (
            "openai".into(),
            registry.definitions(Format::OpenAi)[0]["function"]["parameters"].clone(),
        ),
        (
            "openai strict".into(),
            registry.definitions_with(Format::OpenAi, &strict)[0]["function"]["parameters"].clone(),
        ),
        (
            "responses".into(),
            registry.definitions(Format::OpenAiResponses)[0]["parameters"].clone(),
        ),
        (
            "anthropic".into(),
            registry.definitions(Format::Anthropic)[0]["input_schema"].clone(),
        ),
        (
            "mcp".into(),
            registry.definitions(Format::Mcp)[0]["inputSchema"].clone(),
        ),
    ]
}

fn valid() -> Value {
    json!({"small": 1, "port": 8080, "delta": -3, "count": 7, "offset": -9, "cents": 4900, "limit": 10,
           "default": 1, "const": 2, "counts": [1]})
}

fn with(field: &str, value: Value) -> Value {
    let mut args = valid();
    args[field] = value;
    args
}

#[test]
fn bounded_integer_fields_advertise_their_range_in_every_format() {
    let (_, registry) = registry();
    let ranges: [(&str, Value, Value); 9] = [
        ("small", json!(0), json!(255)),
        ("port", json!(0), json!(65535)),
        ("delta", json!(i32::MIN), json!(i32::MAX)),
        ("count", json!(0), json!(u32::MAX)),
        ("offset", json!(i64::MIN), json!(i64::MAX)),
        ("cents", json!(0), json!(u64::MAX)),
        ("limit", json!(0), json!(u32::MAX)),
        ("default", json!(i32::MIN), json!(i32::MAX)),
        ("const", json!(0), json!(u32::MAX)),
    ];
    for (format, schema) in schemas(&registry) {
        for (field, min, max) in &ranges {
            let p = &schema["properties"][field];
            assert_eq!(&p["minimum"], min, "{format}: {field}: {p}");
            assert_eq!(&p["maximum"], max, "{format}: {field}: {p}");
        }
    }
}

/// For each argument object, every format's schema and the call agree; a refused call ran
/// nothing and claimed nothing.
#[tokio::test]
async fn out_of_range_integers_are_refused_by_the_schema_and_by_the_call_alike() {
    let cases = [
        valid(),
        with("delta", json!(i32::MAX)),
        with("delta", json!(i32::MIN)),
        with("delta", json!(2_147_483_648_i64)),
        with("delta", json!(-2_147_483_649_i64)),
        with("delta", json!(3e9)),
        with("delta", json!(-3e9)),
        with("count", json!(u32::MAX)),
        with("count", json!(4_294_967_296_u64)),
        with("count", json!(3e9)),
        with("count", json!(5e9)),
        with("count", json!(-1)),
        with("small", json!(255)),
        with("small", json!(256)),
        with("small", json!(256.0)),
        with("port", json!(65_536)),
        with("offset", json!(i64::MIN)),
        with("offset", json!(1e15)),
        with("cents", json!(u64::MAX)),
        with("limit", json!(4_294_967_296_u64)),
        with("default", json!(3e9)),
        with("const", json!(-1)),
        with("counts", json!([1, 2, 4_294_967_296_u64])),
        with("counts", json!([1, 2, 3])),
    ];
    let (counter, registry) = registry();
    for (format, schema) in schemas(&registry) {
        let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
        for (i, args) in cases.iter().enumerate() {
            let before = counter.runs.load(Ordering::SeqCst);
            let r = registry
                .call(ToolCall::new(
                    format!("run-{format}-{i}"),
                    "record",
                    args.clone(),
                ))
                .await;
            let allowed = validator.is_valid(args);
            assert_eq!(
                r.is_completed(),
                allowed,
                "{format}: the schema {} {args}; the call: {}",
                if allowed { "allows" } else { "refuses" },
                r.text()
            );
            if !allowed {
                assert!(
                    matches!(r.error(), Some(CallError::InvalidArgs { .. })),
                    "{format} {args}: {:?}",
                    r.as_result()
                );
                assert_eq!(counter.runs.load(Ordering::SeqCst), before, "nothing ran");
                assert!(r.key().is_none(), "refused before a key was claimed");
            }
        }
    }
}

/// The error for an integer the field's type cannot hold says so, whether the model wrote it
/// as an integer or as a float with no fraction (`3e9`): not "floating point", which would
/// send the model to retry with `3000000000` and be refused again.
#[tokio::test]
async fn an_out_of_range_integer_is_refused_with_an_error_that_names_the_range_problem() {
    let (counter, registry) = registry();
    for text in [
        r#"{"small": 1, "port": 1, "delta": 3e9, "count": 1, "offset": 1, "cents": 1}"#,
        r#"{"small": 1, "port": 1, "delta": 3000000000, "count": 1, "offset": 1, "cents": 1}"#,
    ] {
        for r in [
            registry
                .call(ToolCall::from_json("run-t", "record", text))
                .await,
            registry
                .call(ToolCall::new(
                    "run-v",
                    "record",
                    serde_json::from_str(text).unwrap(),
                ))
                .await,
        ] {
            let message = r.text();
            assert!(
                matches!(r.error(), Some(CallError::InvalidArgs { .. })),
                "{message}"
            );
            assert!(message.contains("3000000000"), "{message}");
            assert!(message.contains("i32"), "{message}");
            assert!(!message.contains("floating point"), "{message}");
        }
    }
    assert_eq!(counter.runs.load(Ordering::SeqCst), 0);
}

#[idem::args]
struct Deltas {
    /// Per account.
    deltas: std::collections::BTreeMap<String, i32>,
}

#[derive(Default)]
struct Ledger;

#[toolbox]
impl Ledger {
    /// Apply deltas.
    #[tool(write)]
    async fn apply(&self, _ctx: WriteCtx, args: Deltas) -> Result<usize, ToolError> {
        Ok(args.deltas.len())
    }
}

#[tokio::test]
async fn the_values_of_a_map_carry_their_range_too() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Ledger))
        .build()
        .unwrap();
    let schema = registry.definitions(Format::Mcp)[0]["inputSchema"].clone();
    let values = &schema["properties"]["deltas"]["additionalProperties"];
    assert_eq!(values["maximum"], json!(i32::MAX), "{schema}");
    let validator = jsonschema::validator_for(&schema).unwrap();
    let over = json!({"deltas": {"a": 1, "b": -2_147_483_649_i64}});
    assert!(!validator.is_valid(&over));
    let r = registry.call(ToolCall::new("run-1", "apply", over)).await;
    assert!(
        matches!(r.error(), Some(CallError::InvalidArgs { .. })),
        "{}",
        r.text()
    );
}

// ---- OpenAI strict mode takes a subset of JSON Schema --------------------------------------

#[idem::args]
struct Profile {
    /// Page of results.
    #[serde(default)]
    page: u32,
    /// Signed offset.
    shift: i64,
    /// Labels, each once.
    tags: std::collections::BTreeSet<String>,
    /// When it happened.
    #[schemars(extend("format" = "date-time"))]
    at: String,
    /// Where to call back.
    #[schemars(extend("format" = "uri"))]
    callback: Option<String>,
    /// Kept for old clients.
    #[deprecated]
    legacy: Option<bool>,
    /// Weights.
    weights: Vec<f32>,
}

#[derive(Default)]
struct Profiles;

#[toolbox]
impl Profiles {
    /// Update a profile.
    #[tool(write)]
    #[allow(deprecated)]
    async fn update(&self, _ctx: WriteCtx, args: Profile) -> Result<u32, ToolError> {
        Ok(args.page)
    }
}

/// Walks every subschema and reports each keyword strict mode does not take on it: per type,
/// `pattern` and a known `format` for strings, `minimum`, `maximum`, their exclusive forms and
/// `multipleOf` for numbers, `minItems` and `maxItems` for arrays; `$defs` at the root only.
fn unsupported(schema: &Value, path: &str, root: bool, out: &mut Vec<String>) {
    let Value::Object(map) = schema else { return };
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let formats = [
        "date-time",
        "time",
        "date",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
    ];
    for (k, v) in map {
        let ok = match k.as_str() {
            "type" | "description" | "title" | "enum" | "const" | "anyOf" | "$ref" => true,
            "properties" | "required" | "additionalProperties" => types.contains(&"object"),
            "items" | "minItems" | "maxItems" => types.contains(&"array"),
            "pattern" => types.contains(&"string"),
            "format" => types.contains(&"string") && formats.contains(&v.as_str().unwrap_or("")),
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
                types.contains(&"integer") || types.contains(&"number")
            }
            "$defs" => root,
            _ => false,
        };
        if !ok {
            out.push(format!("{path}: `{k}` ({v})"));
        }
    }
    if let Some(Value::Object(props)) = map.get("properties") {
        for (name, p) in props {
            unsupported(p, &format!("{path}/{name}"), false, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = map.get(key) {
            unsupported(child, &format!("{path}/{key}"), false, out);
        }
    }
    if let Some(Value::Array(branches)) = map.get("anyOf") {
        for (i, b) in branches.iter().enumerate() {
            unsupported(b, &format!("{path}/anyOf/{i}"), false, out);
        }
    }
}

#[test]
fn strict_mode_schemas_use_only_the_keywords_strict_mode_takes() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Profiles))
        .toolbox(Arc::new(Counter::default()))
        .build()
        .unwrap();
    let strict = DefinitionOptions::default().strict(true);
    for def in registry.definitions_with(Format::OpenAi, &strict) {
        assert_eq!(def["function"]["strict"], true, "{def}");
        let mut out = Vec::new();
        unsupported(&def["function"]["parameters"], "#", true, &mut out);
        assert!(out.is_empty(), "{}: {out:#?}", def["function"]["name"]);
    }
    let update = &registry.definitions_with(Format::OpenAiResponses, &strict)[0];
    let p = &update["parameters"]["properties"];
    // The range stays, the integer's format goes; a known string format stays.
    assert_eq!(p["page"]["maximum"], json!(u32::MAX), "{update}");
    assert_eq!(p["shift"]["minimum"], json!(i64::MIN), "{update}");
    assert_eq!(p["at"]["format"], "date-time", "{update}");
    assert!(p["callback"].get("format").is_none(), "{update}");
    // Without strict mode the schema keeps what schemars wrote.
    let loose = &registry.definitions(Format::OpenAi)[0]["function"]["parameters"]["properties"];
    assert_eq!(loose["page"]["format"], "uint32");
    assert_eq!(loose["page"]["default"], 0);
    assert_eq!(loose["callback"]["format"], "uri");
}

/// What strict mode leaves out only loosens the schema: every value the strict schema allows,
/// the call accepts; and a `#[serde(default)]` field the model must now send runs as sent.
#[tokio::test]
async fn the_strict_schema_still_agrees_with_the_call() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Profiles))
        .build()
        .unwrap();
    let strict = DefinitionOptions::default().strict(true);
    let schema =
        registry.definitions_with(Format::OpenAi, &strict)[0]["function"]["parameters"].clone();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let base = json!({"page": 2, "shift": -1, "tags": ["a", "b"], "at": "2026-12-01T08:00:00Z",
                      "callback": null, "legacy": null, "weights": [0.5]});
    let cases = [
        base.clone(),
        {
            let mut v = base.clone();
            v["page"] = json!(4_294_967_296_u64);
            v
        },
        {
            let mut v = base.clone();
            v["callback"] = json!("https://example.com/hook");
            v
        },
        {
            let mut v = base.clone();
            v["shift"] = json!(1.5);
            v
        },
    ];
    for (i, args) in cases.iter().enumerate() {
        let r = registry
            .call(ToolCall::new(format!("run-{i}"), "update", args.clone()))
            .await;
        assert_eq!(
            r.is_completed(),
            validator.is_valid(args),
            "{args}: {}",
            r.text()
        );
    }
}
