//! Expose: tool definitions in the shapes OpenAI (Chat Completions and Responses), Anthropic
//! and MCP clients expect.

mod strict;

pub use strict::to_strict;

use serde_json::{json, Value};

use crate::tool::schema::subschema_as_object;
use crate::tool::{DynTool, ToolKind, ToolSpec};

/// Which API's tool-definition shape to produce. More shapes will come as APIs do, so a
/// `match` on it needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// OpenAI Chat Completions: `{"type": "function", "function": {name, description,
    /// parameters}}`.
    OpenAi,
    /// OpenAI Responses API, flat: `{"type": "function", name, description, parameters,
    /// strict}`. `strict` is always given (`false` unless asked for), since the Responses
    /// API may apply strict mode to a tool that does not say.
    OpenAiResponses,
    /// `{name, description, input_schema}`.
    Anthropic,
    /// MCP `Tool`: `{name, description, inputSchema, outputSchema, annotations}`;
    /// `outputSchema` only for a tool that declares an output schema (see
    /// [`mcp_output_schema`]).
    Mcp,
}

/// Options of [`crate::registry::Registry::definitions_with`].
///
/// ```
/// # use idem_runtime::definitions::DefinitionOptions;
/// let strict = DefinitionOptions::default().strict(true);
/// assert!(strict.strict);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DefinitionOptions {
    /// OpenAI strict mode: `"strict": true` and a schema rewritten to its rules
    /// (closed objects, every property required, optional ones nullable, no keyword strict
    /// mode refuses, such as an integer's `format` or a `default`). A tool whose
    /// schema strict mode cannot express (a map, an enum of argument shapes) is offered
    /// with `"strict": false` and its schema as it is. Used by both OpenAI formats; ignored
    /// by the others.
    pub strict: bool,
    /// MCP: leave `idempotentHint` out of write tools' annotations. The hint tells a client
    /// that re-sending a call has no further effect, which holds only where the repeat
    /// reaches the saved record: the call's scope must outlive the connection and the store
    /// must outlive the process ([`Durability`](crate::store::Durability)). A host that
    /// serves the definitions where that fails (an in-memory store, calls it cannot scope)
    /// sets this; idem's MCP server decides it per server. Ignored by the other formats.
    pub without_idempotent_hint: bool,
}

impl DefinitionOptions {
    /// Sets OpenAI strict mode (see [`DefinitionOptions::strict`](#structfield.strict)).
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = on;
        self
    }

    /// Whether MCP write definitions carry `idempotentHint: true` (the default); see
    /// [`DefinitionOptions::without_idempotent_hint`](#structfield.without_idempotent_hint).
    pub fn idempotent_hint(mut self, on: bool) -> Self {
        self.without_idempotent_hint = !on;
        self
    }
}

/// The definition of one tool in `format`.
///
/// A tool without a description (no doc comment, no `description`) gets no `description`
/// field rather than an empty one.
pub fn definition(tool: &DynTool, format: Format, options: &DefinitionOptions) -> Value {
    let spec = tool.spec();
    let schema = tool.input_schema();
    let mut def = match format {
        Format::OpenAi => {
            let mut function = json!({ "name": spec.name() });
            describe(&mut function, spec.description_text());
            if let Some(strict) = openai_parameters(&mut function, schema, options) {
                function["strict"] = Value::Bool(strict);
            }
            return json!({ "type": "function", "function": function });
        }
        Format::OpenAiResponses => {
            let mut def = json!({ "type": "function", "name": spec.name() });
            describe(&mut def, spec.description_text());
            let strict = openai_parameters(&mut def, schema, options).unwrap_or(false);
            def["strict"] = Value::Bool(strict);
            return def;
        }
        Format::Anthropic => json!({
            "name": spec.name(),
            "input_schema": schema,
        }),
        Format::Mcp => {
            let annotations = match tool.kind() {
                ToolKind::Read => json!({
                    "readOnlyHint": true,
                    "destructiveHint": false,
                    "idempotentHint": true,
                }),
                // A repeat with the same key replays, but only while the repeat reaches the
                // record: the host says when it cannot (see `without_idempotent_hint`).
                ToolKind::Write if options.without_idempotent_hint => json!({
                    "readOnlyHint": false,
                    "destructiveHint": spec.is_destructive(),
                }),
                ToolKind::Write => json!({
                    "readOnlyHint": false,
                    "destructiveHint": spec.is_destructive(),
                    "idempotentHint": true,
                }),
            };
            let mut def = json!({
                "name": spec.name(),
                "inputSchema": schema,
                "annotations": annotations,
            });
            if let Some(output) = mcp_output_schema(spec) {
                def["outputSchema"] = output;
            }
            def
        }
    };
    describe(&mut def, spec.description_text());
    def
}

