//! The golden vectors of `docs/keys.md`, read out of the document itself, so the document and
//! the code cannot drift apart.
//!
//! Keys and fingerprints are persisted: a record written today is looked up by a key derived
//! tomorrow, perhaps by another version or another language. Each vector is checked three
//! ways: by the library (`identify_value`, the one-pass `identify`, `IdemKey::derive`), by an
//! independent implementation of the documented byte layout written here (sha2, LEB128 and
//! hex, no library code), and end to end through a `Registry`, where the handler's key and
//! the store's record must be the documented ones. The table and the worked example in the
//! document are checked against the vectors too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use idem_runtime::identity::canonical::to_canonical_vec;
use idem_runtime::identity::{
    identify, identify_value, identify_value_with, identify_with, Fingerprint, IdemKey,
    IdentityRules, KeyMaterial, Scope,
};
use idem_runtime::{
    call::ToolCall,
    registry::Registry,
    store::{IdemStore, MemoryStore},
    tool::{ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One golden vector, as the JSON block of `docs/keys.md` spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vector {
    name: String,
    run: String,
    tenant: Option<String>,
    principal: Option<String>,
    tool: String,
    /// The name the key is derived under, when the tool declares one apart from its name.
    #[serde(default)]
    key_name: Option<String>,
    intent: Option<String>,
    key_fields: Option<Vec<String>>,
    /// What `exclude(…)` leaves out of the fingerprint and the key.
    #[serde(default)]
    exclude: Option<Vec<String>>,
    args: Value,
    canonical: String,
    /// The canonical arguments without the excluded parts, when the tool excludes any.
    #[serde(default)]
    fingerprinted: Option<String>,
    fingerprint: String,
    key_fields_canonical: Option<String>,
    material: String,
    key: String,
}

impl Vector {
    fn scope(&self) -> Scope {
        let mut scope = Scope::run(self.run.as_str());
        if let Some(tenant) = &self.tenant {
            scope = scope.with_tenant(tenant.as_str());
        }
        if let Some(principal) = &self.principal {
            scope = scope.with_principal(principal.as_str());
        }
        scope
    }

    fn fields(&self) -> Vec<String> {
        self.key_fields.clone().unwrap_or_default()
    }

    fn rules(&self) -> IdentityRules {
        IdentityRules::new(self.fields(), self.exclude.clone().unwrap_or_default()).unwrap()
    }

    /// The name the key is derived under.
    fn keyed_as(&self) -> &str {
        self.key_name.as_deref().unwrap_or(&self.tool)
    }

    /// The canonical text the fingerprint is taken of.
    fn fingerprinted_text(&self) -> &str {
        self.fingerprinted.as_deref().unwrap_or(&self.canonical)
    }
}

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/keys.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The lines after `marker` up to `end` (both exclusive).
fn section<'a>(doc: &'a str, marker: &str, end: &str) -> &'a str {
    let start = doc
        .find(marker)
        .unwrap_or_else(|| panic!("docs/keys.md has no `{marker}`"))
        + marker.len();
    let len = doc[start..]
        .find(end)
        .unwrap_or_else(|| panic!("docs/keys.md: nothing ends the section after `{marker}`"));
    &doc[start..start + len]
}

/// The first fenced block after `marker`, without its fences.
fn fenced_after<'a>(doc: &'a str, marker: &str) -> &'a str {
    let after = section(doc, marker, "\n```\n");
    let open = after
        .find("```")
        .unwrap_or_else(|| panic!("docs/keys.md: no fenced block after `{marker}`"));
    let body = &after[open..];
    &body[body.find('\n').expect("a fence line ends") + 1..]
}

fn vectors() -> Vec<Vector> {
    let doc = doc();
    let block = fenced_after(&doc, "<!-- key-vectors:json -->");
    let vectors: Vec<Vector> = serde_json::from_str(block)
        .unwrap_or_else(|e| panic!("the vectors block of docs/keys.md is not valid: {e}"));
    let names: HashSet<&str> = vectors.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names.len(), vectors.len(), "vector names are unique");
    vectors
}

// ---- An independent implementation of the documented derivation (no library code). ----

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Unsigned LEB128: seven bits at a time, least significant group first, high bit = "more".
fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let low = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(low);
            return out;
        }
        out.push(low | 0x80);
    }
}

