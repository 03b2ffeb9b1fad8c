//! Paths into a call's arguments: what `key(…)` keys by and what `exclude(…)` leaves out.
//!
//! A path is either a top-level member name (`customer`) or a JSON Pointer (RFC 6901,
//! `/customer/id`): text that begins with `/` is a pointer, anything else a name.

use std::fmt;

use serde_json::Value;

/// A part of a call's arguments: a top-level member name, or a JSON Pointer (RFC 6901) into
/// nested values. Text that begins with `/` is a pointer; any other text is a member name,
/// taken as it is.
///
/// ```
/// # use idem_runtime::identity::ArgsPath;
/// let p = ArgsPath::parse("/customer/id").unwrap();
/// assert_eq!(p.tokens(), ["customer", "id"]);
/// assert_eq!(p.member_name(), "/customer/id");
/// // A one-step pointer is the member it names: the same key material as `key(invoice)`.
/// assert_eq!(ArgsPath::parse("/invoice").unwrap().member_name(), "invoice");
/// assert_eq!(ArgsPath::parse("invoice").unwrap().member_name(), "invoice");
/// assert!(ArgsPath::parse("/bad~2escape").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ArgsPath {
    /// The text as declared.
    text: String,
    /// The reference tokens, unescaped (`~1` → `/`, `~0` → `~`).
    tokens: Vec<String>,
}

/// A pointer that is not a valid JSON Pointer (RFC 6901): a `~` not followed by `0` or `1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgsPathError {
    path: String,
    reason: &'static str,
}

