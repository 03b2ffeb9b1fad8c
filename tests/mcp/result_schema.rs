//! What the MCP server answers is valid MCP: every `tools/call` result (each outcome class,
//! fresh and replayed, a refusal, bad arguments) against the published `CallToolResult`
//! schema, and `tools/list` against `ListToolsResult`, for the protocol version the client
//! asked for. Each call's effect is checked on the ledger too: a result that validates but
//! ran twice would still be wrong.

use std::sync::{Arc, Mutex};

use crate::support::{is_error, outcome, result, LineClient};
use idem::mcp::McpServer;
use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde_json::{json, Value};

#[idem::args]
struct SettleArgs {
    /// `done`, `rejected`, `failed`, `pending`, `unavailable` or `unknown`.
    how: String,
    /// Told apart per test call.
    n: u64,
}

#[idem::args]
struct Settled {
    how: String,
    n: u64,
}

#[idem::args]
struct Lookup {
    n: u64,
}

#[derive(Default)]
struct Ledger {
    runs: Mutex<Vec<(String, u64)>>,
}

impl Ledger {
    fn runs_of(&self, n: u64) -> usize {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.1 == n)
            .count()
    }
}

#[toolbox]
impl Ledger {
    /// Ends as the caller asks.
    #[tool(write)]
    async fn settle_as(&self, _ctx: WriteCtx, args: SettleArgs) -> Result<Settled, ToolError> {
        self.runs.lock().unwrap().push((args.how.clone(), args.n));
        match args.how.as_str() {
            "done" => Ok(Settled {
                how: args.how,
                n: args.n,
            }),
            "rejected" => Err(ToolError::rejected("400: nothing executed")),
            "failed" => Err(ToolError::failed_with_ref(
                "declined",
                format!("ch_{}", args.n),
            )),
            "pending" => Err(ToolError::pending(format!("re_{}", args.n))),
            "unavailable" => Err(ToolError::unavailable_for(
                "503",
                std::time::Duration::from_secs(3600),
            )),
            _ => Err(ToolError::unknown("502 after send")),
        }
    }

    /// How many times `settle_as` ran for `n`.
    #[tool(read)]
    async fn runs(&self, _ctx: ReadCtx, args: Lookup) -> Result<u64, ToolError> {
        Ok(self.runs_of(args.n) as u64)
    }
}

type Client = LineClient<
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
>;

async fn client(server: &McpServer) -> Client {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = server.clone();
    tokio::spawn(async move {
        if let Ok(running) = server.serve(tokio::io::split(server_io)).await {
            let _ = running.waiting().await;
        }
    });
    let (read, write) = tokio::io::split(client_io);
    let mut client = LineClient::new(read, write);
    let init = client.initialize().await;
    assert_eq!(result(&init)["protocolVersion"], "2025-11-25", "{init}");
    client
}

/// A validator for `$defs[def]` of the published schema the client negotiated.
fn validator(def: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/idem-runtime/tests/data/schema-2025-11-25.json"
    ))
    .unwrap();
    let full: Value = serde_json::from_str(&text).unwrap();
    let schema = json!({
        "$schema": full["$schema"],
        "$ref": format!("#/$defs/{def}"),
        "$defs": full["$defs"],
    });
    jsonschema::validator_for(&schema).unwrap()
}

