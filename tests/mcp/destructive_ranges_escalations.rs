//! The MCP server from a client's side, for what `mcp_server.rs` leaves out: the hints of a
//! write declared `destructive`, out-of-range integers (refused by the listed schema and by
//! the call, nothing run), and an escalation a person resolves, as the next `tools/call`
//! sees it. Every check is on the ledger or the store's record.

use std::sync::{Arc, Mutex};

use crate::support::{is_error, outcome, result, LineClient};
use idem::mcp::McpServer;
use idem::reconcile::{resolve, Resolution};
use idem::{
    store::RecordState, toolbox, IdemStore, ReadCtx, Reconciler, Registry, ToolError, WriteCtx,
};
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};

#[idem::args]
struct Transfer {
    account: String,
    /// Cents; a signed 32-bit amount.
    delta: i32,
}

#[idem::args]
struct Account {
    account: String,
}

#[derive(Default)]
struct Bank {
    ledger: Mutex<Vec<String>>,
}

impl Bank {
    fn ledger(&self) -> Vec<String> {
        self.ledger.lock().unwrap().clone()
    }
}

#[toolbox]
impl Bank {
    /// Move money.
    #[tool(write)]
    async fn transfer(&self, _ctx: WriteCtx, args: Transfer) -> Result<i32, ToolError> {
        self.ledger
            .lock()
            .unwrap()
            .push(format!("transfer {} {}", args.account, args.delta));
        Ok(args.delta)
    }

    /// Close an account for good.
    #[tool(write, destructive)]
    async fn close(&self, _ctx: WriteCtx, args: Account) -> Result<String, ToolError> {
        self.ledger
            .lock()
            .unwrap()
            .push(format!("close {}", args.account));
        Err(ToolError::unknown("the core banking system timed out"))
    }

    /// The balance.
    #[tool(read)]
    async fn balance(&self, _ctx: ReadCtx, args: Account) -> Result<i64, ToolError> {
        let _ = args;
        Ok(0)
    }
}

type Client = LineClient<ReadHalf<DuplexStream>, WriteHalf<DuplexStream>>;

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
    client.initialize().await;
    client
}

fn bank() -> (Arc<Bank>, Registry) {
    let bank = Arc::new(Bank::default());
    let registry = Registry::builder().toolbox(bank.clone()).build().unwrap();
    (bank, registry)
}

/// On an in-memory store no write is listed `idempotentHint` (a restart forgets its record;
/// `idempotent_hint` has the durable case).
#[tokio::test]
async fn hints_say_what_each_tool_does() {
    let (_, registry) = bank();
    let mut client = client(&McpServer::new(registry)).await;
    let reply = client.request("tools/list", json!({})).await;
    let tools = result(&reply)["tools"].as_array().unwrap().clone();
    let hints = |name: &str| -> Value {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {reply}"))["annotations"]
            .clone()
    };
    assert_eq!(
        hints("close"),
        json!({"readOnlyHint": false, "destructiveHint": true})
    );
    assert_eq!(
        hints("transfer"),
        json!({"readOnlyHint": false, "destructiveHint": false})
    );
    assert_eq!(
        hints("balance"),
        json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true})
    );
}

/// A client that validates against the listed `inputSchema` refuses an `i32` out of range;
/// the server refuses it too, as a tool error the model can correct, and nothing runs. The
/// corrected call runs once, and its repeat is the saved result.
#[tokio::test]
async fn an_out_of_range_integer_is_refused_by_the_listed_schema_and_the_server() {
    let (bank, registry) = bank();
    let mut client = client(&McpServer::new(registry)).await;
    let reply = client.request("tools/list", json!({})).await;
    let schema = result(&reply)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "transfer")
        .unwrap()["inputSchema"]
        .clone();
    let validator = jsonschema::validator_for(&schema).unwrap();

    for delta in [
        json!(3e9),
        json!(2_147_483_648_i64),
        json!(-2_147_483_649_i64),
    ] {
        let args = json!({"account": "acc_1", "delta": delta});
        assert!(!validator.is_valid(&args), "the schema refuses {args}");
        let reply = client.call_tool("transfer", args.clone(), None).await;
        assert!(is_error(&reply), "{reply}");
        assert_eq!(outcome(&reply), "refused", "{reply}");
        let text = result(&reply)["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("expected i32"), "{text}");
    }
    assert_eq!(bank.ledger(), Vec::<String>::new(), "nothing ran");

    let args = json!({"account": "acc_1", "delta": 2_147_483_647});
    assert!(validator.is_valid(&args));
    let first = client.call_tool("transfer", args.clone(), None).await;
    let again = client.call_tool("transfer", args, None).await;
    assert!(!is_error(&first) && !is_error(&again), "{first} {again}");
    assert_eq!(result(&again)["_meta"]["idem/replayed"], json!(true));
    assert_eq!(bank.ledger(), ["transfer acc_1 2147483647"]);
}

/// An unknown close goes to a person (no key contract, no read-back). Until a person decides,
/// the client's repeats are told it is escalated and nothing runs; once the person records
/// that the account was closed, a repeat is that completion.
#[tokio::test]
async fn a_person_resolves_an_escalation_and_the_next_tools_call_sees_it() {
    let (bank, registry) = bank();
    let mut client = client(&McpServer::new(registry.clone())).await;
    let args = json!({"account": "acc_9"});

    let first = client.call_tool("close", args.clone(), None).await;
    assert_eq!(outcome(&first), "unknown", "{first}");
    let key = idem::IdemKey::parse(result(&first)["_meta"]["idem/key"].as_str().unwrap()).unwrap();
    Reconciler::new(&registry).run_all().await.unwrap();
    let store: &dyn IdemStore = registry.store().as_ref();
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().state,
        RecordState::Escalated
    );

    let escalated = client.call_tool("close", args.clone(), None).await;
    assert!(is_error(&escalated));
    assert_eq!(outcome(&escalated), "escalated", "{escalated}");
    let text = result(&escalated)["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("not sent again"), "{text}");

    resolve(
        store,
        &key,
        Resolution::Completed {
            downstream_ref: "closure_77".into(),
            output: Some(json!("closed")),
        },
        "closed in the core system",
    )
    .await
    .unwrap();
    let after = client.call_tool("close", args, None).await;
    assert!(!is_error(&after), "{after}");
    assert_eq!(outcome(&after), "completed");
    assert_eq!(result(&after)["_meta"]["idem/replayed"], json!(true));
    assert_eq!(
        result(&after)["structuredContent"],
        json!({"result": "closed"}),
        "{after}"
    );
    assert_eq!(bank.ledger(), ["close acc_9"], "closed once");
}
