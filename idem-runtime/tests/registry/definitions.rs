//! Tool definitions: each format has the shape its API documents, and MCP definitions validate
//! against the published MCP JSON Schemas (`Tool`, both versions kept in `tests/data`), output
//! schemas included, with the structured content of real calls valid against them.

use idem_runtime::{
    definitions::{
        into_mcp_structured_content, mcp_output_schema, mcp_structured_content, to_strict,
    },
    tool::output_schema_for,
};
use idem_runtime::{
    definitions::{DefinitionOptions, Format},
    registry::Registry,
    tool::{Downstream, ReadCtx, ReadTool, ToolError, ToolSpec, WriteCtx, WriteTool},
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Address {
    line1: String,
    postcode: Option<String>,
}

/// Arguments with a nested type and optional fields.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The customer id.
    customer: String,
    cents: u64,
    memo: Option<String>,
    billing: Option<Address>,
    shipping: Address,
}

struct Charge;
impl WriteTool for Charge {
    type Args = ChargeArgs;
    type Output = ();
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("charge_card")
            .description("Charge a customer's card.")
            .downstream(Downstream::Keyed)
            .destructive(true)
    }
    async fn call(&self, _ctx: WriteCtx, _args: ChargeArgs) -> Result<(), ToolError> {
        Ok(())
    }
}

struct Ping;
impl ReadTool for Ping {
    type Args = ();
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("ping").description("Is the service up?")
    }
    async fn call(&self, _ctx: ReadCtx, _args: ()) -> Result<&'static str, ToolError> {
        Ok("pong")
    }
}

fn registry() -> Registry {
    Registry::builder().tool(Charge).tool(Ping).build().unwrap()
}

fn assert_clean_input_schema(schema: &Value) {
    assert_eq!(schema["type"], "object", "{schema}");
    assert!(schema.get("$schema").is_none(), "no $schema URL: {schema}");
    let text = schema.to_string();
    assert!(!text.contains("$ref"), "nested types are inlined: {text}");
    assert!(
        !text.contains("\"null\""),
        "optional fields are not rendered nullable: {text}"
    );
}

#[test]
fn openai_shape() {
    let defs = registry().definitions(Format::OpenAi);
    assert_eq!(defs.len(), 2);
    let f = &defs[0];
    assert_eq!(f["type"], "function");
    assert_eq!(f["function"]["name"], "charge_card");
    assert_eq!(f["function"]["description"], "Charge a customer's card.");
    assert_clean_input_schema(&f["function"]["parameters"]);
    let required = f["function"]["parameters"]["required"].as_array().unwrap();
    assert!(required.contains(&json!("customer")) && !required.contains(&json!("memo")));
    assert_clean_input_schema(&defs[1]["function"]["parameters"]);
    assert!(f["function"].get("strict").is_none());
}

#[test]
fn openai_strict_closes_objects_and_requires_everything() {
    let defs =
        registry().definitions_with(Format::OpenAi, &DefinitionOptions::default().strict(true));
    let f = &defs[0]["function"];
    assert_eq!(f["strict"], true);
    let p = &f["parameters"];
    assert_eq!(p["additionalProperties"], false);
    let required: Vec<&str> = p["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for name in ["customer", "cents", "memo", "billing", "shipping"] {
        assert!(required.contains(&name), "{name} required in strict mode");
    }
    assert_eq!(p["properties"]["memo"]["type"], json!(["string", "null"]));
    assert_eq!(p["properties"]["shipping"]["additionalProperties"], false);
    // Idempotent: strictifying twice changes nothing more.
    assert_eq!(to_strict(p).as_ref(), Some(p));
}

#[test]
fn anthropic_shape() {
    let defs = registry().definitions(Format::Anthropic);
    let t = &defs[0];
    assert_eq!(t["name"], "charge_card");
    assert_eq!(t["description"], "Charge a customer's card.");
    assert_clean_input_schema(&t["input_schema"]);
    assert_eq!(t.as_object().unwrap().len(), 3);
    assert_eq!(
        defs[1]["input_schema"],
        json!({"type": "object", "properties": {}})
    );
}

fn mcp_tool_validator(file: &str) -> jsonschema::Validator {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    let full: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let schema = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Tool",
        "$defs": full["$defs"],
    });
    jsonschema::validator_for(&schema).unwrap()
}

