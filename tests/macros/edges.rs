//! The edges of `#[tool]`, `#[toolbox]`, `#[idem::args]` and the tool definitions they
//! export: descriptions in every doc form, definition shapes and MCP schema constraints, OpenAI
//! strict mode, `key(..)` under serde renames, toolboxes. Compile-time cases are under
//! `tests/ui/edges/` (trybuild, run by `tests/ui.rs`), runtime cases here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    definitions::DefinitionOptions, tool, toolbox, BuildError, Format, ReadCtx, Registry, ToolCall,
    ToolError, WriteCtx,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Descriptions

/// Charge a customer's card
/// for one invoice.
///
/// Modes:
/// - `fast`: one
///   attempt
/// - `slow`
///
/// ```text
/// keep   this
/// ```
#[tool(write)]
async fn doc_markdown(_ctx: WriteCtx) -> Result<(), ToolError> {
    Ok(())
}

#[doc = "Look up"]
#[doc = "a charge."]
#[tool(read)]
async fn doc_attr(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

/** Block docs
on two lines. */
#[tool(read)]
async fn doc_block(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

/// Ignored: the option wins.
#[tool(read, description = "From the option.")]
async fn doc_option(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

#[tool(read)]
async fn undocumented(_ctx: ReadCtx) -> Result<(), ToolError> {
    Ok(())
}

fn description_of(registry: &Registry, name: &str) -> String {
    registry
        .get(name)
        .unwrap()
        .spec()
        .description_text()
        .to_owned()
}

#[test]
fn descriptions_come_from_docs_in_every_form() {
    let registry = Registry::builder()
        .tool(doc_markdown)
        .tool(doc_attr)
        .tool(doc_option)
        .build()
        .unwrap();
    assert_eq!(
        description_of(&registry, "doc_markdown"),
        "Charge a customer's card for one invoice.\n\nModes:\n- `fast`: one attempt\n- `slow`\n\n```text\nkeep   this\n```"
    );
    assert_eq!(description_of(&registry, "doc_attr"), "Look up a charge.");
    assert_eq!(description_of(&registry, "doc_option"), "From the option.");
    for format in [Format::OpenAi, Format::Anthropic, Format::Mcp] {
        let defs = registry.definitions(format);
        let text = serde_json::to_string(&defs).unwrap();
        assert!(text.contains("From the option."), "{text}");
    }
}

#[test]
fn a_block_doc_has_no_leading_space() {
    let registry = Registry::builder().tool(doc_block).build().unwrap();
    assert_eq!(
        description_of(&registry, "doc_block"),
        "Block docs on two lines."
    );
}

#[test]
fn a_tool_without_a_description_does_not_export_an_empty_one() {
    let registry = Registry::builder().tool(undocumented).build().unwrap();
    for format in [Format::OpenAi, Format::Anthropic, Format::Mcp] {
        let def = &registry.definitions(format)[0];
        let function = def.get("function").unwrap_or(def);
        assert_ne!(function.get("description"), Some(&json!("")), "{def}");
    }
}

// ---------------------------------------------------------------------------------------------
// Definitions: shapes, annotations, MCP schema

#[idem::args]
struct Address {
    line1: String,
    postcode: Option<String>,
}

#[idem::args]
#[serde(rename_all = "snake_case")]
enum Speed {
    Fast,
    Slow,
}

/// Arguments with nested, optional and enum fields.
#[idem::args]
struct OrderArgs {
    /// The customer id.
    customer: String,
    cents: u64,
    tags: Option<Vec<String>>,
    address: Address,
    billing: Option<Address>,
    speed: Speed,
}

/// Place an order.
#[tool(
    write,
    key(customer),
    downstream = "keyed",
    key_travels = "nowhere: no downstream, the tests read its definition"
)]
async fn place_order(_ctx: WriteCtx, args: OrderArgs) -> Result<String, ToolError> {
    Ok(args.customer)
}

/// Delete an order.
#[tool(write, destructive, name = "delete-order")]
async fn delete_order(_ctx: WriteCtx, args: Address) -> Result<String, ToolError> {
    Ok(args.line1)
}

/// Look up an order.
#[tool(read)]
async fn get_order(_ctx: ReadCtx, args: Address) -> Result<String, ToolError> {
    Ok(args.line1)
}

fn orders() -> Registry {
    Registry::builder()
        .tool(place_order)
        .tool(delete_order)
        .tool(get_order)
        .build()
        .unwrap()
}

#[test]
fn openai_and_anthropic_shapes() {
    let registry = orders();
    let openai = registry.definitions(Format::OpenAi);
    let anthropic = registry.definitions(Format::Anthropic);
    assert_eq!(openai.len(), 3);
    for (o, a) in openai.iter().zip(&anthropic) {
        assert_eq!(o["type"], "function");
        let f = o["function"].as_object().unwrap();
        // Sorted: with serde_json's `preserve_order` (which a dependency such as rig-core
        // turns on for the whole build) a map keeps insertion order.
        let mut keys = f.keys().collect::<Vec<_>>();
        keys.sort_unstable();
        assert_eq!(keys, ["description", "name", "parameters"], "{o}");
        assert_eq!(f["name"], a["name"]);
        assert_eq!(f["parameters"], a["input_schema"]);
        assert_eq!(a["input_schema"]["type"], "object");
        assert_eq!(a.as_object().unwrap().len(), 3);
    }
    assert_eq!(anthropic[1]["name"], "delete-order");
    let params = &anthropic[0]["input_schema"];
    assert_eq!(
        params["properties"]["customer"]["description"],
        "The customer id."
    );
    assert_eq!(
        params["properties"]["speed"]["enum"],
        json!(["fast", "slow"])
    );
    assert_eq!(params["properties"]["tags"]["type"], "array");
    let required = params["required"].as_array().unwrap();
    for name in ["customer", "cents", "address", "speed"] {
        assert!(required.contains(&json!(name)), "{name}: {params}");
    }
    for name in ["tags", "billing"] {
        assert!(!required.contains(&json!(name)), "{name}: {params}");
    }
}

#[test]
fn mcp_annotations_follow_the_kind_and_destructive() {
    let defs = orders().definitions(Format::Mcp);
    let hints = |i: usize| {
        let a = &defs[i]["annotations"];
        (
            a["readOnlyHint"].as_bool(),
            a["destructiveHint"].as_bool(),
            a["idempotentHint"].as_bool(),
        )
    };
    assert_eq!(hints(0), (Some(false), Some(false), Some(true)));
    assert_eq!(hints(1), (Some(false), Some(true), Some(true)));
    assert_eq!(hints(2), (Some(true), Some(false), Some(true)));
}

/// The constraints of the MCP `Tool` definition (schema-2025-11-25 and schema-2026-07-28 in
/// `../shared/mcp-schema/`) that a definition can break; jsonschema is not a dev-dependency of
/// the facade, so they are spelled out here.
fn mcp_tool_violations(def: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(obj) = def.as_object() else {
        return vec!["not an object".into()];
    };
    if !obj.get("name").is_some_and(Value::is_string) {
        errors.push("name: required string".into());
    }
    if obj.get("description").is_some_and(|d| !d.is_string()) {
        errors.push("description: not a string".into());
    }
    match obj.get("inputSchema").and_then(Value::as_object) {
        None => errors.push("inputSchema: required object".into()),
        Some(schema) => {
            if schema.get("type") != Some(&json!("object")) {
                errors.push(format!(
                    "inputSchema.type must be \"object\", is {:?}",
                    schema.get("type")
                ));
            }
            if let Some(props) = schema.get("properties") {
                match props.as_object() {
                    None => errors.push("inputSchema.properties: not an object".into()),
                    // 2025-11-25: every property schema is an object (not `true`/`false`).
                    Some(props) => {
                        for (name, p) in props {
                            if !p.is_object() {
                                errors.push(format!("inputSchema.properties.{name}: {p}"));
                            }
                        }
                    }
                }
            }
            if let Some(required) = schema.get("required") {
                if !required
                    .as_array()
                    .is_some_and(|r| r.iter().all(Value::is_string))
                {
                    errors.push("inputSchema.required: not an array of strings".into());
                }
            }
        }
    }
    if let Some(annotations) = obj.get("annotations") {
        for (k, v) in annotations.as_object().into_iter().flatten() {
            let ok = match k.as_str() {
                "title" => v.is_string(),
                _ => v.is_boolean(),
            };
            if !ok {
                errors.push(format!("annotations.{k}: {v}"));
            }
        }
    }
    errors
}

/// Writes the MCP definitions of every registry here to `$CARGO_TARGET_TMPDIR`, for a check
/// against the published schemas with an external validator.
fn dump(name: &str, defs: &[Value]) {
    let path = format!(
        "{}/macro_edges_mcp_{name}.json",
        env!("CARGO_TARGET_TMPDIR")
    );
    std::fs::write(path, serde_json::to_string_pretty(defs).unwrap()).unwrap();
}

#[test]
fn mcp_definitions_meet_the_tool_schema() {
    let defs = orders().definitions(Format::Mcp);
    dump("orders", &defs);
    for d in &defs {
        assert_eq!(mcp_tool_violations(d), Vec::<String>::new(), "{d}");
    }
}

// ---------------------------------------------------------------------------------------------
// Args types that are hard to describe

#[idem::args]
struct FreeFormArgs {
    payload: Value,
}

/// Stores any JSON.
#[tool(write)]
async fn store_json(_ctx: WriteCtx, args: FreeFormArgs) -> Result<Value, ToolError> {
    Ok(args.payload)
}

#[test]
fn a_free_form_field_meets_the_mcp_schema() {
    let defs = Registry::builder()
        .tool(store_json)
        .build()
        .unwrap()
        .definitions(Format::Mcp);
    dump("free_form", &defs);
    assert_eq!(
        mcp_tool_violations(&defs[0]),
        Vec::<String>::new(),
        "{}",
        defs[0]
    );
}

/// Echo a string.
#[tool(read)]
async fn echo(_ctx: ReadCtx, args: String) -> Result<String, ToolError> {
    Ok(args)
}

#[test]
fn a_non_object_args_type_is_refused() {
    let err = Registry::builder().tool(echo).build().unwrap_err();
    assert!(
        matches!(&err, BuildError::InvalidSpec { tool, message }
            if tool == "echo" && message.contains("take a JSON object")),
        "{err}"
    );
}

#[idem::args]
struct Empty;

/// Takes a unit struct.
#[tool(write)]
async fn unit_args(_ctx: WriteCtx, _args: Empty) -> Result<u8, ToolError> {
    Ok(7)
}

#[tokio::test]
async fn a_unit_struct_args_type_takes_an_empty_object() {
    let registry = Registry::builder().tool(unit_args).build().unwrap();
    let defs = registry.definitions(Format::Anthropic);
    assert_eq!(
        defs[0]["input_schema"],
        json!({"type": "object", "properties": {}})
    );
    let r = registry
        .call(ToolCall::new("run", "unit_args", json!({})))
        .await;
    assert_eq!(r.output(), Some(&json!(7)), "{:?}", r.as_result());
}

// ---------------------------------------------------------------------------------------------
// OpenAI strict mode

fn strict(registry: &Registry) -> Vec<Value> {
    registry.definitions_with(Format::OpenAi, &DefinitionOptions::default().strict(true))
}

/// Every object in a schema (outside `$defs`, which strict mode also closes) is closed and
/// requires all its properties, and no object-typed schema leaves `additionalProperties` open.
fn strict_violations(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if map.get("type") == Some(&json!("object"))
                || map
                    .get("type")
                    .and_then(Value::as_array)
                    .is_some_and(|t| t.contains(&json!("object")))
            {
                if map.get("additionalProperties") != Some(&json!(false)) {
                    out.push(format!("{path}: additionalProperties is not false"));
                }
                let props: Vec<&String> = map
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().collect())
                    .unwrap_or_default();
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                for p in props {
                    if !required.contains(&p.as_str()) {
                        out.push(format!("{path}: `{p}` not required"));
                    }
                }
            }
            if map.contains_key("oneOf") {
                out.push(format!("{path}: oneOf (strict mode supports anyOf only)"));
            }
            if map.contains_key("allOf") {
                out.push(format!("{path}: allOf (not supported in strict mode)"));
            }
            // Values, not schemas: a `default: true` is no `true` schema.
            for (k, child) in map
                .iter()
                .filter(|(k, _)| !matches!(k.as_str(), "default" | "const" | "enum" | "examples"))
            {
                strict_violations(child, &format!("{path}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                strict_violations(child, &format!("{path}/{i}"), out);
            }
        }
        Value::Bool(true) if !path.ends_with("additionalProperties") => {
            out.push(format!(
                "{path}: the schema `true` (any value) is not allowed"
            ));
        }
        _ => {}
    }
}