/// The documented hash input of a vector's key, from the document's own fields.
fn key_input(v: &Vector) -> Vec<u8> {
    let mut input = b"idem-key/v2".to_vec();
    let mut part = |bytes: &[u8]| {
        input.extend(leb128(bytes.len()));
        input.extend_from_slice(bytes);
    };
    part(v.tenant.as_deref().unwrap_or("").as_bytes());
    part(&[u8::from(v.tenant.is_some())]);
    part(v.principal.as_deref().unwrap_or("").as_bytes());
    part(&[u8::from(v.principal.is_some())]);
    part(v.run.as_bytes());
    part(v.keyed_as().as_bytes());
    // An intent id wins over key fields, which win over the whole arguments.
    let fingerprint = sha256(v.fingerprinted_text().as_bytes());
    let (kind, material): (&[u8], Vec<u8>) = match (&v.intent, &v.key_fields_canonical) {
        (Some(intent), _) => (b"intent", intent.as_bytes().to_vec()),
        (None, Some(fields)) => (b"fields", fields.as_bytes().to_vec()),
        (None, None) => (b"args", fingerprint.to_vec()),
    };
    part(kind);
    part(&material);
    input
}

#[test]
fn independent_derivation_gives_every_documented_fingerprint_and_key() {
    for v in vectors() {
        assert_eq!(
            hex(&sha256(v.fingerprinted_text().as_bytes())),
            v.fingerprint,
            "{}: fingerprint = sha256(canonical without the excluded parts)",
            v.name
        );
        assert_eq!(
            v.fingerprinted.is_some(),
            v.exclude.is_some(),
            "{}: the fingerprinted text is given exactly when parts are excluded",
            v.name
        );
        let expected_kind = match (&v.intent, &v.key_fields) {
            (Some(_), _) => "intent",
            (None, Some(_)) => "fields",
            (None, None) => "args",
        };
        assert_eq!(v.material, expected_kind, "{}: material precedence", v.name);
        assert_eq!(
            v.key_fields_canonical.is_some(),
            v.key_fields.is_some(),
            "{}: key fields have a canonical form exactly when named",
            v.name
        );
        let key = format!("idem:{}", hex(&sha256(&key_input(&v))));
        assert_eq!(
            key, v.key,
            "{}: key from the documented byte layout",
            v.name
        );
        assert_eq!(key.len(), 69, "{}", v.name);
    }
}

// ---- The library. ----

#[test]
fn the_library_computes_every_vector() {
    for v in vectors() {
        let fields = v.fields();
        let rules = v.rules();
        let by_value = identify_value_with(&v.args, &rules).unwrap();
        // From a serializable value: the path typed arguments take.
        let typed = identify_with(&v.args, &rules).unwrap();
        let mut paths = vec![
            ("identify_value_with", by_value.clone()),
            ("identify_with", typed),
        ];
        if v.exclude.is_none() {
            // Without exclusions, the plain forms (the one-pass writer among them) agree.
            paths.push(("identify_value", identify_value(&v.args, &fields).unwrap()));
            paths.push(("identify", identify(&v.args, &fields).unwrap()));
        }
        for (path, id) in &paths {
            assert_eq!(
                id.fingerprinted
                    .as_ref()
                    .map(|b| String::from_utf8(b.clone()).unwrap()),
                v.fingerprinted,
                "{}: fingerprinted text ({path})",
                v.name
            );
            assert_eq!(
                String::from_utf8(id.canonical.clone()).unwrap(),
                v.canonical,
                "{}: canonical text ({path})",
                v.name
            );
            assert_eq!(id.fingerprint.to_hex(), v.fingerprint, "{}: {path}", v.name);
            assert_eq!(
                id.key_fields
                    .as_ref()
                    .map(|b| String::from_utf8(b.clone()).unwrap()),
                v.key_fields_canonical,
                "{}: key fields ({path})",
                v.name
            );
        }
        assert_eq!(
            to_canonical_vec(&v.args),
            v.canonical.as_bytes(),
            "{}",
            v.name
        );

        let material = match (&v.intent, &by_value.key_fields) {
            (Some(intent), _) => KeyMaterial::Intent(intent),
            (None, Some(fields)) => KeyMaterial::Fields(fields),
            (None, None) => KeyMaterial::ArgsFingerprint(&by_value.fingerprint),
        };
        let key = IdemKey::derive(&v.scope(), v.keyed_as(), material);
        assert_eq!(key.as_str(), v.key, "{}: IdemKey::derive", v.name);
        assert_eq!(IdemKey::parse(&v.key).unwrap(), key, "{}", v.name);
        if v.material == "args" {
            // Whole arguments given as canonical bytes key the same as by their fingerprint.
            let by_bytes = IdemKey::derive(
                &v.scope(),
                v.keyed_as(),
                KeyMaterial::Args(v.fingerprinted_text().as_bytes()),
            );
            assert_eq!(by_bytes, key, "{}", v.name);
        }
        let parsed = Fingerprint::from_hex(&v.fingerprint).unwrap();
        assert_eq!(parsed, by_value.fingerprint, "{}", v.name);
    }
}