/// Sets `parameters` on an OpenAI function definition; returns the `strict` flag to set, if
/// strict mode was asked for.
fn openai_parameters(def: &mut Value, schema: &Value, options: &DefinitionOptions) -> Option<bool> {
    match options.strict.then(|| to_strict(schema)) {
        Some(Some(strict)) => {
            def["parameters"] = strict;
            Some(true)
        }
        // Asked for strict, but this schema (a map, a choice at the root) would accept less
        // under strict rules: offered as it is, and said so.
        Some(None) => {
            def["parameters"] = schema.clone();
            Some(false)
        }
        None => {
            def["parameters"] = schema.clone();
            None
        }
    }
}

fn describe(def: &mut Value, description: &str) {
    if !description.is_empty() {
        def["description"] = Value::String(description.to_owned());
    }
}

/// The property that holds the output of a tool whose output is not a JSON object, in its
/// MCP `outputSchema` and `structuredContent`: `{"result": [..]}` for a `Vec`, as the
/// official MCP SDKs do.
pub const MCP_RESULT_PROPERTY: &str = "result";

/// How a tool's output travels as MCP structured content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum McpOutput {
    /// The schema's root is an object: the output is the structured content.
    Direct,
    /// Any other schema: the structured content is `{"result": output}`.
    Wrapped,
}

/// Keywords that annotate a schema without constraining what it accepts.
const ANNOTATIONS: [&str; 7] = [
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
];

fn mcp_output(spec: &ToolSpec) -> Option<McpOutput> {
    match spec.output_schema_value()? {
        Value::Object(root) if root.get("type").and_then(Value::as_str) == Some("object") => {
            Some(McpOutput::Direct)
        }
        // A schema that accepts any JSON (a `serde_json::Value` output) tells a client
        // nothing: the tool is offered as one without an output schema, and an object output
        // is still its structured content, unwrapped.
        Value::Object(root) if root.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) => None,
        Value::Object(_) => Some(McpOutput::Wrapped),
        // `true` accepts anything (as above); `false` nothing, so the tool never completes.
        // Neither is worth an output schema. Anything else is not a schema at all.
        _ => None,
    }
}

/// The MCP `outputSchema` of a tool: its declared output schema when the root is
/// `"type": "object"` (MCP 2025-11-25 accepts nothing else at the root); any other schema (a
/// `Vec`, a string, an enum, an `Option`) wrapped as the object
/// `{"type": "object", "properties": {"result": schema}, "required": ["result"]}`, its
/// `$defs` moved to the new root where its `$ref`s point. `None` when the tool declares no
/// output schema, or one that accepts any JSON value (`serde_json::Value`), or one that is
/// not a JSON Schema object. [`mcp_structured_content`] shapes the output to match.
///
/// ```
/// # use idem_runtime::{definitions::mcp_output_schema, tool::output_schema_for};
/// # use idem_runtime::tool::ToolSpec;
/// let spec = ToolSpec::new("customers").output_schema(output_schema_for::<Vec<String>>());
/// let schema = mcp_output_schema(&spec).unwrap();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["properties"]["result"]["type"], "array");
/// ```
pub fn mcp_output_schema(spec: &ToolSpec) -> Option<Value> {
    let how = mcp_output(spec)?;
    let mut schema = spec.output_schema_value()?.clone();
    subschema_as_object(&mut schema);
    if how == McpOutput::Direct {
        return Some(schema);
    }
    let mut root = serde_json::Map::new();
    if let Value::Object(inner) = &mut schema {
        inner.remove("$schema");
        for defs in ["$defs", "definitions"] {
            if let Some(d) = inner.remove(defs) {
                root.insert(defs.to_owned(), d);
            }
        }
    }
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), json!({ MCP_RESULT_PROPERTY: schema }));
    root.insert("required".into(), json!([MCP_RESULT_PROPERTY]));
    Some(Value::Object(root))
}

/// The MCP `structuredContent` of a completed call of the tool `spec` describes, whose output
/// is `output`; it validates against [`mcp_output_schema`]. A tool with a wrapped output
/// schema gets `{"result": output}`; any other tool gets its output when that is a JSON
/// object, and `None` otherwise (with a direct output schema, only an output that breaks
/// its own type's schema, such as the `null` saved for one that did not serialize).
pub fn mcp_structured_content(spec: &ToolSpec, output: &Value) -> Option<Value> {
    match mcp_output(spec) {
        Some(McpOutput::Wrapped) => Some(json!({ MCP_RESULT_PROPERTY: output })),
        Some(McpOutput::Direct) | None => output.is_object().then(|| output.clone()),
    }
}

/// [`mcp_structured_content`] of an output the caller gives up: the structured content is
/// `output` itself (or holds it), moved rather than copied.
pub fn into_mcp_structured_content(spec: &ToolSpec, output: Value) -> Option<Value> {
    match mcp_output(spec) {
        Some(McpOutput::Wrapped) => {
            let mut wrapped = serde_json::Map::new();
            wrapped.insert(MCP_RESULT_PROPERTY.to_owned(), output);
            Some(Value::Object(wrapped))
        }
        Some(McpOutput::Direct) | None => output.is_object().then_some(output),
    }
}
