//! `PostgresStore` against the store conformance suite, plus migration and fault checks.
//!
//! Needs a PostgreSQL: `IDEM_POSTGRES_URL=postgres://user@127.0.0.1:5432/db cargo test
//! --all-features`. Without the variable every check prints why it is skipped. Each check
//! works in a schema of its own, dropped afterwards, so runs never collide.

use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{IdemStore, ManualClock, StoreError};
use idem_runtime::{identity::IdemKey, store::RecordState};

const VAR: &str = "IDEM_POSTGRES_URL";

/// The server of the conformance runs, when the environment names one.
pub(crate) fn url() -> Option<String> {
    std::env::var(VAR).ok().filter(|s| !s.trim().is_empty())
}

/// Why the conformance runs skip without one.
pub(crate) fn skip_reason() -> String {
    format!(
        "{VAR} not set; start a PostgreSQL and export \
         {VAR}=postgres://user@127.0.0.1:5432/db to run the Postgres checks (.ci/run does this)"
    )
}

use crate::durable::sql;
use idem_test::stores::PostgresSchema;

struct Postgres;

impl StoreFactory for Postgres {
    type Store = PostgresStore;
    type Location = PostgresSchema;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        url().is_none().then(skip_reason)
    }

    async fn location(&self) -> Result<PostgresSchema, StoreError> {
        let url = url().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(PostgresSchema::on(url.clone(), "postgres"))
    }

    async fn open(
        &self,
        at: &PostgresSchema,
        options: &StoreOptions,
    ) -> Result<PostgresStore, StoreError> {
        PostgresStore::builder(at.url.as_str())
            .schema(at.name.as_str())
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .max_connections(6)
            .connect()
            .await
    }

    fn keeps_nul(&self) -> bool {
        false
    }

    fn corruptions(&self) -> &'static [&'static str] {
        crate::durable::SQL_CORRUPTIONS
    }

    async fn break_record(&self, at: &PostgresSchema, _: &PostgresStore, key: &IdemKey, how: &str) {
        let rows = crate::durable::PostgresRows {
            sql: sql(&at.url).await,
            at,
        };
        rows.corrupt(key, how).await;
    }

    async fn raw_record(
        &self,
        at: &PostgresSchema,
        _: &PostgresStore,
        key: &IdemKey,
    ) -> Option<String> {
        let rows = crate::durable::PostgresRows {
            sql: sql(&at.url).await,
            at,
        };
        rows.raw(key).await
    }

    async fn corrupt(&self, at: &PostgresSchema, key: &IdemKey) -> Result<bool, StoreError> {
        // A running row whose fingerprint does not decode: the cheap one-statement paths
        // (renew, settle) must notice it as well as the locked ones.
        let n = sql(&at.url)
            .await
            .execute(
                &format!(
                    "UPDATE \"{}\".idem_records SET fingerprint = 'not a fingerprint' \
                     WHERE key = $1",
                    at.name
                ),
                &[&key.as_str()],
            )
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        assert_eq!(n, 1, "the record to corrupt must exist");
        Ok(true)
    }
}

idem_runtime::store_conformance_tests!(Postgres);

fn request(name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint("args"),
        tool: "t".into(),
        lease,
        operation: None,
    }
}

/// A PostgreSQL that is not there is `Unavailable` at connect time.
#[tokio::test]
async fn unreachable_postgres_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    match PostgresStore::connect(&format!("postgres://idem@127.0.0.1:{port}/idem")).await {
        Err(StoreError::Unavailable(msg)) => assert!(msg.contains("postgres"), "{msg}"),
        other => panic!("connecting to a closed port must be Unavailable, got {other:?}"),
    }
}

