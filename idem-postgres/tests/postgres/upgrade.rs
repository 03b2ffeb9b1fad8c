//! Upgrading a Postgres schema written at layout version 2 (three secondary indexes on the
//! records) to the current layout: in place, at connect, once however many workers start
//! at once, with every record reading back as it was written; then the whole store
//! conformance suite on schemas that started at version 2.
//!
//! Needs a PostgreSQL (`IDEM_POSTGRES_URL`), like `store_postgres.rs`.

use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
use idem_runtime::store::{
    ClaimToken, Clock, IdemStore, ManualClock, Record, ReleaseRecord, StoreError, Timestamp,
};
use idem_runtime::{identity::IdemKey, store::RecordState};

/// The layout as version 2 left it; `{schema}` stands for the schema's name.
const LAYOUT_V2: &str = include_str!("layout_v2.sql");

use idem_test::stores::PostgresSchema;

use crate::durable::sql;
use crate::store::{skip_reason, url};

/// A fresh schema holding the version 2 layout and no records.
async fn schema_at_v2(url: &str) -> PostgresSchema {
    let schema = PostgresSchema::on(url.to_owned(), "postgres_upgrade");
    sql(url)
        .await
        .batch_execute(&LAYOUT_V2.replace("{schema}", &schema.name))
        .await
        .expect("the version 2 layout");
    schema
}

/// The conformance suite on schemas that start at layout version 2, upgraded by the first
/// connect.
struct PostgresFromV2;

