//! Input schemas: generated once per tool from its `Args` type, shaped for strict clients.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// The input schema of an args type: root `"type": "object"` always, no `$schema` URL,
/// subschemas inlined (recursive types keep `$defs`), and `Option<T>` fields rendered as an
/// optional `T` (not in `required`) — the form every client accepts, where some reject
/// `"type": [T, "null"]`.
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
    value
}

/// Writes boolean subschemas (`true` for a `serde_json::Value` field, `false` for one that
/// takes nothing) as the objects `{}` and `{"not": {}}`: some published tool schemas (MCP
/// 2025-11-25) require every property's schema to be an object. Only keywords that hold
/// subschemas are rewritten (`default: true` or `uniqueItems: true` are values), and
/// `additionalProperties` keeps its boolean, which every format accepts.
fn objects_for_booleans(schema: &mut Value) {
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

fn subschema_as_object(v: &mut Value) {
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
    let required: Vec<String> = map
        .get("required")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
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

/// Rewrites a schema for OpenAI's strict mode: every object closed
/// (`additionalProperties: false`) with every property required, properties that were
/// optional made nullable instead, and `oneOf` written as the `anyOf` strict mode accepts.
///
/// An optional property with a default value (`#[serde(default)] limit: u32`, whose schema
/// says `"default": 0`) is required but not made nullable: serde fills in the default for an
/// absent field, not for a `null`, so a nullable type would invite a value the tool refuses.
/// The model then always sends a value. An `Option` field (no default, or `"default": null`)
/// becomes nullable: serde reads `null` as `None`.
///
/// `None` when the schema cannot be strict without changing what it accepts: a map (an
/// object whose other properties are open: closing it would leave the model only `{}`), or
/// a root that is a choice (`oneOf`/`anyOf`) rather than one object. Such a tool is offered
/// without strict mode.
pub fn to_strict(schema: &Value) -> Option<Value> {
    let root_is_choice = schema.get("properties").is_none()
        && (schema.get("oneOf").is_some() || schema.get("anyOf").is_some());
    if root_is_choice || has_open_map(schema) {
        return None;
    }
    let mut s = schema.clone();
    strictify(&mut s);
    Some(s)
}

/// True when some object in the schema takes properties it does not name
/// (`additionalProperties` a schema or `true`): a `HashMap` or a free-form object.
fn has_open_map(v: &Value) -> bool {
    match v {
        Value::Object(map) => {
            let open = match map.get("additionalProperties") {
                Some(Value::Bool(b)) => *b,
                Some(Value::Object(_)) => true,
                _ => false,
            };
            open || map.values().any(has_open_map)
        }
        Value::Array(items) => items.iter().any(has_open_map),
        _ => false,
    }
}

fn strictify(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                for p in props.values_mut() {
                    strictify(p);
                }
            }
            let is_object = map.get("type").and_then(Value::as_str) == Some("object")
                || map.contains_key("properties");
            if is_object {
                let required: Vec<String> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut all = Vec::new();
                if let Some(Value::Object(props)) = map.get_mut("properties") {
                    for (name, p) in props.iter_mut() {
                        if !required.contains(name) && !has_value_default(p) {
                            make_nullable(p);
                        }
                        all.push(Value::String(name.clone()));
                    }
                }
                map.insert("required".into(), Value::Array(all));
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            // Strict mode accepts `anyOf`, not `oneOf`; for serde's tagged enums, whose
            // branches never overlap, the two accept the same values.
            if let Some(branches) = map.remove("oneOf") {
                map.insert("anyOf".into(), branches);
            }
            for key in ["items", "anyOf", "allOf", "$defs", "prefixItems"] {
                match map.get_mut(key) {
                    Some(Value::Array(items)) => items.iter_mut().for_each(strictify),
                    Some(Value::Object(inner)) if key == "$defs" => {
                        inner.values_mut().for_each(strictify)
                    }
                    Some(inner @ Value::Object(_)) => strictify(inner),
                    _ => {}
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strictify),
        _ => {}
    }
}

/// A default other than `null`: the field is not an `Option`, so serde refuses `null` for it.
fn has_value_default(p: &Value) -> bool {
    p.get("default").is_some_and(|d| !d.is_null())
}

fn make_nullable(p: &mut Value) {
    let Value::Object(map) = p else { return };
    match map.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = std::mem::take(t);
            map.insert(
                "type".into(),
                Value::Array(vec![Value::String(t), Value::String("null".into())]),
            );
        }
        Some(Value::Array(types)) => {
            if !types.iter().any(|t| t == "null") {
                types.push(Value::String("null".into()));
            }
        }
        _ => {
            let inner = Value::Object(std::mem::take(map));
            map.insert(
                "anyOf".into(),
                Value::Array(vec![inner, serde_json::json!({"type": "null"})]),
            );
        }
    }
}
