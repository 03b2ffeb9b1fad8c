//! The tables: every statement with the schema filled in, the layout's version, and the
//! migrations that bring an older layout up to it when a store connects.

use crate::codec::pg_err;
use crate::store::{PostgresStore, EXPIRED_PAGE};
use idem_runtime::store::backend::rules::{self};
use idem_runtime::store::StoreError;
use tokio_postgres::error::SqlState;

/// The newest table layout this version writes.
pub(crate) const SCHEMA_VERSION: i32 = 3;

/// Migration steps from this version on only drop what the statements no longer use:
/// the statements run on the layout before them as well. Such a step needs a brief
/// exclusive lock on the records table, which a transactional handler's open transaction
/// holds off; rather than stall every worker behind it, the step waits at most the
/// builder's lock timeout, and if the lock is not free it is left for the next start.
pub(crate) const DEFERRABLE_FROM: i32 = 3;

/// Every statement, with the schema filled in once.
pub(crate) struct Sql {
    pub(crate) claim: String,
    pub(crate) select: String,
    pub(crate) select_for_update: String,
    pub(crate) select_skip_locked: String,
    pub(crate) upsert: String,
    pub(crate) delete: String,
    pub(crate) settle_fast: String,
    pub(crate) settle_fenced: String,
    pub(crate) renew_fast: String,
    pub(crate) release_fast: String,
    pub(crate) expired_leases: String,
    pub(crate) list: String,
    pub(crate) list_after: String,
    pub(crate) expire_results: String,
    pub(crate) drop_tombstones: String,
    pub(crate) mark_tx: String,
    pub(crate) lock_tx: String,
    pub(crate) settle_tx: String,
    pub(crate) insert_release: String,
    pub(crate) trim_releases: String,
    pub(crate) drop_releases: String,
    pub(crate) select_releases: String,
    pub(crate) list_releases: String,
}

pub(crate) const COLUMNS: &str = "key, fingerprint, tool, state, token, lease_until, created_at, \
    updated_at, payload, message, downstream_ref, result_expired, attempts, tx_effect, \
    operation, read_backs";