// ---- End to end: the registry derives the documented key and stores the documented record. ----

/// Arguments that are any JSON object, serialized back exactly as they came.
#[derive(Deserialize, serde::Serialize)]
#[serde(transparent)]
struct AnyObject(BTreeMap<String, Value>);

/// The key fields the vectors name. `build()` refuses a key field that is not a property of
/// the argument schema, so the schema lists them (and admits any other member).
const KEY_FIELD_PROPERTIES: [&str; 4] = ["address", "customer", "invoice", "note"];

impl schemars::JsonSchema for AnyObject {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AnyObject".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let properties: serde_json::Map<String, Value> = KEY_FIELD_PROPERTIES
            .iter()
            .map(|p| (p.to_string(), serde_json::json!({})))
            .collect();
        schemars::json_schema!({
            "type": "object",
            "properties": properties,
            "additionalProperties": true,
        })
    }
}

/// A write tool that takes any JSON object and notes the key it was handed.
struct Recorder {
    spec: ToolSpec,
    seen: Arc<Mutex<Vec<String>>>,
}

impl WriteTool for Recorder {
    type Args = AnyObject;
    type Output = Value;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, ctx: WriteCtx, _args: Self::Args) -> Result<Value, ToolError> {
        self.seen
            .lock()
            .unwrap()
            .push(ctx.key().as_str().to_owned());
        Ok(Value::Null)
    }
}

