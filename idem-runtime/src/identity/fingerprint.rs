//! The fingerprint: what the arguments of one operation were.

use std::fmt;

use sha2::{Digest, Sha256};

use super::hex::{decode_hex32, encode_hex};

/// SHA-256 of the canonical JSON of an operation's whole (typed, re-serialized) arguments:
/// exactly `sha256(canonical)`, so anyone can recompute it from the saved arguments.
///
/// A key says *which* operation; the fingerprint says *with what*. A repeat whose key matches
/// a saved record but whose fingerprint differs is "same key, changed parameters": it is
/// refused and nothing runs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprints canonical JSON bytes (see [`crate::identity::canonical`]).
    pub fn of_canonical(canonical_args: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(canonical_args).into())
    }

    /// Wraps raw digest bytes (as read back from a store).
    pub fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses 64 hex digits (as printed by `Display`).
    pub fn from_hex(s: &str) -> Option<Fingerprint> {
        decode_hex32(s).map(Fingerprint)
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        encode_hex(&self.0, &mut s);
        s
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Fingerprint::from_hex(&s).ok_or_else(|| serde::de::Error::custom("not a fingerprint"))
    }
}
