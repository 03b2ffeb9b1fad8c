//! Identity: canonical JSON, the idempotency key and the fingerprint.
//!
//! Everything downstream of here (claims, replays, refusals) trusts that one operation has
//! one key and one fingerprint however its arguments were spelled.

pub mod canonical;
mod fingerprint;
mod format;
mod hex;
mod key;
mod path;

pub use canonical::text::CanonicalJson;
pub use fingerprint::Fingerprint;
pub use format::{KeyFormat, KeyMigration, ParseKeyFormatError};
pub use key::{IdemKey, KeyMaterial, ParseKeyError, Scope};
pub(crate) use path::array_index;
pub use path::{ArgsPath, ArgsPathError, IdentityRules};

use serde::Serialize;
use serde_json::Value;

/// How many levels a call's arguments may nest (the registry's public
/// `MAX_ARGS_DEPTH`), in the value the caller gave and in the canonical arguments a claim
/// saves: half of serde_json's parser limit (128), so the forms that wrap the saved
/// arguments (a record's operation, a Redis field, an escalation's JSON line) still parse
/// with that limit on every backend, with room to spare.
pub(crate) const ARGS_DEPTH_LIMIT: usize = 64;

/// How many levels an output may nest to be kept (a handler's, a read-back's, a person's):
/// the arguments' limit, for the same reason. Every backend wraps the output it saves in a
/// form of its own that must parse back with serde_json's limit.
pub(crate) const OUTPUT_DEPTH_LIMIT: usize = ARGS_DEPTH_LIMIT;

/// Whether `value` nests deeper than `levels` arrays and objects. It descends at most
/// `levels + 1` frames whatever the value's depth (it stops at the first level past the
/// bound), and allocates nothing: it runs on every output a call saves.
pub(crate) fn nests_deeper_than(value: &Value, levels: usize) -> bool {
    // Only called below a container at `levels` >= 1.
    let deeper = |c: &Value| nests_deeper_than(c, levels - 1);
    match value {
        Value::Array(a) => levels == 0 || a.iter().any(deeper),
        Value::Object(o) => levels == 0 || o.values().any(deeper),
        _ => false,
    }
}

/// `output` (of `whose`: a tool's name, or "read-back") as a record can keep it: itself, or
/// null when it nests deeper than [`OUTPUT_DEPTH_LIMIT`] (logged as an error). For outputs of
/// effects that happened: the call is completed either way, and the stores must read back
/// what they save.
pub(crate) fn output_to_keep(output: Value, whose: &str) -> Value {
    if nests_deeper_than(&output, OUTPUT_DEPTH_LIMIT) {
        tracing::error!(
            whose,
            limit = OUTPUT_DEPTH_LIMIT,
            "output nests deeper than the stores can keep; saving null"
        );
        return Value::Null;
    }
    output
}

/// The registry's default limit on a call's arguments (the public
/// `DEFAULT_MAX_ARGS_BYTES`): 1 MiB of JSON text.
pub(crate) const ARGS_BYTES_DEFAULT: usize = 1 << 20;

/// The identity of one call's arguments: canonical bytes, fingerprint and key material.
#[derive(Clone, Debug)]
pub struct ArgsIdentity {
    /// Canonical JSON of the typed arguments, re-serialized.
    pub canonical: Vec<u8>,
    /// Fingerprint of `canonical`, or of `fingerprinted` when the tool excludes members.
    pub fingerprint: Fingerprint,
    /// Canonical JSON of the `key(…)` fields, when the tool names any.
    pub key_fields: Option<Vec<u8>>,
    /// Canonical JSON of the arguments without the members `exclude(…)` leaves out, when
    /// the tool excludes any: what the fingerprint (and whole-argument key material) is
    /// taken of. `None`: `canonical` is.
    pub fingerprinted: Option<Vec<u8>>,
}

impl ArgsIdentity {
    /// The canonical bytes the fingerprint is taken of: the arguments without the excluded
    /// members.
    pub fn fingerprinted_bytes(&self) -> &[u8] {
        self.fingerprinted.as_deref().unwrap_or(&self.canonical)
    }
}

/// Why arguments could not be given an identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// The typed arguments did not serialize to JSON.
    Serialize(String),
    /// `key(…)` names fields, but the arguments are not a JSON object.
    NotAnObject {
        /// The declared key fields.
        fields: Vec<String>,
    },
    /// A key field that begins with `/` is not a valid JSON Pointer.
    InvalidPath(ArgsPathError),
}

