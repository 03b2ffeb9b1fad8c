//! Tool definitions through the facade: what a tool advertises is what it accepts. A model (or
//! an MCP client that validates before sending) builds its arguments from the advertised input
//! schema; a call the schema allows must not be refused for its shape, and a call the tool
//! refuses must not be one the schema allows. Checked with a JSON Schema validator against
//! what the registry did: ran the handler, or refused with nothing run.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{
    tool,
    tool::{ReadTool, ToolSpec, WriteTool},
    toolbox, CallError, Format, ReadCtx, Registry, ToolCall, ToolError, WriteCtx,
};
use serde_json::{json, Value};

#[derive(Default)]
struct Counter {
    runs: AtomicU32,
}

impl Counter {
    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

#[idem::args]
struct Open {
    name: String,
}

#[idem::args]
struct Amount {
    cents: u64,
    delta: i32,
}

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Closed {
    name: String,
}

#[toolbox]
impl Counter {
    /// Ring the bell (no arguments, an effect).
    #[tool(write)]
    async fn ring(&self, _ctx: WriteCtx) -> Result<u32, ToolError> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Count the rings so far (no arguments).
    #[tool(read)]
    async fn rings(&self, _ctx: ReadCtx) -> Result<u32, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(0)
    }

    /// Greet someone (extra members ignored).
    #[tool(write)]
    async fn greet(&self, _ctx: WriteCtx, args: Open) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(args.name)
    }

    /// Move an amount (integers).
    #[tool(write)]
    async fn transfer(&self, _ctx: WriteCtx, args: Amount) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!("{} {}", args.cents, args.delta))
    }

    /// Greet someone (extra members refused).
    #[tool(write)]
    async fn greet_strictly(&self, _ctx: WriteCtx, args: Closed) -> Result<String, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(args.name)
    }
}

/// A tool written against the trait with `Args = ()`.
struct Ping(Arc<Counter>);

impl ReadTool for Ping {
    type Args = ();
    type Output = &'static str;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("ping").description("Is the service up?")
    }
    async fn call(&self, _ctx: ReadCtx, _args: ()) -> Result<&'static str, ToolError> {
        self.0.runs.fetch_add(1, Ordering::SeqCst);
        Ok("pong")
    }
}

/// The same with an effect.
struct Bell(Arc<Counter>);

impl WriteTool for Bell {
    type Args = ();
    type Output = u32;
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("bell").description("Ring the bell.")
    }
    async fn call(&self, _ctx: WriteCtx, _args: ()) -> Result<u32, ToolError> {
        Ok(self.0.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

/// A free no-argument write tool.
#[tool(write)]
async fn reboot(_ctx: WriteCtx) -> Result<&'static str, ToolError> {
    Ok("rebooting")
}

fn schema_of(registry: &Registry, tool: &str, format: Format) -> Value {
    let defs = registry.definitions(format);
    let d = defs
        .iter()
        .find(|d| d["name"] == tool || d["function"]["name"] == tool)
        .unwrap_or_else(|| panic!("{tool} is defined"));
    match format {
        Format::OpenAi => d["function"]["parameters"].clone(),
        Format::OpenAiResponses => d["parameters"].clone(),
        Format::Anthropic => d["input_schema"].clone(),
        Format::Mcp => d["inputSchema"].clone(),
        _ => unreachable!(),
    }
}

/// For each argument object: the schema's verdict equals the registry's, and a refused call
/// ran nothing.
async fn assert_schema_agrees_with_the_call(tool: &str, cases: &[Value]) {
    let counter = Arc::new(Counter::default());
    let registry = Registry::builder()
        .toolbox(counter.clone())
        .tool(Ping(counter.clone()))
        .tool(Bell(counter.clone()))
        .build()
        .unwrap();
    for format in [
        Format::OpenAi,
        Format::OpenAiResponses,
        Format::Anthropic,
        Format::Mcp,
    ] {
        let schema = schema_of(&registry, tool, format);
        let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
        for (i, args) in cases.iter().enumerate() {
            let before = counter.runs();
            let r = registry
                .call(ToolCall::new(
                    format!("run-{format:?}-{i}"),
                    tool,
                    args.clone(),
                ))
                .await;
            let accepted = r.is_completed();
            let allowed = validator.is_valid(args);
            assert_eq!(
                accepted,
                allowed,
                "{tool} {format:?}: schema {schema} {} {args}, the call was {}",
                if allowed { "allows" } else { "refuses" },
                match r.error() {
                    Some(e) => format!("refused: {e}"),
                    None => format!("{:?}", r.class()),
                }
            );
            if !accepted {
                assert!(
                    matches!(r.error(), Some(CallError::InvalidArgs { .. })),
                    "{:?}",
                    r.as_result()
                );
                assert_eq!(counter.runs(), before, "a refused call ran nothing");
            }
        }
    }
}

#[tokio::test]
async fn a_tool_without_arguments_advertises_exactly_what_it_accepts() {
    let cases = [
        json!({}),
        json!({"x": 1}),
        json!({"reason": "because", "force": true}),
    ];
    assert_schema_agrees_with_the_call("ring", &cases).await;
    assert_schema_agrees_with_the_call("rings", &cases).await;
    assert_schema_agrees_with_the_call("ping", &cases).await;
    assert_schema_agrees_with_the_call("bell", &cases).await;
}

#[tokio::test]
async fn extra_members_are_advertised_as_they_are_handled() {
    let cases = [
        json!({"name": "ada"}),
        json!({"name": "ada", "x": 1}),
        json!({}),
        json!({"name": 7}),
    ];
    assert_schema_agrees_with_the_call("greet", &cases).await;
    assert_schema_agrees_with_the_call("greet_strictly", &cases).await;
}

#[tokio::test]
async fn integer_fields_accept_what_the_schemas_integer_allows() {
    let cases = [
        json!({"cents": 4900, "delta": -3}),
        json!({"cents": 4900.0, "delta": -3.0}),
        json!({"cents": 49e2, "delta": 0}),
        json!({"cents": 4900.5, "delta": 0}),
        json!({"cents": -1, "delta": 0}),
        json!({"cents": -1.0, "delta": 0}),
        json!({"cents": 1, "delta": 3.5}),
        json!({"cents": "4900", "delta": 0}),
    ];
    assert_schema_agrees_with_the_call("transfer", &cases).await;

    // A whole float is the integer it equals: one operation, one effect.
    let counter = Arc::new(Counter::default());
    let registry = Registry::builder()
        .toolbox(counter.clone())
        .build()
        .unwrap();
    let a = registry
        .call(ToolCall::new(
            "run-1",
            "transfer",
            json!({"cents": 4900, "delta": -3}),
        ))
        .await;
    let b = registry
        .call(ToolCall::from_json(
            "run-1",
            "transfer",
            r#"{"cents": 4900.0, "delta": -3.0}"#,
        ))
        .await;
    assert!(
        a.is_completed() && b.is_completed() && b.replayed(),
        "{:?}",
        b.as_result()
    );
    assert_eq!(a.key(), b.key());
    assert_eq!(counter.runs(), 1);
}

#[tokio::test]
async fn a_no_argument_write_runs_once_for_an_empty_object() {
    let registry = Registry::builder().tool(reboot).build().unwrap();
    let a = registry
        .call(ToolCall::new("run-1", "reboot", json!({})))
        .await;
    let b = registry
        .call(ToolCall::from_json("run-1", "reboot", "{ }").call_id("toolu_2"))
        .await;
    assert!(a.is_completed() && !a.replayed(), "{:?}", a.as_result());
    assert!(b.is_completed() && b.replayed(), "{:?}", b.as_result());
    assert_eq!(a.key(), b.key());
}

fn mcp_tool_validator() -> jsonschema::Validator {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/mcp_client/schema/schema-2025-11-25.json"
    );
    let full: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::validator_for(&json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Tool",
        "$defs": full["$defs"],
    }))
    .unwrap()
}

