//! rmcp's transport settings a host hands to idem's HTTP endpoint hold on every request's
//! event stream, not only on the streams rmcp's service opens itself.

use std::sync::Arc;
use std::time::Duration;

use idem::mcp::rmcp::transport::StreamableHttpServerConfig;
use idem::mcp::McpServer;
use serde_json::json;

use crate::billing::{registry, serve_http, Bank};
use crate::http_client::HttpClient;
use crate::support::is_error;

/// The raw event stream answering one `tools/call` of `charge`, on a server with `config`.
async fn charge_stream(bank: &Arc<Bank>, config: StreamableHttpServerConfig) -> String {
    let server = McpServer::new(registry(bank, None)).single_caller();
    let (addr, _task) = serve_http(server, |e| e.with_config(config)).await;
    let mut client = HttpClient::new(addr);
    assert_eq!(client.initialize().await.status, 200);
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "charge", "arguments": {"customer": "cus_42", "cents": 4900}}});
    let answer = client.post(&call, &[]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(!is_error(&answer.message()), "{answer:?}");
    answer.body
}

/// The `retry:` fields of an event stream, in milliseconds.
fn retry_fields(stream: &str) -> Vec<String> {
    stream
        .lines()
        .filter_map(|l| l.strip_prefix("retry:"))
        .map(|v| v.trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sse_retry_a_host_sets_is_the_one_a_tool_calls_stream_carries() {
    let bank = Arc::new(Bank::default());
    let off = charge_stream(
        &bank,
        StreamableHttpServerConfig::default().with_sse_retry(None),
    )
    .await;
    assert_eq!(retry_fields(&off), Vec::<String>::new(), "{off}");
    let five = charge_stream(
        &bank,
        StreamableHttpServerConfig::default().with_sse_retry(Some(Duration::from_secs(5))),
    )
    .await;
    assert_eq!(retry_fields(&five), ["5000"], "{five}");
    // Each stream answered a charge that ran: two servers, two charges.
    assert_eq!(bank.charges(), 2);
}