impl std::fmt::Display for IdentityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdentityError::Serialize(e) => write!(f, "arguments do not serialize to JSON: {e}"),
            IdentityError::NotAnObject { fields } => write!(
                f,
                "key fields {fields:?} need arguments that serialize to a JSON object"
            ),
            IdentityError::InvalidPath(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for IdentityError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IdentityError::InvalidPath(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ArgsPathError> for IdentityError {
    fn from(e: ArgsPathError) -> Self {
        IdentityError::InvalidPath(e)
    }
}

/// Computes the identity of typed arguments.
///
/// The arguments are re-serialized from their Rust type, so field order, whitespace, `49`
/// vs `49.0` for an `f64`, and fields the type ignores never split one operation into two.
/// The canonical bytes are exactly those of [`canonical::to_canonical_vec`] applied to
/// `serde_json::to_value(args)`, written in one pass without building that tree.
pub fn identify<A: Serialize + ?Sized, S: AsRef<str>>(
    args: &A,
    key_fields: &[S],
) -> Result<ArgsIdentity, IdentityError> {
    if key_fields.iter().any(|f| f.as_ref().starts_with('/')) {
        let rules = IdentityRules::new(key_fields.iter().map(AsRef::as_ref), None::<&str>)?;
        return identify_with(args, &rules);
    }
    use canonical::serializer::{to_canonical, KeyFields, Written};
    let Some(Written {
        bytes: canonical,
        key_fields: selected,
    }) = to_canonical(args, key_fields)
    else {
        // A shape (or an error) the one-pass writer leaves to the reference path.
        let value =
            serde_json::to_value(args).map_err(|e| IdentityError::Serialize(e.to_string()))?;
        return identify_value(&value, key_fields);
    };
    let key_fields = match selected {
        KeyFields::NotAsked => None,
        KeyFields::Selected(fields) => Some(fields),
        KeyFields::NotAnObject => return Err(not_an_object(key_fields)),
    };
    let fingerprint = Fingerprint::of_canonical(&canonical);
    Ok(ArgsIdentity {
        canonical,
        fingerprint,
        key_fields,
        fingerprinted: None,
    })
}

fn not_an_object<S: AsRef<str>>(key_fields: &[S]) -> IdentityError {
    IdentityError::NotAnObject {
        fields: key_fields.iter().map(|s| s.as_ref().to_owned()).collect(),
    }
}

/// [`identify`] for arguments already in JSON form (they should come from a typed value).
pub fn identify_value<S: AsRef<str>>(
    value: &Value,
    key_fields: &[S],
) -> Result<ArgsIdentity, IdentityError> {
    let rules = IdentityRules::new(key_fields.iter().map(AsRef::as_ref), None::<&str>)?;
    identify_value_with(value, &rules)
}

/// [`identify`] under a tool's [`IdentityRules`]: its key paths (member names or JSON
/// Pointers) and the paths it excludes from the fingerprint and the key.
pub fn identify_with<A: Serialize + ?Sized>(
    args: &A,
    rules: &IdentityRules,
) -> Result<ArgsIdentity, IdentityError> {
    if let Some(names) = rules.top_level_names() {
        return identify(args, &names);
    }
    let value = serde_json::to_value(args).map_err(|e| IdentityError::Serialize(e.to_string()))?;
    identify_value_with(&value, rules)
}

/// [`identify_with`] for arguments already in JSON form.
///
/// The canonical bytes are those of the whole arguments (what a claim saves); the
/// fingerprint and the key fields are taken of the arguments without the excluded members.
/// A key path the arguments have no value at reads as `null`, as an absent member does.
pub fn identify_value_with(
    value: &Value,
    rules: &IdentityRules,
) -> Result<ArgsIdentity, IdentityError> {
    let canonical = canonical::to_canonical_vec(value);
    let pruned = if rules.excluded_paths().is_empty() {
        None
    } else {
        let mut pruned = value.clone();
        for path in rules.excluded_paths() {
            path.remove(&mut pruned);
        }
        Some(pruned)
    };
    let fingerprinted = pruned.as_ref().map(canonical::to_canonical_vec);
    let fingerprint = Fingerprint::of_canonical(fingerprinted.as_deref().unwrap_or(&canonical));
    let keyed = pruned.as_ref().unwrap_or(value);
    let key_fields = if rules.key_paths().is_empty() {
        None
    } else {
        if !keyed.is_object() {
            let fields: Vec<&str> = rules.key_paths().iter().map(ArgsPath::as_str).collect();
            return Err(not_an_object(&fields));
        }
        let mut selected = serde_json::Map::new();
        for path in rules.key_paths() {
            // An `Option` field that is `None` may be skipped by serde; it is then absent, and
            // absent must mean the same as null or two spellings would get two keys.
            let v = path.resolve(keyed).cloned().unwrap_or(Value::Null);
            selected.insert(path.member_name().to_owned(), v);
        }
        Some(canonical::to_canonical_vec(&Value::Object(selected)))
    };
    Ok(ArgsIdentity {
        canonical,
        fingerprint,
        key_fields,
        fingerprinted,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::nests_deeper_than;

    fn nested(levels: usize) -> Value {
        let mut v = json!(0);
        for i in 0..levels {
            // Not `json!({"k": v})`: it serializes `v`, recursing as deep as `v` nests.
            v = if i % 2 == 0 {
                Value::Array(vec![v])
            } else {
                Value::Object(std::iter::once(("k".to_owned(), v)).collect())
            };
        }
        v
    }

    #[test]
    fn nesting_counts_arrays_and_objects_not_scalars() {
        assert!(!nests_deeper_than(&json!("text"), 0));
        assert!(nests_deeper_than(&json!([]), 0));
        assert!(!nests_deeper_than(&json!({"a": [1, {"b": 2}]}), 3));
        assert!(nests_deeper_than(&json!({"a": [1, {"b": {}}]}), 3));
        for levels in [1, 63, 64, 65, 500] {
            let v = nested(levels);
            assert!(!nests_deeper_than(&v, levels), "{levels}");
            assert!(nests_deeper_than(&v, levels - 1), "{levels}");
        }
    }

    #[test]
    fn a_value_deeper_than_the_stack_is_measured() {
        let deep = nested(200_000);
        assert!(nests_deeper_than(&deep, 64));
        // Taken apart level by level: its drop would recurse as deep as it nests.
        let mut rest = deep;
        loop {
            rest = match rest {
                Value::Array(mut a) => a.pop().unwrap_or(Value::Null),
                Value::Object(mut o) => o.remove("k").unwrap_or(Value::Null),
                _ => break,
            };
        }
    }
}
