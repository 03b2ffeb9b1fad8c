//! idem's tools inside a host's own rmcp server (`examples/mcp_router.rs`): the host keeps
//! its handler, prompt and plain tool; idem's `charge` keeps its promise through the routes
//! (one charge per caller's repeat, on any connection); a tool both define is an error that
//! names it, nothing replaced.

use std::sync::Arc;

use idem::mcp::rmcp::ServiceExt;
use idem::mcp::{JoinError, McpServer};
use serde_json::json;

use crate::support::{is_error, result, LineClient};

#[allow(dead_code)] // its `main` runs as a binary, not here
#[path = "../../examples/mcp_router.rs"]
mod example;

async fn connect(
    desk: &example::Desk,
) -> LineClient<
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
> {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let desk = desk.clone();
    tokio::spawn(async move {
        if let Ok(running) = desk.serve(tokio::io::split(server_io)).await {
            let _ = running.waiting().await;
        }
    });
    let (read, write) = tokio::io::split(client_io);
    let mut client = LineClient::new(read, write);
    client.initialize().await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joined_routes_serve_idem_and_plain_tools_side_by_side() {
    let billing = Arc::new(example::Billing::default());
    let desk = example::Desk::new(example::registry(billing.clone()).unwrap()).unwrap();
    let mut client = connect(&desk).await;

    let listed = client.request("tools/list", json!({})).await;
    let mut names: Vec<&str> = result(&listed)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["charge", "echo"]);
    let prompts = client.request("prompts/list", json!({})).await;
    assert_eq!(result(&prompts)["prompts"][0]["name"], json!("bill"));

    let echo = client.call_tool("echo", json!({"text": "hi"}), None).await;
    assert_eq!(result(&echo)["content"][0]["text"], json!("hi"));

    let args = json!({"customer": "cus_42", "cents": 4900});
    let first = client.call_tool("charge", args.clone(), None).await;
    assert!(!is_error(&first), "{first}");
    drop(client);
    let mut again = connect(&desk).await;
    let repeat = again.call_tool("charge", args, None).await;
    assert_eq!(billing.charges.lock().unwrap().len(), 1);
    assert_eq!(
        result(&repeat)["_meta"]["idem/replayed"],
        json!(true),
        "{repeat}"
    );
    assert_eq!(
        result(&repeat)["structuredContent"],
        result(&first)["structuredContent"]
    );
}

#[test]
fn a_tool_both_define_is_an_error_naming_it() {
    let billing = Arc::new(example::Billing::default());
    let server = McpServer::new(example::registry(billing).unwrap());
    let clashing = example::plain_tools().with_route(
        server
            .tool_routes::<example::Desk>()
            .unwrap()
            .into_iter()
            .next()
            .unwrap(),
    );
    let err = server.join_router(clashing).expect_err("a clash");
    assert_eq!(
        err,
        JoinError::NameClash {
            name: "charge".to_owned()
        }
    );
    assert!(err.to_string().contains("`charge`"), "{err}");
}
