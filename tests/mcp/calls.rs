//! The MCP server keeps the exactly-once promise whatever the client does: re-sends,
//! concurrent duplicates, changed parameters, a handler past its timeout, bad input and
//! reconnects. Every test asserts on the billing ledger (what the handlers did), not on what
//! the server replied. (Two server processes sharing a store: `tests/mcp_clients/`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{is_error, outcome, result, LineClient};
use idem::mcp::{McpCaller, McpServer};
use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

#[idem::args]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

#[idem::args]
struct Echo {
    text: String,
}

/// What `receipt_charge` returns: an object output, so its own schema is the outputSchema.
#[idem::args]
struct Receipt {
    customer: String,
    cents: u64,
    memo: Option<String>,
}

/// An output type without `JsonSchema`: its tool compiles as ever and has no output schema.
#[derive(serde::Serialize)]
struct Plain {
    count: usize,
}

/// The downstream: every charge a handler made, and every time the slow handler started.
#[derive(Default)]
struct Billing {
    charges: Mutex<Vec<(String, u64)>>,
    slow_starts: Mutex<u32>,
}

impl Billing {
    fn charges(&self) -> Vec<(String, u64)> {
        self.charges.lock().unwrap().clone()
    }
    fn slow_starts(&self) -> u32 {
        *self.slow_starts.lock().unwrap()
    }
}

#[toolbox]
impl Billing {
    /// Charge a customer.
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        // Long enough that concurrent duplicates overlap the one that holds the claim.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.charges
            .lock()
            .unwrap()
            .push((args.customer, args.cents));
        Ok(json!({"charged": args.cents}))
    }

    /// A charge whose bank answers after the tool's timeout: the effect lands, the reply
    /// does not.
    #[tool(write, timeout = "200ms")]
    async fn slow_charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        *self.slow_starts.lock().unwrap() += 1;
        self.charges
            .lock()
            .unwrap()
            .push((args.customer, args.cents));
        tokio::time::sleep(Duration::from_millis(800)).await;
        Ok(json!({"charged": args.cents}))
    }

    /// Ends as the outcome its argument names, after counting the attempt.
    #[tool(write)]
    async fn settle_as(&self, _ctx: WriteCtx, args: Echo) -> Result<Value, ToolError> {
        *self.slow_starts.lock().unwrap() += 1;
        match args.text.as_str() {
            "rejected" => Err(ToolError::rejected("card declined before charging")),
            "failed" => Err(ToolError::failed("charged, then the bank reversed it")),
            "pending" => Err(ToolError::pending("ch_pending_1")),
            "unavailable" => Err(ToolError::unavailable("503 from the bank; nothing charged")),
            "unknown" => Err(ToolError::unknown("connection reset after sending")),
            "panic" => panic!("the handler panicked"),
            _ => Ok(json!({"settled": args.text})),
        }
    }

    /// A charge that takes a while, well within its timeout.
    #[tool(write)]
    async fn unhurried_charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        *self.slow_starts.lock().unwrap() += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.charges
            .lock()
            .unwrap()
            .push((args.customer, args.cents));
        Ok(json!({"charged": args.cents}))
    }

    /// Charge a customer and hand back a receipt.
    #[tool(write)]
    async fn receipt_charge(&self, _ctx: WriteCtx, args: ChargeArgs) -> Result<Receipt, ToolError> {
        self.charges
            .lock()
            .unwrap()
            .push((args.customer.clone(), args.cents));
        Ok(Receipt {
            customer: args.customer,
            cents: args.cents,
            memo: None,
        })
    }

    /// Every charge so far: a list, so its outputSchema is wrapped in `result`.
    #[tool(read)]
    async fn charged(&self, _ctx: ReadCtx) -> Result<Vec<(String, u64)>, ToolError> {
        Ok(self.charges())
    }

    /// How many charges, in a type that has no JSON Schema.
    #[tool(read)]
    async fn count(&self, _ctx: ReadCtx) -> Result<Plain, ToolError> {
        Ok(Plain {
            count: self.charges().len(),
        })
    }

    /// The last receipt, with its output schema left out on purpose.
    #[tool(read, no_output_schema)]
    async fn last_receipt(&self, _ctx: ReadCtx) -> Result<Receipt, ToolError> {
        let (customer, cents) = self.charges().pop().unwrap_or_default();
        Ok(Receipt {
            customer,
            cents,
            memo: None,
        })
    }

    /// Say it back.
    #[tool(read)]
    async fn echo(&self, _ctx: ReadCtx, args: Echo) -> Result<String, ToolError> {
        Ok(args.text)
    }
}