fn assert_strict_ok(def: &Value) {
    let params = &def["function"]["parameters"];
    let mut out = Vec::new();
    strict_violations(params, "", &mut out);
    assert!(out.is_empty(), "{out:?} in {params}");
    assert_eq!(params["type"], "object");
    assert!(params.get("anyOf").is_none() && params.get("oneOf").is_none());
}

#[test]
fn strict_mode_for_nested_optional_and_enum_fields() {
    let defs = strict(&orders());
    for d in &defs {
        assert_eq!(d["function"]["strict"], true);
        assert_strict_ok(d);
    }
    let p = &defs[0]["function"]["parameters"];
    assert_eq!(p["properties"]["tags"]["type"], json!(["array", "null"]));
    assert_eq!(
        p["properties"]["billing"]["type"],
        json!(["object", "null"])
    );
    assert_eq!(
        p["properties"]["address"]["properties"]["postcode"]["type"],
        json!(["string", "null"])
    );
}

#[idem::args]
struct LabelArgs {
    labels: HashMap<String, String>,
}

/// Set labels.
#[tool(write)]
async fn set_labels(_ctx: WriteCtx, args: LabelArgs) -> Result<usize, ToolError> {
    Ok(args.labels.len())
}

#[test]
fn strict_mode_keeps_a_map_usable() {
    let registry = Registry::builder().tool(set_labels).build().unwrap();
    let plain = &registry.definitions(Format::OpenAi)[0]["function"]["parameters"];
    assert_eq!(
        plain["properties"]["labels"]["additionalProperties"],
        json!({"type": "string"}),
        "{plain}"
    );
    let strict = &strict(&registry)[0]["function"];
    // Either the map survives or strict mode is refused for this tool; closing it is neither.
    assert_ne!(
        strict["parameters"]["properties"]["labels"]["additionalProperties"],
        json!(false),
        "{strict}"
    );
    assert_eq!(strict["strict"], false, "{strict}");
}

