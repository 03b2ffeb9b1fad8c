//! Temporary stores: a directory, a Redis key prefix and a Postgres schema of the test's own,
//! each opened as often as a test needs a new worker (a new handle on the same location) and
//! removed when dropped.
//!
//! Redis and Postgres need `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL`. Without them a test prints
//! why it skips them, and under `IDEM_REQUIRE_BACKENDS=1` it fails instead
//! ([`idem::store::conformance::backend_url`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::store::Retention;
use idem::IdemStore;

/// A name no other run of this test uses, nor another test of this run (tests run in
/// parallel, and two may ask for the same tag in the same nanosecond). Only ASCII letters,
/// digits and `_` beyond what `tag` holds, so it can name a schema or a key prefix.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{tag}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// A Redis key prefix no other test uses (ends with `:`), for a test that cleans it up on
/// servers of its own (a cluster's nodes).
pub fn unique_prefix(tag: &str) -> String {
    format!("idem-{}:", unique(tag))
}

/// A fresh directory under the system temp dir, removed when dropped (unless borrowed).
pub struct TempDir(pub PathBuf, bool);

impl TempDir {
    /// Creates it, named after `tag`.
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("idem-{}", unique(tag)));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        TempDir(dir, true)
    }

    /// A directory another process created (and removes): not removed on drop.
    pub fn borrowed(path: PathBuf) -> TempDir {
        TempDir(path, false)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A Postgres schema of the test's own on `url`, dropped (with everything in it) when this
/// is dropped.
#[cfg(feature = "postgres")]
pub struct PostgresSchema {
    /// The server's URL.
    pub url: String,
    /// The schema's name (lower case, so it needs no quoting to match).
    pub name: String,
    owned: bool,
}

#[cfg(feature = "postgres")]
impl PostgresSchema {
    /// A fresh schema name on `IDEM_POSTGRES_URL`, or `None` (with the reason printed) when
    /// the variable is unset; `check` names the test in that message.
    pub fn new(tag: &str, check: &str) -> Option<PostgresSchema> {
        let url = idem::store::conformance::backend_url("IDEM_POSTGRES_URL", check)?;
        Some(PostgresSchema::on(url, tag))
    }

    /// A fresh schema name on `url`.
    pub fn on(url: String, tag: &str) -> PostgresSchema {
        PostgresSchema {
            url,
            // Postgres cuts names at 63 bytes: a long tag must not cut off what is unique.
            name: unique(&format!("idem_{}", &tag[..tag.len().min(24)])).to_lowercase(),
            owned: true,
        }
    }

    /// The schema another process named (and removes): not dropped with this.
    pub fn borrowed(url: String, name: String) -> PostgresSchema {
        PostgresSchema {
            url,
            name,
            owned: false,
        }
    }

    /// A new store on the schema (created on first use), of up to `max_connections`, on
    /// `clock` when given.
    pub async fn open(
        &self,
        max_connections: usize,
        clock: Option<idem::store::ManualClock>,
        retention: Retention,
    ) -> idem::PostgresStore {
        let mut b = idem::PostgresStore::builder(self.url.clone())
            .schema(self.name.clone())
            .retention(retention)
            .max_connections(max_connections);
        if let Some(clock) = clock {
            b = b.clock(Arc::new(clock));
        }
        b.connect().await.expect("the Postgres store connects")
    }
}

#[cfg(feature = "postgres")]
impl Drop for PostgresSchema {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        drop_postgres_schema(self.url.clone(), self.name.clone());
    }
}

/// Drops `schema` on `url` and everything in it, on a runtime of its own (the test's may be
/// shutting down, or be a current-thread one that this would block).
#[cfg(feature = "postgres")]
pub fn drop_postgres_schema(url: String, schema: String) {
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(store) = idem::PostgresStore::builder(url)
                .schema(schema.clone())
                .max_connections(1)
                .connect()
                .await
            else {
                return;
            };
            if let Ok(client) = store.pool().get().await {
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
            }
        });
    })
    .join();
}

/// A Redis key prefix of the test's own on `url`, whose keys are deleted when this is
/// dropped.
#[cfg(feature = "redis")]
pub struct RedisPrefix {
    /// The server's URL.
    pub url: String,
    /// The prefix (ends with `:`).
    pub prefix: String,
    owned: bool,
}

#[cfg(feature = "redis")]
impl RedisPrefix {
    /// A fresh prefix on `IDEM_REDIS_URL`, or `None` (with the reason printed) when the
    /// variable is unset; `check` names the test in that message.
    pub fn new(tag: &str, check: &str) -> Option<RedisPrefix> {
        let url = idem::store::conformance::backend_url("IDEM_REDIS_URL", check)?;
        Some(RedisPrefix::on(url, tag))
    }

