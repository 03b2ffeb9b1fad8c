//! OpenAI strict mode: a tool's input schema rewritten to the rules strict mode enforces.

use serde_json::Value;

use crate::tool::schema::required_names;

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
                let required = required_names(map);
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