#[idem::args]
struct PageArgs {
    #[serde(default)]
    limit: u32,
    #[serde(default = "ten")]
    per_page: u8,
    cursor: Option<String>,
    #[serde(default)]
    after: Option<u64>,
    filter: Filter,
}

#[idem::args]
#[serde(default)]
struct Filter {
    status: String,
    newest_first: bool,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            status: "open".to_owned(),
            newest_first: true,
        }
    }
}

fn ten() -> u8 {
    10
}

/// List with defaulted and optional fields.
#[tool(read)]
async fn list_page(_ctx: ReadCtx, args: PageArgs) -> Result<Value, ToolError> {
    Ok(json!([
        args.limit,
        args.per_page,
        args.cursor,
        args.after,
        args.filter.status,
        args.filter.newest_first
    ]))
}

/// Whether a property schema admits `null`.
fn admits_null(p: &Value) -> bool {
    let in_type = match &p["type"] {
        Value::String(t) => t == "null",
        Value::Array(types) => types.contains(&json!("null")),
        _ => false,
    };
    let in_any_of = p["anyOf"]
        .as_array()
        .is_some_and(|alts| alts.iter().any(admits_null));
    in_type || in_any_of
}

/// Strict mode requires every property, so an optional one is offered as nullable only when
/// the tool takes `null` for it; the others the model must fill in. Each property is sent as
/// `null` and as a value: the call must agree with the schema either way.
#[tokio::test]
async fn strict_mode_offers_null_only_where_the_tool_takes_it() {
    let registry = Registry::builder().tool(list_page).build().unwrap();
    let def = &strict(&registry)[0];
    assert_strict_ok(def);
    let p = &def["function"]["parameters"];
    let filter = &p["properties"]["filter"];
    let nullable = |schema: &Value, name: &str| admits_null(&schema["properties"][name]);
    // An `Option` reads `null` as `None`; a defaulted non-`Option` refuses it.
    assert_eq!(
        ["limit", "per_page", "cursor", "after", "filter"].map(|n| nullable(p, n)),
        [false, false, true, true, false],
        "{p}"
    );
    assert_eq!(
        ["status", "newest_first"].map(|n| nullable(filter, n)),
        [false, false],
        "{p}"
    );

    let full = json!({
        "limit": 3, "per_page": 4, "cursor": "c", "after": 9,
        "filter": {"status": "closed", "newest_first": false},
    });
    let call = |args: Value| registry.call(ToolCall::new("run", "list_page", args));
    let r = call(full.clone()).await;
    assert_eq!(
        r.output(),
        Some(&json!([3, 4, "c", 9, "closed", false])),
        "{:?}",
        r.error()
    );
    for (path, schema) in [
        (vec!["limit"], p),
        (vec!["per_page"], p),
        (vec!["cursor"], p),
        (vec!["after"], p),
        (vec!["filter"], p),
        (vec!["filter", "status"], filter),
        (vec!["filter", "newest_first"], filter),
    ] {
        let mut args = full.clone();
        let (last, parents) = path.split_last().unwrap();
        let target = parents.iter().fold(&mut args, |v, k| &mut v[*k]);
        target[*last] = Value::Null;
        let r = call(args).await;
        assert_eq!(
            r.output().is_some(),
            nullable(schema, last),
            "{path:?} = null: the schema says {}, the call says {:?}",
            schema["properties"][*last],
            r.as_result()
        );
    }
}

