//! Input and output schemas: generated once per tool from its `Args` type (in the form every
//! client accepts) and, when it has one, from its output type.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// The input schema of an args type: root `"type": "object"` always, no `$schema` URL,
/// subschemas inlined (recursive types keep `$defs`), and `Option<T>` fields rendered as an
/// optional `T` (not in `required`) — the form every client accepts, where some reject
/// `"type": [T, "null"]`. A fixed-width integer (`i32`, `u32`, `u64`, …) carries its range
/// as `minimum` and `maximum`, so the schema refuses what its type cannot hold.
pub fn input_schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let schema = generator.into_root_schema_for::<T>();
    let mut value = normalize_root(schema.to_value());
    drop_optional_nulls(&mut value);
    objects_for_booleans(&mut value);
    integer_ranges(&mut value);
    value
}

/// Writes the range of a fixed-width integer type into its schema (`minimum`, `maximum`)
/// where the schema names the type's `format` but not all of its range. schemars bounds
/// `u8`, `u16`, `i8` and `i16`, gives `u32`, `u64` and `usize` a minimum only and `i32`,
/// `i64` and `isize` nothing, so a client that validates against the schema would pass
/// `3e9` for an `i32`, which the call then refuses. With the range in the schema, the schema
/// refuses what the call refuses. Bounds the type's schema already gives (schemars' own, a
/// `#[schemars(range(..))]`) are kept. Every format takes the two keywords: JSON Schema
/// (MCP, Anthropic) and OpenAI's strict mode, which lists `minimum` and `maximum` among the
/// keywords it supports for numbers (and already got `"minimum": 0` for every unsigned
/// field). 128-bit integers are left as they are: their bounds are not JSON numbers serde
/// can write.
fn integer_ranges(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    let is_integer = match map.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(types)) => types.iter().any(|t| t == "integer"),
        _ => false,
    };
    let range = match map.get("format").and_then(Value::as_str) {
        Some(format) if is_integer => integer_range(format),
        _ => None,
    };
    if let Some((min, max)) = range {
        map.entry("minimum").or_insert(min);
        map.entry("maximum").or_insert(max);
    }
    // Only into keywords that hold subschemas: a property may be named `default` or
    // `const`, and a default or an example is a value, left as it was given.
    for (key, child) in map.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(integer_ranges)
            }
            ("prefixItems" | "anyOf" | "oneOf" | "allOf", Value::Array(items)) => {
                items.iter_mut().for_each(integer_ranges)
            }
            (
                "items"
                | "not"
                | "if"
                | "then"
                | "else"
                | "contains"
                | "additionalItems"
                | "propertyNames"
                | "unevaluatedItems"
                | "additionalProperties"
                | "unevaluatedProperties",
                child,
            ) => integer_ranges(child),
            _ => {}
        }
    }
}

/// The range of the integer type schemars names `format`.
fn integer_range(format: &str) -> Option<(Value, Value)> {
    use serde_json::json;
    Some(match format {
        "int8" => (json!(i8::MIN), json!(i8::MAX)),
        "int16" => (json!(i16::MIN), json!(i16::MAX)),
        "int32" => (json!(i32::MIN), json!(i32::MAX)),
        "int64" => (json!(i64::MIN), json!(i64::MAX)),
        "int" => (json!(isize::MIN), json!(isize::MAX)),
        "uint8" => (json!(0), json!(u8::MAX)),
        "uint16" => (json!(0), json!(u16::MAX)),
        "uint32" => (json!(0), json!(u32::MAX)),
        "uint64" => (json!(0), json!(u64::MAX)),
        "uint" => (json!(0), json!(usize::MAX)),
        _ => return None,
    })
}

/// The output schema of a tool's output type: what `serde_json::to_value` of a `T` produces,
/// as JSON Schema 2020-12 (schemars' serialize contract: a field skipped when empty is not
/// `required`). No `$schema` URL, subschemas inlined (recursive types keep `$defs`), boolean
/// subschemas written as objects. Unlike an input schema, `Option<T>` fields keep their
/// `null`: the output carries it. The root is whatever the type is (an object for a struct, an
/// array for a `Vec`); `definitions` decides how a format that wants an object carries it.
///
/// ```
/// # use idem_runtime::tool::{output_schema_for, ToolSpec};
/// #[derive(serde::Serialize, schemars::JsonSchema)]
/// struct Receipt { id: String, cents: u64 }
///
/// let spec = ToolSpec::new("charge").output_schema(output_schema_for::<Receipt>());
/// assert_eq!(spec.output_schema_value().unwrap()["type"], "object");
/// ```
pub fn output_schema_for<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .for_serialize()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    subschema_as_object(&mut value);
    if let Value::Object(root) = &mut value {
        root.remove("$schema");
    }
    value
}

