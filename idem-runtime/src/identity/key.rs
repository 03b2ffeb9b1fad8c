//! The idempotency key: the stable identity of one intended operation.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::hex::{decode_hex32, encode_hex_into};
use super::Fingerprint;

/// Where saved results may be replayed: a run, optionally narrowed to a tenant and principal.
///
/// Two calls in different scopes never share a key, so a saved result never crosses a run or
/// a tenant boundary. Cheap to clone: every call's claim keeps a copy.
///
/// The boundary is only as good as the ids: a scope of a run id alone (what
/// `ToolCall::new` builds) separates tenants only if run ids are unique across them. When
/// one store serves several tenants, give every scope its tenant (and the registry
/// `require_tenant(true)`, which refuses calls without one). The scope comes from the host
/// (its session, its authenticated user), never from the model's arguments.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Scope {
    run_id: Arc<str>,
    tenant: Option<Arc<str>>,
    principal: Option<Arc<str>>,
}

impl Scope {
    /// A scope of one run (an agent session, a workflow instance, a task id).
    pub fn run(run_id: impl Into<String>) -> Self {
        Scope {
            run_id: Arc::from(run_id.into()),
            tenant: None,
            principal: None,
        }
    }

    /// Narrows the scope to a tenant.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(Arc::from(tenant.into()));
        self
    }

    /// Narrows the scope to a principal (the user or service the agent acts for).
    pub fn with_principal(mut self, principal: impl Into<String>) -> Self {
        self.principal = Some(Arc::from(principal.into()));
        self
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The tenant, when given.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The principal, when given.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }
}

/// What a key is derived from, besides scope and tool. See [`IdemKey::derive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMaterial<'a> {
    /// An intent id the caller minted (and stored) before the first send.
    Intent(&'a str),
    /// The canonical JSON of the fields named by `key(…)`.
    Fields(&'a [u8]),
    /// The canonical JSON of the whole arguments. Keyed by its fingerprint: the same key as
    /// [`KeyMaterial::ArgsFingerprint`] of these bytes.
    Args(&'a [u8]),
    /// The whole arguments by their fingerprint (SHA-256 of their canonical JSON), for a
    /// caller that has it already: the arguments are hashed once, for both.
    ArgsFingerprint(&'a Fingerprint),
}

impl KeyMaterial<'_> {
    fn tag(&self) -> &'static [u8] {
        match self {
            KeyMaterial::Intent(_) => b"intent",
            KeyMaterial::Fields(_) => b"fields",
            KeyMaterial::Args(_) | KeyMaterial::ArgsFingerprint(_) => b"args",
        }
    }

    /// Calls `f` with the bytes hashed into the key. Whole arguments enter as their
    /// fingerprint, however they were given.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            KeyMaterial::Intent(s) => f(s.as_bytes()),
            KeyMaterial::Fields(b) => f(b),
            KeyMaterial::Args(canonical) => f(Fingerprint::of_canonical(canonical).as_bytes()),
            KeyMaterial::ArgsFingerprint(fp) => f(fp.as_bytes()),
        }
    }
}

/// The idempotency key of one operation: `idem:` followed by 64 lowercase hex digits.
///
/// Always 69 ASCII characters, so it fits every downstream API that accepts an idempotency
/// key (Stripe allows 255). It is derived from the scope, the tool name and the key material —
/// never from a `tool_use_id` or an attempt number, which change on every retry.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdemKey(Arc<str>);

/// The prefix of every key.
const PREFIX: &str = "idem:";

impl IdemKey {
    /// Length in characters of every key.
    pub const LEN: usize = PREFIX.len() + 64;

    /// Derives the key of an operation.
    ///
    /// The digest is SHA-256 over a versioned, length-prefixed encoding of tenant, principal,
    /// run id, tool and key material (with its kind); lengths are LEB128 varints. Length
    /// prefixes, not separators, keep `("ab", "c")` and `("a", "bc")` apart even when a run id
    /// contains a NUL byte, and the kind keeps an intent id `"x"` apart from key fields whose
    /// canonical JSON happens to be `x`. For a typical call the whole input fits two SHA-256
    /// blocks.
    pub fn derive(scope: &Scope, tool: &str, material: KeyMaterial<'_>) -> IdemKey {
        let mut h = Sha256::new();
        h.update(b"idem-key/v2");
        let mut part = |bytes: &[u8]| {
            let mut len = [0u8; 10];
            let n = leb128(bytes.len() as u64, &mut len);
            h.update(&len[..n]);
            h.update(bytes);
        };
        part(scope.tenant.as_deref().unwrap_or("").as_bytes());
        part(&[u8::from(scope.tenant.is_some())]);
        part(scope.principal.as_deref().unwrap_or("").as_bytes());
        part(&[u8::from(scope.principal.is_some())]);
        part(scope.run_id.as_bytes());
        part(tool.as_bytes());
        part(material.tag());
        material.with_bytes(|bytes| part(bytes));
        IdemKey::from_digest(h.finalize().into())
    }

