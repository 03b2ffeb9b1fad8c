//! Store URLs: `sqlite:…`, `redis://…`, `postgres://…`, and the options a service's store
//! builder may have set beyond the URL (a Redis prefix, partitions or cluster, a Postgres
//! schema, TLS certificates), so the CLI opens the very store the service writes.

use std::path::PathBuf;
use std::sync::Arc;

use idem_runtime::store::IdemStore;

/// How to open the store beyond its URL: what the service's store builder set. Each option
/// belongs to some backends; one given for a store it does not apply to is an error, not
/// ignored (the CLI would look at another store than the service's and find nothing).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct StoreOptions {
    /// Redis: the store's key prefix (`RedisStoreBuilder::prefix`; default `idem:`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Redis: how many partitions the store is spread over
    /// (`RedisStoreBuilder::partitions`; default 1).
    #[arg(long, global = true, value_name = "N")]
    pub partitions: Option<u16>,
    /// Redis: the store lives on a Redis Cluster, and the store URL lists some of its nodes,
    /// comma-separated (`redis://h1:7000,redis://h2:7000`).
    #[arg(long, global = true)]
    pub cluster: bool,
    /// Postgres: the schema holding the store's tables (`PostgresStoreBuilder::schema`;
    /// default `idem`).
    #[arg(long, global = true, value_name = "SCHEMA")]
    pub schema: Option<String>,
    /// Redis and Postgres over TLS: a PEM file of root certificates (a private CA) to trust
    /// instead of the system's. Redis needs a `rediss://` URL; Postgres `sslmode=require`
    /// or stricter.
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Redis and Postgres over TLS: a PEM client certificate, for servers that require one
    /// (with `--tls-key`).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl StoreOptions {
    /// The options given that `backend` has no use for, by flag name.
    fn foreign_to(&self, backend: Backend) -> Vec<&'static str> {
        let redis = backend == Backend::Redis;
        let postgres = backend == Backend::Postgres;
        let mut out = Vec::new();
        let mut check = |given: bool, applies: bool, flag: &'static str| {
            if given && !applies {
                out.push(flag);
            }
        };
        check(self.prefix.is_some(), redis, "--prefix");
        check(self.partitions.is_some(), redis, "--partitions");
        check(self.cluster, redis, "--cluster");
        check(self.schema.is_some(), postgres, "--schema");
        check(self.tls_ca.is_some(), redis || postgres, "--tls-ca");
        check(self.tls_cert.is_some(), redis || postgres, "--tls-cert");
        check(self.tls_key.is_some(), redis || postgres, "--tls-key");
        out
    }

    /// `builder` with the TLS files given (read here), or an error naming the file.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    fn with_tls<B: TakesCertificates>(&self, builder: B) -> Result<B, StoreUrlError> {
        #[allow(unused_variables)]
        let (ca, client) = self.tls_files()?;
        #[cfg(feature = "tls")]
        let builder = {
            let builder = match ca {
                Some(ca) => builder.roots(ca),
                None => builder,
            };
            match client {
                Some((cert, key)) => builder.client(cert, key),
                None => builder,
            }
        };
        Ok(builder)
    }

    /// The TLS files' contents: the CA, and the client certificate with its key.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    #[allow(clippy::type_complexity)]
    fn tls_files(&self) -> Result<(Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>)>), StoreUrlError> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| StoreUrlError(format!("reading {flag} {}: {e}", path.display())))
        };
        let ca = self
            .tls_ca
            .as_ref()
            .map(|p| read("--tls-ca", p))
            .transpose()?;
        let client = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((read("--tls-cert", cert)?, read("--tls-key", key)?)),
            (None, None) => None,
            _ => return Err(StoreUrlError("--tls-cert and --tls-key go together".into())),
        };
        if (ca.is_some() || client.is_some()) && !cfg!(feature = "tls") {
            return Err(StoreUrlError(
                "--tls-ca, --tls-cert and --tls-key need the CLI built with its `tls` feature"
                    .into(),
            ));
        }
        Ok((ca, client))
    }
}

