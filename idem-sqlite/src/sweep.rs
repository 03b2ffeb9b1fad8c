//! Housekeeping over the whole table: expired leases, results past retention, lapsed
//! tombstones.

use crate::codec::{decode, delete, drop_lapsed_releases, millis, put, sql_time, COLUMNS};
use crate::store::{db_err, Inner};
use idem_runtime::store::backend::log_field;
use idem_runtime::store::backend::rules::{self, Aged};
use idem_runtime::store::{RecordState, StoreError, Swept, Timestamp};
use rusqlite::{params, Connection};

/// Applies time to every record that may need it: expired leases, results past retention,
/// lapsed tombstones. The SQL only preselects; [`rules::age`] decides. Returns how many
/// records changed or were deleted in all.
pub(crate) fn sweep(tx: &Connection, inner: &Inner, now: Timestamp) -> Result<usize, StoreError> {
    let (swept, leases) = sweep_counted(tx, inner, now)?;
    Ok(leases + usize::try_from(swept.results + swept.tombstones).unwrap_or(usize::MAX))
}

/// [`sweep`], counting what it did: the results it turned into tombstones and the
/// tombstones and release traces it deleted, and apart, the expired leases it turned
/// *unknown*.
pub(crate) fn sweep_counted(
    tx: &Connection,
    inner: &Inner,
    now: Timestamp,
) -> Result<(Swept, usize), StoreError> {
    let now_sql = sql_time(now);
    let results_cut = now_sql.saturating_sub(millis(inner.retention.results));
    let tombstones_cut = now_sql.saturating_sub(millis(inner.retention.tombstones));
    let candidates = {
        // One arm per rule, so each is a range on an index (an `OR` of the three would
        // scan the table).
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM idem_records
                     WHERE state = 'running' AND lease_until <= ?1
                 UNION SELECT {COLUMNS} FROM idem_records
                     WHERE state IN ('completed', 'failed') AND result_expired = 0
                         AND updated_at <= ?2
                 UNION SELECT {COLUMNS} FROM idem_records
                     WHERE state IN ('completed', 'failed') AND updated_at <= ?3"
            ))
            .map_err(db_err)?;
        let mut rows = stmt
            .query(params![now_sql, results_cut, tombstones_cut])
            .map_err(db_err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(db_err)? {
            match decode(row) {
                Ok(record) => out.push(record),
                // One bad row must not stop housekeeping for the rest; it is reported as
                // corrupt to whoever reads or lists it.
                Err(e) => {
                    tracing::warn!(error = %log_field(&e), "sweep skipped an undecodable record")
                }
            }
        }
        out
    };
    let (mut leases, mut results, mut tombstones) = (0, 0, 0);
    for mut record in candidates {
        let was_running = record.state == RecordState::Running;
        match rules::age(&mut record, now, &inner.retention) {
            Aged::Unchanged => {}
            Aged::Changed => {
                put(tx, &record)?;
                if was_running {
                    leases += 1;
                } else {
                    results += 1;
                }
            }
            Aged::Gone => {
                delete(tx, &record.key)?;
                tombstones += 1;
            }
        }
    }
    tombstones += drop_lapsed_releases(tx, inner, now)? as u64;
    Ok((Swept::new(results, tombstones), leases))
}

/// True when [`sweep`] would find something to look at.
pub(crate) fn needs_sweep(
    conn: &Connection,
    inner: &Inner,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let now_sql = sql_time(now);
    let results_cut = now_sql.saturating_sub(millis(inner.retention.results));
    let tombstones_cut = now_sql.saturating_sub(millis(inner.retention.tombstones));
    // One probe per rule, each a range on an index (see `sweep`).
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM idem_records
                 WHERE state = 'running' AND lease_until <= ?1)
             OR EXISTS (SELECT 1 FROM idem_records
                 WHERE state IN ('completed', 'failed') AND result_expired = 0
                     AND updated_at <= ?2)
             OR EXISTS (SELECT 1 FROM idem_records
                 WHERE state IN ('completed', 'failed') AND updated_at <= ?3)",
    )
    .and_then(|mut s| {
        s.query_row(params![now_sql, results_cut, tombstones_cut], |r| {
            r.get::<_, bool>(0)
        })
    })
    .map_err(db_err)
}