#[test]
fn mcp_definitions_of_every_kind_validate_and_carry_truthful_hints() {
    let registry = Registry::builder()
        .toolbox(Arc::new(Counter::default()))
        .tool(reboot)
        .build()
        .unwrap();
    let validator = mcp_tool_validator();
    let defs = registry.definitions(Format::Mcp);
    assert_eq!(defs.len(), 6);
    for d in &defs {
        let errors: Vec<String> = validator.iter_errors(d).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{d}: {errors:?}");
        let name = d["name"].as_str().unwrap();
        let a = &d["annotations"];
        let read = name == "rings";
        assert_eq!(a["readOnlyHint"], read, "{d}");
        if !read {
            assert_eq!(a["destructiveHint"], false, "{d}");
        }
        assert!(d["inputSchema"]["type"] == "object", "{d}");
        assert!(!d["description"].as_str().unwrap().is_empty());
    }
}

/// A write tool named at run time.
struct Named(&'static str);

impl WriteTool for Named {
    type Args = ();
    type Output = ();
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(self.0).description("A tool.")
    }
    async fn call(&self, _ctx: WriteCtx, _args: ()) -> Result<(), ToolError> {
        Ok(())
    }
}

#[test]
fn tool_names_are_1_to_64_of_letters_digits_underscore_and_hyphen() {
    let max: &'static str = Box::leak("a".repeat(64).into_boxed_str());
    for good in ["a", "A-z_09", "get-charge", "_", "-", max] {
        let registry = Registry::builder().tool(Named(good)).build();
        let registry = registry.unwrap_or_else(|e| panic!("{good:?} refused: {e}"));
        for format in [Format::OpenAi, Format::Anthropic, Format::Mcp] {
            let d = &registry.definitions(format)[0];
            let name = d.get("name").unwrap_or(&d["function"]["name"]);
            assert_eq!(name, good);
        }
    }
    let too_long: &'static str = Box::leak("a".repeat(65).into_boxed_str());
    for bad in [
        "", too_long, "a b", "a.b", "a/b", "é", "charge\n", "tool:1", "a\0",
    ] {
        match Registry::builder().tool(Named(bad)).build() {
            Err(idem::BuildError::InvalidName(message)) => {
                assert!(!message.is_empty());
            }
            Err(other) => panic!("{bad:?}: another error: {other}"),
            Ok(_) => panic!("{bad:?} was accepted"),
        }
    }
    // Two tools, one name: refused, never one silently replacing the other.
    let twice = Registry::builder()
        .tool(Named("charge"))
        .tool(Named("charge"))
        .build();
    assert!(matches!(twice, Err(idem::BuildError::DuplicateName(n)) if n == "charge"));
}
