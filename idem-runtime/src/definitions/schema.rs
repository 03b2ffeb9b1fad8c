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
    value
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
/// (`additionalProperties: false`) with every property required, and properties that were
/// optional made nullable instead.
pub fn to_strict(schema: &Value) -> Value {
    let mut s = schema.clone();
    strictify(&mut s);
    s
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
                        if !required.contains(name) {
                            make_nullable(p);
                        }
                        all.push(Value::String(name.clone()));
                    }
                }
                map.insert("required".into(), Value::Array(all));
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for key in ["items", "anyOf", "oneOf", "allOf", "$defs", "prefixItems"] {
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