    /// A fresh prefix on `url`.
    pub fn on(url: String, tag: &str) -> RedisPrefix {
        RedisPrefix {
            url,
            prefix: unique_prefix(tag),
            owned: true,
        }
    }

    /// The prefix another process named (and cleans up): kept when this is dropped.
    pub fn borrowed(url: String, prefix: String) -> RedisPrefix {
        RedisPrefix {
            url,
            prefix,
            owned: false,
        }
    }

    /// A new store under the prefix.
    pub async fn open(&self, retention: Retention) -> idem::RedisStore {
        self.builder()
            .retention(retention)
            .connect()
            .await
            .expect("the Redis store connects")
    }

    /// A new store under the prefix on `clock`.
    pub async fn open_on(
        &self,
        clock: Arc<dyn idem::store::Clock>,
        retention: Retention,
    ) -> idem::RedisStore {
        self.builder()
            .clock(clock)
            .retention(retention)
            .connect()
            .await
            .expect("the Redis store connects")
    }

    /// A builder for a store under the prefix, for a test that sets more than the clock and
    /// the retention.
    pub fn builder(&self) -> idem::redis::RedisStoreBuilder {
        idem::RedisStore::builder(self.url.clone()).prefix(self.prefix.clone())
    }
}

#[cfg(feature = "redis")]
impl Drop for RedisPrefix {
    fn drop(&mut self) {
        if self.owned {
            delete_prefix(&self.url, &self.prefix);
        }
    }
}

/// Deletes every key under `prefix` on `url` (in the database the URL names, if any) with
/// one server-side script: plain RESP commands over a socket, so the tests need no Redis
/// client crate of their own.
#[cfg(feature = "redis")]
pub fn delete_prefix(url: &str, prefix: &str) {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("redis://");
    let (addr, db) = match rest.split_once('/') {
        Some((addr, db)) => (addr, db.trim()),
        None => (rest, ""),
    };
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return;
    };
    let script =
        "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0";
    let pattern = format!("{prefix}*");
    let mut commands: Vec<Vec<&str>> = Vec::new();
    if !db.is_empty() {
        commands.push(vec!["SELECT", db]);
    }
    commands.push(vec!["EVAL", script, "0", pattern.as_str()]);
    let mut cmd = String::new();
    for args in &commands {
        cmd.push_str(&format!("*{}\r\n", args.len()));
        for a in args {
            cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
    }
    let _ = s.write_all(cmd.as_bytes());
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    // One reply line per command; wait for all of them, so the keys are gone on return.
    let mut replies = Vec::new();
    let mut buf = [0u8; 64];
    while replies.iter().filter(|&&b| b == b'\n').count() < commands.len() {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => replies.extend_from_slice(&buf[..n]),
        }
    }
}

/// One durable location (SQLite file, Redis prefix, Postgres schema) several workers open.
pub struct Durable {
    /// The backend's name: `sqlite`, `redis` or `postgres`.
    pub name: &'static str,
    at: Location,
}

enum Location {
    #[cfg(feature = "sqlite")]
    Sqlite(TempDir),
    #[cfg(feature = "redis")]
    Redis(RedisPrefix),
    #[cfg(feature = "postgres")]
    Postgres(PostgresSchema),
}

/// The environment variables that hand a [`Durable`] to a child process.
const BACKEND: &str = "IDEM_TEST_BACKEND";
const AT: &str = "IDEM_TEST_STORE_AT";
const UNDER: &str = "IDEM_TEST_STORE_UNDER";

/// Every durable backend this build has and this run can reach, each at a fresh location
/// named after `test`.
pub fn durables(test: &str) -> Vec<Durable> {
    let _ = test;
    #[allow(unused_mut)] // with no durable backend, nothing is pushed
    let mut out = Vec::new();
    #[cfg(feature = "sqlite")]
    out.push(Durable {
        name: "sqlite",
        at: Location::Sqlite(TempDir::new(test)),
    });
    #[cfg(feature = "redis")]
    if let Some(p) = RedisPrefix::new(test, test) {
        out.push(Durable {
            name: "redis",
            at: Location::Redis(p),
        });
    }
    #[cfg(feature = "postgres")]
    if let Some(s) = PostgresSchema::new(test, test) {
        out.push(Durable {
            name: "postgres",
            at: Location::Postgres(s),
        });
    }
    out
}