impl std::fmt::Display for ArgsPathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` is not a valid JSON Pointer: {}",
            self.path, self.reason
        )
    }
}

impl std::error::Error for ArgsPathError {}

impl ArgsPathError {
    /// The path as it was given.
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl ArgsPath {
    /// Reads a path: a JSON Pointer when `text` begins with `/`, a top-level member name
    /// otherwise.
    pub fn parse(text: &str) -> Result<ArgsPath, ArgsPathError> {
        let Some(rest) = text.strip_prefix('/') else {
            return Ok(ArgsPath {
                text: text.to_owned(),
                tokens: vec![text.to_owned()],
            });
        };
        let tokens = rest
            .split('/')
            .map(|token| {
                unescape(token).map_err(|reason| ArgsPathError {
                    path: text.to_owned(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ArgsPath {
            text: text.to_owned(),
            tokens,
        })
    }

    /// The path as declared.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The reference tokens from the arguments' root, unescaped: `["customer", "id"]`.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// Whether the path reaches below the top level.
    pub fn is_nested(&self) -> bool {
        self.tokens.len() > 1
    }

    /// The member name this path's value has in the key-fields object (`docs/keys.md`,
    /// section 3.1): a top-level member is its name, whether declared as `invoice` or
    /// `/invoice` (unless that name itself begins with `/`); any other pointer is its text.
    pub fn member_name(&self) -> &str {
        match self.tokens.as_slice() {
            [only] if !only.starts_with('/') => only,
            _ => &self.text,
        }
    }

    /// The value at this path; `None` when the arguments have none there (a missing member,
    /// an index past the end, a step into a scalar).
    pub(crate) fn resolve<'a>(&self, root: &'a Value) -> Option<&'a Value> {
        let mut at = root;
        for token in &self.tokens {
            at = match at {
                Value::Object(map) => map.get(token)?,
                Value::Array(items) => items.get(array_index(token)?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// Removes the object member this path names, if the arguments have it. A path whose last
    /// step is into an array removes nothing: leaving an element out would move the others.
    pub(crate) fn remove(&self, root: &mut Value) {
        let Some((last, parents)) = self.tokens.split_last() else {
            return;
        };
        let mut at = root;
        for token in parents {
            at = match at {
                Value::Object(map) => match map.get_mut(token) {
                    Some(next) => next,
                    None => return,
                },
                Value::Array(items) => match array_index(token).and_then(|i| items.get_mut(i)) {
                    Some(next) => next,
                    None => return,
                },
                _ => return,
            };
        }
        if let Value::Object(map) = at {
            map.remove(last);
        }
    }

    /// Whether this path is `other` or lies inside the value `other` names.
    pub fn is_within(&self, other: &ArgsPath) -> bool {
        self.tokens.starts_with(&other.tokens)
    }
}

impl fmt::Display for ArgsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// An array index token as RFC 6901 spells one: `0`, or digits without a leading zero.
pub(crate) fn array_index(token: &str) -> Option<usize> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    token.parse().ok()
}

fn unescape(token: &str) -> Result<String, &'static str> {
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c != '~' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('0') => out.push('~'),
            Some('1') => out.push('/'),
            _ => return Err("`~` must be followed by `0` (for `~`) or `1` (for `/`)"),
        }
    }
    Ok(out)
}

/// What of a tool's arguments identifies an operation: the `key(…)` paths (the key
/// material), and the `exclude(…)` paths, left out of both the fingerprint and the key.
///
/// The default names nothing: the whole arguments are fingerprinted and, without an intent
/// id, keyed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdentityRules {
    key: Vec<ArgsPath>,
    exclude: Vec<ArgsPath>,
}

impl IdentityRules {
    /// Rules of these key paths and exclusions (each a member name or a JSON Pointer).
    pub fn new<K, E>(key: K, exclude: E) -> Result<IdentityRules, ArgsPathError>
    where
        K: IntoIterator,
        K::Item: AsRef<str>,
        E: IntoIterator,
        E::Item: AsRef<str>,
    {
        let parse = |p: &dyn AsRef<str>| ArgsPath::parse(p.as_ref());
        Ok(IdentityRules {
            key: key
                .into_iter()
                .map(|p| parse(&p))
                .collect::<Result<_, _>>()?,
            exclude: exclude
                .into_iter()
                .map(|p| parse(&p))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The key paths.
    pub fn key_paths(&self) -> &[ArgsPath] {
        &self.key
    }

    /// The excluded paths.
    pub fn excluded_paths(&self) -> &[ArgsPath] {
        &self.exclude
    }

    /// Top-level key names only and no exclusion: the one-pass writer computes everything.
    pub(crate) fn top_level_names(&self) -> Option<Vec<&str>> {
        if !self.exclude.is_empty() || self.key.iter().any(|p| p.text.starts_with('/')) {
            return None;
        }
        Some(self.key.iter().map(|p| p.text.as_str()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointers_follow_rfc_6901() {
        let doc = json!({"a/b": 1, "m~n": 2, "": 3, "list": [10, 20], "o": {"0": "zero"}});
        let at = |p: &str| ArgsPath::parse(p).unwrap().resolve(&doc).cloned();
        assert_eq!(at("/a~1b"), Some(json!(1)));
        assert_eq!(at("/m~0n"), Some(json!(2)));
        assert_eq!(at("/"), Some(json!(3)));
        assert_eq!(at("/list/1"), Some(json!(20)));
        assert_eq!(at("/list/01"), None);
        assert_eq!(at("/list/-"), None);
        assert_eq!(at("/list/2"), None);
        assert_eq!(at("/o/0"), Some(json!("zero")));
        assert_eq!(at("/list/0/deeper"), None);
        for bad in ["/~", "/a~2", "/~x/y"] {
            assert!(ArgsPath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn member_names_of_one_step_pointers_are_the_member() {
        let name = |p: &str| ArgsPath::parse(p).unwrap().member_name().to_owned();
        assert_eq!(name("invoice"), "invoice");
        assert_eq!(name("/invoice"), "invoice");
        assert_eq!(name("/m~0n"), "m~n");
        assert_eq!(name("/"), "");
        // A name that begins with `/` stays a pointer, so it cannot pass for a deeper one.
        assert_eq!(name("/~1a"), "/~1a");
        assert_eq!(name("/a/b"), "/a/b");
    }

    #[test]
    fn removal_takes_object_members_only() {
        let mut doc = json!({"note": {"text": "x", "tag": 1}, "list": [1, 2]});
        ArgsPath::parse("/note/text").unwrap().remove(&mut doc);
        ArgsPath::parse("/list/0").unwrap().remove(&mut doc);
        ArgsPath::parse("/absent/deeper").unwrap().remove(&mut doc);
        assert_eq!(doc, json!({"note": {"tag": 1}, "list": [1, 2]}));
    }
}
