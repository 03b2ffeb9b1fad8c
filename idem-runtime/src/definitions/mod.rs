//! Expose: tool definitions in the shapes OpenAI (Chat Completions and Responses), Anthropic
//! and MCP clients expect.

mod strict;

pub use crate::tool::input_schema_for;
pub use strict::to_strict;

use serde_json::{json, Value};

use crate::tool::{DynTool, ToolKind};

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
    /// MCP `Tool`: `{name, description, inputSchema, annotations}`.
    Mcp,
}

/// Options of [`crate::Registry::definitions_with`].
///
/// ```
/// # use idem_runtime::DefinitionOptions;
/// let strict = DefinitionOptions::default().strict(true);
/// assert!(strict.strict);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DefinitionOptions {
    /// OpenAI strict mode: `"strict": true` and a schema rewritten to its rules
    /// (closed objects, every property required, optional ones nullable). A tool whose
    /// schema strict mode cannot express (a map, an enum of argument shapes) is offered
    /// with `"strict": false` and its schema as it is. Used by both OpenAI formats; ignored
    /// by the others.
    pub strict: bool,
}

impl DefinitionOptions {
    /// Sets OpenAI strict mode (see [`DefinitionOptions::strict`](#structfield.strict)).
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = on;
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
                // Every idem write is idempotent: repeats with the same key replay.
                ToolKind::Write => json!({
                    "readOnlyHint": false,
                    "destructiveHint": spec.is_destructive(),
                    "idempotentHint": true,
                }),
            };
            json!({
                "name": spec.name(),
                "inputSchema": schema,
                "annotations": annotations,
            })
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
