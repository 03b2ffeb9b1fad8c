//! The check of structured content against a tool's `outputSchema` before it is sent.
//!
//! A tool listed with an `outputSchema` promises structured content valid against it, and
//! clients hold it to that (the official Python SDK raises otherwise). The handler's own
//! output is serialized from the type the schema was generated from, but an output a person
//! recorded (`idem resolve KEY --completed REF`) or a read-back settled need not match it. So
//! the server checks every output against the schema before sending it as
//! `structuredContent`, with the validator here: JSON Schema 2020-12, the subset that tool
//! output schemas are made of (what `schemars` emits for Rust types, and the
//! `{"result": …}` wrapper of [`mcp_output_schema`](crate::definitions::mcp_output_schema)).
//!
//! **Understood:** boolean schemas; `type` (one name or an array; `1.0` is an `integer`);
//! `enum`, `const` (numbers compared by value: `1` equals `1.0`); `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum` (exact: `u64::MAX` is not rounded to an `f64`);
//! `multipleOf` (exact for integers; a fractional divisor divides the numbers as they are
//! written, so `0.3` is a multiple of `0.1`); `minLength`, `maxLength` (in characters);
//! `items`, `prefixItems`, `minItems`, `maxItems`, `uniqueItems`; `properties`, `required`,
//! `additionalProperties`, `propertyNames`, `minProperties`, `maxProperties`; `allOf`,
//! `anyOf`, `oneOf`, `not`, `if`/`then`/`else`; `$ref` to a JSON Pointer in the same
//! document (`#`, `#/$defs/…`, `#/definitions/…`, `~0`/`~1` and percent escapes).
//! Annotations (`title`, `description`, `default`, `examples`, `deprecated`, `readOnly`,
//! `writeOnly`, `format`, `$comment`, `content*`, …) constrain nothing and are ignored, as
//! are keywords JSON Schema does not define. On all of it the validator agrees with the
//! `jsonschema` crate (a differential property test, `tests.rs`) but at one point:
//! `jsonschema` rounds an integer beyond 2^53 to an `f64` before dividing it by a fractional
//! `multipleOf`, so it finds `u64::MAX` no multiple of `2.5`; here it is one, exactly.
//!
//! **Fail closed.** A schema with a keyword that constrains values and is not understood
//! here — `pattern`, `patternProperties`, `dependentSchemas`, `dependentRequired`,
//! `contains`, `unevaluated*`, `$dynamicRef`, a `$ref` to another document or an anchor, an
//! embedded `$id`, a `$schema` other than 2020-12 — or a keyword whose value is malformed, or
//! a `$ref` cycle that consumes no input, or a schema nested deeper than 256, is
//! *unverifiable* ([`Validator::compile`] says why). The server then judges no output valid
//! but the handler's own fresh one (serialized from the type the schema describes): it never
//! sends unchecked structured content for an output it did not produce itself. Validation is
//! bounded: an instance that takes more than [`MAX_DEPTH`] nested schema nodes to check is
//! invalid, and no input panics.
//!
//! The schema is compiled once, its `$ref`s resolved to indices, so a check per call walks
//! only the instance.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Number, Value};

/// How deep validation goes: the schema nodes entered for one instance, nested (the
/// instance's own depth, the registry's argument limit of 64 plus the `{"result": …}`
/// wrapper, times the few nodes schemars nests per level). Deeper is invalid.
pub(crate) const MAX_DEPTH: usize = 256;

/// How deeply a schema document may nest (its JSON, `const` and `enum` values included).
const MAX_SCHEMA_DEPTH: usize = 256;

/// The `$schema` this validator implements (absent means the same).
const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Keywords that constrain values but are not understood here: a schema with one is
/// unverifiable.
const UNSUPPORTED: [&str; 16] = [
    "pattern",
    "patternProperties",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "minContains",
    "maxContains",
    "additionalItems",
    "$dynamicRef",
    "$recursiveRef",
    "extends",
    "disallow",
    "divisibleBy",
];

