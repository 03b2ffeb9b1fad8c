//! Rows and records: the statements that read and write one record or release, and the
//! decoding of a row ([`sql::Columns`], shared with the Postgres store).

use std::time::Duration;

use crate::store::{db_err, Inner};
use idem_runtime::identity::IdemKey;
use idem_runtime::store::backend::rules::{self, Aged};
use idem_runtime::store::backend::sql::{self, Columns};
use idem_runtime::store::{ListCursor, Record, RecordState, ReleaseRecord, StoreError, Timestamp};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, Row};

/// Columns in the order [`decode`] reads them.
pub(crate) const COLUMNS: &str = "key, state, fingerprint, tool, token, lease_until, created_at, \
                       updated_at, result_expired, payload, message, downstream_ref, attempts, \
                       operation, read_backs";
pub(crate) fn load(conn: &Connection, key: &IdemKey) -> Result<Option<Record>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM idem_records WHERE key = ?1"
        ))
        .map_err(db_err)?;
    let mut rows = stmt.query([key.as_str()]).map_err(db_err)?;
    match rows.next().map_err(db_err)? {
        Some(row) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// Loads `key` and applies time to it, writing back what changed (inside a write
/// transaction).
pub(crate) fn load_aged(
    tx: &Connection,
    inner: &Inner,
    key: &IdemKey,
    now: Timestamp,
) -> Result<Option<Record>, StoreError> {
    let Some(mut record) = load(tx, key)? else {
        return Ok(None);
    };
    match rules::age(&mut record, now, &inner.retention) {
        Aged::Unchanged => Ok(Some(record)),
        Aged::Changed => {
            put(tx, &record)?;
            Ok(Some(record))
        }
        Aged::Gone => {
            delete(tx, key)?;
            Ok(None)
        }
    }
}

/// A record's payload, attempts and read-backs as the JSON text their columns hold.
pub(crate) fn encode_outcome(r: &Record) -> Result<(Option<String>, String, String), StoreError> {
    let payload = r
        .payload
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Backend(format!("cannot encode the payload: {e}")))?;
    let attempts = serde_json::to_string(&r.attempts)
        .map_err(|e| StoreError::Backend(format!("cannot encode the attempts: {e}")))?;
    let read_backs = serde_json::to_string(&r.read_backs)
        .map_err(|e| StoreError::Backend(format!("cannot encode the read-backs: {e}")))?;
    Ok((payload, attempts, read_backs))
}

pub(crate) fn put(conn: &Connection, r: &Record) -> Result<(), StoreError> {
    let (payload, attempts, read_backs) = encode_outcome(r)?;
    let operation = r
        .operation
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Backend(format!("cannot encode the operation: {e}")))?;
    let mut stmt = conn
        .prepare_cached(&format!(
            "INSERT INTO idem_records ({COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
             ON CONFLICT (key) DO UPDATE SET
                 state = excluded.state, fingerprint = excluded.fingerprint,
                 tool = excluded.tool, token = excluded.token,
                 lease_until = excluded.lease_until, created_at = excluded.created_at,
                 updated_at = excluded.updated_at, result_expired = excluded.result_expired,
                 payload = excluded.payload, message = excluded.message,
                 downstream_ref = excluded.downstream_ref, attempts = excluded.attempts,
                 operation = excluded.operation, read_backs = excluded.read_backs"
        ))
        .map_err(db_err)?;
    stmt.execute(params![
        r.key.as_str(),
        r.state.as_str(),
        r.fingerprint.to_hex(),
        r.tool,
        r.token.to_hex(),
        r.lease_until.map(sql_time),
        sql_time(r.created_at),
        sql_time(r.updated_at),
        i64::from(r.result_expired),
        payload,
        r.message,
        r.downstream_ref,
        attempts,
        operation,
        read_backs,
    ])
    .map_err(db_err)?;
    Ok(())
}

/// Writes what a settle changes ([`rules::settle`]: the state, lease, outcome, evidence and
/// update time) to `r`'s row, which this transaction read: one `UPDATE` of those columns
/// instead of [`put`]'s upsert of every column.
pub(crate) fn put_settled(conn: &Connection, r: &Record) -> Result<(), StoreError> {
    let (payload, attempts, read_backs) = encode_outcome(r)?;
    let n = conn
        .prepare_cached(
            "UPDATE idem_records SET state = ?2, lease_until = ?3, updated_at = ?4,
                 result_expired = ?5, payload = ?6, message = ?7, downstream_ref = ?8,
                 attempts = ?9, read_backs = ?10
             WHERE key = ?1",
        )
        .and_then(|mut s| {
            s.execute(params![
                r.key.as_str(),
                r.state.as_str(),
                r.lease_until.map(sql_time),
                sql_time(r.updated_at),
                i64::from(r.result_expired),
                payload,
                r.message,
                r.downstream_ref,
                attempts,
                read_backs,
            ])
        })
        .map_err(db_err)?;
    if n == 1 {
        Ok(())
    } else {
        Err(StoreError::Backend(format!(
            "SQLite settle of {} found no row to update",
            r.key.as_str()
        )))
    }
}