type Client = LineClient<ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

fn registry(billing: &Arc<Billing>, max_args_bytes: Option<usize>) -> Registry {
    let mut builder = Registry::builder().toolbox(billing.clone());
    if let Some(limit) = max_args_bytes {
        builder = builder.max_args_bytes(limit);
    }
    builder.build().unwrap()
}

/// A connection to `server` over an in-memory pipe, served on a task of its own.
fn connect(server: &McpServer) -> Client {
    connect_to(server.handler())
}

/// A connection to any rmcp `handler` over an in-memory pipe, served on a task of its own.
fn connect_to(handler: impl idem::mcp::rmcp::ServerHandler) -> Client {
    use idem::mcp::rmcp::ServiceExt;

    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    tokio::spawn(async move {
        if let Ok(running) = handler.serve(tokio::io::split(server_io)).await {
            let _ = running.waiting().await;
        }
    });
    let (read, write) = tokio::io::split(client_io);
    LineClient::new(read, write)
}

/// Asserts that `reply` is the saved result of the one `unhurried_charge` made, replayed.
fn assert_replayed_once(billing: &Billing, reply: &Value) {
    assert_eq!(billing.slow_starts(), 1);
    assert_eq!(billing.charges().len(), 1);
    assert_eq!(
        result(reply)["_meta"]["idem/replayed"],
        json!(true),
        "{reply}"
    );
    assert_eq!(result(reply)["structuredContent"], json!({"charged": 4900}));
}

async fn initialized(server: &McpServer) -> Client {
    let mut client = connect(server);
    client.initialize().await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_call_is_one_charge() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    let args = json!({"customer": "acme", "cents": 4900});

    // The client lost the first response and sends the call again under a new id.
    let first = client.call_tool("charge", args.clone(), None).await;
    let again = client.call_tool("charge", args.clone(), None).await;
    assert_eq!(billing.charges(), vec![("acme".to_owned(), 4900)]);
    assert!(!is_error(&first) && !is_error(&again));
    assert_eq!(
        result(&again)["structuredContent"],
        json!({"charged": 4900})
    );
    assert_eq!(result(&again)["_meta"]["idem/replayed"], json!(true));

    // A reconnect is the same caller: the same arguments are the same operation...
    let mut other = initialized(&server).await;
    let after_reconnect = other.call_tool("charge", args.clone(), None).await;
    assert_eq!(
        result(&after_reconnect)["_meta"]["idem/replayed"],
        json!(true)
    );
    assert_eq!(billing.charges().len(), 1);

    // ...and on a server that takes client-named runs, two named runs are two operations,
    // each one operation on any connection.
    let server = McpServer::new(registry(&billing, None)).client_runs(true);
    let mut a = initialized(&server).await;
    let mut b = initialized(&server).await;
    let run = json!({"idem/run": "run-7"});
    a.call_tool("charge", args.clone(), Some(run.clone())).await;
    b.call_tool("charge", args.clone(), Some(run.clone())).await;
    let mut third = initialized(&server).await;
    third
        .call_tool("charge", args, Some(json!({"idem/run": "run-8"})))
        .await;
    assert_eq!(billing.charges().len(), 3);
}

