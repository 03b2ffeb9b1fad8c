//! idem's stores under concurrency, each next to its server's raw operations, in one run.
//!
//! ```text
//! benches/peers/backends.sh            # starts the servers, builds, runs every section
//! backends [SECTION…]                  # redis | cluster | sqlite | postgres | memory (default: all)
//! ```
//!
//! Environment: `IDEM_REDIS_URL` (a Redis with persistence off; `backends.sh` starts one),
//! `IDEM_REDIS_CLUSTER_URLS` (the masters of a Redis Cluster, comma-separated),
//! `IDEM_POSTGRES_URL`, `BENCH_SECS` (seconds per cell, default 3), `BENCH_PAIRS` (A/B pairs
//! for the MemoryStore scaling, default 5). A section whose server is not configured says so
//! and is skipped.
//!
//! Every cell runs `c` tasks (1, 8, 64) on a 2-worker tokio runtime for `BENCH_SECS`, all
//! sharing one store (and so its connection or pool), each task looping on fresh keys (or
//! replays of its own primed key), and reports operations per second. The raw baseline of a
//! section runs on the same server, through the same kind of connection, the same way.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{IdemStore, MemoryStore, Registry, ToolCall};
use idem_peers_bench::{spread, Charge, TEXT};

const CONCURRENCY: [usize; 3] = [1, 8, 64];