#[idem::args]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Payment {
    Card { number: String },
    Iban { iban: String, bic: Option<String> },
}

#[idem::args]
struct PayArgs {
    payment: Payment,
}

/// Pay by card or transfer.
#[tool(write)]
async fn pay(_ctx: WriteCtx, args: PayArgs) -> Result<bool, ToolError> {
    Ok(matches!(args.payment, Payment::Card { .. }))
}

/// Pay, the args being the enum itself.
#[tool(write)]
async fn pay_root(_ctx: WriteCtx, args: Payment) -> Result<bool, ToolError> {
    Ok(matches!(args, Payment::Card { .. }))
}

#[test]
fn strict_mode_for_a_tagged_enum_field() {
    let registry = Registry::builder().tool(pay).build().unwrap();
    assert_strict_ok(&strict(&registry)[0]);
}

#[test]
fn strict_mode_for_an_enum_args_type() {
    // A choice of argument shapes at the root cannot be strict: offered as it is, and said so.
    let registry = Registry::builder().tool(pay_root).build().unwrap();
    let strict = &strict(&registry)[0]["function"];
    assert_eq!(strict["strict"], false, "{strict}");
    let plain = &registry.definitions(Format::OpenAi)[0]["function"];
    assert_eq!(strict["parameters"], plain["parameters"]);
}

