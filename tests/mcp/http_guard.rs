//! The streamable HTTP transport over a real socket: a wrong `Origin` is `403` with no
//! session; a missing or wrong token is `401` before `initialize`, `tools/list` or any
//! session; the guard holds where a host mounts the service itself; idem's accept loop closes
//! a connection that is slow to send its headers, and caps connections and live sessions.
//! Nothing runs for any refused request (judged on the ledger).

use std::sync::Arc;
use std::time::Duration;

use idem::mcp::{McpCaller, McpHttpGuard, McpServer};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::billing::{registry, serve_http, Bank};
use crate::http_client::{send, HttpClient, POST_HEADERS};
use crate::support::is_error;

fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "idem-tests", "version": "0"}}})
    .to_string()
}

fn with(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut headers = POST_HEADERS.to_vec();
    headers.extend_from_slice(extra);
    headers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_origin_is_forbidden_and_gets_no_session() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| {
        e.guard(McpHttpGuard::new().allow_origins(["https://app.example.com"]))
    })
    .await;
    let evil = send(
        addr,
        "POST",
        "/mcp",
        &with(&[("Origin", "http://evil.example")]),
        &initialize_body(),
    )
    .await;
    assert_eq!(evil.status, 403, "{evil:?}");
    assert_eq!(evil.header("mcp-session-id"), None);
    // Loopback pages, listed origins and clients that send no Origin get through.
    for origin in ["http://localhost:5173", "https://app.example.com"] {
        let ok = send(
            addr,
            "POST",
            "/mcp",
            &with(&[("Origin", origin)]),
            &initialize_body(),
        )
        .await;
        assert_eq!(ok.status, 200, "{origin}: {ok:?}");
    }
    // A call from a foreign page never runs.
    let mut client = HttpClient::new(addr);
    client.initialize().await;
    let session = client.session.clone().unwrap();
    let mut headers = with(&[
        ("Origin", "http://evil.example"),
        ("MCP-Protocol-Version", "2025-11-25"),
    ]);
    headers.push(("Mcp-Session-Id", &session));
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "charge", "arguments": {"customer": "c", "cents": 1}}});
    let refused = send(addr, "POST", "/mcp", &headers, &call.to_string()).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(bank.charges(), 0);
}

fn bearer_guard() -> McpHttpGuard {
    McpHttpGuard::new().authenticate(|head| {
        match head
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
        {
            Some("Bearer alice-token") => Ok(McpCaller::default().principal("alice")),
            Some("Bearer bob-token") => Ok(McpCaller::default().principal("bob")),
            _ => Err("send Authorization: Bearer <token>".to_owned()),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_token_is_unauthorized_before_any_session_and_a_token_names_the_caller() {
    let bank = Arc::new(Bank::default());
    // No caller hook: the authenticated caller scopes the calls.
    let server = McpServer::new(registry(&bank, None));
    let (addr, _task) = serve_http(server, |e| e.guard(bearer_guard())).await;
    for headers in [with(&[]), with(&[("Authorization", "Bearer nope")])] {
        let answer = send(addr, "POST", "/mcp", &headers, &initialize_body()).await;
        assert_eq!(answer.status, 401, "{answer:?}");
        assert_eq!(answer.header("mcp-session-id"), None);
        assert!(answer.header("www-authenticate").is_some(), "{answer:?}");
    }
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}});
    let listed = send(addr, "POST", "/mcp", &with(&[]), &list.to_string()).await;
    assert_eq!(listed.status, 401, "{listed:?}");

    // Two callers, each with a token: the same call is one charge each, replayed to each.
    let args = json!({"customer": "cus_42", "cents": 4900});
    for token in ["Bearer alice-token", "Bearer bob-token"] {
        for _ in 0..2 {
            let mut client = HttpClient::new(addr).with_header("Authorization", token);
            assert_eq!(client.initialize().await.status, 200);
            let reply = client.call_tool("charge", args.clone(), &[]).await;
            assert!(!is_error(&reply), "{reply}");
        }
    }
    assert_eq!(bank.charges(), 2);
}

/// The service mounted by a host of its own, under a path of its choosing (as axum's
/// `nest_service` would): the guard comes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_holds_where_a_host_mounts_the_service() {
    use hyper::service::service_fn;
    let bank = Arc::new(Bank::default());
    let service = McpServer::new(registry(&bank, None)).http_service(
        bearer_guard(),
        idem::mcp::rmcp::transport::StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let route = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let mut service = service.clone();
                    async move {
                        assert!(request.uri().path().starts_with("/api/mcp"));
                        tower_service::Service::call(&mut service, request).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), route)
                    .await;
            });
        }
    });
    let refused = send(addr, "POST", "/api/mcp", &with(&[]), &initialize_body()).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    let evil = send(
        addr,
        "POST",
        "/api/mcp",
        &with(&[
            ("Authorization", "Bearer alice-token"),
            ("Origin", "http://evil.example"),
        ]),
        &initialize_body(),
    )
    .await;
    assert_eq!(evil.status, 403, "{evil:?}");
    let mut client = HttpClient::new(addr).with_header("Authorization", "Bearer alice-token");
    client.path = "/api/mcp".to_owned();
    assert_eq!(client.initialize().await.status, 200);
    let reply = client
        .call_tool("charge", json!({"customer": "c", "cents": 1}), &[])
        .await;
    assert!(!is_error(&reply), "{reply}");
    assert_eq!(bank.charges(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_slow_to_send_its_headers_is_closed() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| {
        e.header_read_timeout(Duration::from_millis(200))
    })
    .await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "the server kept a connection that never finished its headers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_one_to_end() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| e.max_connections(1)).await;
    // One connection holds the only slot, its headers unfinished.
    let mut holder = tokio::net::TcpStream::connect(addr).await.unwrap();
    holder.write_all(b"POST /mcp HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiting =
        tokio::spawn(
            async move { send(addr, "POST", "/mcp", &with(&[]), &initialize_body()).await },
        );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a second connection was served past the cap"
    );
    drop(holder);
    let answer = waiting.await.unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_past_the_cap_are_refused() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| e.guard(McpHttpGuard::new().max_sessions(2))).await;
    for _ in 0..2 {
        assert_eq!(HttpClient::new(addr).initialize().await.status, 200);
    }
    let third = HttpClient::new(addr).initialize().await;
    assert_eq!(third.status, 503, "{third:?}");
    assert_eq!(third.header("mcp-session-id"), None);
    // The sessionless revision opens no session: it is still served.
    let mut modern = HttpClient::new(addr).sessionless();
    let reply = modern
        .call_tool("charge", json!({"customer": "c", "cents": 1}), &[])
        .await;
    assert!(!is_error(&reply), "{reply}");
    assert_eq!(bank.charges(), 1);
}
