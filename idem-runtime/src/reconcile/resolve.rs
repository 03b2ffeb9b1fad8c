//! A person's decision on an escalated (or unknown, or pending) operation.

use std::time::Duration;

use serde_json::Value;

use crate::identity::IdemKey;
use crate::registry::Registry;
use crate::store::{
    IdemStore, Record, RecordState, ReleaseNote, Settlement, StoreError, Timestamp,
};
use crate::tool::{ToolSpec, MAX_DEFAULT_IN_FLIGHT_BOUND};

use super::plan::{settled_by, Facts, Limits};

/// What a person decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolution {
    /// The effect happened: settle as completed. Repeats replay `output`.
    Completed {
        /// The downstream's id for the effect.
        downstream_ref: String,
        /// The result repeats get (default: `{"downstream_ref": …}`).
        output: Option<Value>,
    },
    /// The effect failed terminally: settle as failed.
    Failed {
        /// Why.
        reason: String,
    },
    /// The effect did not happen: free the key so the intent may run again. The store keeps
    /// a trace of the release (who, when, the note and the record as it was; see
    /// [`IdemStore::releases`]).
    ///
    /// Refused with [`ResolveError::MayStillLand`] while a send of the record may still
    /// land downstream: until the last send's start + the tool's timeout + twice its
    /// in-flight bound, the rule the reconciler frees keys by (a timed-out handler may
    /// still be running, and commit, until then). Freeing the key earlier lets a repeat run
    /// the handler while the first send can still commit: the duplicate the reconciler
    /// refuses. [`Resolution::ForceRelease`] frees it anyway.
    Release,
    /// A release inside the in-flight bound: for a person who knows the first send will
    /// not land (the downstream's operator said it was dropped). `reason` says how they
    /// know; the release trace keeps it, marked as forced, with the time the bound ends
    /// ([`ReleaseNote::forced`]).
    ForceRelease {
        /// How the person knows the first send will not land (must say something).
        reason: String,
    },
}

/// Why a resolution was refused.
#[derive(Debug)]
pub enum ResolveError {
    /// No record for the key.
    NotFound(IdemKey),
    /// The record is running, completed or failed: nothing for a person to decide.
    NotResolvable {
        /// The key.
        key: IdemKey,
        /// Its state.
        state: RecordState,
    },
    /// A release inside the in-flight bound: a send of the record may still land until
    /// `until`. Release after it, or force it ([`Resolution::ForceRelease`]).
    MayStillLand {
        /// The key.
        key: IdemKey,
        /// When no send of the record can land any more.
        until: Timestamp,
    },
    /// A forced release without a reason.
    NoReason,
    /// A completed resolution whose output nests deeper than the stores keep (as deep as a
    /// call's arguments may: the registry's `MAX_ARGS_DEPTH`).
    OutputTooDeep {
        /// The deepest nesting kept.
        limit: usize,
    },
    /// The store failed, or the record changed under us (try again).
    Store(StoreError),
}

impl std::fmt::Display for ResolveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResolveError::NotFound(key) => write!(f, "no record for {key}"),
            ResolveError::NotResolvable { key, state } => write!(
                f,
                "{key} is {state}; only unknown, pending or escalated records can be resolved"
            ),
            ResolveError::MayStillLand { key, until } => write!(
                f,
                "{key} may still be committed downstream until {until} (a timed-out send can \
                 land until its in-flight bound has passed); release it after that, or force it \
                 with a reason if you know the send will not land"
            ),
            ResolveError::NoReason => {
                f.write_str("a forced release needs a reason (it is kept in the release trace)")
            }
            ResolveError::OutputTooDeep { limit } => write!(
                f,
                "the output nests deeper than {limit} levels, more than a record can keep; give \
                 a flatter one"
            ),
            ResolveError::Store(e) => std::fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for ResolveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the store error's own source.
            ResolveError::Store(e) => std::error::Error::source(e),
            _ => None,
        }
    }
}

impl From<StoreError> for ResolveError {
    fn from(e: StoreError) -> Self {
        ResolveError::Store(e)
    }
}

/// Settles an unknown, pending or escalated record as a person decided. Returns the record
/// as it is afterwards (`None` after a release).
///
/// The same as [`resolve_as`] by `"a person"`: say who with that function.
pub async fn resolve(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    note: &str,
) -> Result<Option<Record>, ResolveError> {
    resolve_as(store, key, resolution, "a person", note).await
}

/// Settles an unknown, pending or escalated record as `operator` decided, for the reason
/// `note`. Returns the record as it is afterwards (`None` after a release).
///
/// Without the record's tool at hand, a [`Resolution::Release`] assumes the largest timeout
/// and in-flight bound the defaults give ([`MAX_DEFAULT_IN_FLIGHT_BOUND`] each): a key is
/// freed 90 minutes after the last send at the earliest. [`resolve_in`] uses what the
/// record's tool declares instead; use it for a tool that declares a longer bound.
///
/// Completed and failed records keep `resolved by OPERATOR: NOTE` as their message. A
/// release frees the key and keeps a trace in the store, with the operator, the note, the
/// time and the record as it was ([`IdemStore::release_unsettled`]), in one atomic step: a
/// record that changed since it was read (a reconciler settled it meanwhile) is refused
/// with [`StoreError::StaleToken`] and nothing is freed.
pub async fn resolve_as(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    operator: &str,
    note: &str,
) -> Result<Option<Record>, ResolveError> {
    resolve_with(store, key, resolution, operator, note, |record| {
        release_safe_at(record, None)
    })
    .await
}