fn assert_valid(validator: &jsonschema::Validator, reply: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(result(reply))
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:?}: {reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tools_call_result_is_a_valid_call_tool_result() {
    let ledger = Arc::new(Ledger::default());
    let server = McpServer::new(Registry::builder().toolbox(ledger.clone()).build().unwrap());
    let mut client = client(&server).await;
    let call_result = validator("CallToolResult");

    let list = client.request("tools/list", json!({})).await;
    assert_valid(&validator("ListToolsResult"), &list);

    for (n, (how, class)) in [
        ("done", "completed"),
        ("rejected", "rejected"),
        ("failed", "failed"),
        ("pending", "pending"),
        ("unavailable", "unavailable"),
        ("unknown", "unknown"),
    ]
    .into_iter()
    .enumerate()
    {
        let n = n as u64;
        let args = json!({"how": how, "n": n});
        let first = client.call_tool("settle_as", args.clone(), None).await;
        assert_valid(&call_result, &first);
        assert_eq!(outcome(&first), class, "{first}");
        assert_eq!(is_error(&first), class != "completed", "{first}");
        let again = client.call_tool("settle_as", args, None).await;
        assert_valid(&call_result, &again);
        // Rejected and unavailable did nothing, so they may run again; the rest replay.
        let runs = if matches!(class, "rejected" | "unavailable") {
            2
        } else {
            1
        };
        assert_eq!(ledger.runs_of(n), runs, "{how}: {again}");
        if runs == 1 {
            assert_eq!(
                result(&again)["_meta"]["idem/replayed"],
                json!(true),
                "{again}"
            );
        }
    }

    // Refused: the same intent with other arguments. Nothing runs.
    let intent = json!({"idem/intent": "intent-1"});
    let ok = client
        .call_tool(
            "settle_as",
            json!({"how": "done", "n": 100}),
            Some(intent.clone()),
        )
        .await;
    assert_valid(&call_result, &ok);
    let refused = client
        .call_tool("settle_as", json!({"how": "done", "n": 101}), Some(intent))
        .await;
    assert_valid(&call_result, &refused);
    assert!(is_error(&refused));
    assert_eq!(outcome(&refused), "refused");
    assert_eq!(ledger.runs_of(101), 0);

    // Bad arguments: a tool error the model can correct, valid too. Nothing runs.
    let bad = client
        .call_tool("settle_as", json!({"how": 7, "n": 200}), None)
        .await;
    assert_valid(&call_result, &bad);
    assert!(is_error(&bad));
    assert_eq!(ledger.runs_of(200), 0);

    // A read.
    let read = client.call_tool("runs", json!({"n": 0}), None).await;
    assert_valid(&call_result, &read);
    assert_eq!(
        result(&read)["structuredContent"],
        json!({"result": 1}),
        "{read}"
    );
}

#[idem::args]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

/// A charge's receipt: an object output, so it is the tool's outputSchema as it stands.
#[idem::args]
struct Receipt {
    charge: String,
    cents: u64,
}

struct Flaky {
    runs: Mutex<u32>,
}

#[toolbox]
impl Flaky {
    /// Charge; the answer of the first request is lost.
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, ToolError> {
        let mut runs = self.runs.lock().unwrap();
        *runs += 1;
        if *runs == 1 {
            return Err(ToolError::unknown("502 after the charge was sent"));
        }
        Ok(Receipt {
            charge: format!("ch_{runs}"),
            cents: args.cents,
        })
    }
}

/// A person resolves an unknown charge as completed with only the downstream's reference
/// (what `idem resolve KEY --completed ch_…` does): the repeat replays it, and what the
/// client gets is still valid against the tool's outputSchema (clients such as the official
/// Python SDK refuse structured content that is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_resolved_by_a_person_keeps_the_output_schema_promise() {
    let flaky = Arc::new(Flaky {
        runs: Mutex::new(0),
    });
    let registry = Registry::builder().toolbox(flaky.clone()).build().unwrap();
    let server = McpServer::new(registry.clone());
    let mut client = client(&server).await;
    let list = client.request("tools/list", json!({})).await;
    let output_schema = result(&list)["tools"][0]["outputSchema"].clone();
    assert_eq!(output_schema["type"], "object", "{list}");
    let output_valid = jsonschema::validator_for(&output_schema).unwrap();

    let args = json!({"customer": "acme", "cents": 4900});
    let first = client.call_tool("charge", args.clone(), None).await;
    assert_eq!(outcome(&first), "unknown", "{first}");
    let key = idem::IdemKey::parse(result(&first)["_meta"]["idem/key"].as_str().unwrap()).unwrap();

    idem::reconcile::resolve(
        &**registry.store(),
        &key,
        idem::reconcile::Resolution::Completed {
            downstream_ref: "ch_1".into(),
            output: None,
        },
        "found in the dashboard",
    )
    .await
    .unwrap();

    let again = client.call_tool("charge", args, None).await;
    assert_valid(&validator("CallToolResult"), &again);
    assert_eq!(outcome(&again), "completed", "{again}");
    assert_eq!(*flaky.runs.lock().unwrap(), 1, "not run again");
    let answer = result(&again);
    match answer.get("structuredContent") {
        Some(structured) => assert!(
            output_valid.is_valid(structured),
            "structuredContent {structured} breaks the advertised outputSchema {output_schema}"
        ),
        // Without structured content, a tool with an outputSchema must answer as an error.
        None => assert!(is_error(&again), "{again}"),
    }
    let text = answer["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("ch_1"),
        "the model still learns the reference: {text}"
    );
}

/// A receipt whose schema has a `pattern`: a keyword the server's outputSchema check does not
/// evaluate, so it cannot tell whether an output it did not produce itself meets the schema.
#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct PatternReceipt {
    #[schemars(pattern(r"^ch_[0-9]+$"))]
    charge: String,
}