#[idem::args]
struct Paging {
    page: u32,
    per_page: Option<u32>,
}

#[idem::args]
#[serde(rename_all = "camelCase")]
struct SearchArgs {
    query_text: String,
    #[serde(flatten)]
    paging: Paging,
}

/// Search with flattened paging.
#[tool(read)]
async fn search(_ctx: ReadCtx, args: SearchArgs) -> Result<String, ToolError> {
    Ok(format!(
        "{}{}{:?}",
        args.query_text, args.paging.page, args.paging.per_page
    ))
}

#[tokio::test]
async fn rename_all_and_flatten_in_every_mode() {
    let registry = Registry::builder().tool(search).build().unwrap();
    let plain = &registry.definitions(Format::Anthropic)[0]["input_schema"];
    for name in ["queryText", "page", "per_page"] {
        assert!(plain["properties"].get(name).is_some(), "{name}: {plain}");
    }
    assert_strict_ok(&strict(&registry)[0]);
    let r = registry
        .call(ToolCall::new(
            "run",
            "search",
            json!({"queryText": "q", "page": 2}),
        ))
        .await;
    assert_eq!(r.output(), Some(&json!("q2None")), "{:?}", r.error());
}

// ---------------------------------------------------------------------------------------------
// Options checked only at build time

#[idem::args]
#[serde(rename_all = "camelCase")]
struct RenamedArgs {
    customer_id: String,
    #[serde(rename = "amount")]
    cents: u64,
    memo_text: Option<String>,
}

