//! For backend authors (feature `sql`): a record's columns as the SQL stores keep them, and
//! the one decoder both use.
//!
//! `idem-sqlite` and `idem-postgres` store a record in the same fifteen columns (key,
//! state, fingerprint, tool, token, lease, times, result, evidence, operation). Each reads
//! its own row types (SQLite's dynamic values, Postgres's typed columns) into [`Columns`];
//! [`Columns::decode`] turns them into a [`Record`], so what counts as a well-formed record
//! is decided once. Anything it refuses is meant to become
//! [`StoreError::Corrupt`](crate::store::StoreError::Corrupt): a row that does not decode
//! never frees its key.

use std::time::Duration;

use crate::identity::{Fingerprint, IdemKey};
use crate::store::{
    AttemptRecord, ClaimToken, Operation, ReadBackRecord, Record, RecordState, Timestamp,
};

/// A record's columns as read from a row, before any of them is parsed.
///
/// Times are milliseconds since the Unix epoch, JSON columns are text.
#[derive(Clone, Copy, Debug)]
pub struct Columns<'a> {
    /// `key`: the key's text form.
    pub key: &'a str,
    /// `state`: [`RecordState::as_str`].
    pub state: &'a str,
    /// `fingerprint`: 64 hex digits.
    pub fingerprint: &'a str,
    /// `tool`.
    pub tool: &'a str,
    /// `token`: 32 hex digits.
    pub token: &'a str,
    /// `lease_until`: required for a running record.
    pub lease_until: Option<i64>,
    /// `created_at`.
    pub created_at: i64,
    /// `updated_at`.
    pub updated_at: i64,
    /// `result_expired`.
    pub result_expired: bool,
    /// `payload`: JSON.
    pub payload: Option<&'a str>,
    /// `message`.
    pub message: Option<&'a str>,
    /// `downstream_ref`.
    pub downstream_ref: Option<&'a str>,
    /// `attempts`: a JSON array of [`AttemptRecord`].
    pub attempts: &'a str,
    /// `operation`: a JSON [`Operation`].
    pub operation: Option<&'a str>,
    /// `read_backs`: a JSON array of [`ReadBackRecord`].
    pub read_backs: &'a str,
}

impl Columns<'_> {
    /// The record these columns hold, or what is wrong with them (naming the column).
    pub fn decode(&self) -> Result<Record, String> {
        let key = IdemKey::parse(self.key).map_err(|e| format!("key: {e}"))?;
        let state = RecordState::parse(self.state)
            .ok_or_else(|| format!("state: unknown state {:?}", self.state))?;
        let fingerprint =
            Fingerprint::from_hex(self.fingerprint).ok_or("fingerprint: not 64 hex digits")?;
        let token = ClaimToken::from_hex(self.token).ok_or("token: not 32 hex digits")?;
        let lease_until = self.lease_until.map(time).transpose()?;
        let created_at = time(self.created_at)?;
        let updated_at = time(self.updated_at)?;
        let payload = self
            .payload
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("payload: not JSON ({e})"))?;
        let attempts: Vec<AttemptRecord> =
            serde_json::from_str(self.attempts).map_err(|e| format!("attempts: {e}"))?;
        let operation: Option<Operation> = self
            .operation
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("operation: {e}"))?;
        let read_backs: Vec<ReadBackRecord> =
            serde_json::from_str(self.read_backs).map_err(|e| format!("read_backs: {e}"))?;
        if state == RecordState::Running && lease_until.is_none() {
            // It would never expire: the key would be in flight forever.
            return Err("running without a lease".to_owned());
        }
        Ok(Record {
            key,
            fingerprint,
            tool: self.tool.into(),
            state,
            token,
            lease_until,
            created_at,
            updated_at,
            payload,
            message: self.message.map(str::to_owned),
            downstream_ref: self.downstream_ref.map(str::to_owned),
            result_expired: self.result_expired,
            attempts,
            operation,
            read_backs,
        })
    }
}

/// A time column's milliseconds as a [`Timestamp`]; a negative one is refused.
pub fn time(ms: i64) -> Result<Timestamp, String> {
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| format!("negative time {ms}"))
}

/// A [`Timestamp`] as a time column's milliseconds (saturating: a time past year 292
/// million is stored as the largest one).
pub fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// A duration in milliseconds, as SQL arithmetic on time columns takes it (saturating).
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