pub(crate) fn delete(conn: &Connection, key: &IdemKey) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM idem_records WHERE key = ?1")
        .and_then(|mut s| s.execute([key.as_str()]))
        .map_err(db_err)?;
    Ok(())
}

/// Adds `release` to the trace of `key`, keeps its last [`rules::RELEASES_KEPT`] and drops
/// every release past the tombstone window (inside the release's transaction).
pub(crate) fn put_release(
    conn: &Connection,
    inner: &Inner,
    key: &IdemKey,
    release: &ReleaseRecord,
    now: Timestamp,
) -> Result<(), StoreError> {
    let entry = serde_json::to_string(release)
        .map_err(|e| StoreError::Backend(format!("cannot encode the release: {e}")))?;
    let seq: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM idem_releases WHERE key = ?1")
        .and_then(|mut s| s.query_row([key.as_str()], |r| r.get(0)))
        .map_err(db_err)?;
    conn.prepare_cached(
        "INSERT INTO idem_releases (key, seq, released_at, entry) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut s| s.execute(params![key.as_str(), seq, sql_time(release.at), entry]))
    .map_err(db_err)?;
    let kept = i64::try_from(rules::RELEASES_KEPT).unwrap_or(i64::MAX);
    conn.prepare_cached("DELETE FROM idem_releases WHERE key = ?1 AND seq <= ?2")
        .and_then(|mut s| s.execute(params![key.as_str(), seq - kept]))
        .map_err(db_err)?;
    drop_lapsed_releases(conn, inner, now)?;
    Ok(())
}

/// Deletes every release past the tombstone window; returns how many.
pub(crate) fn drop_lapsed_releases(
    conn: &Connection,
    inner: &Inner,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    conn.prepare_cached("DELETE FROM idem_releases WHERE released_at <= ?1")
        .and_then(|mut s| s.execute([cut]))
        .map_err(db_err)
}

/// The releases of `key` inside the tombstone window, oldest first.
pub(crate) fn load_releases(
    conn: &Connection,
    inner: &Inner,
    key: &IdemKey,
    now: Timestamp,
) -> Result<Vec<ReleaseRecord>, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    let mut stmt = conn
        .prepare_cached(
            "SELECT entry FROM idem_releases WHERE key = ?1 AND released_at > ?2 ORDER BY seq",
        )
        .map_err(db_err)?;
    let mut rows = stmt.query(params![key.as_str(), cut]).map_err(db_err)?;
    let mut out: Vec<ReleaseRecord> = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        let entry: String = row.get(0).map_err(db_err)?;
        out.push(
            serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                key: key.as_str().to_owned(),
                detail: format!("a release trace entry does not decode: {e}"),
            })?,
        );
    }
    rules::keep_releases(&mut out, now, &inner.retention);
    Ok(out)
}

/// A page of every key's releases inside the tombstone window, in `(released_at, key)`
/// order after `after` (a range on `idem_releases_by_time`).
pub(crate) fn list_release_rows(
    conn: &Connection,
    inner: &Inner,
    after: Option<&ListCursor>,
    limit: usize,
    now: Timestamp,
) -> Result<Vec<ReleaseRecord>, StoreError> {
    let cut = sql_time(now).saturating_sub(millis(inner.retention.tombstones));
    let (at, key) = match after {
        Some(c) => (sql_time(c.created_at), c.key.as_str().to_owned()),
        None => (i64::MIN, String::new()),
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn
        .prepare_cached(
            "SELECT key, entry FROM idem_releases
             WHERE released_at > ?1 AND (released_at, key) > (?2, ?3)
             ORDER BY released_at, key, seq LIMIT ?4",
        )
        .map_err(db_err)?;
    let mut rows = stmt.query(params![cut, at, key, limit]).map_err(db_err)?;
    let mut out: Vec<ReleaseRecord> = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        let key: String = row.get(0).map_err(db_err)?;
        let entry: String = row.get(1).map_err(db_err)?;
        out.push(
            serde_json::from_str(&entry).map_err(|e| StoreError::Corrupt {
                key: key.clone(),
                detail: format!("a release trace entry does not decode: {e}"),
            })?,
        );
    }
    Ok(out)
}