#[test]
fn mcp_definitions_validate_against_the_published_schemas() {
    let mut defs = registry().definitions(Format::Mcp);
    defs.extend(typed_registry().definitions(Format::Mcp));
    for file in ["schema-2025-11-25.json", "schema-2026-07-28.json"] {
        let validator = mcp_tool_validator(file);
        for d in &defs {
            let errors: Vec<String> = validator.iter_errors(d).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{file}: {d} invalid: {errors:?}");
        }
        // The validator is not vacuous: a definition without inputSchema fails.
        let mut broken = defs[0].clone();
        broken.as_object_mut().unwrap().remove("inputSchema");
        assert!(
            !validator.is_valid(&broken),
            "{file}: validator accepts anything"
        );
    }
    let write = &defs[0];
    assert_eq!(write["annotations"]["readOnlyHint"], false);
    assert_eq!(write["annotations"]["idempotentHint"], true);
    assert_eq!(write["annotations"]["destructiveHint"], true);
    assert_eq!(defs[1]["annotations"]["readOnlyHint"], true);
    assert_clean_input_schema(&write["inputSchema"]);
}

#[tokio::test]
async fn a_tool_without_arguments_accepts_an_empty_object() {
    let r = registry()
        .call(idem_runtime::call::ToolCall::new("run", "ping", json!({})))
        .await;
    assert_eq!(r.output(), Some(&json!("pong")), "{:?}", r.as_result());
}

/// A receipt: an object output, with an optional field and a nested type.
#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Receipt {
    id: String,
    cents: u64,
    memo: Option<String>,
    shipping: Address,
}

/// A recursive output type: its schema keeps `$defs` and `$ref`s into them.
#[derive(Serialize, schemars::JsonSchema)]
struct Category {
    name: String,
    children: Vec<Category>,
}

/// An output type whose schema has no root `type` (`oneOf` of objects).
#[derive(Serialize, schemars::JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Delivery {
    Sent { at: u64 },
    Bounced { reason: String },
}

struct Issue;
impl WriteTool for Issue {
    type Args = ChargeArgs;
    type Output = Receipt;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("issue_receipt").output_schema(output_schema_for::<Receipt>())
    }
    async fn call(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, ToolError> {
        Ok(Receipt {
            id: format!("rc_{}", args.customer),
            cents: args.cents,
            memo: args.memo,
            shipping: args.shipping,
        })
    }
}

/// Read tools whose output is `O`, made by `make` from the `text` argument.
struct Typed<O> {
    name: &'static str,
    schema: bool,
    make: fn(String) -> O,
}

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct Text {
    text: String,
}

impl<O: Serialize + schemars::JsonSchema + Send + Sync + 'static> ReadTool for Typed<O> {
    type Args = Text;
    type Output = O;
    fn spec(&self) -> ToolSpec {
        let spec = ToolSpec::new(self.name).description("A typed output.");
        if self.schema {
            spec.output_schema(output_schema_for::<O>())
        } else {
            spec
        }
    }
    async fn call(&self, _ctx: ReadCtx, args: Text) -> Result<O, ToolError> {
        Ok((self.make)(args.text))
    }
}

fn typed_registry() -> Registry {
    let tree = |text: String| {
        vec![Category {
            name: text.clone(),
            children: vec![Category {
                name: format!("{text}/leaf"),
                children: vec![],
            }],
        }]
    };
    Registry::builder()
        .tool(Issue)
        .tool(Typed {
            name: "words",
            schema: true,
            make: |t: String| t.split(' ').map(str::to_owned).collect::<Vec<_>>(),
        })
        .tool(Typed {
            name: "categories",
            schema: true,
            make: tree,
        })
        .tool(Typed {
            name: "delivery",
            schema: true,
            make: |t: String| match t.as_str() {
                "sent" => Delivery::Sent { at: 1_700_000_000 },
                _ => Delivery::Bounced { reason: t },
            },
        })
        .tool(Typed {
            name: "maybe",
            schema: true,
            make: |t: String| (!t.is_empty()).then_some(t),
        })
        .tool(Typed {
            name: "anything",
            schema: true,
            make: |t: String| json!({"echo": t}),
        })
        .tool(Typed {
            name: "no_schema",
            schema: false,
            make: |t: String| json!({"echo": t}),
        })
        .build()
        .unwrap()
}

fn mcp_definition<'a>(defs: &'a [Value], name: &str) -> &'a Value {
    defs.iter().find(|d| d["name"] == name).unwrap()
}

