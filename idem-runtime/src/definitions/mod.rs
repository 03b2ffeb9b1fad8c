//! Expose: tool definitions in the shapes OpenAI, Anthropic and MCP clients expect.

pub(crate) mod schema;

pub use schema::{input_schema_for, to_strict};

use serde_json::{json, Value};

use crate::tool::{DynTool, ToolKind};

/// Which API's tool-definition shape to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `{"type": "function", "function": {name, description, parameters}}`.
    OpenAi,
    /// `{name, description, input_schema}`.
    Anthropic,
    /// MCP `Tool`: `{name, description, inputSchema, annotations}`.
    Mcp,
}

/// Options of [`crate::Registry::definitions_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefinitionOptions {
    /// OpenAI strict mode: `"strict": true` and a schema rewritten to its rules
    /// (closed objects, every property required, optional ones nullable). Ignored by the
    /// other formats.
    pub strict: bool,
}

/// The definition of one tool in `format`.
pub fn definition(tool: &DynTool, format: Format, options: &DefinitionOptions) -> Value {
    let spec = tool.spec();
    let schema = tool.input_schema();
    match format {
        Format::OpenAi => {
            let mut function = json!({
                "name": spec.name(),
                "description": spec.description_text(),
            });
            if options.strict {
                function["parameters"] = to_strict(schema);
                function["strict"] = Value::Bool(true);
            } else {
                function["parameters"] = schema.clone();
            }
            json!({ "type": "function", "function": function })
        }
        Format::Anthropic => json!({
            "name": spec.name(),
            "description": spec.description_text(),
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
                "description": spec.description_text(),
                "inputSchema": schema,
                "annotations": annotations,
            })
        }
    }
}