static RENAMED_CHARGES: AtomicU32 = AtomicU32::new(0);

/// `key` names the Rust fields, which serde renames.
#[tool(write, key(customer_id, cents))]
async fn charge_renamed(_ctx: WriteCtx, args: RenamedArgs) -> Result<u64, ToolError> {
    RENAMED_CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(args.cents)
}

/// The key reads the properties serde writes (`customerId`, `amount`): two customers are two
/// operations, and another memo under one customer's key is the same operation with changed
/// parameters (had the key read the absent `customer_id`, every call would share one key).
#[tokio::test]
async fn key_names_the_rust_field_under_serde_renames() {
    let registry = Registry::builder()
        .tool(charge_renamed)
        .build()
        .expect("key(customer_id, cents) under rename_all and rename");
    let spec = registry.get("charge_renamed").unwrap().spec();
    assert_eq!(
        spec.key_field_names().collect::<Vec<_>>(),
        ["customerId", "amount"]
    );
    let charge = |customer: &str, memo: &str| {
        let args = json!({"customerId": customer, "amount": 5, "memoText": memo});
        registry.call(ToolCall::new("run", "charge_renamed", args))
    };
    let first = charge("c1", "a").await;
    let again = charge("c1", "a").await;
    let changed = charge("c1", "b").await;
    let other = charge("c2", "a").await;
    assert_eq!(first.output(), Some(&json!(5)), "{:?}", first.as_result());
    assert!(again.replayed(), "{:?}", again.as_result());
    assert!(
        matches!(
            changed.as_result(),
            Err(idem::CallError::ChangedParams { .. })
        ),
        "{:?}",
        changed.as_result()
    );
    assert_eq!(other.output(), Some(&json!(5)), "{:?}", other.as_result());
    assert!(!other.replayed());
    assert_eq!(RENAMED_CHARGES.load(Ordering::SeqCst), 2);
}

#[idem::args]
struct Payer {
    id: String,
}

#[idem::args]
struct Detail {
    note: String,
    priority: u8,
}

#[idem::args]
#[serde(rename_all = "camelCase")]
struct NotedArgs {
    payer: Payer,
    cents: u64,
    memo_text: Option<String>,
    detail: Detail,
}

