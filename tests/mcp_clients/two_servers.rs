//! Two `mcp_server` example processes behind an imaginary load balancer, sharing one store
//! (a SQLite file; Redis and Postgres when `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` are set):
//! the same call sent to each, at once and then again, is one charge in their shared ledger
//! file.
//!
//! The servers are this test binary re-executed as the example (`harness = false`, so its
//! stdout is the MCP stream and nothing else).

use std::path::Path;
use std::process::Stdio;

use crate::support::{is_error, result, unique, LineClient, Tally};
use serde_json::json;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

type ChildClient = LineClient<ChildStdout, ChildStdin>;

/// Runs this module's checks.
pub fn run(tally: &mut Tally) {
    tally.run("two_servers::sharing_a_sqlite_file", sharing_a_sqlite_file);
    tally.run("two_servers::sharing_a_redis", sharing_a_redis);
    tally.run("two_servers::sharing_a_postgres", sharing_a_postgres);
}

fn skip(why: &str) {
    assert!(
        !crate::support::require_backends(),
        "IDEM_REQUIRE_BACKENDS=1, but {why}"
    );
    eprintln!("skipping: {why}");
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

fn spawn(store_url: &str, namespace: &str, ledger: &Path) -> (Child, ChildClient) {
    let mut child = Command::from(crate::support::example_command())
        .env("IDEM_STORE_URL", store_url)
        .env("IDEM_STORE_NAMESPACE", namespace)
        .env("IDEM_MCP_LEDGER", ledger)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("the example starts");
    let client = LineClient::new(child.stdout.take().unwrap(), child.stdin.take().unwrap());
    (child, client)
}

/// Runs the scenario against two fresh servers; returns the charges in their ledger.
async fn charges_made(store_url: &str, namespace: &str) -> usize {
    let dir = std::env::temp_dir().join(unique("idem-mcp-two"));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("ledger.jsonl");
    let (_a, mut a) = spawn(store_url, namespace, &ledger);
    let (_b, mut b) = spawn(store_url, namespace, &ledger);
    a.initialize().await;
    b.initialize().await;

    // A standard client: no idem `_meta`. Both servers serve one caller (whoever started
    // them), and their store is shared, so the call is one operation on either.
    let args = json!({"customer": "acme", "cents": 4900});
    let (ia, ib) = (a.id(), b.id());
    a.send(&crate::support::call_message(
        &ia,
        "charge",
        args.clone(),
        None,
    ))
    .await;
    b.send(&crate::support::call_message(
        &ib,
        "charge",
        args.clone(),
        None,
    ))
    .await;
    let (ra, rb) = (a.reply_to(&ia).await, b.reply_to(&ib).await);
    let again_a = a.call_tool("charge", args.clone(), None).await;
    let again_b = b.call_tool("charge", args, None).await;
    for reply in [&ra, &rb, &again_a, &again_b] {
        if !is_error(reply) {
            assert_eq!(result(reply)["structuredContent"]["id"], json!("ch_0001"));
        }
    }
    let lines = std::fs::read_to_string(&ledger).map_or(0, |s| s.lines().count());
    let _ = std::fs::remove_dir_all(&dir);
    lines
}

fn sharing_a_sqlite_file() {
    if !cfg!(feature = "sqlite") {
        return skip("the sqlite feature is off (cargo test --features mcp,sqlite)");
    }
    let dir = std::env::temp_dir().join(unique("idem-mcp-sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let charges = block_on(charges_made(&url, ""));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(charges, 1);
}

fn sharing_a_redis() {
    let Some(url) = std::env::var("IDEM_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        return skip(
            "IDEM_REDIS_URL not set; export IDEM_REDIS_URL=redis://127.0.0.1:6379/ (.ci/run does)",
        );
    };
    if !cfg!(feature = "redis") {
        return skip("the redis feature is off (cargo test --features mcp,redis)");
    }
    let prefix = format!("{}:", unique("idem-mcp"));
    let charges = block_on(charges_made(&url, &prefix));
    redis_delete_prefix(&url, &prefix);
    assert_eq!(charges, 1);
}

fn sharing_a_postgres() {
    let Some(url) = std::env::var("IDEM_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        return skip(
            "IDEM_POSTGRES_URL not set; export IDEM_POSTGRES_URL=postgres://user@127.0.0.1:5432/db (.ci/run does)",
        );
    };
    #[cfg(feature = "postgres")]
    {
        let schema = unique("idem_mcp").replace('-', "_");
        let charges = block_on(async {
            let charges = charges_made(&url, &schema).await;
            if let Ok(store) = idem::PostgresStore::builder(url.as_str())
                .schema(schema.as_str())
                .connect()
                .await
            {
                if let Ok(client) = store.pool().get().await {
                    let drop = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
                    let _ = client.batch_execute(&drop).await;
                }
            }
            charges
        });
        assert_eq!(charges, 1);
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = url;
        skip("the postgres feature is off (cargo test --features mcp,postgres)");
    }
}

/// Deletes the keys under `prefix` with plain RESP over a socket (no Redis client among the
/// test's dependencies).
fn redis_delete_prefix(url: &str, prefix: &str) {
    use std::io::{BufRead, BufReader, Read, Write};
    fn command(addr: &str, args: &[&str]) -> std::io::Result<Vec<String>> {
        let mut stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        let mut request = format!("*{}\r\n", args.len());
        for a in args {
            request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(request.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let mut items = Vec::new();
        if let Some(n) = header.trim_end().strip_prefix('*') {
            for _ in 0..n.parse::<usize>().unwrap_or(0) {
                let mut len = String::new();
                reader.read_line(&mut len)?;
                let n: usize = len.trim_end().trim_start_matches('$').parse().unwrap_or(0);
                let mut buf = vec![0; n + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(n);
                items.push(String::from_utf8_lossy(&buf).into_owned());
            }
        }
        Ok(items)
    }
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    let addr = rest.split('/').next().unwrap_or(rest);
    if let Ok(keys) = command(addr, &["KEYS", &format!("{prefix}*")]) {
        for key in keys {
            let _ = command(addr, &["DEL", &key]);
        }
    }
}
