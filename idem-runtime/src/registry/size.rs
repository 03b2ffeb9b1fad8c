//! The size limit on a caller's JSON value, checked without writing the value out when its
//! shape alone proves it fits.

use std::fmt::Write as _;

use serde_json::Value;

/// Why a caller's value was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its compact text is this many bytes, over the limit.
    TooLarge(usize),
    /// It nests deeper than [`MAX_ARGS_DEPTH`].
    TooDeep,
}

/// Checks that `value`'s compact JSON text is at most `limit` bytes and that it nests at
/// most [`MAX_ARGS_DEPTH`] levels.
///
/// Every call pays this check, and almost every call is far under the limit. A bound from
/// the tree's shape (strings counted at their worst-case escaping, no byte scanned, nothing
/// allocated) settles those in one walk over the nodes; only a value whose bound exceeds the
/// limit, or that nests deeper than [`BOUND_DEPTH`], is measured exactly, by an iterative
/// walk, so a caller's deeply nested value cannot overflow the stack here (serde_json's
/// writer would recurse).
///
/// The depth check comes first on the slow path and never recurses: every later step
/// (canonical JSON, decoding into the arguments' type, dropping the value) walks the tree
/// recursively, and a caller-built value a few thousand levels deep would overflow the
/// stack there and abort the process.
pub(crate) fn check(value: &Value, limit: usize) -> Result<(), Refused> {
    let mut budget = limit;
    // Within the bound's depth the value is within MAX_ARGS_DEPTH too.
    if within_bound(value, &mut budget, 0) {
        return Ok(());
    }
    match exact_len(value, limit, MAX_ARGS_DEPTH) {
        Ok(_) => Ok(()),
        // Too large wins over too deep, as it does for text (whose length is checked first):
        // the size, measured whatever the depth (the walk does not recurse).
        Err(_) => match exact_len(value, usize::MAX, usize::MAX) {
            Ok(size) if size > limit => Err(Refused::TooLarge(size)),
            Ok(_) => Err(Refused::TooDeep),
            Err(_) => Err(Refused::TooLarge(usize::MAX)),
        },
    }
}

/// Drops a value of any depth without recursing: `Value`'s own drop recurses once per level,
/// so a refused value thousands of levels deep would overflow the stack on its way out.
pub(crate) fn dispose(value: Value) {
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// How many levels a call's arguments may nest (a scalar is one level, each array or object
/// around it one more), whether they arrive as a value or as text, and as the canonical
/// arguments a claim saves: deeper ones are refused as invalid arguments before anything
/// runs. Half of serde_json's parser limit (128), so the stored forms that wrap the
/// arguments (a record's operation, an escalation's JSON line) read back on every backend.
pub const MAX_ARGS_DEPTH: usize = crate::identity::ARGS_DEPTH_LIMIT;

/// How deep the recursive bound walks before it leaves the value to the exact walk: a value
/// it accepts (containers at depths 0 to `BOUND_DEPTH - 1`, leaves at most one deeper)
/// nests at most `BOUND_DEPTH + 1` levels, within [`MAX_ARGS_DEPTH`].
const BOUND_DEPTH: usize = MAX_ARGS_DEPTH - 1;

/// Takes an upper bound of `value`'s text from `budget`: false as soon as it does not fit
/// (or the value nests deeper than [`BOUND_DEPTH`]).
fn within_bound(value: &Value, budget: &mut usize, depth: usize) -> bool {
    let size = match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(n) => number_bound(n),
        Value::String(s) => string_bound(s),
        Value::Array(items) => {
            if depth == BOUND_DEPTH || !take(budget, 2 + items.len()) {
                return false;
            }
            return items.iter().all(|v| within_bound(v, budget, depth + 1));
        }
        Value::Object(map) => {
            if depth == BOUND_DEPTH || !take(budget, 2 + map.len() * 2) {
                return false;
            }
            return map
                .iter()
                .all(|(k, v)| take(budget, string_bound(k)) && within_bound(v, budget, depth + 1));
        }
    };
    take(budget, size)
}

fn take(budget: &mut usize, n: usize) -> bool {
    match budget.checked_sub(n) {
        Some(left) => {
            *budget = left;
            true
        }
        None => false,
    }
}

/// A string's worst case: quotes, and every byte escaped as `\u00XX`.
fn string_bound(s: &str) -> usize {
    s.len().saturating_mul(6).saturating_add(2)
}

/// At least as long as the number's text: integers by their digits (one spare byte for a
/// sign), anything else as printed.
fn number_bound(n: &serde_json::Number) -> usize {
    match (n.as_u64(), n.as_i64()) {
        (Some(u), _) => digits(u),
        (None, Some(i)) => 2 + digits(i.unsigned_abs()),
        (None, None) => number_len(n),
    }
}

fn digits(mut u: u64) -> usize {
    let mut n = 1;
    while u >= 10 {
        u /= 10;
        n += 1;
    }
    n
}

/// `value`'s exact text length when it is within `limit` and nests at most `max_depth`
/// levels, walking iteratively; refused as soon as it is not.
fn exact_len(value: &Value, limit: usize, max_depth: usize) -> Result<usize, Refused> {
    let mut total = 0usize;
    let mut pending = vec![(value, 1usize)];
    while let Some((v, depth)) = pending.pop() {
        if depth > max_depth {
            return Err(Refused::TooDeep);
        }
        let size = match v {
            Value::Null => 4,
            Value::Bool(b) => 4 + usize::from(!b),
            Value::Number(n) => number_len(n),
            Value::String(s) => string_len(s),
            Value::Array(items) => {
                pending.extend(items.iter().map(|item| (item, depth + 1)));
                // Brackets and the commas between items.
                2 + items.len().saturating_sub(1)
            }
            Value::Object(map) => {
                pending.extend(map.values().map(|item| (item, depth + 1)));
                // Braces, commas, and each key with its colon.
                map.keys().fold(1 + map.len().max(1), |n, k| {
                    n.saturating_add(string_len(k)).saturating_add(1)
                })
            }
        };
        total = total.saturating_add(size);
        if total > limit {
            return Err(Refused::TooLarge(total));
        }
    }
    Ok(total)
}

