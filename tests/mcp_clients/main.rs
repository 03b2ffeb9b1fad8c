//! The `mcp_server` example as separate processes, driven by clients: two servers sharing a
//! store, and the official MCP SDKs (Python, TypeScript) over stdio and streamable HTTP.
//!
//! The servers are this test binary re-executed as the example (`harness = false`, so its
//! stdout is the MCP stream and nothing else).

#[allow(dead_code)] // its `main` is what a child runs
#[path = "../../examples/mcp_server.rs"]
mod example;
#[path = "../mcp/support.rs"]
mod support;

mod python_sdk;
mod stores;
mod two_servers;
mod typescript_sdk;

fn main() {
    if support::asked_to_run_example() {
        if let Err(e) = example::main() {
            eprintln!("mcp_server: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mut tally = support::Tally::default();
    two_servers::run(&mut tally);
    python_sdk::run(&mut tally);
    typescript_sdk::run(&mut tally);
    tally.finish();
}
