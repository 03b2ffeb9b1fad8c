//! The `mcp_server` example driven by a client nobody here wrote: the official MCP Python
//! SDK, over stdio and streamable HTTP (`tests/mcp_client/check_server.py`; what it checks
//! is listed at its top), on the in-memory store and on each durable one.
//!
//! Needs a Python with the `mcp` and `jsonschema` packages: `IDEM_MCP_PYTHON` names it
//! (`.ci/run` installs `tests/mcp_client/requirements.txt` into `target/mcp-venv`), else
//! `python3`. Without one the check prints why it skipped; under `IDEM_REQUIRE_BACKENDS=1`
//! it fails instead.
//!

use std::path::PathBuf;
use std::process::Command;

use crate::support::Tally;

/// Runs this module's checks: on the example's in-memory store, then on each durable one.
pub fn run(tally: &mut Tally) {
    tally.run("python_sdk::one_charge_per_call_in_memory", || {
        checks_on(None)
    });
    for backend in ["sqlite", "redis", "postgres"] {
        tally.run(
            &format!("python_sdk::one_charge_per_call_across_restarts_on_{backend}"),
            move || checks_on(Some(backend)),
        );
    }
}

fn checks_on(backend: Option<&str>) {
    let python = std::env::var_os("IDEM_MCP_PYTHON").unwrap_or_else(|| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import mcp, jsonschema"])
        .output();
    let missing = match probe {
        Err(e) => Some(format!(
            "{} cannot run: {e}",
            PathBuf::from(&python).display()
        )),
        Ok(out) if !out.status.success() => Some(format!(
            "{} lacks the `mcp` or `jsonschema` package ({})",
            PathBuf::from(&python).display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    };
    if let Some(why) = missing {
        let hint = "python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install -r \
                    tests/mcp_client/requirements.txt && export IDEM_MCP_PYTHON=$PWD/target/mcp-venv/bin/python";
        assert!(
            !crate::support::require_backends(),
            "IDEM_REQUIRE_BACKENDS=1, but {why}; {hint}"
        );
        eprintln!("skipping: {why}; {hint}");
        return;
    }

    let store = match backend {
        None => None,
        Some(backend) => match crate::stores::store(backend) {
            Some(store) => Some(store),
            None => return,
        },
    };
    let server = std::env::current_exe().expect("the test binary");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client/check_server.py");
    // The script passes IDEM_* variables on to the servers it starts.
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .arg(&server)
        .env(crate::support::RUN_EXAMPLE, "1");
    if let Some(store) = &store {
        command
            .env("IDEM_STORE_URL", &store.url)
            .env("IDEM_STORE_NAMESPACE", &store.namespace);
    }
    let out = command.output().expect("the check script runs");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python client's checks failed");
}
