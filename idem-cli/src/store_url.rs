//! Store URLs: `sqlite://PATH`, `redis://…`, `postgres://…`.

use std::sync::Arc;

use idem_runtime::IdemStore;

/// Why a store URL could not be opened.
#[derive(Debug)]
pub struct StoreUrlError(String);

impl std::fmt::Display for StoreUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreUrlError {}

/// Opens the store a URL names.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    let scheme = url.split_once(':').map_or("", |(s, _)| s);
    match scheme {
        "memory" => Err(StoreUrlError(
            "`memory:` names a store that lives inside one process; the CLI cannot see it. \
             Use sqlite://, redis:// or postgres://"
                .into(),
        )),
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
            if path.is_empty() {
                return Err(StoreUrlError("sqlite:// needs a path, e.g. sqlite://./idem.db".into()));
            }
            if !std::path::Path::new(path).exists() {
                return Err(StoreUrlError(format!("no SQLite database at {path}")));
            }
            idem_runtime::store::SqliteStore::open(path)
                .await
                .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
                .map_err(|e| StoreUrlError(e.to_string()))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => idem_runtime::store::RedisStore::connect(url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
            .map_err(|e| StoreUrlError(e.to_string())),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => idem_runtime::store::PostgresStore::connect(url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
            .map_err(|e| StoreUrlError(e.to_string())),
        other => Err(StoreUrlError(format!(
            "unsupported store URL scheme `{other}`: use sqlite://PATH, redis://HOST:PORT or postgres://… \
             (each needs its cargo feature)"
        ))),
    }
}
