//! Versions of the key and fingerprint derivation, and how a store moves between them.
//!
//! Keys and fingerprints are persisted: a record claimed by one build is found by the key the
//! next build derives. A build that derived keys another way would find nothing and run the
//! operation again, so a format change must never reach a store by itself. [`KeyMigration`]
//! is how it does reach one: for a while a registry honours claims made under two formats.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::{ArgsIdentity, Fingerprint, IdemKey, KeyMaterial, Scope};

/// A version of the key and fingerprint derivation (`docs/keys.md`, section 6).
///
/// Each version names a byte layout, a key material and a fingerprint, fixed forever: a
/// change gets a new version, never new bytes under an old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum KeyFormat {
    /// Domain tag `idem-key/v1`, used by development builds before format v2: 8-byte
    /// big-endian length prefixes, whole arguments keyed by their canonical bytes, and the
    /// fingerprint `SHA-256("idem-fingerprint/v1" ‖ 0x00 ‖ canonical)`.
    V1,
    /// Domain tag `idem-key/v2`, the current format: LEB128 length prefixes, whole arguments
    /// keyed by their fingerprint, and the fingerprint `SHA-256(canonical)`.
    V2,
}

impl KeyFormat {
    /// The format this build claims under unless a [`KeyMigration`] says otherwise.
    pub const CURRENT: KeyFormat = KeyFormat::V2;

    /// Every format this build can derive, oldest first.
    pub const ALL: [KeyFormat; 2] = [KeyFormat::V1, KeyFormat::V2];

    /// The domain tag that opens the hashed input, e.g. `"idem-key/v2"`.
    pub fn domain_tag(self) -> &'static str {
        match self {
            KeyFormat::V1 => "idem-key/v1",
            KeyFormat::V2 => "idem-key/v2",
        }
    }

    /// The short name used in configuration and logs: `"v1"`, `"v2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyFormat::V1 => "v1",
            KeyFormat::V2 => "v2",
        }
    }

    /// The format this one replaced, if any.
    pub fn previous(self) -> Option<KeyFormat> {
        match self {
            KeyFormat::V1 => None,
            KeyFormat::V2 => Some(KeyFormat::V1),
        }
    }

    /// Derives an operation's key under this format.
    ///
    /// `None` only when the format cannot be computed from the material given: format v1 keys
    /// whole arguments by their canonical bytes, so it needs [`KeyMaterial::Args`], not
    /// [`KeyMaterial::ArgsFingerprint`].
    pub fn key(self, scope: &Scope, tool: &str, material: KeyMaterial<'_>) -> Option<IdemKey> {
        match self {
            KeyFormat::V1 => IdemKey::derive_v1(scope, tool, material),
            KeyFormat::V2 => Some(IdemKey::derive(scope, tool, material)),
        }
    }

    /// The key and fingerprint of one operation under this format: its scope, tool, intent
    /// id (if the caller gave one) and the identity of its arguments (with the tool's key
    /// fields selected, if it names any). `tool` is the name keys are derived under: the
    /// tool's key name ([`crate::tool::ToolSpec::key_name`]), by default its name. The
    /// material follows the usual precedence: the
    /// intent id, else the key fields, else the whole arguments.
    pub fn identify(
        self,
        scope: &Scope,
        tool: &str,
        intent: Option<&str>,
        args: &ArgsIdentity,
    ) -> Option<(IdemKey, Fingerprint)> {
        let material = match (intent, &args.key_fields) {
            (Some(intent), _) => KeyMaterial::Intent(intent),
            (None, Some(fields)) => KeyMaterial::Fields(fields),
            // The current format keys whole arguments by their fingerprint, already taken.
            (None, None) if self == KeyFormat::V2 => {
                KeyMaterial::ArgsFingerprint(&args.fingerprint)
            }
            (None, None) => KeyMaterial::Args(args.fingerprinted_bytes()),
        };
        let key = self.key(scope, tool, material)?;
        let fingerprint = if self == KeyFormat::V2 {
            args.fingerprint
        } else {
            self.fingerprint(args.fingerprinted_bytes())
        };
        Some((key, fingerprint))
    }

    /// The fingerprint of canonical arguments under this format.
    pub fn fingerprint(self, canonical_args: &[u8]) -> Fingerprint {
        match self {
            KeyFormat::V1 => {
                let mut h = Sha256::new();
                h.update(b"idem-fingerprint/v1\0");
                h.update(canonical_args);
                Fingerprint::from_bytes(h.finalize().into())
            }
            KeyFormat::V2 => Fingerprint::of_canonical(canonical_args),
        }
    }
}

