//! What only the Postgres store has to get right beyond the conformance suite: schemas
//! apart, an exhausted pool, every expired lease listed, corrupt rows left as they are; and
//! its rows read and broken directly (for the suite's corruption check).

use std::sync::Arc;
use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance;
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ManualClock, Record, RecordState, Retention, StoreError,
};
use serde_json::json;

use idem_test::stores::PostgresSchema;

pub(crate) fn pg_url(test: &str) -> Option<String> {
    conformance::backend_url("IDEM_POSTGRES_URL", test)
}

/// A connection of its own to the server, for reading and breaking rows directly.
pub(crate) async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres");
    tokio::spawn(conn);
    client
}

const LEASE: Duration = Duration::from_secs(10);

const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

fn request(name: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint("args"),
        tool: "backend_tool".into(),
        lease,
        operation: None,
    }
}

async fn claim(store: &impl IdemStore, req: &ClaimRequest) -> ClaimToken {
    match store.claim(req).await {
        Ok(ClaimOutcome::Claimed(t)) => t,
        other => panic!("claim of a free key must be granted, got {other:?}"),
    }
}

async fn get(store: &impl IdemStore, key: &IdemKey) -> Record {
    store
        .get(key)
        .await
        .unwrap_or_else(|e| panic!("get failed: {e}"))
        .unwrap_or_else(|| panic!("record {key} vanished"))
}

fn stale<T: std::fmt::Debug>(what: &str, r: Result<T, StoreError>) {
    match r {
        Err(StoreError::StaleToken { .. }) => {}
        other => panic!("{what} must be refused as a stale token, got {other:?}"),
    }
}

/// Claims `name` in a fresh schema, then breaks the row's fingerprint by hand (what
/// `store_postgres.rs`'s conformance hook does). Returns the store, the token, the key,
/// and a way to read the row's raw state.
async fn corrupt_running_row(
    at: &PostgresSchema,
    name: &str,
) -> (PostgresStore, ClaimToken, IdemKey, tokio_postgres::Client) {
    let clock = ManualClock::starting_now();
    let s = at.open(4, Some(clock.clone()), RETENTION).await;
    let req = request(name, LEASE);
    let t = claim(&s, &req).await;
    let sql = sql(&at.url).await;
    let n = sql
        .execute(
            &format!(
                "UPDATE \"{}\".idem_records SET fingerprint = 'garbage' WHERE key = $1",
                at.name
            ),
            &[&req.key.as_str()],
        )
        .await
        .expect("corrupt");
    assert_eq!(n, 1);
    (s, t, req.key, sql)
}

async fn raw_state(
    at: &PostgresSchema,
    sql: &tokio_postgres::Client,
    key: &IdemKey,
) -> Option<String> {
    sql.query_opt(
        &format!(
            "SELECT state FROM \"{}\".idem_records WHERE key = $1",
            at.name
        ),
        &[&key.as_str()],
    )
    .await
    .expect("select")
    .map(|r| r.get::<_, String>(0))
}

/// A Postgres schema, read and written with plain SQL.
pub(crate) struct PostgresRows<'a> {
    pub(crate) at: &'a PostgresSchema,
    pub(crate) sql: tokio_postgres::Client,
}

impl PostgresRows<'_> {
    pub(crate) async fn corrupt(&self, key: &IdemKey, how: &str) {
        let set = match how {
            "fingerprint" => "fingerprint = 'garbage'",
            "state" => "state = 'exploded'",
            "attempts" => "attempts = '[not json'",
            other => unreachable!("{other}"),
        };
        let n = self
            .sql
            .execute(
                &format!(
                    "UPDATE \"{}\".idem_records SET {set} WHERE key = $1",
                    self.at.name
                ),
                &[&key.as_str()],
            )
            .await
            .expect("corrupt");
        assert_eq!(n, 1, "the record to corrupt must exist");
    }

    pub(crate) async fn raw(&self, key: &IdemKey) -> Option<String> {
        self.sql
            .query_opt(
                &format!(
                    "SELECT row_to_json(r)::text FROM \"{}\".idem_records r WHERE key = $1",
                    self.at.name
                ),
                &[&key.as_str()],
            )
            .await
            .expect("select")
            .map(|r| r.get::<_, String>(0))
    }
}

/// Two stores in two schemas of one database share nothing: the same key is free in each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schemas_are_isolated() {
    let Some(url) = pg_url("postgres_schemas_are_isolated") else {
        return;
    };
    let (x, y) = (
        PostgresSchema::on(url.clone(), "postgres"),
        PostgresSchema::on(url.clone(), "postgres"),
    );
    let clock = ManualClock::starting_now();
    let sx = x.open(4, Some(clock.clone()), RETENTION).await;
    let sy = y.open(4, Some(clock.clone()), RETENTION).await;
    let req = request("isolated", LEASE);
    let tx = claim(&sx, &req).await;
    let ty = claim(&sy, &req).await;
    sx.settle(
        &req.key,
        tx,
        Settlement::new(RecordState::Completed).payload(json!("x")),
    )
    .await
    .expect("settle");
    stale(
        "y's token in x",
        sx.settle(&req.key, ty, Settlement::new(RecordState::Completed))
            .await,
    );
    assert_eq!(get(&sy, &req.key).await.state, RecordState::Running);
    assert_eq!(sy.list(RecordState::Completed, 10).await.expect("list"), []);
    assert_eq!(sx.list(RecordState::Running, 10).await.expect("list"), []);
}