    fn from_digest(digest: [u8; 32]) -> IdemKey {
        // Formatted on the stack: the `Arc<str>` is the key's only allocation.
        let mut text = [0u8; Self::LEN];
        text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        encode_hex_into(&digest, &mut text[PREFIX.len()..]);
        let text = std::str::from_utf8(&text).expect("`idem:` and hex digits are ASCII");
        IdemKey(Arc::from(text))
    }

    /// Format v1's derivation (see [`super::KeyFormat::V1`]): `None` for material given only
    /// as a fingerprint, since v1 hashed the canonical bytes themselves.
    pub(super) fn derive_v1(
        scope: &Scope,
        tool: &str,
        material: KeyMaterial<'_>,
    ) -> Option<IdemKey> {
        let bytes: &[u8] = match material {
            KeyMaterial::Intent(s) => s.as_bytes(),
            KeyMaterial::Fields(b) | KeyMaterial::Args(b) => b,
            KeyMaterial::ArgsFingerprint(_) => return None,
        };
        let mut h = Sha256::new();
        h.update(b"idem-key/v1");
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(scope.tenant.as_deref().unwrap_or("").as_bytes());
        part(&[u8::from(scope.tenant.is_some())]);
        part(scope.principal.as_deref().unwrap_or("").as_bytes());
        part(&[u8::from(scope.principal.is_some())]);
        part(scope.run_id.as_bytes());
        part(tool.as_bytes());
        part(material.tag());
        part(bytes);
        Some(IdemKey::from_digest(h.finalize().into()))
    }

    /// The key that sorts before every other: a place to list from.
    pub(crate) fn lowest() -> IdemKey {
        IdemKey(format!("{PREFIX}{}", "0".repeat(64)).into())
    }

    /// Parses a key printed earlier (by [`IdemKey::as_str`], a store or the CLI).
    pub fn parse(s: &str) -> Result<IdemKey, ParseKeyError> {
        let hex = s.strip_prefix(PREFIX).ok_or(ParseKeyError)?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(ParseKeyError);
        }
        decode_hex32(hex).ok_or(ParseKeyError)?;
        Ok(IdemKey(s.into()))
    }

    /// The key as text, e.g. to send as a downstream `Idempotency-Key` header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdemKey({})", self.0)
    }
}

impl AsRef<str> for IdemKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for IdemKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for IdemKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        IdemKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Writes `n` as an unsigned LEB128 varint into `out`; returns its length.
fn leb128(mut n: u64, out: &mut [u8; 10]) -> usize {
    let mut i = 0;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out[i] = byte;
            return i + 1;
        }
        out[i] = byte | 0x80;
        i += 1;
    }
}

/// The text was not a key of the form `idem:` + 64 lowercase hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseKeyError;

impl fmt::Display for ParseKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an idem key: expected `idem:` followed by 64 lowercase hex digits")
    }
}

impl std::error::Error for ParseKeyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_shape() {
        let k = IdemKey::derive(&Scope::run("r1"), "charge", KeyMaterial::Args(b"{}"));
        assert_eq!(k.as_str().len(), IdemKey::LEN);
        assert!(k.as_str().is_ascii());
        assert_eq!(IdemKey::parse(k.as_str()).unwrap(), k);
        assert!(IdemKey::parse("idem:xyz").is_err());
        assert!(IdemKey::parse(&k.as_str().to_uppercase()).is_err());
    }

    #[test]
    fn tenant_absent_differs_from_tenant_empty() {
        let m = KeyMaterial::Args(b"{}");
        let a = IdemKey::derive(&Scope::run("r"), "t", m);
        let b = IdemKey::derive(&Scope::run("r").with_tenant(""), "t", m);
        assert_ne!(a, b);
    }

    #[test]
    fn leb128_lengths() {
        let enc = |n: u64| {
            let mut out = [0u8; 10];
            let len = leb128(n, &mut out);
            out[..len].to_vec()
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(u64::MAX).len(), 10);
    }

    #[test]
    fn material_kind_is_part_of_the_key() {
        let s = Scope::run("r");
        let a = IdemKey::derive(&s, "t", KeyMaterial::Intent("{}"));
        let fp = Fingerprint::of_canonical(b"{}");
        let b = IdemKey::derive(&s, "t", KeyMaterial::Args(b"{}"));
        assert_eq!(
            b,
            IdemKey::derive(&s, "t", KeyMaterial::ArgsFingerprint(&fp)),
            "canonical bytes and their fingerprint are one key"
        );
        let c = IdemKey::derive(&s, "t", KeyMaterial::Fields(b"{}"));
        assert_ne!(a, b);
        assert_ne!(b, c);
        assert_ne!(a, c);
    }
}