fn secs() -> f64 {
    std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn registry(store: impl IdemStore) -> Registry {
    Registry::builder()
        .store(store)
        .tool(Charge)
        .build()
        .expect("valid registry")
}

/// Runs `conc` tasks, each calling `op(task, seq)` (`seq` counting from `seq0`) until
/// `secs` have passed; the operations done and the seconds taken.
async fn run_for<F, Fut>(conc: usize, secs: f64, seq0: u64, op: &Arc<F>) -> (u64, f64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // Each task watches the clock itself: a store that never returns `Pending` (MemoryStore)
    // never lets a worker park, so a tokio timer could not be relied on to stop it.
    let deadline = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..conc)
        .map(|t| {
            let (op, done) = (op.clone(), done.clone());
            tokio::spawn(async move {
                let mut seq = seq0;
                while Instant::now() < deadline {
                    op(t, seq).await;
                    seq += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    (done.load(Ordering::Relaxed), start.elapsed().as_secs_f64())
}

/// [`run_for`] once; operations/s.
async fn throughput<F, Fut>(conc: usize, secs: f64, op: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (n, t) = run_for(conc, secs, 0, &Arc::new(op)).await;
    n as f64 / t
}

/// Slices per A/B cell: `a` and `b` run alternately (who goes first alternates too), each
/// for `secs` in all, so a drift in the machine's load (or its disk's) hits both alike.
const SLICES: u64 = 6;

/// `a` and `b` interleaved (see [`SLICES`]); each side's operations/s over its own time.
async fn ab<FA, FutA, FB, FutB>(conc: usize, secs: f64, a: FA, b: FB) -> (f64, f64)
where
    FA: Fn(usize, u64) -> FutA + Send + Sync + 'static,
    FutA: Future<Output = ()> + Send,
    FB: Fn(usize, u64) -> FutB + Send + Sync + 'static,
    FutB: Future<Output = ()> + Send,
{
    let (a, b) = (Arc::new(a), Arc::new(b));
    let slice = secs / SLICES as f64;
    let (mut na, mut ta, mut nb, mut tb) = (0, 0.0, 0, 0.0);
    for i in 0..SLICES {
        // Fresh keys never repeat across slices.
        let seq0 = i << 32;
        if i % 2 == 0 {
            let (n, t) = run_for(conc, slice, seq0, &a).await;
            (na, ta) = (na + n, ta + t);
            let (n, t) = run_for(conc, slice, seq0, &b).await;
            (nb, tb) = (nb + n, tb + t);
        } else {
            let (n, t) = run_for(conc, slice, seq0, &b).await;
            (nb, tb) = (nb + n, tb + t);
            let (n, t) = run_for(conc, slice, seq0, &a).await;
            (na, ta) = (na + n, ta + t);
        }
    }
    (na as f64 / ta, nb as f64 / tb)
}

/// A fresh write through the registry: a new run id per call, the model's text arguments.
async fn fresh(reg: &Registry, prefix: &str, t: usize, seq: u64) {
    let call = ToolCall::from_json(format!("{prefix}-{t}-{seq}"), "charge", TEXT.to_owned());
    let r = reg.call(call).await;
    assert!(r.is_completed() && !r.replayed(), "{r:?}");
}

/// A replay of task `t`'s primed call.
async fn replay(reg: &Registry, prefix: &str, t: usize) {
    let call = ToolCall::from_json(format!("{prefix}-replay-{t}"), "charge", TEXT.to_owned());
    let r = reg.call(call).await;
    assert!(r.is_completed() && r.replayed(), "{r:?}");
}

async fn prime(reg: &Registry, prefix: &str, tasks: usize) {
    for t in 0..tasks {
        let call = ToolCall::from_json(format!("{prefix}-replay-{t}"), "charge", TEXT.to_owned());
        assert!(reg.call(call).await.is_completed());
    }
}

fn pct(x: f64, of: f64) -> String {
    format!("{:.0}%", 100.0 * x / of)
}

fn row(name: &str, cells: &[String]) {
    println!("| {name} | {} |", cells.join(" | "));
}

fn header(title: &str) {
    println!();
    println!("| {title} | c=1 | c=8 | c=64 |");
    println!("|---|---|---|---|");
}

fn rate(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.1}k/s", x / 1000.0)
    } else {
        format!("{x:.0}/s")
    }
}

// ---------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------

/// (calls, µs) of the commands `cmds` together on one server since its last `CONFIG
/// RESETSTAT` (`INFO commandstats`). idem's store calls its code with `FCALL` (Redis ≥ 7) or
/// `EVALSHA`; counting both measures either build.
async fn calls_and_usec(conn: &mut impl redis::aio::ConnectionLike, cmds: &[&str]) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut total = (0, 0);
    for cmd in cmds {
        let Some(line) = info
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
        else {
            continue;
        };
        let field = |name: &str| -> u64 {
            line.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        total.0 += field("calls=");
        total.1 += field("usec=");
    }
    total
}

/// The commands idem's store calls its code with.
const IDEM_CMDS: &[&str] = &["fcall", "evalsha"];

/// What a store built with `read_before_claim` sends: its functions and the reads.
const READ_FIRST_CMDS: &[&str] = &["fcall", "evalsha", "hgetall"];

/// idem over a Redis Cluster in 1, 3 and 12 partitions: the same fresh-write and replay
/// loads, and what each master's `INFO commandstats` counted (the store's work per shard).
fn bench_cluster(urls: &str) {
    let nodes: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let rt = runtime(2);
    let secs = secs();
    let pid = std::process::id();
    const CONC: usize = 64;
    println!(
        "\nRedis Cluster of {} masters, {secs} s per cell, c = {CONC}, 2 tokio workers",
        nodes.len()
    );
    println!();
    println!(
        "| partitions | load | idem calls/s (wall clock) | `FCALL` per master (share) | \
         server µs per `FCALL`, per master | busiest master's server µs per idem call | \
         idem calls/s that master could serve |"
    );
    println!("|---|---|---|---|---|---|---|");
    rt.block_on(async {
        let mut admins = Vec::new();
        for n in &nodes {
            let client = redis::Client::open(n.as_str()).expect("a node URL");
            admins.push(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect to a node"),
            );
        }
        for partitions in [1u16, 3, 12] {
            // One partition on a cluster needs the whole store in one hash tag.
            let prefix = if partitions == 1 {
                format!("{{idem-peers-{pid}}}:")
            } else {
                format!("idem-peers:{pid}:{partitions}:")
            };
            let store = idem::RedisStore::cluster(nodes.clone())
                .prefix(prefix)
                .partitions(partitions)
                .connect()
                .await
                .expect("connect to the cluster");
            let reg = registry(store);
            prime(&reg, "r", CONC).await;
            for load in ["fresh", "replay"] {
                for a in admins.iter_mut() {
                    let _: () = redis::cmd("CONFIG")
                        .arg("RESETSTAT")
                        .query_async(a)
                        .await
                        .expect("CONFIG RESETSTAT");
                }
                let r = reg.clone();
                let (n, t) = run_for(
                    CONC,
                    secs,
                    0,
                    &Arc::new(move |task, seq| {
                        let r = r.clone();
                        async move {
                            if load == "fresh" {
                                fresh(&r, "f", task, seq).await
                            } else {
                                replay(&r, "r", task).await
                            }
                        }
                    }),
                )
                .await;
                let mut per = Vec::new();
                for a in admins.iter_mut() {
                    per.push(calls_and_usec(a, IDEM_CMDS).await);
                }
                let total: u64 = per.iter().map(|p| p.0).sum();
                let busiest = per.iter().map(|p| p.1).max().unwrap_or(0);
                let per_call = busiest as f64 / n as f64;
                println!(
                    "| {partitions} | {load} | {} | {} | {} | {per_call:.1} µs | {} |",
                    rate(n as f64 / t),
                    per.iter()
                        .map(|p| format!("{} ({})", p.0, pct(p.0 as f64, total as f64)))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    per.iter()
                        .map(|p| format!("{:.1}", p.1 as f64 / p.0.max(1) as f64))
                        .collect::<Vec<_>>()
                        .join(" / "),
                    rate(1e6 / per_call),
                );
            }
        }
    });
}

/// `redis-benchmark -t set -c conc`, sized to last about `secs`; requests/s.
fn redis_benchmark(host: &str, port: u16, conc: usize, secs: f64) -> f64 {
    let run = |n: u64| -> f64 {
        let out = std::process::Command::new("redis-benchmark")
            .args(["-h", host, "-p", &port.to_string(), "-t", "set", "--csv"])
            .args(["-c", &conc.to_string(), "-n", &n.to_string()])
            .output()
            .expect("redis-benchmark runs (apt-get install redis-tools)");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.starts_with("\"SET\""))
            .and_then(|l| l.split(',').nth(1))
            .and_then(|f| f.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("no SET line in redis-benchmark's output: {text}"))
    };
    let probe = run(5_000);
    run(((probe * secs) as u64).max(10_000))
}

/// Server-side µs per call of the commands `cmds` together since the last `CONFIG
/// RESETSTAT` (`INFO commandstats`).
async fn usec_per_call(conn: &mut redis::aio::ConnectionManager, cmds: &[&str]) -> Option<f64> {
    let (calls, usec) = calls_and_usec(conn, cmds).await;
    (calls > 0).then(|| usec as f64 / calls as f64)
}

async fn reset_stats(conn: &mut redis::aio::ConnectionManager) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

fn bench_redis(url: &str) {
    let rt = runtime(2);
    let client = redis::Client::open(url).expect("a Redis URL");
    let info = client.get_connection_info().addr.to_string();
    let (host, port) = info.rsplit_once(':').expect("host:port");
    let (host, port): (String, u16) = (host.to_owned(), port.parse().expect("a port"));
    let secs = secs();
    let pid = std::process::id();
    let mut set = vec![];
    let mut set_rust = vec![];
    let mut script = vec![];
    let mut fresh_w = vec![];
    let mut replays = vec![];
    let mut server_us = vec![];
    let mut fresh_rf = vec![];
    let mut replays_rf = vec![];
    let mut server_rf = vec![];
    for conc in CONCURRENCY {
        set.push(redis_benchmark(&host, port, conc, secs));
        rt.block_on(async {
            let mut admin = redis::aio::ConnectionManager::new(client.clone())
                .await
                .expect("connect");
            // The trivial create-if-absent script, over one shared multiplexed connection.
            let conn = redis::aio::ConnectionManager::new(client.clone())
                .await
                .expect("connect");
            let create = Arc::new(redis::Script::new(
                "return redis.call('SET', KEYS[1], ARGV[1], 'NX')",
            ));
            // `SET` through the same client and connection: what the Rust side adds.
            let c = conn.clone();
            set_rust.push(
                throughput(conc, secs, move |t, seq| {
                    let mut c = c.clone();
                    async move {
                        let _: () = redis::cmd("SET")
                            .arg(format!("set:{pid}:{conc}:{t}:{seq}"))
                            .arg("{\"state\":\"running\"}")
                            .query_async(&mut c)
                            .await
                            .expect("SET");
                    }
                })
                .await,
            );
            reset_stats(&mut admin).await;
            script.push(
                throughput(conc, secs, move |t, seq| {
                    let (mut conn, create) = (conn.clone(), create.clone());
                    async move {
                        let r: Option<String> = create
                            .key(format!("raw:{pid}:{conc}:{t}:{seq}"))
                            .arg("{\"state\":\"running\"}")
                            .invoke_async(&mut conn)
                            .await
                            .expect("EVALSHA");
                        assert!(r.is_some(), "a fresh key is created");
                    }
                })
                .await,
            );
            let script_us = usec_per_call(&mut admin, &["evalsha"]).await;

            let store = idem::RedisStore::builder(url)
                .prefix(format!("idem-peers:{pid}:{conc}:"))
                .connect()
                .await
                .expect("connect to Redis");
            let reg = registry(store);
            reset_stats(&mut admin).await;
            let r = reg.clone();
            fresh_w.push(
                throughput(conc, secs, move |t, seq| {
                    let r = r.clone();
                    async move { fresh(&r, "f", t, seq).await }
                })
                .await,
            );
            let fresh_us = usec_per_call(&mut admin, IDEM_CMDS).await;
            prime(&reg, "r", conc).await;
            reset_stats(&mut admin).await;
            let r = reg.clone();
            replays.push(
                throughput(conc, secs, move |t, _| {
                    let r = r.clone();
                    async move { replay(&r, "r", t).await }
                })
                .await,
            );
            let replay_us = usec_per_call(&mut admin, IDEM_CMDS).await;
            server_us.push((script_us, fresh_us, replay_us));

            // The same loads on a store that reads a record before claiming it
            // (`read_before_claim`): server µs per idem call, every command it sent counted.
            let store = idem::RedisStore::builder(url)
                .prefix(format!("idem-peers:{pid}:{conc}:rf:"))
                .read_before_claim(true)
                .connect()
                .await
                .expect("connect to Redis");
            let reg = registry(store);
            let per_call = |usec: u64, rate: f64| usec as f64 / (rate * secs).max(1.0);
            reset_stats(&mut admin).await;
            let r = reg.clone();
            let rate = throughput(conc, secs, move |t, seq| {
                let r = r.clone();
                async move { fresh(&r, "f", t, seq).await }
            })
            .await;
            fresh_rf.push(rate);
            let (_, usec) = calls_and_usec(&mut admin, READ_FIRST_CMDS).await;
            let fresh_us = per_call(usec, rate);
            prime(&reg, "r", conc).await;
            reset_stats(&mut admin).await;
            let r = reg.clone();
            let rate = throughput(conc, secs, move |t, _| {
                let r = r.clone();
                async move { replay(&r, "r", t).await }
            })
            .await;
            replays_rf.push(rate);
            let (_, usec) = calls_and_usec(&mut admin, READ_FIRST_CMDS).await;
            server_rf.push((fresh_us, per_call(usec, rate)));
        });
    }
    println!("\nRedis at {host}:{port}, {secs} s per cell, 2 tokio workers; ops/s (share of SET)");
    header("Redis");
    row(
        "`redis-benchmark -t set`",
        &set.iter().map(|&x| rate(x)).collect::<Vec<_>>(),
    );
    let vs = |xs: &[f64]| -> Vec<String> {
        xs.iter()
            .zip(&set)
            .map(|(&x, &s)| format!("{} ({})", rate(x), pct(x, s)))
            .collect()
    };
    row("`SET`, the same Rust client and connection", &vs(&set_rust));
    row("`EVALSHA` create-if-absent (`SET NX`)", &vs(&script));
    row("idem fresh write", &vs(&fresh_w));
    row("idem replay", &vs(&replays));
    row("idem fresh write, `read_before_claim`", &vs(&fresh_rf));
    row("idem replay, `read_before_claim`", &vs(&replays_rf));
    let us = |o: Option<f64>| o.map_or("?".to_owned(), |v| format!("{v:.1} µs"));
    row(
        "server µs per call: one-line script (`EVALSHA`) / idem fresh / idem replay (`FCALL`)",
        &server_us
            .iter()
            .map(|(a, b, c)| format!("{} / {} / {}", us(*a), us(*b), us(*c)))
            .collect::<Vec<_>>(),
    );
    row(
        "server µs per idem call, `read_before_claim`: fresh / replay (`FCALL` and `HGETALL`)",
        &server_rf
            .iter()
            .map(|(f, r)| format!("{f:.1} µs / {r:.1} µs"))
            .collect::<Vec<_>>(),
    );
}

// ---------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------

/// The raw baseline: one connection (WAL, the same `synchronous`), handed out one task at a
/// time like idem's writer, on the blocking pool; an `INSERT` committed, then an `UPDATE`
/// committed: two durable commits, as a claim and its settle are.
struct RawSqlite {
    gate: Arc<tokio::sync::Semaphore>,
    conn: Arc<Mutex<rusqlite::Connection>>,
}

impl RawSqlite {
    fn open(path: &std::path::Path, sync: &str) -> RawSqlite {
        let conn = rusqlite::Connection::open(path).expect("open");
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .expect("WAL");
        assert_eq!(mode, "wal");
        conn.pragma_update(None, "synchronous", sync).expect("sync");
        conn.execute_batch(
            "CREATE TABLE raw (key TEXT PRIMARY KEY, state TEXT NOT NULL, payload TEXT)",
        )
        .expect("table");
        RawSqlite {
            gate: Arc::new(tokio::sync::Semaphore::new(1)),
            conn: Arc::new(Mutex::new(conn)),
        }
    }

    async fn on_conn(&self, f: impl FnOnce(&rusqlite::Connection) + Send + 'static) {
        let permit = self.gate.clone().acquire_owned().await.expect("open");
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f(&conn.lock().expect("not poisoned"));
        })
        .await
        .expect("blocking task");
    }

    async fn write(&self, key: String) {
        let k = key.clone();
        self.on_conn(move |c| {
            let n = c
                .prepare_cached("INSERT INTO raw (key, state) VALUES (?1, 'running')")
                .and_then(|mut s| s.execute([&k]))
                .expect("insert");
            assert_eq!(n, 1);
        })
        .await;
        self.on_conn(move |c| {
            let n = c
                .prepare_cached("UPDATE raw SET state = 'completed', payload = ?2 WHERE key = ?1")
                .and_then(|mut s| s.execute([&key, "4900"]))
                .expect("update");
            assert_eq!(n, 1);
        })
        .await;
    }
}

