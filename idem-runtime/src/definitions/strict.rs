//! OpenAI strict mode: a tool's input schema rewritten to the rules strict mode enforces.

use serde_json::Value;

use crate::tool::schema::required_names;

/// Rewrites a schema for OpenAI's strict mode: every object closed
/// (`additionalProperties: false`) with every property required, properties that were
/// optional made nullable instead, `oneOf` written as the `anyOf` strict mode accepts, and
/// the keywords strict mode refuses left out: `format` anywhere but on a string (where only
/// the formats it knows stay), and annotations such as `default`, `examples`, `deprecated`.
/// Integers keep their range as `minimum` and `maximum`, which strict mode takes.
///
/// An optional property with a default value (`#[serde(default)] limit: u32`, whose schema
/// says `"default": 0`) is required but not made nullable: serde fills in the default for an
/// absent field, not for a `null`, so a nullable type would invite a value the tool refuses.
/// The model then always sends a value, and the `default` itself is left out (strict mode
/// refuses the keyword). An `Option` field (no default, or `"default": null`)
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
    drop_unsupported(&mut s);
    Some(s)
}

/// The string formats strict mode accepts; any other `format` value is refused.
const STRING_FORMATS: [&str; 9] = [
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

/// Keywords strict mode refuses (it takes a subset of JSON Schema: per type, `pattern` and a
/// few `format`s for strings, `minimum`, `maximum`, their exclusive forms and `multipleOf`
/// for numbers, `minItems` and `maxItems` for arrays) that can go without changing what the
/// call accepts: each is an annotation, or a constraint serde does not enforce on the
/// arguments anyway, so leaving it out only loosens the schema.
const DROPPED: [&str; 15] = [
    // Annotations. A `default` is one once its property is required (see `to_strict`).
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    // Constraints schemars writes only when asked (`#[schemars(length(..))]`, a set's
    // `uniqueItems`); serde enforces none of them.
    "minLength",
    "maxLength",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "contentEncoding",
    "contentMediaType",
    "minContains",
    "maxContains",
];

/// Removes, from every subschema, the keywords strict mode refuses: those in [`DROPPED`], and
/// `format` except on a string with one of [`STRING_FORMATS`] (schemars names the width of an
/// integer in it, `"format": "uint32"`, which strict mode does not take; the width is
/// carried by `minimum` and `maximum`).
fn drop_unsupported(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    for keyword in DROPPED {
        map.remove(keyword);
    }
    let is_string = match map.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    };
    let supported = is_string
        && map
            .get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| STRING_FORMATS.contains(&f));
    if !supported {
        map.remove("format");
    }
    for (key, child) in map.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(drop_unsupported)
            }
            ("anyOf" | "allOf" | "prefixItems", Value::Array(items)) => {
                items.iter_mut().for_each(drop_unsupported)
            }
            ("items" | "additionalProperties" | "not", child) => drop_unsupported(child),
            _ => {}
        }
    }
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
