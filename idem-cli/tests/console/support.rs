//! What the console tests share: the stores to run on, the console binary started on one
//! of them, a tiny HTTP/1.1 client over a `TcpStream`, and records made through the store's
//! public API.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{AttemptKind, AttemptRecord, OperationDraft, Retention};
use idem_runtime::{
    identity::{CanonicalJson, Fingerprint, IdemKey, KeyMaterial, Scope},
    outcome::OutcomeClass,
    store::{Clock, IdemStore, RecordState, SystemClock, Timestamp},
};
use idem_sqlite::{SqliteStore, SqliteSync};
use idem_test::stores::{PostgresSchema, RedisPrefix};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use idem_test::stores::unique;

/// One store to run on: how the CLI names it, and the store itself.
pub struct Target {
    /// `sqlite`, `redis` or `postgres`.
    pub name: &'static str,
    /// The store URL.
    pub url: String,
    /// The store options that name the test's own location in it.
    pub options: Vec<String>,
    /// The store, opened by the test.
    pub store: Arc<dyn IdemStore>,
    /// The SQLite file, removed on drop.
    file: Option<PathBuf>,
    /// The Redis prefix or Postgres schema, cleaned up when dropped.
    _location: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(path) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(PathBuf::from(p));
            }
        }
    }
}

/// A fresh SQLite database.
pub async fn sqlite(tag: &str) -> Target {
    let path = std::env::temp_dir().join(format!("{}.db", unique(tag)));
    let store = SqliteStore::builder(&path)
        .sync(SqliteSync::Normal)
        .open()
        .await
        .unwrap();
    Target {
        name: "sqlite",
        url: format!("sqlite://{}", path.display()),
        options: vec![],
        store: Arc::new(store),
        file: Some(path),
        _location: None,
    }
}

/// A Redis prefix of the test's own (`None`: no server, and not required).
pub async fn redis(tag: &str) -> Option<Target> {
    let prefix = RedisPrefix::new(tag, "the console on Redis")?;
    let store = prefix.open(Retention::default()).await;
    Some(Target {
        name: "redis",
        url: prefix.url.clone(),
        options: vec!["--prefix".into(), prefix.prefix.clone()],
        store: Arc::new(store),
        file: None,
        _location: Some(Box::new(prefix)),
    })
}

/// A Postgres schema of the test's own (`None`: no server, and not required).
pub async fn postgres(tag: &str) -> Option<Target> {
    let schema = PostgresSchema::new(&tag.replace('-', "_"), "the console on Postgres")?;
    let store = schema.open(4, None, Retention::default()).await;
    Some(Target {
        name: "postgres",
        url: schema.url.clone(),
        options: vec!["--schema".into(), schema.name.clone()],
        store: Arc::new(store),
        file: None,
        _location: Some(Box::new(schema)),
    })
}

/// Every store this machine has (SQLite always).
pub async fn every_store(tag: &str) -> Vec<Target> {
    let mut out = vec![sqlite(tag).await];
    out.extend(redis(tag).await);
    out.extend(postgres(tag).await);
    out
}

/// The token the tests start the console with.
pub const TOKEN: &str = "console-test-token-0123456789";

/// A running `idem console`, stopped on drop.
pub struct Console {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The address it printed to open, with the token.
    pub url: String,
    log: PathBuf,
}

impl Console {
    /// `idem --store URL OPTIONS… console --listen 127.0.0.1:0 --token TOKEN EXTRA…`, with
    /// a clean environment; waits for the address it prints.
    pub fn start(url: &str, options: &[String], extra: &[&str]) -> Console {
        let log = std::env::temp_dir().join(format!("{}.log", unique("console-stderr")));
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .env_remove("IDEM_STORE_URL")
            .env_remove("IDEM_OPERATOR")
            .env_remove("IDEM_CONSOLE_TOKEN")
            .env_remove("USER")
            .arg("--store")
            .arg(url)
            .args(options)
            .args(["console", "--listen", "127.0.0.1:0", "--token", TOKEN])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("run the idem binary");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("idem console: open ")
            .unwrap_or_else(|| panic!("no address in {line:?}: {}", read(&log)))
            .to_owned();
        let addr = url
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {url:?}"));
        Console {
            child,
            addr,
            url,
            log,
        }
    }