static NOTED_CHARGES: AtomicU32 = AtomicU32::new(0);

/// Keyed by a pointer under a key name of its own; a renamed memo and a nested note are left
/// out of the fingerprint.
#[tool(
    write,
    key_name = "charge",
    key("/payer/id"),
    exclude(memo_text, "/detail/note"),
    downstream = "keyed"
)]
async fn charge_noted(ctx: WriteCtx, args: NotedArgs) -> Result<String, ToolError> {
    NOTED_CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{} {} {}", args.payer.id, args.cents, ctx.key()))
}

#[tokio::test]
async fn pointers_exclusions_and_a_key_name_from_the_macro() {
    let registry = Registry::builder().tool(charge_noted).build().unwrap();
    let spec = registry.get("charge_noted").unwrap().spec();
    assert_eq!(spec.key_field_names().collect::<Vec<_>>(), ["/payer/id"]);
    // `memo_text` is the Rust name; the exclusion reads the property serde writes.
    assert_eq!(
        spec.excluded_field_names().collect::<Vec<_>>(),
        ["memoText", "/detail/note"]
    );
    assert_eq!(spec.key_name_text(), "charge");
    let charge = |cents: u64, memo: &str, note: &str| {
        let args = json!({
            "payer": {"id": "p1"},
            "cents": cents,
            "memoText": memo,
            "detail": {"note": note, "priority": 1},
        });
        registry.call(ToolCall::new("run", "charge_noted", args))
    };
    let first = charge(5, "first", "call first").await;
    let reworded = charge(5, "second, reworded", "call later").await;
    let changed = charge(6, "first", "call first").await;
    assert!(first.is_completed(), "{:?}", first.as_result());
    assert!(reworded.replayed(), "{:?}", reworded.as_result());
    assert_eq!(reworded.key(), first.key());
    assert!(
        matches!(
            changed.as_result(),
            Err(idem::CallError::ChangedParams { .. })
        ),
        "{:?}",
        changed.as_result()
    );
    assert_eq!(NOTED_CHARGES.load(Ordering::SeqCst), 1);
}

/// Derived by hand: the macro cannot see serde's names.
#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
struct HandDerivedArgs {
    customer_id: String,
}

/// `key` names a Rust field serde renames, on a type the macro cannot read.
#[tool(write, key(customer_id))]
async fn charge_hand_derived(_ctx: WriteCtx, args: HandDerivedArgs) -> Result<String, ToolError> {
    Ok(args.customer_id)
}