/// The store backends a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Redis,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Redis => "Redis",
            Backend::Postgres => "Postgres",
        }
    }
}

/// Why a store URL could not be opened.
#[derive(Debug)]
pub struct StoreUrlError(String);

impl std::fmt::Display for StoreUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreUrlError {}

/// Opens the store a URL names (the forms are listed in `idem --help`) with default
/// options. A SQLite database must exist already: the CLI inspects records, so a mistyped
/// path is an error rather than a new, empty database.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    open_store_with(url, &StoreOptions::default()).await
}

/// Refuses options given for a store they do not apply to (`store`, as the message names
/// it): an option ignored would be a setting the user believes in and does not have.
fn refuse_foreign(
    options: &StoreOptions,
    backend: Backend,
    store: &str,
) -> Result<(), StoreUrlError> {
    let foreign = options.foreign_to(backend);
    if foreign.is_empty() {
        return Ok(());
    }
    Err(StoreUrlError(format!(
        "{} do{} not apply to {store}",
        foreign.join(", "),
        if foreign.len() == 1 { "es" } else { "" },
    )))
}

/// Opens the store a URL names with `options` (see [`StoreOptions`]).
pub async fn open_store_with(
    url: &str,
    options: &StoreOptions,
) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    let backend = match scheme(url) {
        "sqlite" => Some(Backend::Sqlite),
        "redis" | "rediss" => Some(Backend::Redis),
        "postgres" | "postgresql" => Some(Backend::Postgres),
        _ => None,
    };
    if let Some(backend) = backend {
        refuse_foreign(options, backend, &format!("a {} store", backend.name()))?;
    }
    match scheme(url) {
        "memory" => Err(StoreUrlError(
            "`memory:` names a store that lives inside one process; the CLI cannot see it. \
             Use sqlite://, redis:// or postgres://"
                .into(),
        )),
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let path = sqlite_path(url)?;
            if !path.exists() {
                return Err(StoreUrlError(format!(
                    "no SQLite database at {}",
                    path.display()
                )));
            }
            idem_sqlite::SqliteStore::open(&path)
                .await
                .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
                .map_err(|e| StoreUrlError(e.to_string()))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => open_redis(url, options).await,
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => open_postgres(url, options).await,
        other => Err(StoreUrlError(format!(
            "unsupported store URL scheme `{other}`: use sqlite://PATH, redis://HOST:PORT or postgres://… \
             (each needs its cargo feature)"
        ))),
    }
}

#[cfg(feature = "redis")]
async fn open_redis(
    url: &str,
    options: &StoreOptions,
) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    opened(redis_store(url, options).await)
}

/// What `idem copy` copied (`idem_redis::RedisCopy`, which exists only in builds
/// with Redis).
#[derive(Debug, serde::Serialize)]
pub(crate) struct Copied {
    pub(crate) records: usize,
    pub(crate) lapsed: usize,
    pub(crate) traces: usize,
    pub(crate) per_partition: Vec<usize>,
}

/// Copies the Redis store at `from` (opened with `from_options`) into the one at `to`
/// (`to_options`): `idem copy`. Both must be Redis stores.
pub(crate) async fn copy_redis(
    from: &str,
    from_options: &StoreOptions,
    to: &str,
    to_options: &StoreOptions,
) -> Result<Copied, StoreUrlError> {
    for (url, side) in [(from, "--store"), (to, "--to")] {
        if !matches!(scheme(url), "redis" | "rediss") {
            return Err(StoreUrlError(format!(
                "`idem copy` copies a Redis store into a Redis store; {side} is not a \
                 redis:// or rediss:// URL"
            )));
        }
    }
    #[cfg(feature = "redis")]
    {
        for (options, side) in [(from_options, "this store"), (to_options, "the new store")] {
            refuse_foreign(options, Backend::Redis, &format!("{side}, a Redis store"))?;
        }
        let source = redis_store(from, from_options)
            .await
            .map_err(|e| StoreUrlError(format!("opening this store: {e}")))?;
        let target = redis_store(to, to_options)
            .await
            .map_err(|e| StoreUrlError(format!("opening the new store: {e}")))?;
        let copied = source
            .copy_into(&target)
            .await
            .map_err(|e| StoreUrlError(e.to_string()))?;
        Ok(Copied {
            records: copied.records,
            lapsed: copied.lapsed,
            traces: copied.traces,
            per_partition: copied.per_partition,
        })
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = (from_options, to_options);
        Err(StoreUrlError(
            "this idem CLI was built without its `redis` feature".into(),
        ))
    }
}

