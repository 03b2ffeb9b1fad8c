//! For backend authors: what an [`IdemStore`](super::IdemStore) implementation needs and a
//! tool author never touches.
//!
//! A tool author sees records, keys, clocks and [`StoreError`](super::StoreError); a backend
//! sees, besides, the requests and answers of the contract ([`ClaimRequest`],
//! [`ClaimOutcome`], [`Settlement`]), the contract's transitions as pure functions
//! ([`rules`]), and the pieces the backends of this workspace share: the column codec of the
//! SQL stores ([`sql`], feature `sql`) and the TLS material of the network stores ([`tls`],
//! feature `tls`). The backends (`idem-sqlite`, `idem-redis`, `idem-postgres`) are crates
//! of their own built on this module alone; a new backend is written the same way and
//! proved with the conformance suite (`idem_runtime::store::conformance`, feature
//! `testing`).
//!
//! The codec and the TLS material live here, behind features, rather than in crates of their
//! own: each is a few hundred lines that decide what the contract means for stored data
//! (which rows are records, which certificates a store accepts), they change with the
//! record and the store errors defined beside them, and a crate of their own would be one
//! more published crate every backend pins to the same version anyway. `sql` costs no
//! dependency; `tls` brings rustls only to builds that ask for TLS.

use std::sync::Arc;
use std::time::Duration;

use super::{ClaimToken, OperationDraft, Record};
use crate::identity::{Fingerprint, IdemKey};

pub mod rules;
#[cfg(feature = "sql")]
pub mod sql;
mod sweeper;
#[cfg(feature = "tls")]
pub mod tls;

pub use super::clock::deadline_after;

/// `value`'s text as a log field: whole up to 256 bytes, else cut at a character boundary
/// with the count of bytes left out (a huge value is measured, never copied). For what a
/// backend logs of data it read back, whose size nobody bounded: a corrupt record's key, a
/// decoder's error quoting it.
///
/// ```
/// use idem_runtime::store::backend::log_field;
/// let key = "k".repeat(10_000);
/// assert_eq!(log_field(&key), format!("{}… (9744 more bytes)", "k".repeat(256)));
/// assert_eq!(log_field(&"idem:ab12"), "idem:ab12");
/// ```
pub fn log_field(value: &dyn std::fmt::Display) -> String {
    crate::observe::field(value)
}
pub use super::record::Settlement;
pub use sweeper::{SweepTask, DEFAULT_SWEEP_EVERY};

/// A request to claim a key.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The operation's key.
    pub key: IdemKey,
    /// Fingerprint of its arguments.
    pub fingerprint: Fingerprint,
    /// The tool's name (kept in the record for operators). Shared: the registry hands every
    /// claim of a tool the same allocation.
    pub tool: Arc<str>,
    /// How long the claim holds without renewal.
    pub lease: Duration,
    /// What was asked for, saved with the claim so a reconciler or a person can act on it
    /// even if this worker dies before it settles. A draft: the store builds the
    /// [`Operation`](crate::store::Operation) it keeps ([`OperationDraft::to_operation`]) only when the claim is won,
    /// so a repeat that finds the key claimed builds nothing.
    pub operation: Option<OperationDraft>,
}

/// What a claim found.
///
/// The record comes shared: a store that keeps its records in memory hands back the one it
/// holds (a replay copies nothing but the saved result), and a store that reads a row
/// wraps the record it decoded in [`Arc::new`].
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimOutcome {
    /// The key was free; the caller holds it and must settle or release it.
    Claimed(ClaimToken),
    /// A record with the same fingerprint exists; its state says what to tell the caller.
    Existing(Arc<Record>),
    /// A record with this key but another fingerprint exists: same key, changed parameters.
    Mismatch(Arc<Record>),
}