impl Durable {
    /// A new handle on the location: what another worker (or a restarted one) opens.
    pub async fn open(&self) -> Arc<dyn IdemStore> {
        self.open_with(Retention::default()).await
    }

    /// Like [`Durable::open`], with a retention of the test's choosing.
    pub async fn open_with(&self, retention: Retention) -> Arc<dyn IdemStore> {
        self.open_on(None, retention).await
    }

    /// Like [`Durable::open_with`], on `clock` (the store's leases and retention then follow
    /// a test's manual clock) or on the system clock for `None`.
    // With no durable backend in the build there is no location: every match diverges.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(unreachable_code)
    )]
    pub async fn open_on(
        &self,
        clock: Option<idem::store::ManualClock>,
        retention: Retention,
    ) -> Arc<dyn IdemStore> {
        let _ = (&clock, &retention);
        match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => {
                let mut b = idem::SqliteStore::builder(dir.path().join("idem.sqlite3"))
                    .retention(retention);
                if let Some(clock) = clock {
                    b = b.clock(Arc::new(clock));
                }
                Arc::new(b.open().await.expect("the SQLite store opens"))
            }
            #[cfg(feature = "redis")]
            Location::Redis(p) => match clock {
                Some(clock) => Arc::new(p.open_on(Arc::new(clock), retention).await),
                None => Arc::new(p.open(retention).await),
            },
            #[cfg(feature = "postgres")]
            Location::Postgres(s) => Arc::new(s.open(6, clock, retention).await),
            #[allow(unreachable_patterns)] // no variant without a durable backend
            _ => unreachable!("no durable backend in this build"),
        }
    }

    /// The Postgres store itself (for its transactions), when this is Postgres.
    #[cfg(feature = "postgres")]
    pub async fn postgres(&self) -> Option<idem::PostgresStore> {
        match &self.at {
            Location::Postgres(s) => Some(s.open(6, None, Retention::default()).await),
            #[allow(unreachable_patterns)] // only Postgres in a Postgres-only build
            _ => None,
        }
    }

    /// The store URL the `idem` CLI takes for this location, and its extra options.
    // With no durable backend in the build there is no location: every match diverges.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(unreachable_code)
    )]
    pub fn cli_target(&self) -> (String, Vec<String>) {
        match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => (
                format!("sqlite://{}", dir.path().join("idem.sqlite3").display()),
                vec![],
            ),
            #[cfg(feature = "redis")]
            Location::Redis(p) => (p.url.clone(), vec!["--prefix".into(), p.prefix.clone()]),
            #[cfg(feature = "postgres")]
            Location::Postgres(s) => (s.url.clone(), vec!["--schema".into(), s.name.clone()]),
            #[allow(unreachable_patterns)] // no variant without a durable backend
            _ => unreachable!("no durable backend in this build"),
        }
    }

    /// The environment a child process needs to open this location ([`Durable::from_env`]).
    // With no durable backend in the build there is no location: every match diverges.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(unreachable_code)
    )]
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let (at, under) = match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => (dir.path().display().to_string(), String::new()),
            #[cfg(feature = "redis")]
            Location::Redis(p) => (p.url.clone(), p.prefix.clone()),
            #[cfg(feature = "postgres")]
            Location::Postgres(s) => (s.url.clone(), s.name.clone()),
            #[allow(unreachable_patterns)] // no variant without a durable backend
            _ => unreachable!("no durable backend in this build"),
        };
        vec![(BACKEND, self.name.to_owned()), (AT, at), (UNDER, under)]
    }

    /// The location a parent process named in [`Durable::env`]; not removed on drop (the
    /// parent removes it).
    // With no durable backend in the build there is no location: every match diverges.
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "redis", feature = "postgres")),
        allow(unreachable_code)
    )]
    pub fn from_env() -> Option<Durable> {
        let name = std::env::var(BACKEND).ok()?;
        let at = std::env::var(AT).ok()?;
        let under = std::env::var(UNDER).ok()?;
        let _ = (&at, &under);
        let (name, at) = match name.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => ("sqlite", Location::Sqlite(TempDir::borrowed(at.into()))),
            #[cfg(feature = "redis")]
            "redis" => ("redis", Location::Redis(RedisPrefix::borrowed(at, under))),
            #[cfg(feature = "postgres")]
            "postgres" => (
                "postgres",
                Location::Postgres(PostgresSchema::borrowed(at, under)),
            ),
            _ => return None,
        };
        Some(Durable { name, at })
    }
}
