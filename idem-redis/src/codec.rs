//! Hashes and records: a record's hash (as `HGETALL` returns it) decoded, a settlement's
//! arguments encoded, the script's replies and Redis's errors mapped to [`StoreError`].

use std::collections::HashMap;
use std::time::Duration;

use ::redis::{ErrorKind, RedisError, Value};
use idem_runtime::identity::{Fingerprint, IdemKey};
use idem_runtime::store::backend::Settlement;
use idem_runtime::store::{
    AttemptRecord, ClaimToken, Operation, ReadBackRecord, Record, RecordState, StoreError,
    Timestamp,
};

/// A release as the script stores it: the record is its hash, as `HGETALL` returned it.
#[derive(serde::Deserialize)]
pub(crate) struct StoredRelease {
    pub(crate) at: String,
    pub(crate) by: String,
    pub(crate) note: String,
    pub(crate) record: Vec<String>,
}

pub(crate) fn to_json<T: serde::Serialize + ?Sized>(
    v: &T,
    what: &str,
) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Backend(format!("{what}: {e}")))
}

/// A duration for the script, in milliseconds, capped at 2^52 (about 140 000 years, so
/// "forever" still means forever). Lua numbers are doubles: a lease end or an expiry past
/// 2^53 would lose precision, read back as a time that does not fit, or overflow Redis's
/// `PEXPIRE` after the script had already written the record.
pub(crate) fn millis(d: Duration) -> u64 {
    const MAX: u64 = 1 << 52;
    u64::try_from(d.as_millis()).map_or(MAX, |ms| ms.min(MAX))
}

pub(crate) fn unexpected(op: &str, reply: &Value) -> StoreError {
    StoreError::Backend(format!(
        "unexpected reply to the idem {op} script: {reply:?}"
    ))
}

pub(crate) fn map_err(e: RedisError) -> StoreError {
    if e.code() == Some("IDEMCORRUPT") {
        let detail = e.detail().unwrap_or_default();
        let (key, detail) = detail.split_once(' ').unwrap_or((detail, ""));
        return StoreError::Corrupt {
            key: key.to_owned(),
            detail: detail.to_owned(),
        };
    }
    let unavailable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::BusyLoadingError | ErrorKind::MasterDown | ErrorKind::ReadOnly
        );
    if unavailable {
        StoreError::Unavailable(format!("redis: {e}"))
    } else {
        StoreError::Backend(format!("redis: {e}"))
    }
}

/// The first element of a reply, as text.
pub(crate) fn tag(items: &[Value]) -> Option<&str> {
    match items.first() {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok(),
        Some(Value::SimpleString(s)) => Some(s),
        _ => None,
    }
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The stale-token error a script reported, or an unexpected-reply error.
pub(crate) fn refusal(key: &IdemKey, op: &str, items: &[Value]) -> StoreError {
    match (tag(items), items.get(1).and_then(text)) {
        (Some("stale"), Some(state)) => StoreError::StaleToken {
            key: key.clone(),
            state,
        },
        (Some("invalid"), _) => {
            StoreError::Backend("a settlement cannot return a record to running".into())
        }
        _ => unexpected(op, &Value::Array(items.to_vec())),
    }
}

/// A settle's arguments to the script (ARGV[6..12]: token, state, payload, message,
/// downstream ref, attempts, read-backs), shared by `settle` and `release_traced`.
pub(crate) fn settle_args(token: ClaimToken, s: &Settlement) -> Result<[Vec<u8>; 7], StoreError> {
    let payload = match &s.payload {
        Some(p) => Some(to_json(p, "payload")?),
        None => None,
    };
    Ok([
        token.to_hex().into_bytes(),
        s.state.as_str().as_bytes().to_vec(),
        opt_arg(payload.as_deref()),
        opt_arg(s.message.as_deref()),
        opt_arg(s.downstream_ref.as_deref()),
        to_json(&s.attempts, "attempts")?.into_bytes(),
        to_json(&s.read_backs, "read-backs")?.into_bytes(),
    ])
}

/// `Some(v)` → `+v`, `None` → `-`: how the script tells "empty" from "absent".
pub(crate) fn opt_arg(v: Option<&str>) -> Vec<u8> {
    match v {
        Some(s) => {
            let mut out = Vec::with_capacity(s.len() + 1);
            out.push(b'+');
            out.extend_from_slice(s.as_bytes());
            out
        }
        None => b"-".to_vec(),
    }
}

/// Parses an `HGETALL` reply into a record.
pub(crate) fn decode_record(fields: &Value, record_prefix: &str) -> Result<Record, StoreError> {
    let Value::Array(items) = fields else {
        return Err(StoreError::Corrupt {
            key: "?".into(),
            detail: format!("expected a hash, got {fields:?}"),
        });
    };
    let mut map: HashMap<String, String> = HashMap::with_capacity(items.len() / 2);
    for pair in items.chunks(2) {
        let (Some(f), Some(v)) = (pair.first().and_then(text), pair.get(1).and_then(text)) else {
            return Err(StoreError::Corrupt {
                key: "?".into(),
                detail: "a field is not UTF-8 text".into(),
            });
        };
        map.insert(f, v);
    }
    let raw_key = map.get("k").cloned().unwrap_or_default();
    let corrupt = |detail: String| StoreError::Corrupt {
        key: format!("{record_prefix}{raw_key}"),
        detail,
    };
    let field = |name: &str| {
        map.get(name)
            .map(String::as_str)
            .ok_or_else(|| corrupt(format!("missing field `{name}`")))
    };
    let time = |name: &str| -> Result<Timestamp, StoreError> {
        field(name)?
            .parse::<u64>()
            .map(Timestamp)
            .map_err(|_| corrupt(format!("field `{name}` is not a time")))
    };
    let key = IdemKey::parse(field("k")?).map_err(|e| corrupt(e.to_string()))?;
    let fingerprint = Fingerprint::from_hex(field("fp")?)
        .ok_or_else(|| corrupt("malformed fingerprint".into()))?;
    let state = RecordState::parse(field("st")?)
        .ok_or_else(|| corrupt(format!("unknown state `{}`", map["st"])))?;
    let token =
        ClaimToken::from_hex(field("tok")?).ok_or_else(|| corrupt("malformed token".into()))?;
    let lease_until = match map.get("lease") {
        Some(_) => Some(time("lease")?),
        None => None,
    };
    let payload = match map.get("pl") {
        Some(p) => Some(
            serde_json::from_str(p).map_err(|e| corrupt(format!("payload is not JSON: {e}")))?,
        ),
        None => None,
    };
    let attempts: Vec<AttemptRecord> = serde_json::from_str(field("att")?)
        .map_err(|e| corrupt(format!("malformed attempts: {e}")))?;
    let read_backs: Vec<ReadBackRecord> = serde_json::from_str(field("rb")?)
        .map_err(|e| corrupt(format!("malformed read-backs: {e}")))?;
    let operation: Option<Operation> = match map.get("op") {
        Some(op) => Some(
            serde_json::from_str(op).map_err(|e| corrupt(format!("malformed operation: {e}")))?,
        ),
        None => None,
    };
    Ok(Record {
        key,
        fingerprint,
        tool: field("tool")?.into(),
        state,
        token,
        lease_until,
        created_at: time("ca")?,
        updated_at: time("ua")?,
        payload,
        message: map.get("msg").cloned(),
        downstream_ref: map.get("dref").cloned(),
        result_expired: map.get("rx").map(String::as_str) == Some("1"),
        attempts,
        operation,
        read_backs,
    })
}