impl fmt::Display for KeyFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text named no key format this build knows (`"v1"`, `"v2"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseKeyFormatError(String);

impl fmt::Display for ParseKeyFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown key format {:?}: this build knows \"v1\" and \"v2\"",
            self.0
        )
    }
}

impl std::error::Error for ParseKeyFormatError {}

impl FromStr for KeyFormat {
    type Err = ParseKeyFormatError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyFormat::ALL
            .into_iter()
            .find(|f| f.as_str() == s || f.domain_tag() == s)
            .ok_or_else(|| ParseKeyFormatError(s.to_owned()))
    }
}

/// Which key format a registry claims under, and which other format's claims it honours.
///
/// Without a migration a registry claims under [`KeyFormat::CURRENT`] and looks nowhere
/// else: a repeat of an operation claimed under another format would find no record and run
/// again. A migration closes that gap for one step between two formats, in two phases of a
/// rolling upgrade (`docs/keys.md`, section 6):
///
/// 1. [`KeyMigration::claim_previous`] while builds of the previous format still run: the new
///    build claims under the *previous* format, so old and new builds contend for one key, and
///    it also honours claims under the current one.
/// 2. [`KeyMigration::honour_previous`] once no build of the previous format is left: claims
///    go under the current format, and a claim found under the previous format's key is this
///    operation's claim (replayed, waited for, or refused on changed parameters, exactly as if
///    it had been found under the new key). Keep it for at least the result plus tombstone
///    retention after the last claim under the previous format.
///
/// Honouring a second format costs one extra store read per call before the claim, and one
/// after a won claim (which closes the race with a worker claiming under the other format in
/// between; if both find each other, both stand back and try again, and a call that keeps
/// colliding reports "in flight"). A reconciler of a registry with a migration also looks
/// under the other format's key before it sends an operation again or frees its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyMigration {
    claim: KeyFormat,
    honour: Option<KeyFormat>,
}

impl KeyMigration {
    /// No migration: claim under [`KeyFormat::CURRENT`], honour nothing else.
    pub const fn none() -> KeyMigration {
        KeyMigration {
            claim: KeyFormat::CURRENT,
            honour: None,
        }
    }

    /// Claims under `format` and honours nothing else: what a build of that format does.
    pub const fn claim_under(format: KeyFormat) -> KeyMigration {
        KeyMigration {
            claim: format,
            honour: None,
        }
    }

    /// Also honours claims found under `other` (ignored when it is the claim format).
    pub fn honouring(mut self, other: KeyFormat) -> KeyMigration {
        self.honour = (other != self.claim).then_some(other);
        self
    }

    /// Phase 1 of an upgrade from `previous`: claim under `previous`, honour the current format.
    pub fn claim_previous(previous: KeyFormat) -> KeyMigration {
        KeyMigration::claim_under(previous).honouring(KeyFormat::CURRENT)
    }

    /// Phase 2 of an upgrade from `previous`: claim under the current format, honour `previous`.
    pub fn honour_previous(previous: KeyFormat) -> KeyMigration {
        KeyMigration::claim_under(KeyFormat::CURRENT).honouring(previous)
    }

    /// The format new claims are made under.
    pub fn claim_format(&self) -> KeyFormat {
        self.claim
    }

    /// The other format whose claims are honoured, if any.
    pub fn honoured_format(&self) -> Option<KeyFormat> {
        self.honour
    }
}

impl Default for KeyMigration {
    fn default() -> Self {
        KeyMigration::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_is_the_plain_derivation() {
        let scope = Scope::run("r").with_tenant("t");
        let m = KeyMaterial::Args(br#"{"a":1}"#);
        assert_eq!(
            KeyFormat::V2.key(&scope, "charge", m),
            Some(IdemKey::derive(&scope, "charge", m))
        );
        assert_eq!(
            KeyFormat::V2.fingerprint(b"{}"),
            Fingerprint::of_canonical(b"{}")
        );
    }

    #[test]
    fn formats_give_different_keys_and_fingerprints() {
        let scope = Scope::run("r");
        for m in [
            KeyMaterial::Args(b"{}"),
            KeyMaterial::Intent("order-1"),
            KeyMaterial::Fields(br#"{"id":1}"#),
        ] {
            assert_ne!(
                KeyFormat::V1.key(&scope, "t", m),
                KeyFormat::V2.key(&scope, "t", m)
            );
        }
        assert_ne!(
            KeyFormat::V1.fingerprint(b"{}"),
            KeyFormat::V2.fingerprint(b"{}")
        );
        let fp = Fingerprint::of_canonical(b"{}");
        assert_eq!(
            KeyFormat::V1.key(&scope, "t", KeyMaterial::ArgsFingerprint(&fp)),
            None
        );
    }

    #[test]
    fn names_round_trip() {
        for f in KeyFormat::ALL {
            assert_eq!(f.as_str().parse::<KeyFormat>(), Ok(f));
            assert_eq!(f.domain_tag().parse::<KeyFormat>(), Ok(f));
        }
        assert!("v3".parse::<KeyFormat>().is_err());
    }

    #[test]
    fn a_migration_never_honours_its_own_claim_format() {
        let m = KeyMigration::claim_under(KeyFormat::V2).honouring(KeyFormat::V2);
        assert_eq!(m.honoured_format(), None);
        let m = KeyMigration::honour_previous(KeyFormat::V1);
        assert_eq!(
            (m.claim_format(), m.honoured_format()),
            (KeyFormat::V2, Some(KeyFormat::V1))
        );
        let m = KeyMigration::claim_previous(KeyFormat::V1);
        assert_eq!(
            (m.claim_format(), m.honoured_format()),
            (KeyFormat::V1, Some(KeyFormat::V2))
        );
    }
}