/// Milliseconds as SQLite's signed integer. Times past year 292 million (a `Duration::MAX`
/// lease) are stored as `i64::MAX`: still "never" in practice.
pub(crate) fn sql_time(t: Timestamp) -> i64 {
    sql::millis(t)
}

pub(crate) fn millis(d: Duration) -> i64 {
    sql::duration_millis(d)
}

/// Decodes a row selected with [`COLUMNS`]. Anything unexpected is [`StoreError::Corrupt`].
pub(crate) fn decode(row: &Row<'_>) -> Result<Record, StoreError> {
    let raw_key = match row.get_ref(0) {
        Ok(ValueRef::Text(t)) => String::from_utf8_lossy(t).into_owned(),
        Ok(other) => format!("<{:?} key>", other.data_type()),
        Err(e) => format!("<unreadable key: {e}>"),
    };
    decode_fields(row).map_err(|detail| StoreError::Corrupt {
        key: raw_key,
        detail,
    })
}

pub(crate) fn decode_fields(row: &Row<'_>) -> Result<Record, String> {
    let result_expired = match int(row, 8, "result_expired")? {
        0 => false,
        1 => true,
        n => return Err(format!("result_expired: {n} is not 0 or 1")),
    };
    Columns {
        key: text(row, 0, "key")?,
        state: text(row, 1, "state")?,
        fingerprint: text(row, 2, "fingerprint")?,
        tool: text(row, 3, "tool")?,
        token: text(row, 4, "token")?,
        lease_until: opt_int(row, 5, "lease_until")?,
        created_at: int(row, 6, "created_at")?,
        updated_at: int(row, 7, "updated_at")?,
        result_expired,
        payload: opt_text(row, 9, "payload")?,
        message: opt_text(row, 10, "message")?,
        downstream_ref: opt_text(row, 11, "downstream_ref")?,
        attempts: text(row, 12, "attempts")?,
        operation: opt_text(row, 13, "operation")?,
        read_backs: text(row, 14, "read_backs")?,
    }
    .decode()
}

pub(crate) fn value<'r>(row: &'r Row<'_>, i: usize, name: &str) -> Result<ValueRef<'r>, String> {
    row.get_ref(i).map_err(|e| format!("{name}: {e}"))
}

pub(crate) fn text<'r>(row: &'r Row<'_>, i: usize, name: &str) -> Result<&'r str, String> {
    opt_text(row, i, name)?.ok_or_else(|| format!("{name}: NULL"))
}

pub(crate) fn opt_text<'r>(
    row: &'r Row<'_>,
    i: usize,
    name: &str,
) -> Result<Option<&'r str>, String> {
    match value(row, i, name)? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(t) => std::str::from_utf8(t)
            .map(Some)
            .map_err(|_| format!("{name}: not UTF-8")),
        other => Err(format!(
            "{name}: {:?} where text belongs",
            other.data_type()
        )),
    }
}

pub(crate) fn int(row: &Row<'_>, i: usize, name: &str) -> Result<i64, String> {
    opt_int(row, i, name)?.ok_or_else(|| format!("{name}: NULL"))
}

pub(crate) fn opt_int(row: &Row<'_>, i: usize, name: &str) -> Result<Option<i64>, String> {
    match value(row, i, name)? {
        ValueRef::Null => Ok(None),
        ValueRef::Integer(n) => Ok(Some(n)),
        other => Err(format!(
            "{name}: {:?} where an integer belongs",
            other.data_type()
        )),
    }
}
/// One page of a listing. The index `idem_records_by_state (state, created_at, key)` serves
/// both forms: the row-value comparison is a range on it, so a page costs `limit` rows,
/// however deep into the state it starts.
pub(crate) fn list_rows(
    conn: &Connection,
    state: RecordState,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<Vec<Record>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt;
    let mut rows = match after {
        None => {
            stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM idem_records WHERE state = ?1
                     ORDER BY created_at, key LIMIT ?2"
                ))
                .map_err(db_err)?;
            stmt.query(params![state.as_str(), limit]).map_err(db_err)?
        }
        Some(c) => {
            stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM idem_records
                     WHERE state = ?1 AND (created_at, key) > (?2, ?3)
                     ORDER BY created_at, key LIMIT ?4"
                ))
                .map_err(db_err)?;
            stmt.query(params![
                state.as_str(),
                sql_time(c.created_at),
                c.key.as_str(),
                limit
            ])
            .map_err(db_err)?
        }
    };
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db_err)? {
        out.push(decode(row)?);
    }
    Ok(out)
}
