//! A raw JSON-RPC client for MCP servers over line-delimited streams (an in-memory duplex or
//! a child's stdin/stdout), so tests can send exactly the bytes they mean, malformed ones
//! included, and the `mcp_server` example built for the child-process tests.
#![allow(dead_code)] // each test binary uses part of it

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines};

/// Generous bound for one reply (a cold debug binary on a busy CI machine). Only a hang runs
/// into it; nothing asserts on how long anything took.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(60);

/// A client speaking newline-delimited JSON-RPC.
pub struct LineClient<R, W> {
    lines: Lines<BufReader<R>>,
    write: W,
    next_id: i64,
    /// Replies read while waiting for another one.
    early: Vec<Value>,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> LineClient<R, W> {
    /// A client over a read and a write half.
    pub fn new(read: R, write: W) -> Self {
        LineClient {
            lines: BufReader::new(read).lines(),
            write,
            next_id: 1000,
            early: Vec::new(),
        }
    }

    /// Sends one line as it is.
    pub async fn send_raw(&mut self, line: &str) {
        self.write.write_all(line.as_bytes()).await.expect("write");
        self.write.write_all(b"\n").await.expect("write");
        self.write.flush().await.expect("flush");
    }

    /// Sends a JSON-RPC message.
    pub async fn send(&mut self, message: &Value) {
        self.send_raw(&message.to_string()).await;
    }

    /// The next message the server sends.
    pub async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(REPLY_DEADLINE, self.lines.next_line())
            .await
            .expect("a reply before the deadline")
            .expect("read")
            .expect("the server closed the stream");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON from server: {e}: {line}"))
    }

    /// The reply to request `id` (other replies are kept for their turn; notifications are
    /// skipped).
    pub async fn reply_to(&mut self, id: &Value) -> Value {
        if let Some(i) = self.early.iter().position(|m| m.get("id") == Some(id)) {
            return self.early.remove(i);
        }
        loop {
            let message = self.recv().await;
            if message.get("id") == Some(id) {
                return message;
            }
            if message.get("id").is_some() {
                self.early.push(message);
            }
        }
    }

    /// A fresh request id.
    pub fn id(&mut self) -> Value {
        self.next_id += 1;
        json!(self.next_id)
    }

    /// Sends a request and waits for its reply.
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.reply_to(&id).await
    }

    /// `initialize` + `notifications/initialized`.
    pub async fn initialize(&mut self) -> Value {
        let reply = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "idem-tests", "version": "0"}
                }),
            )
            .await;
        assert!(reply.get("result").is_some(), "initialize failed: {reply}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        reply
    }

    /// `tools/call` with `arguments` and, when given, `_meta`.
    pub async fn call_tool(&mut self, name: &str, arguments: Value, meta: Option<Value>) -> Value {
        let id = self.id();
        self.send(&call_message(&id, name, arguments, meta)).await;
        self.reply_to(&id).await
    }
}

/// A `tools/call` request.
pub fn call_message(id: &Value, name: &str, arguments: Value, meta: Option<Value>) -> Value {
    let mut params = json!({"name": name, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// The `result` of a reply that must have one.
pub fn result(reply: &Value) -> &Value {
    reply
        .get("result")
        .unwrap_or_else(|| panic!("expected a result: {reply}"))
}

/// `result.isError` of a `tools/call` reply.
pub fn is_error(reply: &Value) -> bool {
    result(reply)["isError"] == json!(true)
}

/// `result._meta["idem/outcome"]` of a `tools/call` reply.
pub fn outcome(reply: &Value) -> String {
    result(reply)["_meta"]["idem/outcome"]
        .as_str()
        .unwrap_or_else(|| panic!("no idem/outcome: {reply}"))
        .to_owned()
}

/// Set in a child's environment, this test binary runs `examples/mcp_server.rs` (compiled in
/// as a module) instead of its checks: what the child serves is the example's code, built by
/// the same `cargo test` with the same features, with no second cargo run.
pub const RUN_EXAMPLE: &str = "IDEM_MCP_RUN_EXAMPLE";

/// The command that starts the example server: this very binary, with [`RUN_EXAMPLE`] set.
pub fn example_command() -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    command.env(RUN_EXAMPLE, "1");
    command
}

/// True in a child started by [`example_command`].
pub fn asked_to_run_example() -> bool {
    std::env::var_os(RUN_EXAMPLE).is_some()
}

/// True when tests must fail rather than skip for want of a server or a client.
pub fn require_backends() -> bool {
    std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1")
}

/// Counts checks and prints the closing line test runners read.
#[derive(Default)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
}

impl Tally {
    /// Runs one check; a panic in it is a failure, reported with its message.
    pub fn run(&mut self, name: &str, check: impl FnOnce() + std::panic::UnwindSafe) {
        match std::panic::catch_unwind(check) {
            Ok(()) => {
                self.passed += 1;
                println!("test {name} ... ok");
            }
            Err(_) => {
                self.failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }

    /// Prints `N passed, N failed` and exits non-zero when something failed.
    pub fn finish(self) {
        println!("\n{} passed, {} failed", self.passed, self.failed);
        if self.failed > 0 {
            std::process::exit(1);
        }
    }
}

pub use idem_test::stores::unique;