/// Why a schema cannot be checked here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unverifiable(String);

impl fmt::Display for Unverifiable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// At most this many bytes of a reason, which may quote the schema.
const MAX_REASON: usize = 200;

fn unverifiable<T>(why: impl Into<String>) -> Result<T, Unverifiable> {
    let mut why = why.into();
    if why.len() > MAX_REASON {
        let mut end = MAX_REASON;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why.truncate(end);
        why.push('…');
    }
    Err(Unverifiable(why))
}

/// A compiled output schema.
#[derive(Debug)]
pub(crate) struct Validator {
    nodes: Vec<Node>,
}

#[derive(Debug)]
enum Node {
    Bool(bool),
    Keywords(Box<Keywords>),
}

/// A JSON number, as serde_json holds it.
#[derive(Clone, Copy, Debug)]
enum Num {
    U(u64),
    I(i64),
    F(f64),
}

#[derive(Debug, Default)]
struct Keywords {
    /// Bits of [`type_bit`]; `None` for any type.
    types: Option<u8>,
    enumeration: Option<Vec<Value>>,
    constant: Option<Value>,
    minimum: Option<Num>,
    maximum: Option<Num>,
    exclusive_minimum: Option<Num>,
    exclusive_maximum: Option<Num>,
    multiple_of: Option<Num>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    prefix_items: Vec<usize>,
    items: Option<usize>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    unique_items: bool,
    properties: HashMap<String, usize>,
    required: Vec<String>,
    additional_properties: Option<usize>,
    property_names: Option<usize>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    all_of: Vec<usize>,
    any_of: Vec<usize>,
    one_of: Vec<usize>,
    not: Option<usize>,
    if_then_else: Option<(usize, Option<usize>, Option<usize>)>,
    reference: Option<usize>,
}

const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const OBJECT: u8 = 4;
const ARRAY: u8 = 8;
const NUMBER: u8 = 16;
const STRING: u8 = 32;
const INTEGER: u8 = 64;

fn type_bit(name: &str) -> Option<u8> {
    Some(match name {
        "null" => NULL,
        "boolean" => BOOLEAN,
        "object" => OBJECT,
        "array" => ARRAY,
        "number" => NUMBER,
        "string" => STRING,
        "integer" => INTEGER,
        _ => return None,
    })
}

impl Validator {
    /// Compiles `schema`, or says why it cannot be checked here.
    pub(crate) fn compile(schema: &Value) -> Result<Validator, Unverifiable> {
        let mut compiler = Compiler {
            root: schema,
            nodes: Vec::new(),
            refs: HashMap::new(),
            pending: Vec::new(),
        };
        let root = compiler.add(schema, 0, true)?;
        debug_assert_eq!(root, 0);
        while let Some((slot, pointer)) = compiler.pending.pop() {
            let target = compiler.resolve(&pointer)?;
            compiler.nodes[slot] = compiler.node(target, 0, pointer.is_empty())?;
        }
        let validator = Validator {
            nodes: compiler.nodes,
        };
        validator.check_cycles()?;
        Ok(validator)
    }

    /// True when `instance` is valid against the schema.
    pub(crate) fn is_valid(&self, instance: &Value) -> bool {
        self.valid(0, instance, 0)
    }