#[tokio::test]
async fn a_registry_call_claims_every_documented_key() {
    for v in vectors() {
        if !v.args.is_object() {
            continue;
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut spec = ToolSpec::new(v.tool.clone()).description("Records its key.");
        if let Some(fields) = &v.key_fields {
            spec = spec.key_fields(fields.clone());
        }
        if let Some(excluded) = &v.exclude {
            spec = spec.exclude_fields(excluded.clone());
        }
        if let Some(key_name) = &v.key_name {
            spec = spec.key_name(key_name.clone());
        }
        let store = Arc::new(MemoryStore::new());
        let registry = Registry::builder()
            .shared_store(store.clone())
            .tool(Recorder {
                spec,
                seen: seen.clone(),
            })
            .build()
            .unwrap_or_else(|e| panic!("{}: {e}", v.name));
        let mut call = ToolCall::new(v.run.clone(), v.tool.clone(), v.args.clone());
        if let Some(tenant) = &v.tenant {
            call = call.tenant(tenant.clone());
        }
        if let Some(principal) = &v.principal {
            call = call.principal(principal.clone());
        }
        if let Some(intent) = &v.intent {
            call = call.intent(intent.clone());
        }
        let result = registry.call(call).await;
        assert_eq!(
            result.key().map(IdemKey::as_str),
            Some(v.key.as_str()),
            "{}: {result:?}",
            v.name
        );
        assert_eq!(
            seen.lock().unwrap().as_slice(),
            [v.key.as_str()],
            "{}",
            v.name
        );
        let record = store
            .get(&IdemKey::parse(&v.key).unwrap())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{}: no record under the documented key", v.name));
        assert_eq!(record.fingerprint.to_hex(), v.fingerprint, "{}", v.name);
        let operation = record.operation.expect("the operation is saved");
        assert_eq!(operation.args.as_str(), v.canonical, "{}", v.name);
        assert_eq!(operation.scope, v.scope(), "{}", v.name);
        assert_eq!(operation.intent, v.intent, "{}", v.name);
    }
}

// ---- The prose agrees with the vectors. ----

/// Inline code for a table cell.
fn code(s: &str) -> String {
    assert!(
        !s.contains('`') && !s.contains('|'),
        "a vector's text cannot sit in a table cell: {s}"
    );
    format!("`{s}`")
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The table of `docs/keys.md`, as the vectors say it must read.
fn render_table(vectors: &[Vector]) -> String {
    let mut t = String::from(
        "| Vector | Scope · tool · key material | Canonical arguments | Fingerprint | Key |\n\
         |---|---|---|---|---|\n",
    );
    for v in vectors {
        let mut scope = format!("run {}", code(&json_string(&v.run)));
        if let Some(tenant) = &v.tenant {
            scope += &format!(", tenant {}", code(&json_string(tenant)));
        }
        if let Some(principal) = &v.principal {
            scope += &format!(", principal {}", code(&json_string(principal)));
        }
        let mut material = match (&v.intent, &v.key_fields_canonical) {
            (Some(intent), _) => format!("intent {}", code(&json_string(intent))),
            (None, Some(fields)) => format!("fields {}", code(fields)),
            (None, None) => "args".to_owned(),
        };
        if let Some(excluded) = &v.exclude {
            let excluded: Vec<String> = excluded.iter().map(|e| code(e)).collect();
            material += &format!(", without {}", excluded.join(", "));
        }
        let tool = match &v.key_name {
            Some(key_name) => format!("{} keyed as {}", code(&v.tool), code(key_name)),
            None => code(&v.tool),
        };
        t += &format!(
            "| {} | {scope} · {tool} · {material} | {} | {} | {} |\n",
            code(&v.name),
            code(&v.canonical),
            code(&v.fingerprint),
            code(&v.key)
        );
    }
    t
}

#[test]
fn the_table_shows_the_vectors() {
    let doc = doc();
    let table = section(
        &doc,
        "<!-- key-vectors:table -->",
        "<!-- /key-vectors:table -->",
    );
    let expected = render_table(&vectors());
    assert!(
        table.trim() == expected.trim(),
        "the table in docs/keys.md must read:\n\n{expected}"
    );
}

#[test]
fn the_worked_example_is_the_hash_input_of_its_vector() {
    let doc = doc();
    let marker = "<!-- key-vectors:example args-tenant -->";
    let block = fenced_after(&doc, marker);
    let mut bytes = Vec::new();
    for line in block.lines() {
        let data = line.split('#').next().unwrap();
        for byte in data.split_whitespace() {
            bytes.push(u8::from_str_radix(byte, 16).unwrap_or_else(|e| panic!("{byte}: {e}")));
        }
    }
    let vectors = vectors();
    let v = vectors.iter().find(|v| v.name == "args-tenant").unwrap();
    assert_eq!(hex(&bytes), hex(&key_input(v)));
    assert_eq!(format!("idem:{}", hex(&sha256(&bytes))), v.key);
}

// ---- The vectors cover what the document says they cover. ----

#[derive(Default)]
struct Seen {
    exponent_floats: BTreeSet<String>,
    integers_above_2_53: bool,
    negative: bool,
    negative_zero: bool,
    integral_float: bool,
    control_char: bool,
    astral_key: bool,
    astral_value: bool,
    array_in_array: bool,
    object_in_array: bool,
}

fn walk(value: &Value, seen: &mut Seen) {
    let astral = |s: &str| s.chars().any(|c| c as u32 > 0xFFFF);
    match value {
        Value::Number(n) => {
            if n.as_u64().is_some_and(|u| u > 1 << 53) {
                seen.integers_above_2_53 = true;
            }
            if let Some(f) = n.as_f64() {
                seen.negative |= f.is_sign_negative();
            }
            if n.is_f64() {
                let f = n.as_f64().unwrap();
                seen.negative_zero |= f == 0.0 && f.is_sign_negative();
                seen.integral_float |= f.fract() == 0.0 && f.abs() < 1e15;
                let text = n.to_string();
                if text.contains('e') {
                    seen.exponent_floats.insert(text);
                }
            }
        }
        Value::String(s) => {
            seen.control_char |= s.chars().any(|c| c < ' ');
            seen.astral_value |= astral(s);
        }
        Value::Array(items) => {
            seen.array_in_array |= items.iter().any(Value::is_array);
            seen.object_in_array |= items.iter().any(Value::is_object);
            items.iter().for_each(|i| walk(i, seen));
        }
        Value::Object(map) => {
            for (k, v) in map {
                seen.astral_key |= astral(k);
                seen.control_char |= k.chars().any(|c| c < ' ');
                walk(v, seen);
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

#[test]
fn the_vectors_cover_every_documented_case() {
    let vectors = vectors();
    assert!(vectors.len() >= 12, "at least 12 vectors");
    let mut seen = Seen::default();
    for v in &vectors {
        walk(&v.args, &mut seen);
    }
    assert!(seen.exponent_floats.contains("1e+21"), "1e21");
    assert!(
        seen.exponent_floats.iter().any(|f| f.contains("e-")),
        "a small float"
    );
    assert!(seen.integers_above_2_53, "a u64 above 2^53");
    assert!(
        seen.negative && seen.negative_zero,
        "negative numbers and -0"
    );
    assert!(
        seen.integral_float,
        "a float with an integral value (written with .0)"
    );
    assert!(seen.control_char, "control characters");
    assert!(
        seen.astral_key && seen.astral_value,
        "astral-plane keys and values"
    );
    assert!(
        seen.array_in_array && seen.object_in_array,
        "nested arrays and objects"
    );
    assert!(
        vectors.iter().any(|v| v.args == serde_json::json!({})),
        "empty args"
    );
    for kind in ["args", "fields", "intent"] {
        assert!(
            vectors.iter().any(|v| v.material == kind),
            "{kind} material"
        );
    }
    assert!(vectors
        .iter()
        .any(|v| v.tenant.is_some() && v.principal.is_some()));
    assert!(vectors
        .iter()
        .any(|v| v.tenant.is_none() && v.principal.is_some()));
    assert!(
        vectors.iter().any(|v| v.tenant.as_deref() == Some("")),
        "an empty tenant, which differs from none"
    );
    assert!(
        vectors
            .iter()
            .any(|v| v.intent.is_some() && v.key_fields.is_some()),
        "an intent id next to key fields (the intent wins)"
    );
    assert!(
        vectors.iter().any(|v| v
            .key_fields_canonical
            .as_ref()
            .is_some_and(|f| f.len() >= 128)),
        "key material of 128 bytes or more (a two-byte length prefix)"
    );
    // Keys that must differ do; keys that must agree do.
    let key = |name: &str| &vectors.iter().find(|v| v.name == name).unwrap().key;
    assert_ne!(key("tenant-empty"), key("no-tenant"));
    assert_eq!(key("intent"), key("intent-over-key-fields"));
    assert_eq!(key("key-fields"), key("key-fields-other-memo"));
    // A one-step pointer is the member it names.
    assert_eq!(key("key-fields"), key("key-pointer-one-step"));
    // An excluded part changes neither the key nor the fingerprint, only the saved text.
    let vector = |name: &str| vectors.iter().find(|v| v.name == name).unwrap();
    assert_eq!(key("exclude"), key("exclude-reworded"));
    assert_eq!(
        vector("exclude").fingerprint,
        vector("exclude-reworded").fingerprint
    );
    assert_ne!(
        vector("exclude").canonical,
        vector("exclude-reworded").canonical
    );
    // A renamed tool that keeps its old name as key name keeps its keys.
    assert_eq!(key("key-name"), key("args-tenant"));
    assert_ne!(vector("key-name").tool, vector("args-tenant").tool);
    assert!(
        vectors.iter().any(|v| v
            .key_fields
            .iter()
            .flatten()
            .any(|f| f.matches('/').count() > 1)),
        "a key field by a nested JSON Pointer"
    );
    assert!(
        vectors
            .iter()
            .any(|v| v.exclude.is_some() && v.key_fields.is_some()),
        "an exclusion inside a key field"
    );
    let keys: HashSet<&str> = vectors.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys.len(), vectors.len() - 5, "every other key is distinct");
}

// ---- What the vectors cannot show: the typed value model. ----

#[test]
fn typed_arguments_are_canonicalized_as_their_type_serializes_them() {
    #[derive(serde::Serialize)]
    struct Args {
        amount: f64,
        ratio: f32,
        note: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        memo: Option<String>,
    }
    let args = Args {
        amount: 49.0,
        ratio: 0.1,
        note: None,
        memo: None,
    };
    let id = identify(&args, &["memo"]).unwrap();
    // An f64 is always a float (`49.0`, never `49`); an f32 is widened to f64 first; a
    // skipped field is absent from the arguments but reads as null in the key fields.
    assert_eq!(
        String::from_utf8(id.canonical).unwrap(),
        r#"{"amount":49.0,"note":null,"ratio":0.10000000149011612}"#
    );
    assert_eq!(id.key_fields.unwrap(), br#"{"memo":null}"#);
    // A float that is not finite has no JSON form: it is written as null.
    let id = identify(&[f64::NAN, f64::INFINITY, -0.0], &[] as &[&str]).unwrap();
    assert_eq!(id.canonical, b"[null,null,-0.0]");
    // Arguments of `()` (a tool without arguments) are `null`.
    assert_eq!(identify(&(), &[] as &[&str]).unwrap().canonical, b"null");
}
