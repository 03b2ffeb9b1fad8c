//! A plain HTTP/1.1 client over a real socket, for streamable HTTP: each request on a
//! connection of its own (`Connection: close`), its answer read to the end, so a test sends
//! exactly the headers it means (`Origin`, `Authorization`, `Idempotency-Key`, none at all).

use std::net::SocketAddr;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::REPLY_DEADLINE;

/// What the server answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    /// A header's value (names compared without case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC message in the body: the body itself, or the last `data:` line of an
    /// event stream that holds one.
    pub fn message(&self) -> Value {
        if let Ok(v) = serde_json::from_str(&self.body) {
            return v;
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .rfind(|v| v.get("id").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC reply in: {self:?}"))
    }
}

/// Sends one request to `addr` and reads the whole answer.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    tokio::time::timeout(REPLY_DEADLINE, exchange(addr, method, path, headers, body))
        .await
        .expect("an answer before the deadline")
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        addr.port(),
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        unchunk(rest)
    } else {
        rest.to_owned()
    };
    Answer {
        status,
        headers,
        body,
    }
}

fn unchunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    body
}

/// The headers every streamable HTTP POST carries.
pub const POST_HEADERS: [(&str, &str); 2] = [
    ("Content-Type", "application/json"),
    ("Accept", "application/json, text/event-stream"),
];

/// A client of one streamable HTTP endpoint, with a session once initialized (the
/// revisions before 2026-07-28) or none (2026-07-28, where every request says its version).
pub struct HttpClient {
    pub addr: SocketAddr,
    pub path: String,
    pub session: Option<String>,
    pub protocol: Option<String>,
    /// Headers sent with every request (`Authorization`, `Origin`).
    pub extra: Vec<(String, String)>,
    next_id: i64,
}

impl HttpClient {
    /// A client of `addr` at `/mcp`.
    pub fn new(addr: SocketAddr) -> HttpClient {
        HttpClient {
            addr,
            path: "/mcp".to_owned(),
            session: None,
            protocol: None,
            extra: Vec::new(),
            next_id: 0,
        }
    }

    /// The same client, sending `name: value` with every request.
    pub fn with_header(mut self, name: &str, value: &str) -> HttpClient {
        self.extra.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Posts one JSON-RPC message, with `more` headers.
    pub async fn post(&mut self, message: &Value, more: &[(&str, &str)]) -> Answer {
        let mut headers: Vec<(&str, &str)> = POST_HEADERS.to_vec();
        if let Some(session) = &self.session {
            headers.push(("Mcp-Session-Id", session));
        }
        if let Some(protocol) = &self.protocol {
            headers.push(("MCP-Protocol-Version", protocol));
        }
        for (n, v) in &self.extra {
            headers.push((n, v));
        }
        headers.extend_from_slice(more);
        send(
            self.addr,
            "POST",
            &self.path,
            &headers,
            &message.to_string(),
        )
        .await
    }

    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }

    /// `initialize` (and `notifications/initialized`) at protocol version 2025-11-25; the
    /// answer to `initialize`.
    pub async fn initialize(&mut self) -> Answer {
        let id = self.id();
        let answer = self
            .post(
                &json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "idem-tests", "version": "0"}}}),
                &[],
            )
            .await;
        if answer.status != 200 {
            return answer;
        }
        self.session = answer.header("mcp-session-id").map(str::to_owned);
        self.protocol = Some("2025-11-25".to_owned());
        let note = self
            .post(
                &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                &[],
            )
            .await;
        assert!(note.status < 300, "initialized: {note:?}");
        answer
    }

    /// A client of the sessionless revision (2026-07-28): no `initialize`, no session.
    pub fn sessionless(mut self) -> HttpClient {
        self.protocol = Some("2026-07-28".to_owned());
        self
    }

    /// A request; its JSON-RPC reply (`more`: headers of this request only).
    pub async fn request(&mut self, method: &str, params: Value, more: &[(&str, &str)]) -> Value {
        let id = self.id();
        let mut params = params;
        if self.session.is_none() && self.protocol.as_deref() == Some("2026-07-28") {
            // The sessionless revision carries the client's version and capabilities on
            // every request.
            let meta = params
                .as_object_mut()
                .expect("params are an object")
                .entry("_meta")
                .or_insert_with(|| json!({}));
            meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
            meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
            meta["io.modelcontextprotocol/clientInfo"] =
                json!({"name": "idem-tests", "version": "0"});
        }
        // The sessionless revision names the method (and the tool) in headers too.
        let name = params["name"].as_str().unwrap_or_default().to_owned();
        let mut headers: Vec<(&str, &str)> = more.to_vec();
        if self.session.is_none() {
            headers.push(("Mcp-Method", method));
            if method == "tools/call" {
                headers.push(("Mcp-Name", &name));
            }
        }
        let answer = self
            .post(
                &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
                &headers,
            )
            .await;
        assert_eq!(answer.status, 200, "{method}: {answer:?}");
        answer.message()
    }

    /// `tools/call` of `name` with `arguments`.
    pub async fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
        more: &[(&str, &str)],
    ) -> Value {
        self.request(
            "tools/call",
            json!({"name": name, "arguments": arguments}),
            more,
        )
        .await
    }
}