    /// Fails on a cycle of `$ref`s (and the applicators that do not descend into the
    /// instance: `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`), which would recurse
    /// without end.
    fn check_cycles(&self) -> Result<(), Unverifiable> {
        // 0: not seen, 1: on the current path, 2: done.
        let mut state = vec![0u8; self.nodes.len()];
        for start in 0..self.nodes.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack = vec![(start, self.in_place(start))];
            state[start] = 1;
            while let Some((node, children)) = stack.last_mut() {
                match children.pop() {
                    Some(child) if state[child] == 1 => {
                        return unverifiable("a $ref cycle that consumes no input")
                    }
                    Some(child) if state[child] == 0 => {
                        state[child] = 1;
                        let next = self.in_place(child);
                        stack.push((child, next));
                    }
                    Some(_) => {}
                    None => {
                        state[*node] = 2;
                        stack.pop();
                    }
                }
            }
        }
        Ok(())
    }

    /// The nodes `node` applies to the instance itself.
    fn in_place(&self, node: usize) -> Vec<usize> {
        let Node::Keywords(k) = &self.nodes[node] else {
            return Vec::new();
        };
        let mut out: Vec<usize> = k
            .all_of
            .iter()
            .chain(&k.any_of)
            .chain(&k.one_of)
            .copied()
            .collect();
        out.extend(k.not);
        out.extend(k.reference);
        if let Some((i, t, e)) = k.if_then_else {
            out.push(i);
            out.extend(t);
            out.extend(e);
        }
        out
    }

    fn valid(&self, node: usize, instance: &Value, depth: usize) -> bool {
        if depth >= MAX_DEPTH {
            return false;
        }
        let k = match &self.nodes[node] {
            Node::Bool(b) => return *b,
            Node::Keywords(k) => k,
        };
        let depth = depth + 1;
        if let Some(types) = k.types {
            if types & type_of(instance) == 0 {
                return false;
            }
        }
        if let Some(c) = &k.constant {
            if !json_eq(c, instance) {
                return false;
            }
        }
        if let Some(values) = &k.enumeration {
            if !values.iter().any(|v| json_eq(v, instance)) {
                return false;
            }
        }
        let kind_ok = match instance {
            Value::Number(n) => valid_number(k, num(n)),
            Value::String(s) => valid_string(k, s),
            Value::Array(items) => self.valid_array(k, items, depth),
            Value::Object(map) => self.valid_object(k, map, depth),
            Value::Null | Value::Bool(_) => true,
        };
        if !kind_ok {
            return false;
        }
        if let Some(r) = k.reference {
            if !self.valid(r, instance, depth) {
                return false;
            }
        }
        if !k.all_of.iter().all(|&s| self.valid(s, instance, depth)) {
            return false;
        }
        if !k.any_of.is_empty() && !k.any_of.iter().any(|&s| self.valid(s, instance, depth)) {
            return false;
        }
        if !k.one_of.is_empty() {
            let mut matched = 0;
            for &s in &k.one_of {
                if self.valid(s, instance, depth) {
                    matched += 1;
                    if matched > 1 {
                        return false;
                    }
                }
            }
            if matched != 1 {
                return false;
            }
        }
        if let Some(n) = k.not {
            if self.valid(n, instance, depth) {
                return false;
            }
        }
        if let Some((i, t, e)) = k.if_then_else {
            let branch = if self.valid(i, instance, depth) { t } else { e };
            if let Some(b) = branch {
                if !self.valid(b, instance, depth) {
                    return false;
                }
            }
        }
        true
    }

    fn valid_array(&self, k: &Keywords, items: &[Value], depth: usize) -> bool {
        let len = items.len() as u64;
        if k.min_items.is_some_and(|m| len < m) || k.max_items.is_some_and(|m| len > m) {
            return false;
        }
        for (i, item) in items.iter().enumerate() {
            let schema = match k.prefix_items.get(i) {
                Some(&s) => Some(s),
                None => k.items,
            };
            if let Some(s) = schema {
                if !self.valid(s, item, depth) {
                    return false;
                }
            }
        }
        !k.unique_items || unique(items)
    }

    fn valid_object(&self, k: &Keywords, map: &Map<String, Value>, depth: usize) -> bool {
        let len = map.len() as u64;
        if k.min_properties.is_some_and(|m| len < m) || k.max_properties.is_some_and(|m| len > m) {
            return false;
        }
        if !k.required.iter().all(|name| map.contains_key(name)) {
            return false;
        }
        for (name, value) in map {
            let schema = match k.properties.get(name) {
                Some(&s) => Some(s),
                None => k.additional_properties,
            };
            if let Some(s) = schema {
                if !self.valid(s, value, depth) {
                    return false;
                }
            }
            if let Some(s) = k.property_names {
                // A name is a string: no deeper than the object holding it.
                if !self.valid(s, &Value::String(name.clone()), depth) {
                    return false;
                }
            }
        }
        true
    }
}