/// [`resolve_as`] on `registry`'s store, with the in-flight bound of the record's tool as
/// `registry` declares it ([`ToolSpec::effective_in_flight_bound`], the reconciler's rule).
/// A record whose tool `registry` does not know is held to [`resolve_as`]'s assumption.
pub async fn resolve_in(
    registry: &Registry,
    key: &IdemKey,
    resolution: Resolution,
    operator: &str,
    note: &str,
) -> Result<Option<Record>, ResolveError> {
    resolve_with(
        &**registry.store(),
        key,
        resolution,
        operator,
        note,
        |record| releasable_at(registry, record),
    )
    .await
}

/// When a [`Resolution::Release`] of `record` through [`resolve_in`] on `registry` stops
/// being refused: no send of it can land after this, by the in-flight bound of its tool as
/// `registry` declares it (else by the largest defaults, as [`resolve_as`] assumes).
pub fn releasable_at(registry: &Registry, record: &Record) -> Timestamp {
    let default_bound = registry.executor().default_in_flight_bound;
    let facts = registry
        .get(&record.tool)
        .map(|t| Facts::of(t.spec(), default_bound, NO_LIMITS, None));
    release_safe_at(record, facts)
}

/// Limits a release's bound does not read.
const NO_LIMITS: Limits = Limits {
    max_retries: 0,
    patience: Duration::ZERO,
    max_failed_read_backs: 0,
};

/// When no send of `record` can land any more, by its tool's `facts` when known, else by
/// the largest defaults.
fn release_safe_at(record: &Record, facts: Option<Facts>) -> Timestamp {
    let facts = facts.unwrap_or_else(|| {
        let assumed = ToolSpec::new("unknown")
            .timeout(MAX_DEFAULT_IN_FLIGHT_BOUND)
            .in_flight_bound(MAX_DEFAULT_IN_FLIGHT_BOUND);
        Facts::of(&assumed, None, NO_LIMITS, None)
    });
    settled_by(record, &facts)
}

async fn resolve_with(
    store: &dyn IdemStore,
    key: &IdemKey,
    resolution: Resolution,
    operator: &str,
    note: &str,
    releasable_at: impl FnOnce(&Record) -> Timestamp,
) -> Result<Option<Record>, ResolveError> {
    if let Resolution::ForceRelease { reason } = &resolution {
        if reason.trim().is_empty() {
            return Err(ResolveError::NoReason);
        }
    }
    let record = store
        .get(key)
        .await?
        .ok_or_else(|| ResolveError::NotFound(key.clone()))?;
    if !matches!(
        record.state,
        RecordState::Unknown | RecordState::Pending | RecordState::Escalated
    ) {
        return Err(ResolveError::NotResolvable {
            key: key.clone(),
            state: record.state,
        });
    }
    let by = if note.is_empty() {
        format!("resolved by {operator}")
    } else {
        format!("resolved by {operator}: {note}")
    };
    let settlement = match resolution {
        Resolution::Release | Resolution::ForceRelease { .. } => {
            let until = releasable_at(&record);
            let trace = match &resolution {
                Resolution::ForceRelease { reason } if store.clock().now() < until => {
                    ReleaseNote::forced(operator, note, reason.trim(), until)
                }
                _ if store.clock().now() < until => {
                    return Err(ResolveError::MayStillLand {
                        key: key.clone(),
                        until,
                    })
                }
                _ => ReleaseNote::new(operator, note),
            };
            // One atomic step: no takeover first, so the trace holds the record exactly as
            // the person saw it, and a record that moved on since is refused, not freed.
            store.release_unsettled(key, record.token, &trace).await?;
            tracing::info!(key = %key, tool = %record.tool,
                operator = %crate::observe::field(&operator), note = %crate::observe::field(&trace.note),
                "released by a person; the intent may run again (the store keeps the release)");
            return Ok(None);
        }
        Resolution::Completed {
            downstream_ref,
            output,
        } => {
            let output =
                output.unwrap_or_else(|| serde_json::json!({ "downstream_ref": downstream_ref }));
            let limit = crate::identity::OUTPUT_DEPTH_LIMIT;
            if crate::identity::nests_deeper_than(&output, limit) {
                return Err(ResolveError::OutputTooDeep { limit });
            }
            Settlement::new(RecordState::Completed)
                .payload(output)
                .downstream_ref(downstream_ref)
                .message(by)
        }
        Resolution::Failed { reason } => {
            Settlement::new(RecordState::Failed).message(format!("{reason} ({by})"))
        }
    };
    let token = store
        .reclaim(key, record.token, Duration::from_secs(60))
        .await?;
    store.settle(key, token, settlement).await?;
    Ok(store.get(key).await?)
}