    /// What it wrote to stderr so far.
    pub fn log(&self) -> String {
        read(&self.log)
    }

    /// A session: the first visit with `?token=`, then the cookie it set.
    pub async fn session(&self) -> Session {
        let r = request(self.addr, "GET", &format!("/?token={TOKEN}"), &[], None).await;
        assert_eq!(r.status, 303, "{}", r.body);
        let cookie = r
            .header("set-cookie")
            .and_then(|c| c.split(';').next())
            .expect("a cookie")
            .to_owned();
        Session {
            addr: self.addr,
            cookie,
        }
    }
}

fn read(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A browser's session with the console: its cookie.
pub struct Session {
    addr: SocketAddr,
    /// `NAME=TOKEN`.
    pub cookie: String,
}

impl Session {
    /// `GET path` with the cookie.
    pub async fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[("Cookie", &self.cookie)], None).await
    }

    /// `POST path` with the cookie, the console's own `Origin` and `form`.
    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Response {
        let origin = format!("http://{}", self.addr);
        self.post_with(path, &[("Origin", &origin)], form).await
    }

    /// `POST path` with the cookie, `headers` and `form`.
    pub async fn post_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        form: &[(&str, &str)],
    ) -> Response {
        let mut all = vec![("Cookie", self.cookie.as_str())];
        all.extend_from_slice(headers);
        request(self.addr, "POST", path, &all, Some(&encode(form))).await
    }

    /// The CSRF token the record page of `key` carries in its forms.
    pub async fn csrf(&self, key: &IdemKey) -> String {
        let page = self.get(&format!("/records/{key}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let at = page
            .body
            .find("name=\"csrf\" value=\"")
            .expect("a CSRF field")
            + 19;
        page.body[at..].split('"').next().unwrap().to_owned()
    }
}

/// `form` as `application/x-www-form-urlencoded`.
pub fn encode(form: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    form.iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Response {
    /// The first header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection (`Connection: close`); `form` is sent as
/// a urlencoded body.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    form: Option<&str>,
) -> Response {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    let body = form.unwrap_or("");
    if form.is_some() {
        head.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw))
        .await
        .expect("the console answers")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// What a record made by [`record`] holds.
pub struct Made<'a> {
    pub tool: &'a str,
    pub run: &'a str,
    pub args: Value,
    pub state: RecordState,
    pub message: &'a str,
    /// How long ago its one send went out.
    pub sent_ago: Duration,
}

/// Past any in-flight bound the stock binary assumes (90 minutes after the send).
pub const LONG_AGO: Duration = Duration::from_secs(2 * 3600);

/// Claims a key through the store and settles it as `made` says, with one attempt whose
/// message is the record's; returns the key.
pub async fn record(store: &dyn IdemStore, made: Made<'_>) -> IdemKey {
    let scope = Scope::run(made.run.to_owned());
    let args = CanonicalJson::from_value(&made.args);
    let key = IdemKey::derive(
        &scope,
        made.tool,
        KeyMaterial::Args(args.as_str().as_bytes()),
    );
    let req = ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_canonical(args.as_str().as_bytes()),
        tool: made.tool.into(),
        lease: Duration::from_secs(60),
        operation: Some(OperationDraft::new(scope, None, args)),
    };
    let ClaimOutcome::Claimed(token) = store.claim(&req).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    let now = SystemClock.now();
    let sent = Timestamp(now.0.saturating_sub(made.sent_ago.as_millis() as u64));
    let settlement = Settlement::new(made.state)
        .message(made.message.to_owned())
        .attempts(vec![AttemptRecord::new(
            1,
            sent,
            sent,
            AttemptKind::Returned,
            OutcomeClass::Unknown,
            Some(made.message.to_owned()),
        )]);
    store.settle(&key, token, settlement).await.unwrap();
    key
}