fn type_of(v: &Value) -> u8 {
    match v {
        Value::Null => NULL,
        Value::Bool(_) => BOOLEAN,
        Value::Object(_) => OBJECT,
        Value::Array(_) => ARRAY,
        Value::String(_) => STRING,
        Value::Number(n) if is_integer(num(n)) => NUMBER | INTEGER,
        Value::Number(_) => NUMBER,
    }
}

fn valid_number(k: &Keywords, n: Num) -> bool {
    let lt =
        |bound: Option<Num>, ok: &[Ordering]| bound.is_none_or(|b| ok.contains(&cmp_num(n, b)));
    lt(k.minimum, &[Ordering::Greater, Ordering::Equal])
        && lt(k.maximum, &[Ordering::Less, Ordering::Equal])
        && lt(k.exclusive_minimum, &[Ordering::Greater])
        && lt(k.exclusive_maximum, &[Ordering::Less])
        && k.multiple_of.is_none_or(|m| multiple_of(n, m))
}

fn valid_string(k: &Keywords, s: &str) -> bool {
    if k.min_length.is_none() && k.max_length.is_none() {
        return true;
    }
    let len = s.chars().count() as u64;
    k.min_length.is_none_or(|m| len >= m) && k.max_length.is_none_or(|m| len <= m)
}

fn num(n: &Number) -> Num {
    if let Some(u) = n.as_u64() {
        Num::U(u)
    } else if let Some(i) = n.as_i64() {
        Num::I(i)
    } else {
        Num::F(n.as_f64().unwrap_or(f64::NAN))
    }
}

fn is_integer(n: Num) -> bool {
    match n {
        Num::U(_) | Num::I(_) => true,
        Num::F(f) => f.is_finite() && f.fract() == 0.0,
    }
}

/// `2^64` and `-2^63`: every `f64` in between truncates to a value an `i128` holds exactly.
const TWO_64: f64 = 18_446_744_073_709_551_616.0;
const MINUS_TWO_63: f64 = -9_223_372_036_854_775_808.0;

/// The exact order of two JSON numbers (no rounding of a `u64` to an `f64`).
fn cmp_num(a: Num, b: Num) -> Ordering {
    fn int(n: Num) -> Option<i128> {
        match n {
            Num::U(u) => Some(i128::from(u)),
            Num::I(i) => Some(i128::from(i)),
            Num::F(_) => None,
        }
    }
    fn int_float(i: i128, f: f64) -> Ordering {
        if f.is_nan() {
            return Ordering::Equal;
        }
        if f >= TWO_64 {
            return Ordering::Less;
        }
        if f < MINUS_TWO_63 {
            return Ordering::Greater;
        }
        let t = f.trunc();
        // In range: exact.
        let ti = t as i128;
        match i.cmp(&ti) {
            Ordering::Equal if f > t => Ordering::Less,
            Ordering::Equal if f < t => Ordering::Greater,
            o => o,
        }
    }
    match (a, b, int(a), int(b)) {
        (_, _, Some(x), Some(y)) => x.cmp(&y),
        (Num::F(x), Num::F(y), _, _) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
        (_, Num::F(y), Some(x), _) => int_float(x, y),
        (Num::F(x), _, _, Some(y)) => int_float(y, x).reverse(),
        _ => Ordering::Equal,
    }
}