/// Every connection of the pool is busy: store calls fail as `Unavailable` within the
/// pool's wait timeout (the executor then refuses before running a handler), never hang
/// or panic, and work again once a connection is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_exhausted_pool_is_unavailable() {
    let Some(url) = pg_url("postgres_exhausted_pool_is_unavailable") else {
        return;
    };
    let at = PostgresSchema::on(url.clone(), "postgres");
    let config: tokio_postgres::Config = url.parse().expect("url");
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(1)
        .wait_timeout(Some(Duration::from_millis(200)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .expect("pool");
    let clock = ManualClock::starting_now();
    let s = PostgresStore::with_pool(pool.clone())
        .schema(at.name.as_str())
        .clock(Arc::new(clock.clone()))
        .connect()
        .await
        .expect("connect");
    let req = request("pool", LEASE);
    let held = pool.get().await.expect("the only connection");
    let r = tokio::time::timeout(Duration::from_secs(20), s.claim(&req))
        .await
        .expect("a claim on an exhausted pool must not hang");
    assert!(
        matches!(r, Err(StoreError::Unavailable(_))),
        "exhausted pool: {r:?}"
    );
    drop(held);
    let t = claim(&s, &req).await;
    let held = pool.get().await.expect("the only connection");
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        s.settle(&req.key, t, Settlement::new(RecordState::Completed)),
    )
    .await
    .expect("no hang");
    assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
    drop(held);
    assert_eq!(get(&s, &req.key).await.state, RecordState::Running);
    s.settle(&req.key, t, Settlement::new(RecordState::Completed))
        .await
        .expect("settle once a connection is free");
    assert_eq!(get(&s, &req.key).await.state, RecordState::Completed);
}

/// After a crash of many workers (or one worker with many calls in flight) more than a
/// thousand claims' leases have passed. The store contract: listings apply lease expiry
/// first, so every one of them is listed as unknown and none as running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lists_every_expired_lease_as_unknown() {
    let Some(url) = pg_url("postgres_lists_every_expired_lease_as_unknown") else {
        return;
    };
    let at = PostgresSchema::on(url.clone(), "postgres");
    let clock = ManualClock::starting_now();
    let s = at.open(4, Some(clock.clone()), RETENTION).await;
    const N: usize = 1010;
    let keys: Vec<String> = (0..N)
        .map(|i| {
            conformance::key(&format!("crashed-{i}"))
                .as_str()
                .to_owned()
        })
        .collect();
    let now = i64::try_from(clock.now().as_millis()).expect("ms");
    let fp = conformance::fingerprint("args").to_hex();
    // As claims written by workers that then died: running, lease end in the future.
    sql(&at.url)
        .await
        .execute(
            &format!(
                "INSERT INTO \"{}\".idem_records \
                   (key, fingerprint, tool, state, token, lease_until, created_at, updated_at) \
                 SELECT k, $2, 't', 'running', md5(k), $3::bigint + 10000, $3::bigint, $3::bigint \
                 FROM unnest($1::text[]) AS k",
                at.name
            ),
            &[&keys, &fp, &now],
        )
        .await
        .expect("insert claims");
    clock.advance(Duration::from_secs(11));
    let unknown = s
        .list(RecordState::Unknown, 5000)
        .await
        .expect("list unknown");
    let running = s
        .list(RecordState::Running, 5000)
        .await
        .expect("list running");
    assert_eq!(
        (unknown.len(), running.len()),
        (N, 0),
        "every expired lease is listed as unknown, none as running"
    );
}

/// A running row that does not decode is `Corrupt` from settle (the conformance suite
/// checks that much) — and a settle that reports an error must not have been applied: the
/// executor treats a failed settle as "not recorded".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_settle_of_a_corrupt_row_reports_error_and_applies_nothing() {
    let Some(url) = pg_url("postgres_settle_of_a_corrupt_row") else {
        return;
    };
    let at = PostgresSchema::on(url.clone(), "postgres");
    let (s, t, key, sql) = corrupt_running_row(&at, "corrupt-settle").await;
    let r = s
        .settle(&key, t, Settlement::new(RecordState::Completed))
        .await;
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    assert_eq!(
        raw_state(&at, &sql, &key).await.as_deref(),
        Some("running"),
        "settle returned {r:?} but changed the row"
    );
}

/// Release of a running row that does not decode must be `Corrupt` (the conformance
/// suite's rule: every operation on a corrupt key), keeping the row for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_release_of_a_corrupt_row_is_corrupt() {
    let Some(url) = pg_url("postgres_release_of_a_corrupt_row") else {
        return;
    };
    let at = PostgresSchema::on(url.clone(), "postgres");
    let (s, t, key, sql) = corrupt_running_row(&at, "corrupt-release").await;
    let r = s.release(&key, t).await;
    let state = raw_state(&at, &sql, &key).await;
    assert!(
        matches!(r, Err(StoreError::Corrupt { .. })) && state.as_deref() == Some("running"),
        "release of a corrupt row: {r:?}, row now {state:?} (must be Corrupt and kept)"
    );
}

/// The ways the suite's corruption check breaks a row: a column that does not decode.
pub(crate) const SQL_CORRUPTIONS: &[&str] = &["fingerprint", "state", "attempts"];
