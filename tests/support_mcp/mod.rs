//! A raw JSON-RPC client for MCP servers over line-delimited streams (an in-memory duplex or
//! a child's stdin/stdout), so tests can send exactly the bytes they mean, malformed ones
//! included, and the `mcp_server` example built for the child-process tests.
#![allow(dead_code)] // each test binary uses part of it

use std::path::PathBuf;
use std::process::Command;
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

/// The `mcp_server` example, built with this test binary's features (a no-op when
/// `cargo test` already built it), so what runs is the code under test.
pub fn example_binary() -> PathBuf {
    let mut features = vec!["mcp"];
    if cfg!(feature = "sqlite") {
        features.push("sqlite");
    }
    if cfg!(feature = "redis") {
        features.push("redis");
    }
    if cfg!(feature = "postgres") {
        features.push("postgres");
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "-p", "idem", "--example", "mcp_server"])
        .arg("--features")
        .arg(features.join(","))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the mcp_server example failed");
    // This test binary is target/<profile>/deps/<name>; the example is beside deps/.
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir
        .join("examples")
        .join(format!("mcp_server{}", std::env::consts::EXE_SUFFIX));
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// A name no other run of a test uses.
pub fn unique(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{tag}-{}-{nanos}", std::process::id())
}
