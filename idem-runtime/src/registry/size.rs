//! The size limit on a caller's JSON value, checked without writing the value out when its
//! shape alone proves it fits.

use std::fmt::Write as _;

use serde_json::Value;

/// Checks that `value`'s compact JSON text is at most `limit` bytes; `Err(size)` when over.
///
/// Every call pays this check, and almost every call is far under the limit. A bound from
/// the tree's shape (strings counted at their worst-case escaping, no byte scanned, nothing
/// allocated) settles those in one walk over the nodes; only a value whose bound exceeds the
/// limit, or that nests deeper than [`BOUND_DEPTH`], is measured exactly, by an iterative
/// walk, so a caller's deeply nested value cannot overflow the stack here (serde_json's
/// writer would recurse).
pub(crate) fn check(value: &Value, limit: usize) -> Result<(), usize> {
    let mut budget = limit;
    if within_bound(value, &mut budget, 0) {
        return Ok(());
    }
    match exact_len(value, limit) {
        Some(_) => Ok(()),
        None => Err(exact_len(value, usize::MAX).unwrap_or(usize::MAX)),
    }
}

/// How deep the recursive bound walks before it leaves the value to the exact walk.
const BOUND_DEPTH: usize = 64;

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

/// `value`'s exact text length when it is within `limit`, walking iteratively; `None` as
/// soon as it is not.
fn exact_len(value: &Value, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        let size = match v {
            Value::Null => 4,
            Value::Bool(b) => 4 + usize::from(!b),
            Value::Number(n) => number_len(n),
            Value::String(s) => string_len(s),
            Value::Array(items) => {
                pending.extend(items);
                // Brackets and the commas between items.
                2 + items.len().saturating_sub(1)
            }
            Value::Object(map) => {
                pending.extend(map.values());
                // Braces, commas, and each key with its colon.
                map.keys().fold(1 + map.len().max(1), |n, k| {
                    n.saturating_add(string_len(k)).saturating_add(1)
                })
            }
        };
        total = total.saturating_add(size);
        if total > limit {
            return None;
        }
    }
    Some(total)
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
            prop_assert_eq!(exact_len(&v, usize::MAX), Some(size));
            let mut budget = usize::MAX;
            prop_assert!(within_bound(&v, &mut budget, 0));
            prop_assert!(usize::MAX - budget >= size, "bound {} under the size {}", usize::MAX - budget, size);
            for limit in [size.saturating_sub(1), size, size + 1, size * 7 + 8] {
                let expected = if size <= limit { Ok(()) } else { Err(size) };
                prop_assert_eq!(check(&v, limit), expected);
            }
        }
    }

    #[test]
    fn control_characters_and_quotes_are_bounded() {
        let v = json!({"\u{1}\"": ["\u{0}\\\n", 1.5e300, -9_223_372_036_854_775_808i64]});
        let size = exact(&v);
        assert_eq!(exact_len(&v, usize::MAX), Some(size));
        let mut budget = usize::MAX;
        assert!(within_bound(&v, &mut budget, 0));
        assert!(usize::MAX - budget >= size);
        assert_eq!(check(&v, size), Ok(()));
        assert_eq!(check(&v, size - 1), Err(size));
    }

    #[test]
    fn deep_values_do_not_overflow_the_bound() {
        let mut v = Value::Null;
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        // 100 000 levels of `[` and `]`: over a 150 000-byte limit, measured exactly.
        assert_eq!(check(&v, 150_000), Err(200_004));
        assert_eq!(check(&v, 1 << 30), Ok(()));
        // `Value`'s own drop recurses; unwind it iteratively.
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }
}