/// Appends the JSON array `$n` to the stored one, as text (no JSON round trip: the evidence
/// is kept byte for byte).
pub(crate) fn append_json(column: &str, n: u8) -> String {
    format!(
        "CASE WHEN ${n} = '[]' THEN {column} WHEN {column} = '[]' THEN ${n} \
         ELSE left({column}, -1) || ',' || right(${n}, -1) END"
    )
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let t = format!("\"{schema}\".idem_records");
        let r = format!("\"{schema}\".idem_releases");
        Sql {
            claim: format!(
                "WITH ins AS ( \
                   INSERT INTO {t} (key, fingerprint, tool, state, token, lease_until, \
                     created_at, updated_at, operation) \
                   VALUES ($1, $2, $3, 'running', $4, $5, $6, $6, $7) \
                   ON CONFLICT (key) DO NOTHING RETURNING xmin::text AS version) \
                 SELECT (SELECT version FROM ins), r.key, r.fingerprint, r.tool, r.state, \
                   r.token, r.lease_until, r.created_at, r.updated_at, r.payload, r.message, \
                   r.downstream_ref, r.result_expired, r.attempts, r.tx_effect, r.operation, \
                   r.read_backs \
                 FROM (SELECT 1) AS one LEFT JOIN {t} AS r ON r.key = $1"
            ),
            select: format!("SELECT {COLUMNS} FROM {t} WHERE key = $1"),
            select_for_update: format!("SELECT {COLUMNS} FROM {t} WHERE key = $1 FOR UPDATE"),
            select_skip_locked: format!(
                "SELECT {COLUMNS} FROM {t} WHERE key = $1 FOR UPDATE SKIP LOCKED"
            ),
            upsert: format!(
                "INSERT INTO {t} ({COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
                   $16) \
                 ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
                   tool = EXCLUDED.tool, state = EXCLUDED.state, token = EXCLUDED.token, \
                   lease_until = EXCLUDED.lease_until, created_at = EXCLUDED.created_at, \
                   updated_at = EXCLUDED.updated_at, payload = EXCLUDED.payload, \
                   message = EXCLUDED.message, downstream_ref = EXCLUDED.downstream_ref, \
                   result_expired = EXCLUDED.result_expired, attempts = EXCLUDED.attempts, \
                   tx_effect = EXCLUDED.tx_effect, operation = EXCLUDED.operation, \
                   read_backs = EXCLUDED.read_backs"
            ),
            delete: format!("DELETE FROM {t} WHERE key = $1"),
            // The common settle: a live claim settled by its holder (rules::settle's first
            // branch). Rows of transactional handlers take the locked path, so this never
            // waits on a handler's open transaction.
            settle_fast: format!(
                "UPDATE {t} SET state = $3, lease_until = NULL, payload = $4, message = $5, \
                   downstream_ref = COALESCE($6, downstream_ref), attempts = {}, \
                   read_backs = {}, result_expired = false, updated_at = $8 \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $8 \
                   AND NOT tx_effect \
                   AND $10::int4 <= {cap} AND $11::int4 <= {cap} \
                   AND (attempts = '[]' OR json_array_length(attempts::json) + $10 <= {cap}) \
                   AND (read_backs = '[]' \
                     OR json_array_length(read_backs::json) + $11 <= {cap}) \
                 RETURNING {COLUMNS}",
                append_json("attempts", 7),
                append_json("read_backs", 9),
                // Within the evidence cap the append is exactly what rules::settle does;
                // past it, the locked path applies rules::cap_evidence. $10 and $11 count
                // the new evidence; the stored evidence of a claim is still empty (`[]`)
                // when its holder settles it, so its JSON is parsed only when it is not.
                cap = 2 * rules::EVIDENCE_KEPT,
            ),
            // The claim's own insert, settled by its holder: `xmin` is the version the
            // claim wrote (see `Fences`), so the evidence columns still hold `[]` and the
            // row needs no decoding. Otherwise exactly `settle_fast`.
            settle_fenced: format!(
                "UPDATE {t} SET state = $3, lease_until = NULL, payload = $4, message = $5, \
                   downstream_ref = COALESCE($6, downstream_ref), attempts = $7, \
                   read_backs = $9, result_expired = false, updated_at = $8 \
                 WHERE key = $1 AND token = $2 AND xmin::text = $12 AND state = 'running' \
                   AND lease_until > $8 AND NOT tx_effect \
                   AND $10::int4 <= {cap} AND $11::int4 <= {cap}",
                cap = 2 * rules::EVIDENCE_KEPT,
            ),
            renew_fast: format!(
                "UPDATE {t} SET lease_until = $3, updated_at = $4 \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $4 \
                   AND NOT tx_effect \
                 RETURNING {COLUMNS}"
            ),
            release_fast: format!(
                "DELETE FROM {t} \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $3 \
                   AND NOT tx_effect \
                 RETURNING {COLUMNS}"
            ),
            // A keyset page: rows that stay running after ageing (a corrupt row, or a
            // transactional claim still being decided) are walked past, not met again.
            // Served by the (state, created_at, key) index: the running rows are the calls
            // in flight, few, and a lease index would cost every claim an index write.
            expired_leases: format!(
                "SELECT key, lease_until FROM {t} \
                 WHERE state = 'running' AND lease_until <= $1 AND (lease_until, key) > ($2, $3) \
                 ORDER BY lease_until, key LIMIT {EXPIRED_PAGE}"
            ),
            list: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = $1 ORDER BY created_at, key LIMIT $2"
            ),
            // A keyset page: the row comparison is a range on the (state, created_at, key)
            // index, so a page deep into a large state costs no more than the first.
            list_after: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = $1 AND (created_at, key) > ($2, $3) \
                 ORDER BY created_at, key LIMIT $4"
            ),
            // Retention runs on the (state, created_at, key) index: a record is settled
            // after it is claimed, so `created_at <= $1` holds for every record the rule
            // picks and narrows the scan to the old end of each state. (A settle stamped by
            // a clock behind the claimer's ages once both times pass the cut: late by the
            // skew.) A separate index on `updated_at` would cost every settle a write.
            expire_results: format!(
                // rules::expire_result, in SQL: the tombstone keeps no arguments, output,
                // messages or read-backs. `jsonb` refuses the escape `\u0000` that a NUL in
                // an attempt's message is stored as, and one such record would fail every
                // sweep: the escape becomes `\u2400` first. The text stays valid JSON either
                // way (the six characters are an escape, or plain text after an escaped
                // backslash), and only messages change, which are dropped here.
                "UPDATE {t} SET result_expired = true, payload = NULL, message = NULL, \
                   operation = NULL, read_backs = '[]', \
                   attempts = COALESCE((SELECT jsonb_agg(a - 'message' ORDER BY n)::text \
                     FROM jsonb_array_elements(replace(attempts, '\\u0000', '\\u2400')::jsonb) \
                     WITH ORDINALITY AS e(a, n)), '[]') \
                 WHERE state IN ('completed', 'failed') AND NOT result_expired \
                   AND created_at <= $1 AND updated_at <= $1"
            ),
            drop_tombstones: format!(
                "DELETE FROM {t} WHERE state IN ('completed', 'failed') \
                   AND created_at <= $1 AND updated_at <= $1"
            ),
            mark_tx: format!(
                "UPDATE {t} SET tx_effect = true \
                 WHERE key = $1 AND token = $2 AND state = 'running' AND lease_until > $3"
            ),
            lock_tx: format!(
                "SELECT 1 FROM {t} WHERE key = $1 AND token = $2 AND state = 'running' \
                 FOR UPDATE"
            ),
            settle_tx: format!(
                "UPDATE {t} SET state = 'completed', lease_until = NULL, payload = $3, \
                   message = NULL, result_expired = false, tx_effect = false, \
                   updated_at = $4 \
                 WHERE key = $1 AND token = $2 AND state = 'running'"
            ),
            insert_release: format!(
                "INSERT INTO {r} (key, seq, released_at, entry) \
                 SELECT $1, COALESCE(max(seq), 0) + 1, $2, $3 FROM {r} WHERE key = $1 \
                 RETURNING seq"
            ),
            trim_releases: format!("DELETE FROM {r} WHERE key = $1 AND seq <= $2"),
            drop_releases: format!("DELETE FROM {r} WHERE released_at <= $1"),
            select_releases: format!(
                "SELECT entry FROM {r} WHERE key = $1 AND released_at > $2 ORDER BY seq"
            ),
            list_releases: format!(
                "SELECT key, entry FROM {r} \
                 WHERE released_at > $1 AND (released_at, key) > ($2, $3) \
                 ORDER BY released_at, key, seq LIMIT $4"
            ),
        }
    }

    /// The layout, one step per version. Steps are never edited once released: a database
    /// of any version reaches the newest by running the steps after its own.
    pub(crate) fn migrations(schema: &str) -> [String; SCHEMA_VERSION as usize] {
        let s = format!("\"{schema}\"");
        let t = format!("{s}.idem_records");
        let r = format!("{s}.idem_releases");
        [
            format!(
                "CREATE TABLE {t} ( \
               key            text PRIMARY KEY, \
               fingerprint    text NOT NULL, \
               tool           text NOT NULL, \
               state          text NOT NULL, \
               token          text NOT NULL, \
               lease_until    bigint, \
               created_at     bigint NOT NULL, \
               updated_at     bigint NOT NULL, \
               payload        text, \
               message        text, \
               downstream_ref text, \
               result_expired boolean NOT NULL DEFAULT false, \
               attempts       text NOT NULL DEFAULT '[]', \
               tx_effect      boolean NOT NULL DEFAULT false, \
               operation      text, \
               read_backs     text NOT NULL DEFAULT '[]'); \
             CREATE INDEX idem_records_state ON {t} (state, created_at, key); \
             CREATE INDEX idem_records_leases ON {t} (lease_until) WHERE state = 'running'; \
             CREATE INDEX idem_records_retention ON {t} (updated_at) \
               WHERE state IN ('completed', 'failed');"
            ),
            // 2: release traces (`IdemStore::release_unsettled`), one row per release.
            format!(
                "CREATE TABLE {r} ( \
               key         text NOT NULL, \
               seq         bigint NOT NULL, \
               released_at bigint NOT NULL, \
               entry       text NOT NULL, \
               PRIMARY KEY (key, seq)); \
             CREATE INDEX idem_releases_by_time ON {r} (released_at, key, seq);"
            ),
            // 3: one secondary index on the records instead of three. The expiry scan and
            // retention run on `idem_records_state` (see `expired_leases`,
            // `expire_results`), so a claim writes two index entries instead of three and
            // a settle two instead of three. Every statement of this version runs on
            // layout 2 as well, so this step may wait for a later start (see
            // `DEFERRABLE_FROM`).
            format!(
                "DROP INDEX IF EXISTS {s}.idem_records_leases; \
                 DROP INDEX IF EXISTS {s}.idem_records_retention;"
            ),
        ]
    }
}