/// The Redis store at `url` with `options`, connected.
#[cfg(feature = "redis")]
async fn redis_store(
    url: &str,
    options: &StoreOptions,
) -> Result<idem_redis::RedisStore, idem_runtime::store::StoreError> {
    let mut builder = if options.cluster {
        idem_redis::RedisStore::cluster(url.split(',').map(str::trim).filter(|s| !s.is_empty()))
    } else {
        idem_redis::RedisStore::builder(url)
    };
    if let Some(prefix) = &options.prefix {
        builder = builder.prefix(prefix.as_str());
    }
    if let Some(n) = options.partitions {
        builder = builder.partitions(n);
    }
    options
        .with_tls(builder)
        .map_err(|e| idem_runtime::store::StoreError::Backend(e.0))?
        .connect()
        .await
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    url: &str,
    options: &StoreOptions,
) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    let mut builder = idem_postgres::PostgresStore::builder(url);
    if let Some(schema) = &options.schema {
        builder = builder.schema(schema.as_str());
    }
    opened(options.with_tls(builder)?.connect().await)
}

/// A connected store as the CLI holds it, or the connection's error.
#[cfg(any(feature = "redis", feature = "postgres"))]
fn opened<S: IdemStore + 'static>(
    store: Result<S, idem_runtime::store::StoreError>,
) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
    store
        .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
        .map_err(|e| StoreUrlError(e.to_string()))
}

/// A store builder that takes TLS certificates as PEM (both network stores' builders).
#[cfg(any(feature = "redis", feature = "postgres"))]
trait TakesCertificates: Sized {
    #[cfg(feature = "tls")]
    fn roots(self, pem: Vec<u8>) -> Self;
    #[cfg(feature = "tls")]
    fn client(self, cert: Vec<u8>, key: Vec<u8>) -> Self;
}

#[cfg(feature = "redis")]
impl TakesCertificates for idem_redis::RedisStoreBuilder {
    #[cfg(feature = "tls")]
    fn roots(self, pem: Vec<u8>) -> Self {
        self.tls_root_certificates(pem)
    }
    #[cfg(feature = "tls")]
    fn client(self, cert: Vec<u8>, key: Vec<u8>) -> Self {
        self.tls_client_certificate(cert, key)
    }
}

#[cfg(feature = "postgres")]
impl TakesCertificates for idem_postgres::PostgresStoreBuilder {
    #[cfg(feature = "tls")]
    fn roots(self, pem: Vec<u8>) -> Self {
        self.tls_root_certificates(pem)
    }
    #[cfg(feature = "tls")]
    fn client(self, cert: Vec<u8>, key: Vec<u8>) -> Self {
        self.tls_client_certificate(cert, key)
    }
}

fn scheme(url: &str) -> &str {
    url.split_once(':').map_or("", |(s, _)| s)
}