/// Bad configuration is reported as such, before any connection is attempted.
#[tokio::test]
async fn bad_configuration_is_a_backend_error() {
    for (url, schema) in [
        (
            "postgres://idem@127.0.0.1:1/idem",
            "Robert'); DROP TABLE students;--",
        ),
        ("not a url at all ::", "idem"),
    ] {
        match PostgresStore::builder(url).schema(schema).connect().await {
            Err(StoreError::Backend(_)) => {}
            other => panic!("{url:?}/{schema:?} must be a Backend error, got {other:?}"),
        }
    }
}

/// Many workers starting at once on a fresh schema migrate it exactly once; reopening is a
/// no-op; a schema migrated by a newer idem is refused, not misread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_are_applied_once_and_versioned() {
    let Some(url) = url() else {
        conformance::skip("this Postgres check", &skip_reason());
        return;
    };
    let schema = PostgresSchema::on(url.clone(), "postgres");
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let (url, name) = (url.clone(), schema.name.clone());
            tokio::spawn(async move {
                PostgresStore::builder(url)
                    .schema(name)
                    .max_connections(2)
                    .connect()
                    .await
            })
        })
        .collect();
    for o in opens {
        o.await.expect("task").expect("concurrent migration");
    }
    let client = sql(&url).await;
    let versions: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM \"{}\".idem_schema_version",
                schema.name
            ),
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(versions, 3, "each of the three migrations applied once");
    client
        .execute(
            &format!(
                "INSERT INTO \"{}\".idem_schema_version (version) VALUES (999)",
                schema.name
            ),
            &[],
        )
        .await
        .expect("insert");
    match PostgresStore::builder(url.as_str())
        .schema(schema.name.as_str())
        .connect()
        .await
    {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("newer"), "{msg}"),
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

/// The lease-expiry message is the same text every backend writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_reads_like_every_backend() {
    let Some(url) = url() else {
        conformance::skip("this Postgres check", &skip_reason());
        return;
    };
    let schema = PostgresSchema::on(url.clone(), "postgres");
    let clock = ManualClock::starting_now();
    let store = PostgresStore::builder(url.as_str())
        .schema(schema.name.as_str())
        .clock(std::sync::Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect");
    let memory = idem_runtime::store::MemoryStore::with_clock(std::sync::Arc::new(clock.clone()));
    let req = request("message", Duration::from_secs(5));
    assert!(matches!(
        store.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    assert!(matches!(
        memory.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    clock.advance(Duration::from_secs(6));
    let a = store.get(&req.key).await.expect("get").expect("record");
    let b = memory.get(&req.key).await.expect("get").expect("record");
    assert_eq!(a.state, RecordState::Unknown);
    assert_eq!(a.message, b.message);
}

/// `purge_expired` applies retention to records nobody reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_drops_results_then_tombstones() {
    let Some(url) = url() else {
        conformance::skip("this Postgres check", &skip_reason());
        return;
    };
    let schema = PostgresSchema::on(url.clone(), "postgres");
    let clock = ManualClock::starting_now();
    let retention = idem_runtime::store::Retention {
        results: Duration::from_secs(60),
        tombstones: Duration::from_secs(600),
    };
    let store = PostgresStore::builder(url.as_str())
        .schema(schema.name.as_str())
        .clock(std::sync::Arc::new(clock.clone()))
        .retention(retention)
        .connect()
        .await
        .expect("connect");
    for i in 0..3 {
        let req = request(&format!("purge-{i}"), Duration::from_secs(5));
        let Ok(ClaimOutcome::Claimed(t)) = store.claim(&req).await else {
            panic!("claim");
        };
        store
            .settle(
                &req.key,
                t,
                idem_runtime::store::backend::Settlement::new(RecordState::Completed)
                    .payload(serde_json::json!(i)),
            )
            .await
            .expect("settle");
    }
    assert_eq!(store.purge_expired().await.expect("purge"), (0, 0));
    clock.advance(Duration::from_secs(61));
    assert_eq!(store.purge_expired().await.expect("purge"), (3, 0));
    clock.advance(Duration::from_secs(600));
    assert_eq!(store.purge_expired().await.expect("purge"), (0, 3));
}
