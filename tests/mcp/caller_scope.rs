//! The scope of an MCP call is its caller, not its connection or session: a standard client
//! (no idem `_meta`) that re-sends a write after reconnecting, to the same server or to a
//! restarted one on the same durable store, gets one effect and the saved result; two
//! callers never share one; an HTTP server that cannot tell callers apart runs no write.
//! Judged on the bank's ledger.

use std::sync::Arc;

use idem::mcp::{McpCaller, McpServer};
use serde_json::json;

use crate::billing::{registry, replayed, serve_http, Bank};
use crate::http_client::HttpClient;
use crate::support::{is_error, outcome, result, LineClient};

const CHARGE: &str = r#"{"customer": "cus_42", "cents": 4900}"#;

fn charge() -> serde_json::Value {
    serde_json::from_str(CHARGE).unwrap()
}

/// A stdio-like connection (an in-memory pipe) to `server`, initialized.
async fn pipe(
    server: &McpServer,
) -> LineClient<
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_resent_on_a_new_stdio_connection_is_one_charge() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None));
    let mut first = pipe(&server).await;
    let answered = first.call_tool("charge", charge(), None).await;
    assert!(!is_error(&answered), "{answered}");
    drop(first);
    let mut second = pipe(&server).await;
    let again = second.call_tool("charge", charge(), None).await;
    assert_eq!(bank.charges(), 1);
    assert!(replayed(&again), "{again}");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_resent_to_a_restarted_stdio_server_on_a_durable_store_is_one_charge() {
    use crate::billing::{sqlite_file, sqlite_store};
    let bank = Arc::new(Bank::default());
    let file = sqlite_file().await;
    let before = McpServer::new(registry(&bank, Some(sqlite_store(&file).await)));
    let mut client = pipe(&before).await;
    client.call_tool("charge", charge(), None).await;
    drop((client, before));
    // A new process: a new registry, a new store handle, on the same file.
    let after = McpServer::new(registry(&bank, Some(sqlite_store(&file).await)));
    let again = pipe(&after).await.call_tool("charge", charge(), None).await;
    assert_eq!(bank.charges(), 1);
    assert!(replayed(&again), "{again}");
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_http_sessions_and_a_restart_are_one_charge_for_a_single_caller() {
    use crate::billing::{sqlite_file, sqlite_store};
    let bank = Arc::new(Bank::default());
    let file = sqlite_file().await;
    let server = McpServer::new(registry(&bank, Some(sqlite_store(&file).await))).single_caller();
    let (addr, task) = serve_http(server, |e| e).await;
    for _ in 0..3 {
        let mut client = HttpClient::new(addr);
        client.initialize().await;
        let reply = client.call_tool("charge", charge(), &[]).await;
        assert!(!is_error(&reply), "{reply}");
    }
    task.abort();
    let restarted =
        McpServer::new(registry(&bank, Some(sqlite_store(&file).await))).single_caller();
    let (addr, _task) = serve_http(restarted, |e| e).await;
    let mut client = HttpClient::new(addr);
    client.initialize().await;
    let again = client.call_tool("charge", charge(), &[]).await;
    // The sessionless revision, on the same store: the same caller, the same operation.
    let mut modern = HttpClient::new(addr).sessionless();
    let modern_again = modern.call_tool("charge", charge(), &[]).await;
    assert_eq!(bank.charges(), 1);
    assert!(replayed(&again), "{again}");
    assert!(replayed(&modern_again), "{modern_again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessionless_client_gets_one_charge_for_a_single_caller() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut client = HttpClient::new(addr).sessionless();
    let first = client.call_tool("charge", charge(), &[]).await;
    let again = client.call_tool("charge", charge(), &[]).await;
    assert!(!is_error(&first), "{first}");
    assert_eq!(bank.charges(), 1);
    assert!(replayed(&again), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_cannot_tell_callers_apart_runs_no_write() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None));
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut session = HttpClient::new(addr);
    session.initialize().await;
    let refused = session.call_tool("charge", charge(), &[]).await;
    let mut modern = HttpClient::new(addr).sessionless();
    let refused_too = modern.call_tool("charge", charge(), &[]).await;
    assert_eq!(bank.charges(), 0);
    for reply in [&refused, &refused_too] {
        assert!(is_error(reply) && outcome(reply) == "refused", "{reply}");
        let text = result(reply)["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("McpServer::caller"), "{text}");
    }
    // Reads answer for nobody in particular: they run.
    let read = session.call_tool("count", json!({}), &[]).await;
    assert!(!is_error(&read), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_http_callers_never_share_a_charge_and_a_forged_run_reaches_nothing() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None))
        .client_runs(true)
        .caller(|head| {
            let who = head
                .and_then(|h| h.headers.get("x-user"))
                .and_then(|v| v.to_str().ok())
                .ok_or("no x-user")?;
            Ok(McpCaller::default().principal(who))
        });
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut alice = HttpClient::new(addr).with_header("x-user", "alice");
    let mut bob = HttpClient::new(addr).with_header("x-user", "bob");
    alice.initialize().await;
    bob.initialize().await;
    let run = [("Idempotency-Key", "order-1")];
    let hers = alice.call_tool("charge", charge(), &run).await;
    let his = bob.call_tool("charge", charge(), &run).await;
    assert_eq!(bank.charges(), 2);
    assert!(!replayed(&his), "{his}");
    assert_ne!(bank.keys()[0], bank.keys()[1]);

    // Bob names runs of his choosing, among them the spelling of the run every unnamed
    // call is in, with Alice's idempotency key: each is an operation of his own, never her
    // saved result.
    let alices = result(&hers)["_meta"]["idem/key"].clone();
    for forged in ["mcp/caller", "mcp/client/x"] {
        let params = json!({"name": "charge", "arguments": charge(),
            "_meta": {"idem/run": forged, "idempotencyKey": "order-1"}});
        let reply = bob.request("tools/call", params, &[]).await;
        assert!(!replayed(&reply), "{reply}");
        assert_ne!(result(&reply)["_meta"]["idem/key"], alices, "{reply}");
    }
    assert_eq!(bank.charges(), 4);
    let alices = alices.as_str().unwrap();
    assert_eq!(bank.keys().iter().filter(|k| *k == alices).count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_named_run_is_refused_unless_the_host_takes_them() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None));
    let mut client = pipe(&server).await;
    let reply = client
        .call_tool("charge", charge(), Some(json!({"idem/run": "run-1"})))
        .await;
    assert!(reply.get("error").is_some(), "{reply}");
    assert_eq!(bank.charges(), 0);
}
