//! Client-supplied idempotency keys are intent ids scoped by the caller: the
//! `Idempotency-Key` header of a streamable HTTP `tools/call`, `_meta["idempotencyKey"]` and
//! `_meta["idem/intent"]` name one operation; two that disagree are refused with nothing run;
//! oversized values and request ids are refused before anything runs. Judged on the ledger.

use std::sync::Arc;

use idem::mcp::McpServer;
use serde_json::json;

use crate::billing::{registry, replayed, serve_http, Bank};
use crate::http_client::HttpClient;
use crate::support::{is_error, result};

fn charge() -> serde_json::Value {
    json!({"customer": "cus_42", "cents": 4900})
}

fn call(meta: serde_json::Value) -> serde_json::Value {
    json!({"name": "charge", "arguments": charge(), "_meta": meta})
}

async fn session(bank: &Arc<Bank>) -> HttpClient {
    let server = McpServer::new(registry(bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut client = HttpClient::new(addr);
    client.initialize().await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_arguments_under_two_keys_are_two_charges_and_each_key_replays() {
    let bank = Arc::new(Bank::default());
    let mut client = session(&bank).await;
    let first = client
        .call_tool("charge", charge(), &[("Idempotency-Key", "a")])
        .await;
    let second = client
        .call_tool("charge", charge(), &[("Idempotency-Key", "b")])
        .await;
    assert!(!is_error(&first) && !is_error(&second), "{first} {second}");
    assert_eq!(bank.charges(), 2);
    // Every spelling of key `a` is the same operation.
    let by_meta = client
        .request("tools/call", call(json!({"idempotencyKey": "a"})), &[])
        .await;
    let by_intent = client
        .request("tools/call", call(json!({"idem/intent": "a"})), &[])
        .await;
    let all = client
        .request(
            "tools/call",
            call(json!({"idem/intent": "a", "idempotencyKey": "a"})),
            &[("Idempotency-Key", "a")],
        )
        .await;
    assert_eq!(bank.charges(), 2);
    for reply in [&by_meta, &by_intent, &all] {
        assert!(replayed(reply), "{reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_keys_are_refused_and_nothing_runs() {
    let bank = Arc::new(Bank::default());
    let mut client = session(&bank).await;
    let header_and_meta = client
        .request(
            "tools/call",
            call(json!({"idempotencyKey": "a"})),
            &[("Idempotency-Key", "b")],
        )
        .await;
    let two_metas = client
        .request(
            "tools/call",
            call(json!({"idempotencyKey": "a", "idem/intent": "b"})),
            &[],
        )
        .await;
    for reply in [&header_and_meta, &two_metas] {
        assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
    }
    assert_eq!(bank.charges(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_keys_runs_and_request_ids_are_refused_and_nothing_runs() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None))
        .single_caller()
        .client_runs(true);
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut client = HttpClient::new(addr);
    client.initialize().await;
    let long = "k".repeat(idem::mcp::MAX_INTENT_BYTES + 1);
    let long_run = "r".repeat(idem::mcp::MAX_RUN_BYTES + 1);
    let replies = [
        client
            .request("tools/call", call(json!({ "idempotencyKey": long })), &[])
            .await,
        client
            .request("tools/call", call(json!({ "idem/intent": long })), &[])
            .await,
        client
            .request("tools/call", call(json!({ "idem/run": long_run })), &[])
            .await,
        client
            .call_tool("charge", charge(), &[("Idempotency-Key", &long)])
            .await,
    ];
    for reply in &replies {
        let message = reply["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}"));
        assert!(
            !message.contains("kkkk") && !message.contains("rrrr"),
            "{message}"
        );
    }
    // A JSON-RPC id longer than the bound: refused too.
    let id = "i".repeat(idem::mcp::MAX_CALL_ID_BYTES + 1);
    let answer = client
        .post(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "charge", "arguments": charge()}}),
            &[],
        )
        .await;
    assert!(answer.message().get("error").is_some(), "{answer:?}");
    assert_eq!(bank.charges(), 0);
    // Within the bounds it runs.
    let ok = client
        .call_tool("charge", charge(), &[("Idempotency-Key", &long[1..])])
        .await;
    assert!(!is_error(&ok), "{ok}");
    assert_eq!(result(&ok)["structuredContent"], json!({"charged": 4900}));
    assert_eq!(bank.charges(), 1);
}