/// The digits and the decimal exponent of a JSON number as it is written (an `f64` in its
/// shortest form): `n = digits * 10^exponent`, digits without trailing zeros.
fn decimal(n: Num) -> (u128, i32) {
    let (mut digits, mut exponent) = match n {
        Num::U(u) => (u128::from(u), 0),
        Num::I(i) => (u128::from(i.unsigned_abs()), 0),
        Num::F(f) => {
            // `{:e}` is the shortest form that reads back as `f`: `1.5e-7`, `3e300`.
            let text = format!("{:e}", f.abs());
            let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
            let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
            let digits = format!("{whole}{fraction}").parse::<u128>().unwrap_or(0);
            let exp = exp.parse::<i32>().unwrap_or(0);
            (digits, exp - fraction.len() as i32)
        }
    };
    while digits != 0 && digits % 10 == 0 {
        digits /= 10;
        exponent += 1;
    }
    (digits, exponent)
}

/// `10^k mod m`, for `m > 0`.
fn pow10_mod(mut k: u32, m: u128) -> u128 {
    let (mut result, mut base) = (1 % m, 10 % m);
    while k > 0 {
        if k & 1 == 1 {
            result = result * base % m;
        }
        base = base * base % m;
        k >>= 1;
    }
    result
}

/// True when `n / m` is an integer (`m > 0`, checked when the schema compiles). An integer
/// divisor divides integers exactly (a float by its binary value, as `jsonschema` does); a
/// fractional one divides the numbers as they are written in decimal (`0.3` is a multiple of
/// `0.1`).
fn multiple_of(n: Num, m: Num) -> bool {
    let as_f64 = |x: Num| match x {
        Num::U(u) => u as f64,
        Num::I(i) => i as f64,
        Num::F(f) => f,
    };
    let value = as_f64(n);
    if value == 0.0 {
        return true;
    }
    if is_integer(m) {
        return match (n, m) {
            (Num::U(_) | Num::I(_), Num::U(_) | Num::I(_)) => {
                let int = |x: Num| match x {
                    Num::U(u) => i128::from(u),
                    Num::I(i) => i128::from(i),
                    Num::F(_) => 0,
                };
                int(m) != 0 && int(n) % int(m) == 0
            }
            _ => is_integer(n) && value % as_f64(m) == 0.0,
        };
    }
    // value / m = (a / b) * 10^(ea - eb).
    let (a, ea) = decimal(n);
    let (b, eb) = decimal(m);
    if b == 0 {
        return false;
    }
    if ea >= eb {
        let Ok(k) = u32::try_from(ea - eb) else {
            return false;
        };
        a % b * pow10_mod(k, b) % b == 0
    } else {
        // b * 10^(eb - ea) must divide a, which has at most 20 digits.
        let Ok(k) = u32::try_from(eb - ea) else {
            return false;
        };
        match 10u128.checked_pow(k).and_then(|p| p.checked_mul(b)) {
            Some(d) => a % d == 0,
            None => false,
        }
    }
}

/// JSON Schema equality: numbers by value (`1` equals `1.0`), objects regardless of order.
fn json_eq(a: &Value, b: &Value) -> bool {
    cmp_json(a, b, 0) == Some(Ordering::Equal)
}

/// A total order on JSON values consistent with [`json_eq`]; `None` past [`MAX_DEPTH`].
fn cmp_json(a: &Value, b: &Value, depth: usize) -> Option<Ordering> {
    if depth >= MAX_DEPTH {
        return None;
    }
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Number(_) => 2,
            Value::String(_) => 3,
            Value::Array(_) => 4,
            Value::Object(_) => 5,
        }
    }
    Some(match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => cmp_num(num(x), num(y)),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (p, q) in x.iter().zip(y) {
                match cmp_json(p, q, depth + 1)? {
                    Ordering::Equal => {}
                    o => return Some(o),
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            match x.len().cmp(&y.len()) {
                Ordering::Equal => {}
                o => return Some(o),
            }
            let mut xs: Vec<(&String, &Value)> = x.iter().collect();
            let mut ys: Vec<(&String, &Value)> = y.iter().collect();
            xs.sort_unstable_by(|p, q| p.0.cmp(q.0));
            ys.sort_unstable_by(|p, q| p.0.cmp(q.0));
            for ((kx, _), (ky, _)) in xs.iter().zip(&ys) {
                match kx.cmp(ky) {
                    Ordering::Equal => {}
                    o => return Some(o),
                }
            }
            for ((_, vx), (_, vy)) in xs.iter().zip(&ys) {
                match cmp_json(vx, vy, depth + 1)? {
                    Ordering::Equal => {}
                    o => return Some(o),
                }
            }
            Ordering::Equal
        }
        _ => rank(a).cmp(&rank(b)),
    })
}