/// The file a `sqlite:` URL names.
///
/// What follows `sqlite:` (and an optional `//`) is a path, taken literally: a leading `/`
/// makes it absolute, however many slashes there are (`sqlite:///abs.db`, and the
/// `sqlite:////abs.db` some tools write, both name `/abs.db`); anything else is relative to
/// the working directory (`sqlite://./rel.db`, `sqlite://rel.db`, `sqlite:rel.db`).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn sqlite_path(url: &str) -> Result<PathBuf, StoreUrlError> {
    let rest = url
        .strip_prefix("sqlite:")
        .ok_or_else(|| StoreUrlError(format!("not a sqlite: URL: {url}")))?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if rest == ":memory:" || rest.starts_with(":memory:?") {
        return Err(StoreUrlError(
            "an in-memory SQLite database starts empty and lives only inside this process, \
             so it holds no records to inspect: name the database file your service uses"
                .into(),
        ));
    }
    if rest.is_empty() {
        return Err(StoreUrlError(
            "sqlite: needs a path, e.g. sqlite://./idem.db or sqlite:///var/lib/idem.db".into(),
        ));
    }
    if rest.contains('?') {
        return Err(StoreUrlError(format!(
            "sqlite: URLs take no query parameters (the path is taken literally): {url}"
        )));
    }
    if rest.starts_with('/') {
        // Keep exactly one leading slash: `//x` would be a different (implementation-defined)
        // path on POSIX, and four slashes are a common way to write an absolute path.
        Ok(PathBuf::from(format!("/{}", rest.trim_start_matches('/'))))
    } else {
        Ok(PathBuf::from(rest))
    }
}

/// True when `url` carries a password: in its user info (`scheme://user:PASSWORD@host`,
/// `redis://:PASSWORD@host`) or as a `password=` query parameter (Postgres). SQLite URLs
/// are paths and never do.
///
/// Hand-parsed rather than with the `url` crate on purpose: multi-host Postgres URLs
/// (`postgres://u:p@h1:5432,h2:5432/db`) are not URLs that crate accepts, and a warning must
/// not miss them.
pub(crate) fn has_password(url: &str) -> bool {
    if scheme(url) == "sqlite" {
        return false;
    }
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let (before_query, query) = rest
        .split_once('?')
        .map_or((rest, None), |(a, q)| (a, Some(q)));
    // The user info ends at the last `@` before the query: a password with an unescaped `/`
    // still counts (better a needless warning than a missed one).
    let in_user_info = before_query
        .rsplit_once('@')
        .and_then(|(user_info, _)| user_info.split_once(':'))
        .is_some_and(|(_, password)| !password.is_empty());
    let in_query = query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            name.eq_ignore_ascii_case("password") && !value.is_empty()
        })
    });
    in_user_info || in_query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_paths() {
        let ok = |url: &str| sqlite_path(url).unwrap().display().to_string();
        assert_eq!(ok("sqlite:////var/idem.db"), "/var/idem.db");
        assert_eq!(ok("sqlite:///var/idem.db"), "/var/idem.db");
        assert_eq!(ok("sqlite:/var/idem.db"), "/var/idem.db");
        assert_eq!(ok("sqlite://./rel.db"), "./rel.db");
        assert_eq!(ok("sqlite://rel.db"), "rel.db");
        assert_eq!(ok("sqlite:rel.db"), "rel.db");
        assert_eq!(ok("sqlite://../up/x.db"), "../up/x.db");
        assert_eq!(ok("sqlite:///tmp/a b@c:d.db"), "/tmp/a b@c:d.db");
        for bad in [
            "sqlite:",
            "sqlite://",
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite::memory:?cache=shared",
            "sqlite:///x.db?mode=ro",
            "redis://x",
        ] {
            assert!(sqlite_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords() {
        for yes in [
            "postgres://alice:pw@host:5432/db",
            "postgresql://alice:pw@h1:5432,h2:5433/db?sslmode=require",
            "postgres://alice@host/db?sslmode=disable&password=pw",
            "postgres://alice@host/db?PASSWORD=pw",
            "redis://:pw@127.0.0.1:6379/0",
            "rediss://user:p%40ss@host",
            "redis://user:pa:ss@host",
            "postgres://alice:pa/ss@host/db",
        ] {
            assert!(has_password(yes), "{yes}");
        }
        for no in [
            "postgres://alice@host:5432/db",
            "postgres://host/db?user=alice",
            "postgres://alice:@host/db",
            "redis://127.0.0.1:6379/0",
            "redis://host/0?note=a:b@c",
            "sqlite://user:pw@host.db",
            "sqlite:///tmp/x.db",
            "memory:",
        ] {
            assert!(!has_password(no), "{no}");
        }
    }
}