/// Writes boolean subschemas (`true` for a `serde_json::Value` field, `false` for one that
/// takes nothing) as the objects `{}` and `{"not": {}}`: some published tool schemas (MCP
/// 2025-11-25) require every property's schema to be an object. Only keywords that hold
/// subschemas are rewritten (`default: true` or `uniqueItems: true` are values), and
/// `additionalProperties` keeps its boolean, which every format accepts.
pub(crate) fn objects_for_booleans(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    for (key, child) in map.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(subschema_as_object)
            }
            ("prefixItems" | "anyOf" | "oneOf" | "allOf", Value::Array(items)) => {
                items.iter_mut().for_each(subschema_as_object)
            }
            (
                "items" | "not" | "if" | "then" | "else" | "contains" | "additionalItems"
                | "propertyNames" | "unevaluatedItems",
                child,
            ) => subschema_as_object(child),
            ("additionalProperties" | "unevaluatedProperties", child @ Value::Object(_)) => {
                objects_for_booleans(child)
            }
            _ => {}
        }
    }
}

/// [`objects_for_booleans`] for a schema that may itself be a boolean.
pub(crate) fn subschema_as_object(v: &mut Value) {
    match v {
        Value::Bool(true) => *v = Value::Object(Map::new()),
        Value::Bool(false) => *v = serde_json::json!({"not": {}}),
        _ => objects_for_booleans(v),
    }
}

/// Renders each optional property (absent from `required`) as its plain type: `[T, "null"]`
/// becomes `T`, and `anyOf: [X, {"type": "null"}]` becomes `X`. Serde still accepts an
/// explicit `null` for an `Option`; the schema just doesn't advertise it.
fn drop_optional_nulls(v: &mut Value) {
    let Value::Object(map) = v else {
        if let Value::Array(items) = v {
            items.iter_mut().for_each(drop_optional_nulls);
        }
        return;
    };
    let required = required_names(map);
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        for (name, p) in props.iter_mut() {
            if !required.contains(name) {
                strip_null(p);
            }
        }
    }
    for (_, child) in map.iter_mut() {
        drop_optional_nulls(child);
    }
}

fn strip_null(p: &mut Value) {
    let Value::Object(map) = p else { return };
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            map.insert("type".into(), only);
        }
        return;
    }
    let is_null = |s: &Value| s.get("type").and_then(Value::as_str) == Some("null");
    if let Some(Value::Array(alts)) = map.get("anyOf") {
        if alts.len() == 2 && alts.iter().any(is_null) {
            let Some(Value::Array(alts)) = map.remove("anyOf") else {
                return;
            };
            if let Some(Value::Object(inner)) = alts.into_iter().find(|a| !is_null(a)) {
                for (k, v) in inner {
                    map.entry(k).or_insert(v);
                }
            }
        }
    }
}

fn normalize_root(value: Value) -> Value {
    let mut root = match value {
        Value::Object(map) => map,
        // `true`/`false` schemas: anything goes / nothing goes. Tools take objects.
        _ => Map::new(),
    };
    root.remove("$schema");
    let is_null_only = root.get("type").and_then(Value::as_str) == Some("null");
    if is_null_only {
        // `()` args: a tool without arguments.
        root.remove("type");
        root.remove("const");
        root.remove("title");
    }
    if !root.contains_key("type") {
        root.insert("type".into(), Value::String("object".into()));
    }
    if root.get("type").and_then(Value::as_str) == Some("object")
        && !root.contains_key("properties")
        && !root.contains_key("oneOf")
        && !root.contains_key("anyOf")
    {
        root.insert("properties".into(), Value::Object(Map::new()));
    }
    Value::Object(root)
}

/// The names an object schema lists under `required`.
pub(crate) fn required_names(map: &Map<String, Value>) -> Vec<String> {
    map.get("required")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