/// True when no two items are equal ([`json_eq`]); false when they are too deep to tell.
fn unique(items: &[Value]) -> bool {
    // Within the depth, `cmp_json` is a total order (the sort relies on it).
    if !items.iter().all(|v| within(v, MAX_DEPTH - 1)) {
        return false;
    }
    let mut sorted: Vec<&Value> = items.iter().collect();
    sorted.sort_unstable_by(|a, b| cmp_json(a, b, 0).unwrap_or(Ordering::Equal));
    sorted
        .windows(2)
        .all(|w| cmp_json(w[0], w[1], 0) == Some(Ordering::Less))
}

/// True when `value` nests no deeper than `levels`.
fn within(value: &Value, levels: usize) -> bool {
    match value {
        Value::Array(items) => levels > 0 && items.iter().all(|v| within(v, levels - 1)),
        Value::Object(map) => levels > 0 && map.values().all(|v| within(v, levels - 1)),
        _ => true,
    }
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    /// `$ref` pointers already given a node.
    refs: HashMap<String, usize>,
    /// Nodes reserved for `$ref` targets, to compile.
    pending: Vec<(usize, String)>,
}

impl<'a> Compiler<'a> {
    /// Compiles `schema` into a new node; its index.
    fn add(&mut self, schema: &'a Value, depth: usize, root: bool) -> Result<usize, Unverifiable> {
        let slot = self.nodes.len();
        self.nodes.push(Node::Bool(true));
        self.nodes[slot] = self.node(schema, depth, root)?;
        Ok(slot)
    }