impl StoreFactory for PostgresFromV2 {
    type Store = PostgresStore;
    type Location = PostgresSchema;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        url().is_none().then(skip_reason)
    }

    fn keeps_nul(&self) -> bool {
        false
    }

    async fn location(&self) -> Result<PostgresSchema, StoreError> {
        let url = url().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(schema_at_v2(&url).await)
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

    async fn corrupt(&self, at: &PostgresSchema, key: &IdemKey) -> Result<bool, StoreError> {
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

idem_runtime::store_conformance_tests!(PostgresFromV2);

use idem_test::old_records;
use old_records::{ms, OldRecords};

/// A schema at version 2 with records in every shape its code wrote (running, completed
/// with evidence and arguments, unknown, a release trace) is upgraded by six workers
/// connecting at once: the version is recorded once, the two dropped indexes are gone, and
/// every record reads back field for field and keeps working (settle, replay, listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_2_schema_is_upgraded_in_place() {
    let Some(url) = url() else {
        conformance::skip("this Postgres check", &skip_reason());
        return;
    };
    let schema = schema_at_v2(&url).await;
    let clock = ManualClock::starting_now();
    let old = OldRecords::new(clock.now());
    let OldRecords {
        t0,
        fingerprint,
        ref operation,
        ref attempts,
        ref operation_json,
        ..
    } = old;
    let client = sql(&url).await;
    let insert = format!(
        "INSERT INTO \"{}\".idem_records (key, fingerprint, tool, state, token, lease_until, \
           created_at, updated_at, payload, message, downstream_ref, result_expired, attempts, \
           tx_effect, operation, read_backs) \
         VALUES ($1, $2, 'charge', $3, $4, $5, $6, $7, $8, $9, $10, false, $11, false, $12, $13)",
        schema.name
    );
    let rows = old.rows();
    for row in rows {
        client
            .execute(
                &insert,
                &[
                    &row.key.as_str(),
                    &fingerprint.to_hex(),
                    &row.state,
                    &row.token.to_hex(),
                    &row.lease_until,
                    &ms(t0),
                    &(ms(t0) + 100),
                    &row.payload,
                    &row.message,
                    &row.downstream_ref,
                    &row.attempts,
                    operation_json,
                    &row.read_backs,
                ],
            )
            .await
            .expect("an old-format row");
    }
    let released = conformance::key("upgrade-released");
    let release = ReleaseRecord {
        at: Timestamp(t0.as_millis() + 200),
        by: "ops".into(),
        note: "not in the ledger".into(),
        record: Record {
            key: released.clone(),
            fingerprint,
            tool: "charge".into(),
            state: RecordState::Unknown,
            token: ClaimToken::fresh(),
            lease_until: None,
            created_at: t0,
            updated_at: Timestamp(t0.as_millis() + 100),
            payload: None,
            message: Some("timed out after 30s".into()),
            downstream_ref: None,
            result_expired: false,
            attempts: attempts.clone(),
            operation: Some(operation.clone()),
            read_backs: Vec::new(),
        },
    };
    client
        .execute(
            &format!(
                "INSERT INTO \"{}\".idem_releases (key, seq, released_at, entry) \
                 VALUES ($1, 1, $2, $3)",
                schema.name
            ),
            &[
                &released.as_str(),
                &(ms(t0) + 200),
                &serde_json::to_string(&release).unwrap(),
            ],
        )
        .await
        .expect("an old-format release");

    // Six workers upgrade at once.
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let (url, name, clock) = (url.clone(), schema.name.clone(), clock.clone());
            tokio::spawn(async move {
                PostgresStore::builder(url)
                    .schema(name)
                    .clock(std::sync::Arc::new(clock))
                    .max_connections(2)
                    .connect()
                    .await
            })
        })
        .collect();
    let mut stores = Vec::new();
    for o in opens {
        stores.push(o.await.expect("task").expect("an upgrading connect"));
    }
    let versions: Vec<i32> = client
        .query(
            &format!(
                "SELECT version FROM \"{}\".idem_schema_version ORDER BY version",
                schema.name
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        [1, 2, 3],
        "version 3 recorded once, on top of 1 and 2"
    );
    let indexes: Vec<String> = client
        .query(
            "SELECT indexname::text FROM pg_indexes \
             WHERE schemaname = $1 AND tablename = 'idem_records' ORDER BY indexname",
            &[&schema.name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(indexes, ["idem_records_pkey", "idem_records_state"]);

    let store = &stores[0];
    old.check_upgraded(store, &stores[1]).await;
    let trace = store.releases(&released).await.unwrap();
    assert_eq!(trace, [release], "the release trace survives the upgrade");
}

/// A transaction holding the records table (a transactional handler still running, under a
/// version before the upgrade) does not stall a starting worker: the upgrade waits at most
/// the lock timeout, the worker starts on layout 2 and works, and a later start finishes
/// the upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_blocked_by_an_open_transaction_waits_for_a_later_start() {
    let Some(url) = url() else {
        conformance::skip("this Postgres check", &skip_reason());
        return;
    };
    let schema = schema_at_v2(&url).await;
    let mut holder = sql(&url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT count(*) FROM \"{}\".idem_records", schema.name),
        &[],
    )
    .await
    .unwrap();
    let connect = || {
        PostgresStore::builder(url.as_str())
            .schema(schema.name.as_str())
            .lock_timeout(Duration::from_millis(200))
            .max_connections(2)
            .connect()
    };
    let store = connect().await.expect("a start on the old layout");
    let client = sql(&url).await;
    let version_sql = format!(
        "SELECT max(version) FROM \"{}\".idem_schema_version",
        schema.name
    );
    let version = || async {
        client
            .query_one(&version_sql, &[])
            .await
            .unwrap()
            .get::<_, i32>(0)
    };
    assert_eq!(version().await, 2, "the upgrade waited for a later start");
    let req = ClaimRequest {
        key: conformance::key("on-layout-2"),
        fingerprint: conformance::fingerprint("args"),
        tool: "t".into(),
        lease: Duration::from_secs(30),
        operation: None,
    };
    let ClaimOutcome::Claimed(token) = store.claim(&req).await.unwrap() else {
        panic!("a fresh key must be claimed");
    };
    store
        .settle(&req.key, token, Settlement::new(RecordState::Completed))
        .await
        .unwrap();
    assert_eq!(
        store.get(&req.key).await.unwrap().map(|r| r.state),
        Some(RecordState::Completed)
    );
    tx.rollback().await.unwrap();
    drop(connect().await.expect("a later start"));
    assert_eq!(version().await, 3, "the later start upgraded");
}
