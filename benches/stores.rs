//! The cost of one write's bookkeeping — a claim and its settle — per backend.
//!
//! ```text
//! IDEM_REDIS_URL=redis://127.0.0.1:6379/ IDEM_POSTGRES_URL=postgres://… \
//!     cargo bench -p idem-rs --features sqlite,redis,postgres --bench stores
//! ```
//!
//! MemoryStore (also full: a refused claim beside a repeat's) and SQLite (both sync modes, on
//! a temp file) always run; Redis and Postgres
//! run when their variable is set (otherwise the bench says it skipped them). Each iteration
//! claims a fresh key and settles it completed, exactly what the executor does around a
//! handler. Network backends are measured over
//! loopback, so the numbers are a floor: add your network's round-trip time per call
//! (Redis: 2 round trips; Postgres: 2 in the common case).
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use idem::identity::KeyMaterial;
use idem::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem::store::StoreError;
use idem::{identity::Fingerprint, store::RecordState, IdemKey, Scope};
use idem::{IdemStore, MemoryStore};
use serde_json::json;

fn request(n: u64, run: &str) -> ClaimRequest {
    ClaimRequest {
        key: IdemKey::derive(
            &Scope::run(run),
            "bench",
            KeyMaterial::Intent(&n.to_string()),
        ),
        fingerprint: Fingerprint::of_canonical(b"{}"),
        tool: "bench".into(),
        lease: Duration::from_secs(60),
        operation: None,
    }
}

async fn claim_and_settle(store: &dyn IdemStore, n: u64, run: &str) {
    let req = request(n, run);
    let ClaimOutcome::Claimed(token) = store.claim(&req).await.expect("claim") else {
        panic!("a fresh key must be claimed");
    };
    store
        .settle(
            &req.key,
            token,
            Settlement::new(RecordState::Completed).payload(json!({"id": "ch_1", "cents": 4900})),
        )
        .await
        .expect("settle");
}

fn bench_store(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    name: &str,
    store: Arc<dyn IdemStore>,
) {
    let counter = AtomicU64::new(0);
    let run = format!("bench-{}-{}", std::process::id(), name);
    c.bench_function(&format!("claim+settle/{name}"), |b| {
        b.to_async(rt).iter(|| {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let (store, run) = (store.clone(), run.clone());
            async move { claim_and_settle(&*store, black_box(n), &run).await }
        })
    });
}

/// What a full `MemoryStore` does with a claim of a new key (refuse it), beside a repeat's
/// claim of a key it holds: refusing costs about what answering does, not a walk over every
/// record.
fn bench_full_memory(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    let store = MemoryStore::new();
    let run = "bench-full";
    let held = store.max_records() as u64;
    rt.block_on(async {
        for n in 0..held {
            claim_and_settle(&store, n, run).await;
        }
    });
    let repeat = request(0, run);
    c.bench_function("full/memory_repeat", |b| {
        b.to_async(rt).iter(|| async {
            let outcome = store.claim(black_box(&repeat)).await.expect("claim");
            assert!(!matches!(outcome, ClaimOutcome::Claimed(_)), "a held key");
        })
    });
    let counter = AtomicU64::new(held);
    c.bench_function("full/memory_refused", |b| {
        b.to_async(rt).iter(|| {
            let req = request(counter.fetch_add(1, Ordering::Relaxed), run);
            let store = &store;
            async move {
                let refused = store.claim(black_box(&req)).await;
                assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
            }
        })
    });
}

fn stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    bench_store(c, &rt, "memory", Arc::new(MemoryStore::new()));
    bench_full_memory(c, &rt);

    // SQLite on a temp file, once per sync mode (FULL fsyncs every commit, NORMAL does not).
    #[cfg(feature = "sqlite")]
    for (name, sync) in [
        ("sqlite_full", idem::SqliteSync::Full),
        ("sqlite_normal", idem::SqliteSync::Normal),
    ] {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = idem::SqliteStore::builder(dir.path().join("idem.db"))
            .sync(sync)
            .open_blocking()
            .expect("open SQLite");
        bench_store(c, &rt, name, Arc::new(store));
    }

    #[cfg(feature = "redis")]
    match std::env::var("IDEM_REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let prefix = format!("idem-bench:{}:", std::process::id());
            let store = rt
                .block_on(idem::RedisStore::builder(url).prefix(prefix).connect())
                .expect("connect to Redis");
            bench_store(c, &rt, "redis", Arc::new(store));
        }
        _ => eprintln!("skipping redis: IDEM_REDIS_URL not set"),
    }
    #[cfg(feature = "postgres")]
    match std::env::var("IDEM_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => {
            let schema = format!("idem_bench_{}", std::process::id());
            let store = rt
                .block_on(idem::PostgresStore::builder(url).schema(schema).connect())
                .expect("connect to Postgres");
            bench_store(c, &rt, "postgres", Arc::new(store.clone()));
            rt.block_on(async {
                if let Ok(client) = store.pool().get().await {
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", store.schema()))
                        .await;
                }
            });
        }
        _ => eprintln!("skipping postgres: IDEM_POSTGRES_URL not set"),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = stores
}
criterion_main!(benches);