struct PatternFlaky {
    runs: Mutex<u32>,
}

#[toolbox]
impl PatternFlaky {
    /// Charge; the answer of the first request is lost.
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<PatternReceipt, ToolError> {
        let mut runs = self.runs.lock().unwrap();
        *runs += 1;
        if *runs == 1 {
            return Err(ToolError::unknown("502 after the charge was sent"));
        }
        Ok(PatternReceipt {
            charge: format!("ch_{}", args.cents),
        })
    }
}

/// An outputSchema the server cannot check (here, a `pattern`) fails closed: the handler's
/// own output, serialized from the type the schema describes, is still structured content,
/// but a completion a person recorded is not, even one that looks right — it is sent as an
/// error whose text says it completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_schema_the_server_cannot_check_admits_only_the_handlers_own_output() {
    let flaky = Arc::new(PatternFlaky {
        runs: Mutex::new(0),
    });
    let registry = Registry::builder().toolbox(flaky.clone()).build().unwrap();
    let server = McpServer::new(registry.clone());
    let mut client = client(&server).await;
    let list = client.request("tools/list", json!({})).await;
    let output_schema = result(&list)["tools"][0]["outputSchema"].clone();
    assert_eq!(
        output_schema["properties"]["charge"]["pattern"], "^ch_[0-9]+$",
        "{list}"
    );

    let args = json!({"customer": "acme", "cents": 4900});
    let first = client.call_tool("charge", args.clone(), None).await;
    assert_eq!(outcome(&first), "unknown", "{first}");
    let key = idem::IdemKey::parse(result(&first)["_meta"]["idem/key"].as_str().unwrap()).unwrap();
    idem::reconcile::resolve(
        &**registry.store(),
        &key,
        idem::reconcile::Resolution::Completed {
            downstream_ref: "ch_1".into(),
            output: Some(json!({"charge": "ch_1"})),
        },
        "found in the dashboard",
    )
    .await
    .unwrap();

    let again = client.call_tool("charge", args, None).await;
    assert_valid(&validator("CallToolResult"), &again);
    assert_eq!(outcome(&again), "completed", "{again}");
    assert_eq!(*flaky.runs.lock().unwrap(), 1, "not run again");
    assert!(is_error(&again), "{again}");
    assert!(result(&again).get("structuredContent").is_none(), "{again}");
    let text = result(&again)["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("ch_1"),
        "the model still learns the result: {text}"
    );

    // A fresh call: the handler's own output is sent as structured content.
    let fresh = client
        .call_tool("charge", json!({"customer": "acme", "cents": 12}), None)
        .await;
    assert_valid(&validator("CallToolResult"), &fresh);
    assert!(!is_error(&fresh), "{fresh}");
    assert_eq!(*flaky.runs.lock().unwrap(), 2, "ran once more");
    assert_eq!(
        result(&fresh)["structuredContent"],
        json!({"charge": "ch_12"}),
        "{fresh}"
    );
    assert!(jsonschema::validator_for(&output_schema)
        .unwrap()
        .is_valid(&result(&fresh)["structuredContent"]));
}

#[idem::args]
struct ListArgs {
    /// Only this customer's, when given.
    customer: Option<String>,
}

struct Catalog;

#[toolbox]
impl Catalog {
    /// List charges; every argument is optional.
    #[tool(read)]
    async fn list(&self, _ctx: ReadCtx, args: ListArgs) -> Result<Vec<String>, ToolError> {
        Ok(vec![args.customer.unwrap_or_else(|| "everyone".into())])
    }

    /// What time is it?
    #[tool(read)]
    async fn now(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
        Ok(1_700_000_000)
    }
}

/// MCP's `arguments` is optional: a client may leave it out for a tool whose arguments are
/// all optional (or that has none). That is `{}`, not a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_arguments_is_an_empty_object() {
    let server = McpServer::new(
        Registry::builder()
            .toolbox(Arc::new(Catalog))
            .build()
            .unwrap(),
    );
    let mut client = client(&server).await;
    for (name, expected) in [
        ("list", json!({"result": ["everyone"]})),
        ("now", json!({"result": 1_700_000_000})),
    ] {
        let id = client.id();
        client
            .send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name}}))
            .await;
        let reply = client.reply_to(&id).await;
        assert_valid(&validator("CallToolResult"), &reply);
        assert!(!is_error(&reply), "{name}: {reply}");
        assert_eq!(result(&reply)["structuredContent"], expected, "{reply}");
    }
}
