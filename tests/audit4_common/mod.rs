//! Durable stores for the audit4 tests: a SQLite file, a Redis prefix and a Postgres schema
//! of the test's own, each opened as often as a test needs a new "worker" (a new handle on
//! the same location), and removed afterwards.
//!
//! Redis and Postgres need `IDEM_REDIS_URL` / `IDEM_POSTGRES_URL`; without them a test says
//! why it skips them, and under `IDEM_REQUIRE_BACKENDS=1` it fails instead.

// Compiled under every feature set: with no durable backend, most of it has nothing to do.
#![allow(dead_code, unreachable_code, unused_mut, unused_variables)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::store::Retention;
use idem::IdemStore;

/// One durable location several workers open.
pub struct Durable {
    pub name: &'static str,
    at: Location,
    /// Removed on drop (false in a child process that opens its parent's location).
    owned: bool,
}

enum Location {
    #[cfg(feature = "sqlite")]
    Sqlite(tempfile_dir::Dir),
    #[cfg(feature = "redis")]
    Redis { url: String, prefix: String },
    #[cfg(feature = "postgres")]
    Postgres { url: String, schema: String },
    #[allow(dead_code)]
    None,
}

fn unique(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{test}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Every durable backend this run can reach, each at a fresh location.
pub fn durables(test: &str) -> Vec<Durable> {
    let _ = unique(test);
    let mut out = Vec::new();
    #[cfg(feature = "sqlite")]
    out.push(Durable {
        name: "sqlite",
        at: Location::Sqlite(tempfile_dir::Dir::new(&unique(test))),
        owned: true,
    });
    #[cfg(feature = "redis")]
    if let Some(url) = idem::store::conformance::backend_url("IDEM_REDIS_URL", test) {
        out.push(Durable {
            name: "redis",
            at: Location::Redis {
                url,
                prefix: format!("idem-audit4-{}:", unique(test)),
            },
            owned: true,
        });
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = idem::store::conformance::backend_url("IDEM_POSTGRES_URL", test) {
        out.push(Durable {
            name: "postgres",
            at: Location::Postgres {
                url,
                schema: format!("idem_audit4_{}", unique(test)).to_lowercase(),
            },
            owned: true,
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
        let _ = retention;
        match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => Arc::new(
                idem::SqliteStore::builder(dir.path().join("idem.sqlite3"))
                    .retention(retention)
                    .open()
                    .await
                    .expect("the SQLite store opens"),
            ),
            #[cfg(feature = "redis")]
            Location::Redis { url, prefix } => Arc::new(
                idem::RedisStore::builder(url.clone())
                    .prefix(prefix.clone())
                    .retention(retention)
                    .connect()
                    .await
                    .expect("the Redis store connects"),
            ),
            #[cfg(feature = "postgres")]
            Location::Postgres { url, schema } => {
                Arc::new(self.postgres_with(url, schema, retention).await)
            }
            Location::None => unreachable!("no backend"),
        }
    }

    #[cfg(feature = "postgres")]
    async fn postgres_with(
        &self,
        url: &str,
        schema: &str,
        retention: Retention,
    ) -> idem::PostgresStore {
        idem::PostgresStore::builder(url.to_owned())
            .schema(schema.to_owned())
            .retention(retention)
            .max_connections(6)
            .connect()
            .await
            .expect("the Postgres store connects")
    }

    /// The Postgres store itself (for its transactions), when this is Postgres.
    #[cfg(feature = "postgres")]
    pub async fn postgres(&self) -> Option<idem::PostgresStore> {
        match &self.at {
            Location::Postgres { url, schema } => {
                Some(self.postgres_with(url, schema, Retention::default()).await)
            }
            _ => None,
        }
    }

    /// The store URL the `idem` CLI takes for this location, and its extra options.
    pub fn cli_target(&self) -> (String, Vec<String>) {
        match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => (
                format!("sqlite://{}", dir.path().join("idem.sqlite3").display()),
                vec![],
            ),
            #[cfg(feature = "redis")]
            Location::Redis { url, prefix } => {
                (url.clone(), vec!["--prefix".into(), prefix.clone()])
            }
            #[cfg(feature = "postgres")]
            Location::Postgres { url, schema } => {
                (url.clone(), vec!["--schema".into(), schema.clone()])
            }
            Location::None => unreachable!("no backend"),
        }
    }
}

impl Durable {
    /// The environment a child process needs to open this location ([`Durable::from_env`]).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let (a, b) = match &self.at {
            #[cfg(feature = "sqlite")]
            Location::Sqlite(dir) => (dir.path().display().to_string(), String::new()),
            #[cfg(feature = "redis")]
            Location::Redis { url, prefix } => (url.clone(), prefix.clone()),
            #[cfg(feature = "postgres")]
            Location::Postgres { url, schema } => (url.clone(), schema.clone()),
            Location::None => unreachable!("no backend"),
        };
        vec![
            ("IDEM_AUDIT4_BACKEND", self.name.to_owned()),
            ("IDEM_AUDIT4_AT", a),
            ("IDEM_AUDIT4_UNDER", b),
        ]
    }

    /// The location a parent process named in [`Durable::env`]; not removed on drop.
    pub fn from_env() -> Option<Durable> {
        let name = std::env::var("IDEM_AUDIT4_BACKEND").ok()?;
        let a = std::env::var("IDEM_AUDIT4_AT").ok()?;
        let b = std::env::var("IDEM_AUDIT4_UNDER").ok()?;
        let _ = (&a, &b);
        let (name, at) = match name.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => (
                "sqlite",
                Location::Sqlite(tempfile_dir::Dir::borrowed(a.into())),
            ),
            #[cfg(feature = "redis")]
            "redis" => ("redis", Location::Redis { url: a, prefix: b }),
            #[cfg(feature = "postgres")]
            "postgres" => ("postgres", Location::Postgres { url: a, schema: b }),
            _ => return None,
        };
        Some(Durable {
            name,
            at,
            owned: false,
        })
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        if !self.owned {
            // A borrowed SQLite directory is not removed either (`Dir::borrowed`).
            return;
        }
        match &self.at {
            #[cfg(feature = "redis")]
            Location::Redis { url, prefix } => delete_prefix(url, prefix),
            #[cfg(feature = "postgres")]
            Location::Postgres { url, schema } => {
                let (url, schema) = (url.clone(), schema.clone());
                // A runtime of its own: the test's may be shutting down.
                let _ = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
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
                                .batch_execute(&format!(
                                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                                ))
                                .await;
                        }
                    });
                })
                .join();
            }
            _ => {}
        }
    }
}

#[cfg(feature = "sqlite")]
mod tempfile_dir {
    /// A directory of the test's own under the system temp dir, removed on drop.
    pub struct Dir(std::path::PathBuf, bool);
    impl Dir {
        pub fn borrowed(path: std::path::PathBuf) -> Dir {
            Dir(path, false)
        }
        pub fn new(name: &str) -> Dir {
            let path = std::env::temp_dir().join(format!("idem-audit4-{name}"));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path, true)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            if self.1 {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}

/// Deletes every key under `prefix` with one server-side script (no Redis client crate in
/// the facade's dev-dependencies: one RESP command over a socket).
#[cfg(feature = "redis")]
fn delete_prefix(url: &str, prefix: &str) {
    use std::io::{Read, Write};
    let addr = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return;
    };
    let script =
        "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0";
    let pattern = format!("{prefix}*");
    let args = ["EVAL", script, "0", pattern.as_str()];
    let mut cmd = format!("*{}\r\n", args.len());
    for a in args {
        cmd.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let _ = s.write_all(cmd.as_bytes());
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf);
}