    fn node(&mut self, schema: &'a Value, depth: usize, root: bool) -> Result<Node, Unverifiable> {
        if depth >= MAX_SCHEMA_DEPTH {
            return unverifiable(format!("the schema nests deeper than {MAX_SCHEMA_DEPTH}"));
        }
        let map = match schema {
            Value::Bool(b) => return Ok(Node::Bool(*b)),
            Value::Object(map) => map,
            other => return unverifiable(format!("not a schema: {other}")),
        };
        let mut k = Keywords::default();
        let d = depth + 1;
        for (keyword, value) in map {
            let keyword = keyword.as_str();
            match keyword {
                "type" => k.types = Some(types(value)?),
                "enum" => match value {
                    Value::Array(values) => {
                        values.iter().try_for_each(|v| shallow(v, d))?;
                        k.enumeration = Some(values.clone());
                    }
                    _ => return malformed(keyword),
                },
                "const" => {
                    shallow(value, d)?;
                    k.constant = Some(value.clone());
                }
                "minimum" => k.minimum = Some(number(keyword, value)?),
                "maximum" => k.maximum = Some(number(keyword, value)?),
                "exclusiveMinimum" => k.exclusive_minimum = Some(number(keyword, value)?),
                "exclusiveMaximum" => k.exclusive_maximum = Some(number(keyword, value)?),
                "multipleOf" => {
                    let m = number(keyword, value)?;
                    if cmp_num(m, Num::U(0)) != Ordering::Greater {
                        return malformed(keyword);
                    }
                    k.multiple_of = Some(m);
                }
                "minLength" => k.min_length = Some(count(keyword, value)?),
                "maxLength" => k.max_length = Some(count(keyword, value)?),
                "minItems" => k.min_items = Some(count(keyword, value)?),
                "maxItems" => k.max_items = Some(count(keyword, value)?),
                "minProperties" => k.min_properties = Some(count(keyword, value)?),
                "maxProperties" => k.max_properties = Some(count(keyword, value)?),
                "uniqueItems" => match value {
                    Value::Bool(b) => k.unique_items = *b,
                    _ => return malformed(keyword),
                },
                "required" => match value {
                    Value::Array(names) => {
                        for name in names {
                            match name {
                                Value::String(s) => k.required.push(s.clone()),
                                _ => return malformed(keyword),
                            }
                        }
                    }
                    _ => return malformed(keyword),
                },
                "properties" => match value {
                    Value::Object(props) => {
                        for (name, schema) in props {
                            let s = self.add(schema, d + 1, false)?;
                            k.properties.insert(name.clone(), s);
                        }
                    }
                    _ => return malformed(keyword),
                },
                "additionalProperties" => {
                    k.additional_properties = Some(self.add(value, d, false)?)
                }
                "propertyNames" => k.property_names = Some(self.add(value, d, false)?),
                "items" => match value {
                    Value::Array(_) => {
                        return unverifiable("`items` as an array (drafts before 2020-12)")
                    }
                    _ => k.items = Some(self.add(value, d, false)?),
                },
                "prefixItems" => k.prefix_items = self.non_empty_list(keyword, value, d)?,
                "allOf" => k.all_of = self.non_empty_list(keyword, value, d)?,
                "anyOf" => k.any_of = self.non_empty_list(keyword, value, d)?,
                "oneOf" => k.one_of = self.non_empty_list(keyword, value, d)?,
                "not" => k.not = Some(self.add(value, d, false)?),
                "if" | "then" | "else" => {}
                "$ref" => match value {
                    Value::String(r) => k.reference = Some(self.reference(r)?),
                    _ => return malformed(keyword),
                },
                "$schema" => match value {
                    Value::String(s) if s.strip_suffix('#').unwrap_or(s) == DRAFT_2020_12 => {}
                    _ => {
                        return unverifiable(format!(
                            "`$schema` {value}: only {DRAFT_2020_12} is checked here"
                        ))
                    }
                },
                "$id" if !root => {
                    return unverifiable("an embedded `$id` (a second base for `$ref`s)")
                }
                _ if UNSUPPORTED.contains(&keyword) => {
                    return unverifiable(format!("`{keyword}` is not checked here"))
                }
                // Annotations, `$defs`, `$anchor`, a root `$id`, and keywords JSON Schema does
                // not define: none constrains values.
                _ => {}
            }
        }
        if let Some(condition) = map.get("if") {
            let i = self.add(condition, d, false)?;
            let t = map.get("then").map(|s| self.add(s, d, false)).transpose()?;
            let e = map.get("else").map(|s| self.add(s, d, false)).transpose()?;
            k.if_then_else = Some((i, t, e));
        } else {
            // `then`/`else` without `if` apply nothing, but must still be schemas.
            for keyword in ["then", "else"] {
                if let Some(s) = map.get(keyword) {
                    self.add(s, d, false)?;
                }
            }
        }
        Ok(Node::Keywords(Box::new(k)))
    }

    fn list(
        &mut self,
        keyword: &str,
        value: &'a Value,
        depth: usize,
    ) -> Result<Vec<usize>, Unverifiable> {
        match value {
            Value::Array(schemas) => schemas
                .iter()
                .map(|s| self.add(s, depth + 1, false))
                .collect(),
            _ => malformed(keyword),
        }
    }

    fn non_empty_list(
        &mut self,
        keyword: &str,
        value: &'a Value,
        depth: usize,
    ) -> Result<Vec<usize>, Unverifiable> {
        let list = self.list(keyword, value, depth)?;
        if list.is_empty() {
            return malformed(keyword);
        }
        Ok(list)
    }

