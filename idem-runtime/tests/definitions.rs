//! Tool definitions: each format has the shape its API documents, and MCP definitions validate
//! against the published MCP JSON Schemas (`Tool`, both versions kept in `tests/data`).

use idem_runtime::definitions::to_strict;
use idem_runtime::{
    DefinitionOptions, Downstream, Format, ReadCtx, ReadTool, Registry, ToolError, ToolSpec,
    WriteCtx, WriteTool,
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
    let defs = registry().definitions(Format::Mcp);
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
        .call(idem_runtime::ToolCall::new("run", "ping", json!({})))
        .await;
    assert_eq!(r.output(), Some(&json!("pong")), "{:?}", r.as_result());
}
