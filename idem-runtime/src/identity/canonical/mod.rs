//! Canonical JSON: one byte string per JSON value, whatever the field order.
//!
//! Object keys are sorted here, explicitly, by their UTF-8 bytes. We never rely on the
//! iteration order of `serde_json::Map`: any crate in the build can switch that map to
//! insertion order through the `preserve_order` feature (cargo unifies features), and then
//! two spellings of one operation would hash to two keys — a duplicate charge.

pub(crate) mod serializer;
pub(super) mod text;

use std::io::Write as _;

use serde_json::Value;

/// Writes the canonical form of `value` into `out`.
///
/// The form is compact JSON (no whitespace) with every object's keys sorted by their UTF-8
/// bytes at every depth. Strings and numbers are written the way `serde_json` writes them, so
/// the output is always valid JSON that parses back to an equal value.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        // `Display` is exactly what `Number::to_string` gave, without the heap string.
        Value::Number(n) => write!(out, "{n}").expect("writing to a Vec cannot fail"),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // The default map iterates in key order already; checking that is cheap and
            // skips the sort's allocation. Under `preserve_order` the check fails and we sort:
            // correctness never depends on which map serde_json was built with.
            let sorted = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            if sorted {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_entries(entries.into_iter(), out);
            }
        }
    }
}

fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(k, out);
        out.push(b':');
        write_canonical(v, out);
    }
    out.push(b'}');
}

/// Returns the canonical form of `value` (see [`write_canonical`]).
pub fn to_canonical_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    out
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // serde_json escapes exactly the control characters, `"` and `\`; a string without any
    // of them (almost every one) is written as is, the same bytes serde_json would write.
    if !s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        return;
    }
    // serde_json's string escaping is exact and cannot fail for a `str` written to a Vec.
    serde_json::to_writer(&mut *out, s).expect("writing a JSON string to a Vec cannot fail");
}

/// How many levels `json` (valid compact JSON, such as canonical bytes) nests, counted as
/// the registry counts a value's depth: a scalar or an empty container is one level, and
/// each container adds one to its deepest member. One pass over the bytes, no recursion.
pub(crate) fn nesting_levels(json: &[u8]) -> usize {
    let (mut open, mut deepest) = (0usize, 0usize);
    let mut bytes = json.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'[' | b'{' => {
                open += 1;
                deepest = deepest.max(open);
            }
            b']' | b'}' => open = open.saturating_sub(1),
            b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => {}
            b'"' => {
                // A string (a key counts as its member's level, which follows it).
                deepest = deepest.max(open + 1);
                while let Some(&c) = bytes.next() {
                    match c {
                        b'\\' => {
                            bytes.next();
                        }
                        b'"' => break,
                        _ => {}
                    }
                }
            }
            // A number, `true`, `false` or `null`.
            _ => deepest = deepest.max(open + 1),
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"y": [ {"d": 1, "c": 2} ], "x": null}});
        let bytes = to_canonical_vec(&a);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"a":{"x":null,"y":[{"c":2,"d":1}]},"b":1}"#
        );
    }

    #[test]
    fn escapes_strings_and_keeps_array_order() {
        let v = json!({"k\"ey": ["z", "a\n", 1.5, -0, true]});
        let bytes = to_canonical_vec(&v);
        let back: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, v);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"k\"ey":["z","a\n",1.5,0,true]}"#
        );
    }
}
