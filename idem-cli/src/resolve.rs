//! `idem resolve`: a person's decision, signed and kept.
//!
//! The runtime's record has no field for who resolved it, so the CLI signs the note it
//! passes to [`idem_runtime::reconcile::resolve_in`]: the record's reason then reads
//! `resolved by a person: NOTE (by OPERATOR at TIME)`. A release frees the key and the
//! store keeps a trace of it, with the operator and the note ([`IdemStore::releases`];
//! `idem show KEY` prints it). Before releasing, the CLI also writes the whole record, with
//! the operator, note and time, to stderr as one JSON line, for a log kept outside the store.
//! A release while a send of the record may still land is refused, saying until when,
//! unless `--force REASON` says how the operator knows it will not (the trace keeps it).

use idem_runtime::reconcile::{releasable_at, resolve_in, Resolution, ResolveError};
use idem_runtime::{
    identity::IdemKey,
    registry::Registry,
    store::{Record, RecordState},
};
use serde::Serialize;

use crate::escape::{needs_escape, Esc};
use crate::output;

/// A resolution whose input has been checked; nothing is touched until [`Request::apply`].
pub(crate) struct Request {
    key: IdemKey,
    resolution: Resolution,
    note: String,
    operator: String,
}

impl Request {
    /// Checks the command line: a key, exactly one decision, valid `--output` JSON, a note
    /// that says something, and a name for who decides (`--operator`, else
    /// `IDEM_OPERATOR` through clap, else `$USER`).
    pub(crate) fn check(
        key: &str,
        completed: Option<String>,
        output: Option<&str>,
        failed: Option<String>,
        (release, force): (bool, Option<String>),
        note: &str,
        operator: Option<String>,
    ) -> Result<Request, String> {
        let key = IdemKey::parse(key).map_err(|e| e.to_string())?;
        let output = match output.map(serde_json::from_str) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(e)) => return Err(format!("--output is not valid JSON: {e}")),
        };
        // An empty id or reason is a slip (an unset shell variable), not a decision: the
        // record would be settled for good with nothing a later reader can check.
        if completed.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err("--completed needs the downstream's id for the effect".into());
        }
        if failed.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err("--failed needs the reason the effect failed".into());
        }
        if force.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err("--force needs the reason you know the send will not land".into());
        }
        let resolution = match (completed, failed, release) {
            (Some(downstream_ref), None, false) => Resolution::Completed {
                downstream_ref,
                output,
            },
            (None, Some(reason), false) => Resolution::Failed { reason },
            (None, None, true) => match force {
                Some(reason) => Resolution::ForceRelease {
                    reason: reason.trim().to_owned(),
                },
                None => Resolution::Release,
            },
            _ => {
                return Err("say exactly one of --completed REF, --failed REASON, --release".into())
            }
        };
        let note = note.trim();
        if note.is_empty() {
            return Err("--note must say why (it is kept with the decision)".into());
        }
        let operator = operator
            .filter(|o| !o.trim().is_empty())
            .or_else(|| std::env::var("USER").ok().filter(|u| !u.trim().is_empty()))
            .ok_or("say who decides: --operator NAME (or set IDEM_OPERATOR; $USER when set)")?;
        let operator = operator.trim().to_owned();
        if operator.chars().any(needs_escape) {
            return Err("--operator must be a plain name, without control characters".into());
        }
        Ok(Request {
            key,
            resolution,
            note: note.to_owned(),
            operator,
        })
    }

    /// The key the decision is for.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn key(&self) -> &IdemKey {
        &self.key
    }

    /// Applies the decision and prints the record as it is afterwards (or the release).
    pub(crate) async fn apply(self, registry: &Registry, json: bool) -> Result<(), String> {
        // One JSON line and nothing else on stderr, so `2>>releases.jsonl` keeps exactly it.
        let decided = self
            .decide(registry, |line| eprintln!("{line}"))
            .await
            .map_err(|refusal| match refusal {
                Refusal::MayStillLand(e) => format!("{e} (--force REASON)"),
                Refusal::Other(e) => e,
            })?;
        match decided.record {
            Some(record) => output::record(&record, json),
            None => {
                // `previous` is `None` only if the record became resolvable between the
                // look before the release and the release (a race with a reconciler):
                // released all the same, without the evidence line.
                if json {
                    output::json(&ReleaseEvidence {
                        event: None,
                        key: &self.key,
                        released: Some(true),
                        operator: &self.operator,
                        note: &self.note,
                        at: &decided.at,
                        previous: decided.previous.as_ref(),
                    });
                } else {
                    println!(
                        "{} released by {}: the intent may run again (the store keeps the \
                         release and the record as it was: `idem show {}`)",
                        self.key,
                        Esc(&self.operator),
                        self.key
                    );
                }
            }
        }
        Ok(())
    }

    /// Applies the decision: the one path every front end (the CLI's `resolve`, the
    /// console's confirmed form) takes, so they cannot disagree. A release is first held to
    /// the in-flight bound, then `release_evidence` gets the record about to be released
    /// (who, when, why and the whole record, as one JSON line) for a log kept outside the
    /// store; then [`resolve_in`] settles or releases it.
    pub(crate) async fn decide(
        &self,
        registry: &Registry,
        release_evidence: impl FnOnce(String),
    ) -> Result<Decided, Refusal> {
        let store = &**registry.store();
        let at = store.clock().now().to_string();
        let release = matches!(
            self.resolution,
            Resolution::Release | Resolution::ForceRelease { .. }
        );
        // A release's trace names the operator and the time in fields of its own; a
        // settled record has only its message to say who decided.
        let (operator, signed) = if release {
            (self.operator.clone(), self.note.clone())
        } else {
            (
                "a person".to_owned(),
                format!("{} (by {} at {at})", self.note, self.operator),
            )
        };
        let previous = if release {
            self.before_release(registry, &at, release_evidence).await?
        } else {
            None
        };
        match resolve_in(
            registry,
            &self.key,
            self.resolution.clone(),
            &operator,
            &signed,
        )
        .await
        {
            Ok(record) => Ok(Decided {
                at,
                record,
                previous,
            }),
            Err(e @ ResolveError::MayStillLand { .. }) => Err(Refusal::MayStillLand(e)),
            Err(e) => Err(Refusal::Other(e.to_string())),
        }
    }

    /// Hands the record about to be released to `release_evidence`, as one JSON line.
    /// Returns it (`None` when it is not a person's to release: `resolve` says why).
    /// A release refused for the in-flight bound is refused here, before the line: the log
    /// holds only releases that were tried.
    async fn before_release(
        &self,
        registry: &Registry,
        at: &str,
        release_evidence: impl FnOnce(String),
    ) -> Result<Option<Record>, Refusal> {
        let store = &**registry.store();
        let Some(previous) = store
            .get(&self.key)
            .await
            .map_err(|e| Refusal::Other(e.to_string()))?
        else {
            return Ok(None);
        };
        if !matches!(
            previous.state,
            RecordState::Unknown | RecordState::Pending | RecordState::Escalated
        ) {
            return Ok(None);
        }
        let until = releasable_at(registry, &previous);
        if matches!(self.resolution, Resolution::Release) && store.clock().now() < until {
            return Err(Refusal::MayStillLand(ResolveError::MayStillLand {
                key: self.key.clone(),
                until,
            }));
        }
        release_evidence(output::json_line(&ReleaseEvidence {
            event: Some("release"),
            key: &self.key,
            released: None,
            operator: &self.operator,
            note: &self.note,
            at,
            previous: Some(&previous),
        }));
        Ok(Some(previous))
    }
}

/// What [`Request::decide`] did.
pub(crate) struct Decided {
    /// When, by the store's clock (the time in the signed note).
    pub(crate) at: String,
    /// The record as it is afterwards; `None` after a release (the key is free).
    pub(crate) record: Option<Record>,
    /// The record as it was before a release.
    pub(crate) previous: Option<Record>,
}

/// Why [`Request::decide`] changed nothing.
pub(crate) enum Refusal {
    /// A release while a send of the record may still land: forcing it needs a reason.
    MayStillLand(ResolveError),
    /// Anything else: the record is not a person's to settle, the store failed, ….
    Other(String),
}

/// What a release leaves behind: the record as it was, who released it, when and why.
#[derive(Serialize)]
struct ReleaseEvidence<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'static str>,
    key: &'a IdemKey,
    #[serde(skip_serializing_if = "Option::is_none")]
    released: Option<bool>,
    operator: &'a str,
    note: &'a str,
    at: &'a str,
    previous: Option<&'a Record>,
}
