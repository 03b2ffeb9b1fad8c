//! The `mcp_server` example driven by the official MCP TypeScript SDK
//! (`tests/mcp_client/check_server.mjs`; what it checks is listed at its top), on each
//! durable store.
//!
//! Needs Node.js and the SDK installed from `tests/mcp_client/package-lock.json`:
//! `IDEM_MCP_NODE_MODULES` names the `node_modules` (`.ci/run` runs `npm ci` into
//! `target/mcp-node`). Without them the check skips; under `IDEM_REQUIRE_BACKENDS=1` it fails.

use std::path::PathBuf;
use std::process::Command;

use crate::stores::store;
use crate::support::{require_backends, Tally};

/// Runs this module's checks.
pub fn run(tally: &mut Tally) {
    for backend in ["sqlite", "redis", "postgres"] {
        tally.run(
            &format!("typescript_sdk::reconnects_callers_and_refusals_on_{backend}"),
            move || checks_on(backend),
        );
    }
}

fn checks_on(backend: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let modules = std::env::var_os("IDEM_MCP_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/mcp-node/node_modules"));
    let node = Command::new("node").arg("--version").output();
    let sdk = modules.join("@modelcontextprotocol/sdk/package.json");
    let missing = match node {
        Err(e) => Some(format!("node cannot run: {e}")),
        Ok(_) if !sdk.exists() => Some(format!("{} is missing", sdk.display())),
        Ok(_) => None,
    };
    if let Some(why) = missing {
        let hint =
            "mkdir -p target/mcp-node && cp tests/mcp_client/package*.json target/mcp-node/ \
                    && npm ci --prefix target/mcp-node";
        assert!(
            !require_backends(),
            "IDEM_REQUIRE_BACKENDS=1, but {why}; {hint}"
        );
        eprintln!("skipping: {why}; {hint}");
        return;
    }
    let Some(store) = store(backend) else { return };
    let out = Command::new("node")
        .arg(root.join("tests/mcp_client/check_server.mjs"))
        .arg(std::env::current_exe().expect("the test binary"))
        .arg(&modules)
        .env(crate::support::RUN_EXAMPLE, "1")
        .env("IDEM_STORE_URL", &store.url)
        .env("IDEM_STORE_NAMESPACE", &store.namespace)
        .output()
        .expect("the check script runs");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the TypeScript client's checks failed on {backend}"
    );
}
