//! `idempotentHint: true` is listed on a write only where a repeat after a reconnect or a
//! restart reaches the saved record: over a store that outlives the process, on a server
//! that can scope the write to its caller.

use std::sync::Arc;

use idem::mcp::McpServer;
use serde_json::{json, Value};

use crate::billing::{registry, serve_http, Bank};
use crate::http_client::HttpClient;
use crate::support::result;

fn hint_of_charge(reply: &Value) -> Option<Value> {
    result(reply)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "charge")
        .unwrap_or_else(|| panic!("charge listed: {reply}"))["annotations"]
        .get("idempotentHint")
        .cloned()
}

async fn listed_over_http(server: McpServer) -> Value {
    let (addr, _task) = serve_http(server, |e| e).await;
    let mut client = HttpClient::new(addr);
    client.initialize().await;
    client.request("tools/list", json!({}), &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_store_lists_no_write_as_idempotent() {
    let bank = Arc::new(Bank::default());
    let server = McpServer::new(registry(&bank, None)).single_caller();
    assert_eq!(hint_of_charge(&listed_over_http(server).await), None);
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_store_lists_writes_as_idempotent_where_the_server_scopes_them() {
    use crate::billing::{sqlite_file, sqlite_store};
    let bank = Arc::new(Bank::default());
    let store = sqlite_store(&sqlite_file().await).await;
    assert_eq!(store.durability(), idem::store::Durability::Durable);
    let scoped = McpServer::new(registry(&bank, Some(store.clone()))).single_caller();
    assert_eq!(
        hint_of_charge(&listed_over_http(scoped).await),
        Some(json!(true))
    );
    // Over HTTP with no way to tell callers apart, writes are refused: no hint.
    let unscoped = McpServer::new(registry(&bank, Some(store)));
    assert_eq!(hint_of_charge(&listed_over_http(unscoped).await), None);
}

#[test]
fn the_memory_store_says_it_lives_in_the_process() {
    use idem::IdemStore;
    assert_eq!(
        idem::MemoryStore::new().durability(),
        idem::store::Durability::Process
    );
}