#[test]
fn key_under_a_rename_the_macro_cannot_see_is_refused_at_build() {
    let Err(err) = Registry::builder().tool(charge_hand_derived).build() else {
        panic!("a key field that is not a property must not build");
    };
    assert!(
        matches!(&err, BuildError::InvalidSpec { tool, message }
            if tool == "charge_hand_derived"
                && message.contains("`customer_id`")
                && message.contains("customerId")
                && message.contains("#[idem::args]")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Toolboxes

#[idem::args]
struct TicketArgs {
    title: String,
}

struct Tickets {
    opened: AtomicU32,
    prefix: String,
}

#[toolbox]
impl Tickets {
    /// Open a ticket.
    #[tool(write, key(title), timeout = "5s")]
    async fn open_ticket(&self, ctx: WriteCtx, args: TicketArgs) -> Result<String, ToolError> {
        let n = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(ctx.key().as_str().starts_with("idem:"));
        Ok(format!("{}{n}:{}", self.prefix, args.title))
    }

    /// How many tickets are open?
    #[tool(read, name = "ticket-count")]
    async fn count(&self, _ctx: ReadCtx) -> Result<u32, ToolError> {
        Ok(self.opened.load(Ordering::SeqCst))
    }

    /// Close every ticket.
    #[tool(write, destructive)]
    async fn close_all(&self, _ctx: WriteCtx) -> Result<u32, ToolError> {
        Ok(self.opened.swap(0, Ordering::SeqCst))
    }
}

struct Mail;

#[toolbox]
impl Mail {
    /// Also opens a ticket.
    #[tool(write)]
    async fn open_ticket(&self, _ctx: WriteCtx, args: TicketArgs) -> Result<String, ToolError> {
        Ok(args.title)
    }
}

/// A free fn with a toolbox method's name.
#[tool(read, name = "ticket-count")]
async fn ticket_count_free(_ctx: ReadCtx) -> Result<u32, ToolError> {
    Ok(0)
}

fn tickets() -> Arc<Tickets> {
    Arc::new(Tickets {
        opened: AtomicU32::new(0),
        prefix: "T".to_owned(),
    })
}

#[tokio::test]
async fn a_toolbox_shares_its_state_across_tools() {
    let state = tickets();
    let registry = Registry::builder().toolbox(state.clone()).build().unwrap();
    assert_eq!(
        registry.tools().map(|t| t.name()).collect::<Vec<_>>(),
        ["open_ticket", "ticket-count", "close_all"]
    );
    let spec = registry.get("open_ticket").unwrap().spec();
    assert_eq!(spec.timeout_duration(), Duration::from_secs(5));
    assert_eq!(spec.key_field_names().collect::<Vec<_>>(), ["title"]);

    let open = |title: &str| ToolCall::new("run", "open_ticket", json!({ "title": title }));
    let a = registry.call(open("disk full")).await;
    let again = registry.call(open("disk full")).await;
    let b = registry.call(open("cpu hot")).await;
    assert_eq!(a.output(), Some(&json!("T1:disk full")));
    assert!(again.replayed());
    assert_eq!(b.output(), Some(&json!("T2:cpu hot")));
    let count = registry
        .call(ToolCall::new("run", "ticket-count", json!({})))
        .await;
    assert_eq!(count.output(), Some(&json!(2)));
    assert_eq!(state.opened.load(Ordering::SeqCst), 2);

    let mcp = registry.definitions(Format::Mcp);
    dump("tickets", &mcp);
    assert_eq!(mcp[1]["annotations"]["readOnlyHint"], true);
    assert_eq!(mcp[2]["annotations"]["destructiveHint"], true);
    for d in &mcp {
        assert_eq!(mcp_tool_violations(d), Vec::<String>::new(), "{d}");
    }
}

#[tokio::test]
async fn toolbox_methods_stay_callable() {
    use idem::identity::KeyMaterial;
    use idem::{IdemKey, Scope};
    let state = tickets();
    let key = IdemKey::derive(&Scope::run("t"), "open_ticket", KeyMaterial::Intent("i"));
    let out = state
        .open_ticket(WriteCtx::for_test(key), TicketArgs { title: "x".into() })
        .await
        .unwrap();
    assert_eq!(out, "T1:x");
    assert_eq!(state.count(ReadCtx::for_test("t")).await.unwrap(), 1);
}

#[test]
fn duplicate_names_across_toolboxes_and_fns_are_build_errors() {
    let dup = |built: Result<Registry, BuildError>, name: &str| match built {
        Err(BuildError::DuplicateName(n)) => assert_eq!(n, name),
        Err(other) => panic!("expected DuplicateName({name}), got {other}"),
        Ok(_) => panic!("expected DuplicateName({name}), the registry built"),
    };
    dup(
        Registry::builder()
            .toolbox(tickets())
            .toolbox(Arc::new(Mail))
            .build(),
        "open_ticket",
    );
    dup(
        Registry::builder()
            .toolbox(tickets())
            .tool(ticket_count_free)
            .build(),
        "ticket-count",
    );
    dup(
        Registry::builder()
            .toolbox(tickets())
            .toolbox(tickets())
            .build(),
        "open_ticket",
    );
    dup(
        Registry::builder()
            .tool(set_labels)
            .tool(set_labels)
            .build(),
        "set_labels",
    );
}
