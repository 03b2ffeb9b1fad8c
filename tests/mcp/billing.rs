//! The downstream most tests here charge: a ledger of every charge a handler made, shared
//! by every server a test starts (as a bank is shared by every process that calls it).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use idem::mcp::{McpHttp, McpServer};
use idem::{toolbox, IdemStore, ReadCtx, Registry, ToolError, WriteCtx};
use serde_json::{json, Value};

/// Arguments of `charge`.
#[idem::args]
pub struct ChargeArgs {
    pub customer: String,
    pub cents: u64,
}

/// Every charge made, with the key it was made under.
#[derive(Default)]
pub struct Bank {
    charges: Mutex<Vec<(String, u64, String)>>,
}

impl Bank {
    /// How many charges were made.
    pub fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    /// The keys the charges were made under, in order.
    pub fn keys(&self) -> Vec<String> {
        self.charges
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.2.clone())
            .collect()
    }
}

#[toolbox]
impl Bank {
    /// Charge a customer.
    #[tool(write)]
    async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Value, ToolError> {
        self.charges.lock().unwrap().push((
            args.customer,
            args.cents,
            ctx.key().as_str().to_owned(),
        ));
        Ok(json!({"charged": args.cents}))
    }

    /// How many charges were made.
    #[tool(read)]
    async fn count(&self, _ctx: ReadCtx) -> Result<Value, ToolError> {
        Ok(json!({"count": self.charges()}))
    }
}

/// A registry over `bank` on `store` (in memory when `None`).
pub fn registry(bank: &Arc<Bank>, store: Option<Arc<dyn IdemStore>>) -> Registry {
    let mut builder = Registry::builder().toolbox(bank.clone());
    if let Some(store) = store {
        builder = builder.shared_store(store);
    }
    builder.build().unwrap()
}

/// A SQLite store in a fresh file of its own (the file's path, to open it again).
#[cfg(feature = "sqlite")]
pub async fn sqlite_file() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(crate::support::unique("idem-mcp-store"));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("idem.db")
}

/// A store opened on the SQLite file `path`, as a restarted process would open it.
#[cfg(feature = "sqlite")]
pub async fn sqlite_store(path: &std::path::Path) -> Arc<dyn IdemStore> {
    Arc::new(idem::SqliteStore::open(path).await.unwrap())
}

/// Serves `server` over HTTP on a free loopback port, `configure` applied to the endpoint;
/// the address and the serving task (abort it to stop the server).
pub async fn serve_http(
    server: McpServer,
    configure: impl FnOnce(McpHttp) -> McpHttp,
) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let endpoint = configure(server.bind_http("127.0.0.1:0").await.unwrap());
    let addr = endpoint.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = endpoint.serve().await;
    });
    (addr, task)
}

/// `result._meta["idem/replayed"]` of a `tools/call` reply.
pub fn replayed(reply: &Value) -> bool {
    crate::support::result(reply)["_meta"]["idem/replayed"] == json!(true)
}
