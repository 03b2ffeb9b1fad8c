//! [`CanonicalJson`]: canonical JSON text, shared, parsed only when someone looks inside.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::to_canonical_vec;

/// JSON text in canonical form (see [`super::write_canonical`]): how an operation's arguments
/// are saved with its claim.
///
/// The executor already has these bytes (they are what the fingerprint hashes), so saving
/// them costs no second serialization, and a repeat that only replays never builds a
/// `serde_json::Value` at all. The value is parsed on first use (through `Deref`, e.g.
/// `args["customer"]`) and kept. Clones share one allocation; equality compares the text,
/// which for canonical JSON is equality of the values.
#[derive(Clone)]
pub struct CanonicalJson(Arc<Inner>);

struct Inner {
    text: String,
    value: OnceLock<Value>,
}

impl CanonicalJson {
    /// The canonical form of `value`.
    pub fn from_value(value: &Value) -> Self {
        Self::from_canonical_bytes(to_canonical_vec(value))
    }

    /// Wraps bytes written by this module's canonical writers (valid UTF-8 JSON).
    pub(crate) fn from_canonical_bytes(bytes: Vec<u8>) -> Self {
        let text = String::from_utf8(bytes).unwrap_or_else(|e| {
            // The writers only emit `str` contents and ASCII; keep going rather than panic.
            debug_assert!(false, "canonical writer emitted invalid UTF-8: {e}");
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        });
        debug_assert!(
            serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok(),
            "canonical writer emitted invalid JSON: {text}"
        );
        CanonicalJson(Arc::new(Inner {
            text,
            value: OnceLock::new(),
        }))
    }

    /// The canonical JSON text.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// The parsed value (parsed once, on first use).
    pub fn value(&self) -> &Value {
        self.0.value.get_or_init(|| {
            // Canonical text is valid JSON by construction; null is only a last resort.
            serde_json::from_str(&self.0.text).unwrap_or(Value::Null)
        })
    }

    /// Deserializes the text straight into `T` (no intermediate `Value`).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0.text)
    }
}

impl Deref for CanonicalJson {
    type Target = Value;
    fn deref(&self) -> &Value {
        self.value()
    }
}

impl AsRef<Value> for CanonicalJson {
    fn as_ref(&self) -> &Value {
        self.value()
    }
}

impl From<Value> for CanonicalJson {
    fn from(value: Value) -> Self {
        // Not kept: under serde_json's `preserve_order` its maps would serialize in the
        // caller's order; the value parsed back from the canonical text is in key order.
        CanonicalJson::from_value(&value)
    }
}

impl From<&Value> for CanonicalJson {
    fn from(value: &Value) -> Self {
        CanonicalJson::from_value(value)
    }
}

impl PartialEq for CanonicalJson {
    fn eq(&self, other: &Self) -> bool {
        self.0.text == other.0.text
    }
}

impl Eq for CanonicalJson {}

impl std::hash::Hash for CanonicalJson {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.text.hash(state);
    }
}

impl PartialEq<Value> for CanonicalJson {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl fmt::Debug for CanonicalJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CanonicalJson({})", self.0.text)
    }
}

impl fmt::Display for CanonicalJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text)
    }
}

/// Serialized as the JSON value itself (not a string holding it), in every format.
impl serde::Serialize for CanonicalJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(s)
    }
}

/// Accepts any JSON value and keeps its canonical form.
impl<'de> serde::Deserialize<'de> for CanonicalJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(CanonicalJson::from)
    }
}