impl PostgresStore {
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        let schema = &self.inner.schema;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        // One migrator per schema at a time, across every worker.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('idem-migrate:' || $1::text))",
            &[schema],
        )
        .await
        .map_err(pg_err)?;
        tx.batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; \
             CREATE TABLE IF NOT EXISTS \"{schema}\".idem_schema_version ( \
               version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());"
        ))
        .await
        .map_err(pg_err)?;
        let current: i32 = tx
            .query_one(
                &format!("SELECT COALESCE(max(version), 0) FROM \"{schema}\".idem_schema_version"),
                &[],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if current > SCHEMA_VERSION {
            return Err(StoreError::Backend(format!(
                "schema \"{schema}\" is at version {current}, newer than this version of idem \
                 understands ({SCHEMA_VERSION}); upgrade idem"
            )));
        }
        for (i, step) in Sql::migrations(schema).iter().enumerate() {
            let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
            if version <= current {
                continue;
            }
            let record = format!(
                "INSERT INTO \"{schema}\".idem_schema_version (version) VALUES ({version})"
            );
            if version < DEFERRABLE_FROM {
                tx.batch_execute(&format!("{step}; {record}"))
                    .await
                    .map_err(pg_err)?;
                continue;
            }
            let lock_timeout = self.inner.lock_timeout.as_millis().max(1);
            let tried = tx
                .batch_execute(&format!(
                    "SAVEPOINT idem_migrate; SET LOCAL lock_timeout = {lock_timeout}; \
                     {step}; {record}; RELEASE idem_migrate"
                ))
                .await;
            match tried {
                Ok(()) => {}
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    tx.batch_execute("ROLLBACK TO idem_migrate")
                        .await
                        .map_err(pg_err)?;
                    tracing::warn!(
                        schema = %schema,
                        version,
                        "idem schema upgrade left for a later start: the records table is \
                         locked by a transaction still in progress"
                    );
                    break;
                }
                Err(e) => return Err(pg_err(e)),
            }
        }
        tx.commit().await.map_err(pg_err)
    }
}