/// Two callers that send the same arguments (naming the same run, where the server takes
/// client-named runs) are two operations: neither is replayed the other's result. A
/// caller the hook refuses gets a protocol error and nothing runs, and a registry that
/// requires a tenant is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_never_share_a_result() {
    let billing = Arc::new(Billing::default());
    let registry = Registry::builder()
        .toolbox(billing.clone())
        .require_tenant(true)
        .build()
        .unwrap();
    // Over stdio (and these in-memory pipes) there is no request head: each server is
    // one tenant's, as a stdio server started for that tenant would be.
    let acme = McpServer::new(registry.clone())
        .client_runs(true)
        .caller(|head| {
            assert!(head.is_none(), "no HTTP head over a pipe");
            Ok(McpCaller::tenant("acme").principal("ops-bot"))
        });
    let globex = McpServer::new(registry.clone())
        .client_runs(true)
        .caller(|_| Ok(McpCaller::tenant("globex")));
    let nobody = McpServer::new(registry.clone())
        .caller(|_| Err("who are you? this server serves authenticated callers".to_owned()));
    let unscoped = McpServer::new(registry).client_runs(true);
    let args = json!({"customer": "acme", "cents": 4900});
    let run = json!({"idem/run": "run-shared"});

    let mut a = initialized(&acme).await;
    let first = a.call_tool("charge", args.clone(), Some(run.clone())).await;
    assert!(!is_error(&first), "{first}");
    assert_eq!(billing.charges().len(), 1);

    // The same caller on a new connection, same run: a repeat, replayed.
    let mut a2 = initialized(&acme).await;
    let again = a2
        .call_tool("charge", args.clone(), Some(run.clone()))
        .await;
    assert_eq!(
        result(&again)["_meta"]["idem/replayed"],
        json!(true),
        "{again}"
    );
    assert_eq!(billing.charges().len(), 1);

    // Another tenant naming the same run: its own operation, never the first one's result.
    let mut g = initialized(&globex).await;
    let theirs = g.call_tool("charge", args.clone(), Some(run.clone())).await;
    assert!(!is_error(&theirs), "{theirs}");
    assert_eq!(
        result(&theirs)["_meta"]["idem/replayed"],
        json!(false),
        "{theirs}"
    );
    assert_ne!(
        result(&theirs)["_meta"]["idem/key"],
        result(&first)["_meta"]["idem/key"]
    );
    assert_eq!(billing.charges().len(), 2);

    // Refused by the hook: a protocol error with its reason, nothing charged.
    let mut n = initialized(&nobody).await;
    let refused = n.call_tool("charge", args.clone(), Some(run.clone())).await;
    let error = refused.get("error").unwrap_or_else(|| panic!("{refused}"));
    assert!(
        error["message"]
            .as_str()
            .unwrap_or_default()
            .contains("who are you"),
        "{refused}"
    );
    // Without a hook, the registry's tenant requirement refuses the call; nothing runs.
    let mut u = initialized(&unscoped).await;
    let untenanted = u.call_tool("charge", args, Some(run)).await;
    assert!(is_error(&untenanted), "{untenanted}");
    assert_eq!(billing.charges().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_are_one_charge() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    let args = json!({"customer": "acme", "cents": 4900});

    // Eight copies in flight at once on one connection (rmcp runs each on its own task)...
    let ids: Vec<Value> = (0..8).map(|_| client.id()).collect();
    for id in &ids {
        let message = crate::support::call_message(id, "charge", args.clone(), None);
        client.send(&message).await;
    }
    // ...and eight more on eight connections of the same caller.
    let mut others = Vec::new();
    for _ in 0..8 {
        others.push(initialized(&server).await);
    }
    let mut sent = Vec::new();
    for other in &mut others {
        let id = other.id();
        let message = crate::support::call_message(&id, "charge", args.clone(), None);
        other.send(&message).await;
        sent.push(id);
    }
    let mut replies = Vec::new();
    for id in &ids {
        replies.push(client.reply_to(id).await);
    }
    for (other, id) in others.iter_mut().zip(&sent) {
        replies.push(other.reply_to(id).await);
    }
    // One caller, one operation, one charge.
    assert_eq!(billing.charges().len(), 1, "{:?}", billing.charges());
    // No duplicate was told it completed unless it was given the one charge's result.
    for reply in &replies {
        if !is_error(reply) {
            assert_eq!(result(reply)["structuredContent"], json!({"charged": 4900}));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_parameters_under_one_intent_are_refused() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    let intent = json!({"idem/intent": "order-1234-charge"});

    let first = client
        .call_tool(
            "charge",
            json!({"customer": "acme", "cents": 4900}),
            Some(intent.clone()),
        )
        .await;
    let changed = client
        .call_tool(
            "charge",
            json!({"customer": "acme", "cents": 9900}),
            Some(intent.clone()),
        )
        .await;
    assert_eq!(billing.charges(), vec![("acme".to_owned(), 4900)]);
    assert!(!is_error(&first));
    assert!(is_error(&changed));
    assert_eq!(outcome(&changed), "refused");
    let text = result(&changed)["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("different parameters"), "{text}");

    // Two intents with equal arguments are two charges.
    client
        .call_tool(
            "charge",
            json!({"customer": "acme", "cents": 4900}),
            Some(json!({"idem/intent": "order-1235-charge"})),
        )
        .await;
    assert_eq!(billing.charges().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_is_unknown_and_not_run_again() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    let args = json!({"customer": "acme", "cents": 4900});

    let first = client.call_tool("slow_charge", args.clone(), None).await;
    assert!(
        is_error(&first),
        "an unknown outcome must not read as success: {first}"
    );
    assert_eq!(outcome(&first), "unknown");
    let text = result(&first)["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("outcome unknown"), "{text}");

    // The client retries, at once and after the late reply has landed.
    let retry = client.call_tool("slow_charge", args.clone(), None).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later = client.call_tool("slow_charge", args, None).await;
    assert_eq!(billing.slow_starts(), 1);
    assert_eq!(billing.charges().len(), 1);
    // Until something settles it, the record stays what it was, or the late reply settled it;
    // either way nothing reads as a fresh success.
    assert!(is_error(&retry));
    assert_eq!(result(&later)["_meta"]["idem/replayed"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_protocol_answer_and_the_server_keeps_serving() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, Some(64 * 1024)));
    let mut client = connect(&server);
    let args = json!({"customer": "acme", "cents": 4900});

    // A call before `initialize`: a JSON-RPC error for its id, and the server waits on.
    let early = client.call_tool("charge", args.clone(), None).await;
    assert!(early.get("error").is_some(), "{early}");
    client.initialize().await;

    // An unknown tool: invalid params.
    let unknown = client.call_tool("refund_everything", json!({}), None).await;
    assert_eq!(unknown["error"]["code"], json!(-32602), "{unknown}");

    // Arguments of the wrong type, of the wrong shape, missing: tool errors the model reads.
    for bad in [
        json!({"customer": 42, "cents": 4900}),
        json!({"customer": "acme", "cents": "lots"}),
        json!({"customer": "acme"}),
        json!({"customer": "acme", "cents": -1}),
    ] {
        let reply = client.call_tool("charge", bad.clone(), None).await;
        assert!(is_error(&reply), "{bad} → {reply}");
        assert_eq!(outcome(&reply), "refused");
    }
    // Arguments that are not an object, and no arguments at all: protocol or tool errors.
    let id = client.id();
    client
        .send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": "charge", "arguments": [1, 2]}}))
        .await;
    let array = client.reply_to(&id).await;
    assert!(array.get("error").is_some() || is_error(&array), "{array}");
    let id = client.id();
    client
        .send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "charge"}}))
        .await;
    let none = client.reply_to(&id).await;
    assert!(is_error(&none), "{none}");

    // Oversized arguments: refused before anything runs.
    let huge = json!({"customer": "x".repeat(100 * 1024), "cents": 4900});
    let reply = client.call_tool("charge", huge, None).await;
    assert!(is_error(&reply));
    let text = result(&reply)["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("exceed the limit"), "{text}");

    // A malformed `_meta` field of ours: invalid params.
    let reply = client
        .call_tool("charge", args.clone(), Some(json!({"idem/run": 7})))
        .await;
    assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");

    // Not JSON at all (no id to answer: ignored), then JSON that is no JSON-RPC message.
    client
        .send_raw("{\"jsonrpc\": \"2.0\", \"id\": 99, \"method\": ")
        .await;
    client.send_raw("{\"hello\": \"world\"}").await;
    let invalid = client.recv().await;
    assert_eq!(invalid["error"]["code"], json!(-32600), "{invalid}");
    // An unknown method.
    let reply = client.request("tools/explode", json!({})).await;
    assert_eq!(reply["error"]["code"], json!(-32601), "{reply}");

    assert!(billing.charges().is_empty(), "{:?}", billing.charges());

    // Still serving: a good call now runs once.
    let ok = client.call_tool("charge", args.clone(), None).await;
    assert!(!is_error(&ok), "{ok}");
    let echo = client
        .call_tool("echo", json!({"text": "still here"}), None)
        .await;
    assert_eq!(result(&echo)["content"][0]["text"], json!("still here"));
    assert_eq!(billing.charges().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_has_the_registrys_definitions_and_hints() {
    let billing = Arc::new(Billing::default());
    let registry = registry(&billing, None);
    let server = McpServer::new(registry.clone());
    let mut client = initialized(&server).await;
    let reply = client.request("tools/list", json!({})).await;
    let tools = result(&reply)["tools"].as_array().unwrap().clone();
    // An in-memory store forgets every record with the process: a repeat sent to a
    // restarted server would run again, so no write is listed as idempotent.
    let unhinted = idem::definitions::DefinitionOptions::default().idempotent_hint(false);
    assert_eq!(
        tools,
        registry.definitions_with(idem::Format::Mcp, &unhinted)
    );
    let charge = tools.iter().find(|t| t["name"] == "charge").unwrap();
    assert_eq!(charge["annotations"].get("idempotentHint"), None);
    assert_eq!(charge["annotations"]["readOnlyHint"], json!(false));
    let echo = tools.iter().find(|t| t["name"] == "echo").unwrap();
    assert_eq!(echo["annotations"]["readOnlyHint"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_but_completed_is_an_error() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    for (asked, class) in [
        ("rejected", "rejected"),
        ("failed", "failed"),
        ("pending", "pending"),
        ("unavailable", "unavailable"),
        ("unknown", "unknown"),
        ("panic", "unknown"),
        ("done", "completed"),
    ] {
        let reply = client
            .call_tool("settle_as", json!({"text": asked}), None)
            .await;
        assert_eq!(outcome(&reply), class, "{reply}");
        assert_eq!(is_error(&reply), class != "completed", "{reply}");
        if class == "completed" {
            assert_eq!(
                result(&reply)["structuredContent"],
                json!({"settled": "done"})
            );
        } else {
            assert!(result(&reply).get("structuredContent").is_none(), "{reply}");
        }
    }
    let attempts = billing.slow_starts();
    // Asked again: the failed, pending and unknown calls are not run again (a rejected one
    // may be: nothing was done).
    for asked in ["failed", "pending", "unknown", "panic", "done"] {
        let reply = client
            .call_tool("settle_as", json!({"text": asked}), None)
            .await;
        assert_eq!(is_error(&reply), asked != "done", "{reply}");
    }
    assert_eq!(billing.slow_starts(), attempts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_mid_call_does_not_abandon_the_charge() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let args = json!({"customer": "acme", "cents": 4900});

    // The client sends the call and hangs up before the reply.
    let mut client = initialized(&server).await;
    let id = client.id();
    client
        .send(&crate::support::call_message(
            &id,
            "unhurried_charge",
            args.clone(),
            None,
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(client);

    // It reconnects and asks again: the charge it started was completed and
    // saved, so it gets that one back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut again = initialized(&server).await;
    let reply = again.call_tool("unhurried_charge", args, None).await;
    assert_replayed_once(&billing, &reply);
}

/// A host's own handler in front of idem's, with a deadline of its own for every call: past
/// it, the host stops awaiting (drops) idem's `tools/call` and answers with an error.
struct ImpatientHost {
    inner: idem::mcp::McpHandler,
}

impl idem::mcp::rmcp::ServerHandler for ImpatientHost {
    fn get_info(&self) -> idem::mcp::rmcp::model::InitializeResult {
        self.inner.get_info()
    }

    async fn call_tool(
        &self,
        request: idem::mcp::rmcp::model::CallToolRequestParams,
        context: idem::mcp::rmcp::service::RequestContext<idem::mcp::rmcp::service::RoleServer>,
    ) -> Result<idem::mcp::rmcp::model::CallToolResponse, idem::mcp::rmcp::ErrorData> {
        let call = self.inner.call_tool(request, context);
        match tokio::time::timeout(Duration::from_millis(50), call).await {
            Ok(answer) => answer,
            Err(_) => Err(idem::mcp::rmcp::ErrorData::internal_error(
                "the host's deadline passed",
                None,
            )),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_stops_awaiting_a_call_does_not_abandon_the_charge() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let args = json!({"customer": "acme", "cents": 4900});
    let mut client = connect_to(ImpatientHost {
        inner: server.handler(),
    });
    client.initialize().await;

    // The charge takes 300 ms; the host gives up on it after 50.
    let first = client
        .call_tool("unhurried_charge", args.clone(), None)
        .await;
    assert!(first.get("error").is_some(), "{first}");
    assert_eq!(billing.slow_starts(), 1);

    // The charge idem had claimed ran to its end anyway and settled its record...
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(billing.charges(), vec![("acme".to_owned(), 4900)]);
    // ...so the client's retry, through idem's own handler, gets it back, run once.
    let mut again = initialized(&server).await;
    let reply = again.call_tool("unhurried_charge", args, None).await;
    assert_replayed_once(&billing, &reply);
}

/// The outputSchema each tool is listed with, by name (`None`: listed without one).
async fn output_schemas(client: &mut Client) -> std::collections::HashMap<String, Option<Value>> {
    let reply = client.request("tools/list", json!({})).await;
    result(&reply)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t.get("outputSchema").cloned(),
            )
        })
        .collect()
}

fn assert_valid(schema: &Value, content: &Value, reply: &Value) {
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(content)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{content} against {schema}: {errors:?}; {reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_calls_carry_structured_content_valid_against_the_output_schema() {
    let billing = Arc::new(Billing::default());
    let server = McpServer::new(registry(&billing, None));
    let mut client = initialized(&server).await;
    let schemas = output_schemas(&mut client).await;
    // Typed outputs are listed with a schema; `serde_json::Value` outputs without one.
    for name in ["receipt_charge", "charged", "echo"] {
        let schema = schemas[name]
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no outputSchema"));
        assert_eq!(schema["type"], "object", "{name}: {schema}");
    }
    // No schema: `Value` says nothing, `Plain` has none (the macro found no `JsonSchema`),
    // and `last_receipt` asked for none.
    for name in ["charge", "settle_as", "count", "last_receipt"] {
        assert_eq!(schemas[name], None, "{name}");
    }
    let spec = |name: &str| server.registry().get(name).unwrap().spec().clone();
    assert!(spec("count").output_schema_value().is_none());
    assert!(spec("last_receipt").output_schema_value().is_none());
    assert!(spec("receipt_charge").output_schema_value().is_some());

    let args = json!({"customer": "acme", "cents": 4900});
    let first = client.call_tool("receipt_charge", args.clone(), None).await;
    let again = client.call_tool("receipt_charge", args, None).await;
    assert_eq!(billing.charges(), vec![("acme".to_owned(), 4900)]);
    let receipt_schema = schemas["receipt_charge"].as_ref().unwrap();
    for reply in [&first, &again] {
        assert!(!is_error(reply), "{reply}");
        assert_valid(receipt_schema, &result(reply)["structuredContent"], reply);
    }
    assert_eq!(
        result(&first)["structuredContent"],
        json!({"customer": "acme", "cents": 4900, "memo": null})
    );
    assert_eq!(result(&again)["_meta"]["idem/replayed"], json!(true));
    assert_eq!(
        result(&again)["structuredContent"],
        result(&first)["structuredContent"]
    );

    // Outputs that are not objects travel wrapped, as their schemas say.
    let charged = client.call_tool("charged", json!({}), None).await;
    assert_valid(
        schemas["charged"].as_ref().unwrap(),
        &result(&charged)["structuredContent"],
        &charged,
    );
    assert_eq!(
        result(&charged)["structuredContent"],
        json!({"result": [["acme", 4900]]})
    );
    let echo = client.call_tool("echo", json!({"text": "hi"}), None).await;
    assert_valid(
        schemas["echo"].as_ref().unwrap(),
        &result(&echo)["structuredContent"],
        &echo,
    );
    assert_eq!(result(&echo)["structuredContent"], json!({"result": "hi"}));

    // Without an output schema, an object output is still the structured content.
    let count = client.call_tool("count", json!({}), None).await;
    assert_eq!(
        result(&count)["structuredContent"],
        json!({"count": 1}),
        "{count}"
    );

    // The validator is not vacuous: the unwrapped list breaks the listed schema.
    let validator = jsonschema::validator_for(schemas["charged"].as_ref().unwrap()).unwrap();
    assert!(!validator.is_valid(&json!([["acme", 4900]])));

    // Refused arguments claim nothing: an error, no structured content, no charge.
    let bad = client
        .call_tool("receipt_charge", json!({"customer": "acme"}), None)
        .await;
    assert!(
        is_error(&bad) && result(&bad).get("structuredContent").is_none(),
        "{bad}"
    );
    assert_eq!(billing.charges().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_result_of_a_tool_with_an_output_schema_is_not_an_empty_success() {
    use idem::store::Retention;
    use idem::{
        store::{ManualClock, Timestamp},
        MemoryStore,
    };

    let clock = ManualClock::new(Timestamp(1_600_000_000_000));
    let store = MemoryStore::with_clock(Arc::new(clock.clone())).retention(Retention {
        results: Duration::from_secs(3600),
        tombstones: Duration::from_secs(30 * 24 * 3600),
    });
    let billing = Arc::new(Billing::default());
    let registry = Registry::builder()
        .toolbox(billing.clone())
        .store(store)
        .build()
        .unwrap();
    let server = McpServer::new(registry);
    let mut client = initialized(&server).await;
    let args = json!({"customer": "acme", "cents": 4900});
    let first = client.call_tool("receipt_charge", args.clone(), None).await;
    assert!(!is_error(&first), "{first}");

    // The saved result outlives its retention: the repeat finds only the tombstone. A
    // success would promise structured content it cannot give (clients that validate, like
    // the official Python SDK, raise), so it is an error whose text says it was done.
    clock.advance(Duration::from_secs(2 * 3600));
    let again = client.call_tool("receipt_charge", args, None).await;
    assert_eq!(billing.charges().len(), 1, "{again}");
    assert!(is_error(&again), "{again}");
    assert_eq!(outcome(&again), "completed", "{again}");
    assert!(result(&again).get("structuredContent").is_none(), "{again}");
    let text = result(&again)["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("already done"), "{text}");
}