    /// The node of a `$ref` (compiled later, once per pointer).
    fn reference(&mut self, r: &str) -> Result<usize, Unverifiable> {
        let Some(fragment) = r.strip_prefix('#') else {
            return unverifiable(format!("`$ref` {r:?} is not in this document"));
        };
        let pointer = percent_decode(fragment).map_or_else(
            || unverifiable(format!("`$ref` {r:?} is not a JSON Pointer")),
            Ok,
        )?;
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return unverifiable(format!("`$ref` {r:?} names an anchor"));
        }
        if let Some(&slot) = self.refs.get(&pointer) {
            return Ok(slot);
        }
        let slot = self.nodes.len();
        self.nodes.push(Node::Bool(true));
        self.refs.insert(pointer.clone(), slot);
        self.pending.push((slot, pointer));
        Ok(slot)
    }

    /// The schema a JSON Pointer names in the document (no `$id` on the way: it would
    /// change where the target's own `$ref`s point).
    fn resolve(&self, pointer: &str) -> Result<&'a Value, Unverifiable> {
        let mut at = self.root;
        if pointer.is_empty() {
            return Ok(at);
        }
        // A `$ref` fragment is a JSON Pointer (RFC 6901), as a key path is.
        let path = pointer
            .starts_with('/')
            .then(|| idem_runtime::identity::ArgsPath::parse(pointer).ok())
            .flatten();
        let Some(path) = path else {
            return unverifiable(format!("`$ref` #{pointer} is not a JSON Pointer"));
        };
        for token in path.tokens() {
            if !std::ptr::eq(at, self.root) && at.get("$id").is_some() {
                return unverifiable(format!("`$ref` #{pointer} goes through an `$id`"));
            }
            let next = match at {
                Value::Object(map) => map.get(token),
                Value::Array(items) => token
                    .parse::<usize>()
                    .ok()
                    .filter(|_| token == "0" || !token.starts_with('0'))
                    .and_then(|i| items.get(i)),
                _ => None,
            };
            at = next.map_or_else(
                || unverifiable(format!("`$ref` #{pointer} names nothing")),
                Ok,
            )?;
        }
        Ok(at)
    }
}

fn malformed<T>(keyword: &str) -> Result<T, Unverifiable> {
    unverifiable(format!("`{keyword}` has a malformed value"))
}

fn types(value: &Value) -> Result<u8, Unverifiable> {
    let one = |v: &Value| {
        v.as_str()
            .and_then(type_bit)
            .map_or_else(|| unverifiable(format!("`type` names no type: {v}")), Ok)
    };
    match value {
        Value::Array(names) if !names.is_empty() => {
            names.iter().try_fold(0, |bits, v| Ok(bits | one(v)?))
        }
        Value::Array(_) => malformed("type"),
        v => one(v),
    }
}

fn number(keyword: &str, value: &Value) -> Result<Num, Unverifiable> {
    match value {
        Value::Number(n) => Ok(num(n)),
        _ => malformed(keyword),
    }
}

/// A non-negative integer keyword (`1.0` counts); values past `u64::MAX` saturate.
fn count(keyword: &str, value: &Value) -> Result<u64, Unverifiable> {
    match value.as_number().map(num) {
        Some(Num::U(u)) => Ok(u),
        Some(Num::F(f)) if f >= 0.0 && is_integer(Num::F(f)) => {
            Ok(if f >= TWO_64 { u64::MAX } else { f as u64 })
        }
        _ => malformed(keyword),
    }
}

/// Fails for a value nested deeper than the schema may be.
fn shallow(value: &Value, depth: usize) -> Result<(), Unverifiable> {
    if depth >= MAX_SCHEMA_DEPTH {
        return unverifiable(format!("the schema nests deeper than {MAX_SCHEMA_DEPTH}"));
    }
    match value {
        Value::Array(items) => items.iter().try_for_each(|v| shallow(v, depth + 1)),
        Value::Object(map) => map.values().try_for_each(|v| shallow(v, depth + 1)),
        _ => Ok(()),
    }
}

/// A URI fragment with its `%XX` escapes decoded; `None` when they do not make UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests;
