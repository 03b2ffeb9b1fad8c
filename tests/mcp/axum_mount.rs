//! idem's MCP service mounted in a host's axum app (`examples/mcp_axum.rs`) with
//! `nest_service`, over a real socket: the app's own route is served beside it; the guard
//! comes along (a request without a token is `401` and a foreign `Origin` `403`, before any
//! session and with nothing run); a caller's repeat on a new session, or on a second app
//! over the same store, is one charge and a replay; two callers are two charges.

use std::net::SocketAddr;
use std::sync::Arc;

use idem::{IdemStore, MemoryStore, Registry};
use serde_json::json;

use crate::http_client::{send, HttpClient, POST_HEADERS};
use crate::support::{is_error, result};

#[allow(dead_code)] // its `main` runs as a binary, not here
#[path = "../../examples/mcp_axum.rs"]
mod example;

const TOKENS: &str = "alice-token=alice,bob-token=bob";

/// The example's app over `billing` on `store`, served on a loopback port of its own.
async fn serve_app(billing: &Arc<example::Billing>, store: Arc<dyn IdemStore>) -> SocketAddr {
    let registry = Registry::builder()
        .toolbox(billing.clone())
        .shared_store(store)
        .build()
        .unwrap();
    let app = example::app(registry, example::bearer_guard(TOKENS));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "idem-tests", "version": "0"}}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mounted_service_keeps_its_guard_and_its_promise() {
    let billing = Arc::new(example::Billing::default());
    let store: Arc<dyn IdemStore> = Arc::new(MemoryStore::new());
    let addr = serve_app(&billing, store.clone()).await;

    // The host's own route is the host's.
    let health = send(addr, "GET", "/health", &[], "").await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok"));

    // Refused before any session, nothing run.
    let anonymous = send(addr, "POST", "/mcp", &POST_HEADERS, &initialize_body()).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(anonymous.header("mcp-session-id"), None);
    let mut headers = POST_HEADERS.to_vec();
    headers.extend([
        ("Authorization", "Bearer alice-token"),
        ("Origin", "http://evil.example"),
    ]);
    let foreign = send(addr, "POST", "/mcp", &headers, &initialize_body()).await;
    assert_eq!(foreign.status, 403, "{foreign:?}");
    assert_eq!(foreign.header("mcp-session-id"), None);

    // Alice charges, reconnects and sends the same call: one charge, the saved result.
    let args = json!({"customer": "cus_42", "cents": 4900});
    let mut alice = HttpClient::new(addr).with_header("Authorization", "Bearer alice-token");
    assert_eq!(alice.initialize().await.status, 200);
    let first = alice.call_tool("charge", args.clone(), &[]).await;
    assert!(!is_error(&first), "{first}");
    let mut again = HttpClient::new(addr).with_header("Authorization", "Bearer alice-token");
    assert_eq!(again.initialize().await.status, 200);
    let repeat = again.call_tool("charge", args.clone(), &[]).await;
    assert_eq!(
        result(&repeat)["_meta"]["idem/replayed"],
        json!(true),
        "{repeat}"
    );
    assert_eq!(
        result(&repeat)["structuredContent"],
        result(&first)["structuredContent"]
    );
    assert_eq!(billing.charges.lock().unwrap().len(), 1);

    // A second app over the same store (a restart, another machine): still one charge.
    let restarted = serve_app(&billing, store).await;
    let mut after = HttpClient::new(restarted).with_header("Authorization", "Bearer alice-token");
    assert_eq!(after.initialize().await.status, 200);
    let replayed = after.call_tool("charge", args.clone(), &[]).await;
    assert_eq!(result(&replayed)["_meta"]["idem/replayed"], json!(true));
    assert_eq!(billing.charges.lock().unwrap().len(), 1);

    // Bob is another caller: his equal call is his own charge, never Alice's result.
    let mut bob = HttpClient::new(addr).with_header("Authorization", "Bearer bob-token");
    assert_eq!(bob.initialize().await.status, 200);
    let his = bob.call_tool("charge", args, &[]).await;
    assert_eq!(
        result(&his)["_meta"]["idem/replayed"],
        json!(false),
        "{his}"
    );
    assert_ne!(
        result(&his)["_meta"]["idem/key"],
        result(&first)["_meta"]["idem/key"]
    );
    assert_eq!(billing.charges.lock().unwrap().len(), 2);
}
