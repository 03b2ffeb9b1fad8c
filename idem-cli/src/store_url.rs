//! Store URLs: `sqlite:…`, `redis://…`, `postgres://…`.

use std::path::PathBuf;
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

/// Opens the store a URL names (the forms are listed in `idem --help`). A SQLite database
/// must exist already: the CLI inspects records, so a mistyped path is an error rather than
/// a new, empty database.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdemStore>, StoreUrlError> {
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
            idem_runtime::SqliteStore::open(&path)
                .await
                .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
                .map_err(|e| StoreUrlError(e.to_string()))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => idem_runtime::RedisStore::connect(url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
            .map_err(|e| StoreUrlError(e.to_string())),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => idem_runtime::PostgresStore::connect(url)
            .await
            .map(|s| Arc::new(s) as Arc<dyn IdemStore>)
            .map_err(|e| StoreUrlError(e.to_string())),
        other => Err(StoreUrlError(format!(
            "unsupported store URL scheme `{other}`: use sqlite://PATH, redis://HOST:PORT or postgres://… \
             (each needs its cargo feature)"
        ))),
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