/// A string's exact length as serde_json writes it: quotes, `\"` `\\` and the short
/// escapes of `\b \t \n \f \r` in two bytes, other control characters as `\u00XX`.
fn string_len(s: &str) -> usize {
    s.bytes().fold(2usize, |n, b| {
        n + match b {
            b'"' | b'\\' | 0x08 | 0x09 | 0x0a | 0x0c | 0x0d => 2,
            0x00..=0x1f => 6,
            _ => 1,
        }
    })
}

/// A number's exact length as serde_json prints it (whatever its features: with
/// `arbitrary_precision` a number may be longer than any `f64`).
fn number_len(n: &serde_json::Number) -> usize {
    struct Counter(usize);
    impl std::fmt::Write for Counter {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = write!(counter, "{n}");
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::canonical::nesting_levels;
    use proptest::prelude::*;
    use serde_json::json;

    fn exact(v: &Value) -> usize {
        serde_json::to_vec(v).unwrap().len()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "[\\x00-\\x1f\"\\\\a]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The exact walk agrees with serde_json's text, the bound is never under it, and the
        /// check agrees with the exact size at every limit around it.
        #[test]
        fn agrees_with_the_exact_size(v in json_value()) {
            let size = exact(&v);
            prop_assert_eq!(exact_len(&v, usize::MAX, usize::MAX), Ok(size));
            let mut budget = usize::MAX;
            prop_assert!(within_bound(&v, &mut budget, 0));
            prop_assert!(usize::MAX - budget >= size, "bound {} under the size {}", usize::MAX - budget, size);
            for limit in [size.saturating_sub(1), size, size + 1, size * 7 + 8] {
                let expected = if size <= limit { Ok(()) } else { Err(Refused::TooLarge(size)) };
                prop_assert_eq!(check(&v, limit), expected);
            }
        }
    }

    #[test]
    fn control_characters_and_quotes_are_bounded() {
        let v = json!({"\u{1}\"": ["\u{0}\\\n", 1.5e300, -9_223_372_036_854_775_808i64]});
        let size = exact(&v);
        assert_eq!(exact_len(&v, usize::MAX, usize::MAX), Ok(size));
        let mut budget = usize::MAX;
        assert!(within_bound(&v, &mut budget, 0));
        assert!(usize::MAX - budget >= size);
        assert_eq!(check(&v, size), Ok(()));
        assert_eq!(check(&v, size - 1), Err(Refused::TooLarge(size)));
    }

    fn nested(levels: usize) -> Value {
        let mut v = Value::Null;
        for _ in 0..levels {
            v = Value::Array(vec![v]);
        }
        v
    }

    /// `Value`'s own drop recurses; unwind a deep one iteratively.
    fn unwind(mut v: Value) {
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn deep_values_are_refused_without_recursing() {
        // 100 000 levels: refused as too deep at any size limit, by a walk that does not
        // recurse (the recursive bound gives up at 64 levels).
        let v = nested(100_000);
        assert_eq!(check(&v, 1 << 30), Err(Refused::TooDeep));
        // Too large wins, as for text: the size is measured whatever the depth.
        assert_eq!(check(&v, 150_000), Err(Refused::TooLarge(200_004)));
        unwind(v);
    }

    #[test]
    fn the_depth_limit_is_exact() {
        // `nested(n)` is n arrays around a null: n + 1 levels.
        let at_limit = nested(MAX_ARGS_DEPTH - 1);
        assert_eq!(check(&at_limit, 1 << 20), Ok(()));
        let over = nested(MAX_ARGS_DEPTH);
        assert_eq!(check(&over, 1 << 20), Err(Refused::TooDeep));
        // Counted as the canonical arguments' depth is.
        let levels = |v: &Value| nesting_levels(&serde_json::to_vec(v).unwrap());
        assert_eq!(levels(&at_limit), MAX_ARGS_DEPTH);
        assert_eq!(levels(&over), MAX_ARGS_DEPTH + 1);
        // The value at the limit, wrapped as a saved operation wraps it, still parses with
        // serde_json's default limit, with room to spare.
        let mut wrapped = at_limit;
        for _ in 0..MAX_ARGS_DEPTH - 2 {
            wrapped = json!({ "args": wrapped });
        }
        let text = serde_json::to_string(&wrapped).unwrap();
        assert!(serde_json::from_str::<Value>(&text).is_ok());
    }

    /// A value's depth the way [`check`] counts it.
    fn depth(v: &Value) -> usize {
        1 + match v {
            Value::Array(items) => items.iter().map(depth).max().unwrap_or(0),
            Value::Object(map) => map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        /// The canonical bytes' depth is the value's depth, and the check refuses exactly
        /// the values deeper than the limit.
        #[test]
        fn text_depth_agrees_with_the_value(v in json_value(), extra in 0usize..70) {
            let mut v = v;
            for _ in 0..extra {
                v = Value::Array(vec![v]);
            }
            let d = depth(&v);
            prop_assert_eq!(nesting_levels(&crate::identity::canonical::to_canonical_vec(&v)), d);
            prop_assert_eq!(check(&v, usize::MAX).is_ok(), d <= MAX_ARGS_DEPTH);
        }
    }
}
