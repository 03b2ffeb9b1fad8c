//! Rows and records: a row's columns decoded through the column codec shared with SQLite
//! ([`sql::Columns`]), parameters encoded, driver errors mapped to [`StoreError`].

use idem_runtime::store::backend::sql::{self, Columns};
use idem_runtime::store::{Record, StoreError, Timestamp};
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

/// A count for an `int4` parameter (past its range: its largest value, which no cap admits).
pub(crate) fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(crate) fn ms(t: Timestamp) -> i64 {
    sql::millis(t)
}

/// PostgreSQL text cannot hold NUL; a message with one is kept with U+FFFD in its place.
pub(crate) fn pg_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// `e` and every error below it, `: `-separated. tokio-postgres's own text names only the
/// step that failed ("error performing TLS handshake", "db error"); the reason (a
/// certificate signed by an unknown CA, the server's `pg_hba.conf` refusal) is its source.
pub(crate) fn chain(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

pub(crate) fn pg_err(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().cloned();
    let e = chain(&e);
    match code.as_ref() {
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE => StoreError::Backend(
            "the record is locked by a transaction still in progress \
             (a transactional handler that is still running)"
                .into(),
        ),
        Some(c)
            if c.code().starts_with("08")
                || *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Unavailable(format!("postgres: {e}"))
        }
        Some(_) => StoreError::Backend(format!("postgres: {e}")),
        // No SQLSTATE: the connection broke, timed out or could not be made.
        None => StoreError::Unavailable(format!("postgres: {e}")),
    }
}

pub(crate) fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StoreError::Unavailable(format!("postgres pool: {other}")),
    }
}

/// Decodes a record from `row`'s columns starting at `at` (in [`COLUMNS`] order); `None`
/// when the key column is NULL (an outer join that found nothing). The flag is `tx_effect`.
pub(crate) fn decode(row: &Row, at: usize) -> Result<Option<(Record, bool)>, StoreError> {
    let raw_key: Option<String> = row.try_get(at).map_err(|e| StoreError::Corrupt {
        key: "?".into(),
        detail: e.to_string(),
    })?;
    let Some(raw_key) = raw_key else {
        return Ok(None);
    };
    let corrupt = |detail: String| StoreError::Corrupt {
        key: raw_key.clone(),
        detail,
    };
    let col = |i: usize| at + i;
    macro_rules! get {
        ($i:expr, $t:ty) => {
            row.try_get::<_, $t>(col($i))
                .map_err(|e| corrupt(format!("column {}: {e}", $i)))?
        };
    }
    let lease_until = get!(5, Option<i64>);
    let payload = get!(8, Option<String>);
    let message = get!(9, Option<String>);
    let downstream_ref = get!(10, Option<String>);
    let operation = get!(14, Option<String>);
    let record = Columns {
        key: &raw_key,
        fingerprint: &get!(1, String),
        tool: &get!(2, String),
        state: &get!(3, String),
        token: &get!(4, String),
        lease_until,
        created_at: get!(6, i64),
        updated_at: get!(7, i64),
        payload: payload.as_deref(),
        message: message.as_deref(),
        downstream_ref: downstream_ref.as_deref(),
        result_expired: get!(11, bool),
        attempts: &get!(12, String),
        operation: operation.as_deref(),
        read_backs: &get!(15, String),
    }
    .decode()
    .map_err(corrupt)?;
    let tx_effect = get!(13, bool);
    Ok(Some((record, tx_effect)))
}

pub(crate) fn decode_some(row: &Row) -> Result<(Record, bool), StoreError> {
    decode(row, 0)?.ok_or_else(|| StoreError::Corrupt {
        key: "?".into(),
        detail: "a row without a key".into(),
    })
}

pub(crate) fn to_json<T: serde::Serialize + ?Sized>(
    v: &T,
    what: &str,
) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(format!("{what}: {e}")))
}