fn bench_sqlite() {
    let rt = runtime(2);
    let secs = secs();
    let dir = tempfile::tempdir().expect("a temp dir");
    println!("\nSQLite on {} (WAL), {secs} s per side per cell, raw and idem interleaved in {SLICES} slices; writes/s (share of raw)", dir.path().display());
    header("SQLite");
    for (name, pragma, sync) in [
        ("FULL", "FULL", idem::SqliteSync::Full),
        ("NORMAL", "NORMAL", idem::SqliteSync::Normal),
    ] {
        let mut raw_w = vec![];
        let mut idem_w = vec![];
        for conc in CONCURRENCY {
            rt.block_on(async {
                let raw = Arc::new(RawSqlite::open(
                    &dir.path().join(format!("raw-{name}-{conc}.db")),
                    pragma,
                ));
                let store =
                    idem::SqliteStore::builder(dir.path().join(format!("idem-{name}-{conc}.db")))
                        .sync(sync)
                        .open()
                        .await
                        .expect("open SQLite");
                let reg = registry(store);
                let (r, i) = ab(
                    conc,
                    secs,
                    move |t, seq| {
                        let raw = raw.clone();
                        async move { raw.write(format!("{t}-{seq}")).await }
                    },
                    move |t, seq| {
                        let r = reg.clone();
                        async move { fresh(&r, "f", t, seq).await }
                    },
                )
                .await;
                raw_w.push(r);
                idem_w.push(i);
            });
        }
        row(
            &format!("raw `INSERT` + `UPDATE`, {name}"),
            &raw_w.iter().map(|&x| rate(x)).collect::<Vec<_>>(),
        );
        row(
            &format!("idem fresh write, {name}"),
            &idem_w
                .iter()
                .zip(&raw_w)
                .map(|(&x, &r)| format!("{} ({})", rate(x), pct(x, r)))
                .collect::<Vec<_>>(),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------

fn bench_postgres(url: &str) {
    let rt = runtime(2);
    let secs = secs();
    let schema = format!("idem_peers_{}", std::process::id());
    let store = rt
        .block_on(
            idem::PostgresStore::builder(url)
                .schema(schema.clone())
                .connect(),
        )
        .expect("connect to Postgres");
    let pool = store.pool().clone();
    rt.block_on(async {
        let c = pool.get().await.expect("a connection");
        c.batch_execute(&format!(
            "CREATE TABLE \"{schema}\".raw (key TEXT PRIMARY KEY, state TEXT NOT NULL, payload TEXT)"
        ))
        .await
        .expect("table");
    });
    let reg = registry(store);
    rt.block_on(async {
        // Only counts from here on (if `pg_stat_statements` is loaded; see `per_statement`).
        if let Ok(c) = pool.get().await {
            let _ = c.batch_execute("SELECT pg_stat_statements_reset()").await;
        }
    });
    let mut raw_w = vec![];
    let mut idem_w = vec![];
    for conc in CONCURRENCY {
        rt.block_on(async {
            let (p, s) = (pool.clone(), schema.clone());
            let r = reg.clone();
            let (raw, idem) = ab(
                conc,
                secs,
                move |t, seq| {
                    let (pool, schema) = (p.clone(), s.clone());
                    async move {
                        let key = format!("{conc}-{t}-{seq}");
                        // Two statements, each on a connection taken from the pool, as a
                        // claim and its settle are.
                        let c = pool.get().await.expect("a connection");
                        let st = c
                            .prepare_cached(&format!(
                                "INSERT INTO \"{schema}\".raw (key, state) VALUES ($1, 'running') \
                                 ON CONFLICT (key) DO NOTHING"
                            ))
                            .await
                            .expect("prepare");
                        assert_eq!(c.execute(&st, &[&key]).await.expect("insert"), 1);
                        drop(c);
                        let c = pool.get().await.expect("a connection");
                        let st = c
                            .prepare_cached(&format!(
                                "UPDATE \"{schema}\".raw SET state = 'completed', payload = $2 \
                                 WHERE key = $1"
                            ))
                            .await
                            .expect("prepare");
                        assert_eq!(c.execute(&st, &[&key, &"4900"]).await.expect("update"), 1);
                    }
                },
                move |t, seq| {
                    let r = r.clone();
                    async move { fresh(&r, &format!("f{conc}"), t, seq).await }
                },
            )
            .await;
            raw_w.push(raw);
            idem_w.push(idem);
        });
    }
    println!(
        "\nPostgres, pool of {} connections shared by both rows, {secs} s per side per cell, interleaved in {SLICES} slices; writes/s (share of raw)",
        pool.status().max_size
    );
    header("Postgres");
    row(
        "raw `INSERT … ON CONFLICT` + `UPDATE`",
        &raw_w.iter().map(|&x| rate(x)).collect::<Vec<_>>(),
    );
    row(
        "idem fresh write",
        &idem_w
            .iter()
            .zip(&raw_w)
            .map(|(&x, &r)| format!("{} ({})", rate(x), pct(x, r)))
            .collect::<Vec<_>>(),
    );
    rt.block_on(per_statement(&pool, &schema));
    rt.block_on(async {
        if let Ok(c) = pool.get().await {
            let _ = c
                .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
                .await;
        }
    });
}

/// The server's own view of every statement the section ran often (raw and idem alike):
/// mean execution time and WAL bytes per call, from `pg_stat_statements`, which
/// `BENCH_PG_STATS=1 backends.sh` preloads on its cluster.
async fn per_statement(pool: &deadpool_postgres::Pool, schema: &str) {
    let Ok(c) = pool.get().await else { return };
    let rows = c
        .query(
            "SELECT calls, mean_exec_time, wal_bytes::float8 / greatest(calls, 1), \
               left(regexp_replace(query, '\\s+', ' ', 'g'), 80) \
             FROM pg_stat_statements \
             WHERE (query LIKE '%' || $1 || '%' OR query IN ('BEGIN', 'COMMIT', 'ROLLBACK')) \
               AND calls >= 100 \
             ORDER BY total_exec_time DESC LIMIT 10",
            &[&schema],
        )
        .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            println!("\n(no per-statement figures: {e}; `BENCH_PG_STATS=1 backends.sh` loads pg_stat_statements)");
            return;
        }
    };
    println!("\nPer statement, server side (`pg_stat_statements`), every cell of the section:");
    println!();
    println!("| calls | mean µs | WAL bytes per call | statement |");
    println!("|---|---|---|---|");
    for r in rows {
        let (calls, mean_ms, wal, query): (i64, f64, f64, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let query = query.replace(&format!("\"{schema}\"."), "");
        println!(
            "| {calls} | {:.1} | {wal:.0} | `{query}…` |",
            mean_ms * 1000.0
        );
    }
}

// ---------------------------------------------------------------------------------------
// MemoryStore: 2-thread scaling
// ---------------------------------------------------------------------------------------

/// Distinct-key writes/s with `threads` workers and one task per worker, on a new store.
fn memory_rate(threads: usize, secs: f64) -> f64 {
    let rt = runtime(threads);
    rt.block_on(async {
        let reg = registry(MemoryStore::new());
        throughput(threads, secs, move |t, seq| {
            let r = reg.clone();
            async move { fresh(&r, "m", t, seq).await }
        })
        .await
    })
}

fn bench_memory() {
    let secs = secs();
    let pairs: usize = std::env::var("BENCH_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!(
        "\nMemoryStore, distinct-key fresh writes, {pairs} interleaved A/B pairs of {secs} s cells"
    );
    println!();
    println!("| pair | 1 thread | 2 threads | scaling |");
    println!("|---|---|---|---|");
    let mut ratios = vec![];
    for p in 0..pairs {
        // Alternate which side goes first, so a drift in the machine's load hits both.
        let (one, two) = if p % 2 == 0 {
            let a = memory_rate(1, secs);
            (a, memory_rate(2, secs))
        } else {
            let b = memory_rate(2, secs);
            (memory_rate(1, secs), b)
        };
        ratios.push(two / one);
        println!(
            "| {} | {} | {} | {:.2}× |",
            p + 1,
            rate(one),
            rate(two),
            two / one
        );
    }
    let (m, lo, hi) = spread(&ratios);
    println!("| median (p10–p90) | | | **{m:.2}×** ({lo:.2}–{hi:.2}) |");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |s: &str| args.is_empty() || args.iter().any(|a| a == s);
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if want("redis") {
        match env("IDEM_REDIS_URL") {
            Some(url) => bench_redis(&url),
            None => println!("\nskipping redis: IDEM_REDIS_URL not set"),
        }
    }
    if want("cluster") {
        match env("IDEM_REDIS_CLUSTER_URLS") {
            Some(urls) => bench_cluster(&urls),
            None => println!("\nskipping cluster: IDEM_REDIS_CLUSTER_URLS not set"),
        }
    }
    if want("sqlite") {
        bench_sqlite();
    }
    if want("postgres") {
        match env("IDEM_POSTGRES_URL") {
            Some(url) => bench_postgres(&url),
            None => println!("\nskipping postgres: IDEM_POSTGRES_URL not set"),
        }
    }
    if want("memory") {
        bench_memory();
    }
}