#[test]
fn mcp_output_schemas_are_objects_at_the_root_and_absent_when_undeclared() {
    let defs = typed_registry().definitions(Format::Mcp);
    // An object output: its own schema, `null` allowed where serde writes it.
    let issue = &mcp_definition(&defs, "issue_receipt")["outputSchema"];
    assert_eq!(issue["type"], "object");
    assert_eq!(
        issue["properties"]["memo"]["type"],
        json!(["string", "null"])
    );
    assert!(issue.get("$schema").is_none(), "{issue}");
    // Anything else: wrapped in `{"result": …}`, `$defs` at the root its `$ref`s point to.
    for name in ["words", "categories", "delivery", "maybe"] {
        let schema = &mcp_definition(&defs, name)["outputSchema"];
        assert_eq!(schema["type"], "object", "{name}: {schema}");
        assert_eq!(schema["required"], json!(["result"]), "{name}: {schema}");
        assert!(
            schema["properties"]["result"].is_object(),
            "{name}: {schema}"
        );
    }
    let categories = &mcp_definition(&defs, "categories")["outputSchema"];
    assert!(categories["$defs"]["Category"].is_object(), "{categories}");
    assert!(categories["properties"]["result"].get("$defs").is_none());
    // No declared schema, or one that accepts anything: no outputSchema.
    for name in ["anything", "no_schema"] {
        let def = mcp_definition(&defs, name);
        assert!(def.get("outputSchema").is_none(), "{name}: {def}");
    }
    // The provider formats carry no output schema.
    for format in [Format::OpenAi, Format::OpenAiResponses, Format::Anthropic] {
        for def in typed_registry().definitions(format) {
            let text = def.to_string();
            assert!(!text.contains("outputSchema"), "{format:?}: {text}");
            assert!(!text.contains("Category"), "{format:?}: {text}");
        }
    }
}

#[tokio::test]
async fn structured_content_of_completed_calls_validates_against_the_output_schema() {
    let registry = typed_registry();
    let shipping = json!({"line1": "1 Main St"});
    let calls = [
        (
            "issue_receipt",
            json!({"customer": "acme", "cents": 4900, "shipping": shipping}),
        ),
        (
            "issue_receipt",
            json!({"customer": "acme", "cents": 1, "memo": "tip", "shipping": shipping}),
        ),
        ("words", json!({"text": "exactly once"})),
        ("categories", json!({"text": "books"})),
        ("delivery", json!({"text": "sent"})),
        ("delivery", json!({"text": "mailbox full"})),
        ("maybe", json!({"text": "yes"})),
        ("maybe", json!({"text": ""})),
    ];
    for (name, args) in calls {
        let tool = registry.get(name).unwrap();
        let schema = mcp_output_schema(tool.spec()).unwrap();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let result = registry
            .call(idem_runtime::call::ToolCall::new("run", name, args.clone()))
            .await;
        let output = result
            .output()
            .unwrap_or_else(|| panic!("{name}: {result:?}"));
        let content = mcp_structured_content(tool.spec(), output).unwrap();
        // Given up rather than lent, the output becomes the same content.
        assert_eq!(
            into_mcp_structured_content(tool.spec(), output.clone()).as_ref(),
            Some(&content),
            "{name}"
        );
        let errors: Vec<String> = validator
            .iter_errors(&content)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{name} {args}: {content} against {schema}: {errors:?}"
        );
        // The validator is not vacuous: the bare output of a wrapped tool, or a receipt
        // without its id, fails.
        let wrong = match output {
            Value::Object(o) => Value::Object(
                o.iter()
                    .filter(|(k, _)| *k != "id")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            other => other.clone(),
        };
        if name == "issue_receipt" || !wrong.is_object() {
            assert!(
                !validator.is_valid(&wrong),
                "{name}: {wrong} accepted by {schema}"
            );
        }
    }
    // Without an output schema, an object output is the structured content, unwrapped.
    for name in ["anything", "no_schema"] {
        let tool = registry.get(name).unwrap();
        let result = registry
            .call(idem_runtime::call::ToolCall::new(
                "run",
                name,
                json!({"text": "hi"}),
            ))
            .await;
        assert_eq!(
            mcp_structured_content(tool.spec(), result.output().unwrap()),
            Some(json!({"echo": "hi"}))
        );
        assert_eq!(
            into_mcp_structured_content(tool.spec(), result.output().unwrap().clone()),
            Some(json!({"echo": "hi"}))
        );
    }
}
