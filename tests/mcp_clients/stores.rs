//! The durable stores a client check runs the example servers on: a SQLite file always
//! (feature `sqlite`), Redis and Postgres when `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL` name
//! a server. A missing one is a skip, or a failure under `IDEM_REQUIRE_BACKENDS=1`.

use crate::support::{require_backends, unique};

/// Where a server's records go: the example's `IDEM_STORE_URL` and `IDEM_STORE_NAMESPACE`.
pub struct Store {
    pub url: String,
    pub namespace: String,
    /// The SQLite file's directory, removed with the store.
    dir: Option<std::path::PathBuf>,
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The store `backend` (`sqlite`, `redis`, `postgres`), fresh for one check; `None` (after
/// saying why) when it cannot be had here.
pub fn store(backend: &str) -> Option<Store> {
    let (feature_on, env) = match backend {
        "sqlite" => (cfg!(feature = "sqlite"), None),
        "redis" => (cfg!(feature = "redis"), Some("IDEM_REDIS_URL")),
        "postgres" => (cfg!(feature = "postgres"), Some("IDEM_POSTGRES_URL")),
        _ => unreachable!("no such backend: {backend}"),
    };
    let missing = |why: String| {
        assert!(!require_backends(), "IDEM_REQUIRE_BACKENDS=1, but {why}");
        eprintln!("skipping {backend}: {why}");
        None
    };
    if !feature_on {
        return missing(format!(
            "the {backend} feature is off (cargo test --features mcp,{backend})"
        ));
    }
    let Some(env) = env else {
        let dir = std::env::temp_dir().join(unique("idem-mcp-clients"));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        return Some(Store {
            url: format!("sqlite://{}", dir.join("idem.db").display()),
            namespace: String::new(),
            dir: Some(dir),
        });
    };
    match std::env::var(env).ok().filter(|u| !u.is_empty()) {
        None => missing(format!(
            "{env} is not set (.ci/run starts a server and sets it)"
        )),
        Some(url) => Some(Store {
            url,
            namespace: match backend {
                "redis" => format!("{}:", unique("idem-mcp-clients")),
                _ => unique("idem_mcp_clients").replace('-', "_"),
            },
            dir: None,
        }),
    }
}
