//! Watching keys the executor freed after "unavailable, not executed".
//!
//! A downstream that answers 503 or 429 speaks for the copy of the request it answered. A
//! copy that reached it another way (a proxy or load balancer that redelivered the
//! request) may have run all the same, while the caller was told nothing was done. The
//! executor frees such a key with a release trace ([`ReleaseNote::EXECUTOR`]), and the
//! reconciler reads the operation back from that trace until no copy can land any more:
//!
//! | trace | key now / read-back finds | decision |
//! |---|---|---|
//! | released by someone else (a person, the reconciler) | — | not watched |
//! | tool not registered here as a write tool, or no operation in the trace | — | not watched |
//! | any | the key holds a record again (a repeat claimed it) | done: that record speaks for the operation |
//! | | *read back* | |
//! | any | no read-back | done: nothing to look with |
//! | any | found completed, failed or pending | record it again, as found, and tell a person |
//! | any | found more than one effect | record it again as unknown and escalate |
//! | any | the read-back fails | look again next pass |
//! | any | not found, before last send + timeout + 2 × in-flight bound | look again next pass |
//! | any | not found, after that | done: nothing ran |
//!
//! Like [`super::plan`], the decision is a pure function (of the trace, what its tool
//! declares, the time and the read-back's answer), tested row by row below.

use crate::store::{ReleaseNote, ReleaseRecord, Settlement, Timestamp};
use crate::tool::{ReadBack, ToolError};

use super::plan::{evidence_of, settled_by, settlement_found, Facts};

/// What to do about one release trace.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Watch {
    /// Not a release this watch is about (see the table).
    Ignore,
    /// Run the tool's read-back, then decide again with its answer.
    ReadBack,
    /// Nothing more to learn: looked at for good.
    Done {
        /// Why, for the log.
        why: String,
    },
    /// Not decided yet; the next pass looks again.
    Again {
        /// Why, for the decision.
        why: String,
    },
    /// The effect is there: claim the key again and settle it as found.
    Restore {
        /// The settlement, without the read-back's evidence (the caller adds it, timed).
        settlement: Settlement,
        /// What the read-back found, for the decision and the person told.
        summary: String,
    },
    /// More than one effect: claim the key again as unknown and hand it to a person.
    Escalate {
        /// Why, for the record and the person.
        reason: String,
    },
}

/// Decides what to do about `release` at `now`; `tool` is `None` when its tool is not
/// registered with this reconciler as a write tool. `key_held` says whether the key holds
/// a record now. As with [`super::plan::plan`], `read_back` is `None` until the decision
/// asks for one.
pub(crate) fn watch(
    release: &ReleaseRecord,
    tool: Option<&Facts>,
    key_held: bool,
    now: Timestamp,
    read_back: Option<&Result<ReadBack, ToolError>>,
) -> Watch {
    let record = &release.record;
    if release.by != ReleaseNote::EXECUTOR || record.operation.is_none() {
        return Watch::Ignore;
    }
    let Some(tool) = tool else {
        return Watch::Ignore;
    };
    if key_held {
        return Watch::Done {
            why: "the key holds a record again; it speaks for the operation".to_owned(),
        };
    }
    let Some(read_back) = read_back else {
        return Watch::ReadBack;
    };
    let found = match read_back {
        Ok(found) => found,
        Err(_) => {
            return Watch::Again {
                why: format!(
                    "released after \"unavailable\"; read-back {}",
                    evidence_of(read_back)
                ),
            }
        }
    };
    let summary = found.summary();
    match found {
        ReadBack::Unsupported => Watch::Done {
            why: "the tool has no read-back".to_owned(),
        },
        ReadBack::NotFound => {
            let settled_by = settled_by(record, tool);
            if now < settled_by {
                Watch::Again {
                    why: format!(
                        "released after \"unavailable\"; not found yet, a copy may land until {settled_by}"
                    ),
                }
            } else {
                Watch::Done {
                    why: "not found after every copy could have landed: nothing ran".to_owned(),
                }
            }
        }
        ReadBack::Ambiguous { .. } => Watch::Escalate {
            reason: format!(
                "released after every attempt was refused as unavailable, but the read-back {summary}"
            ),
        },
        _ => match settlement_found(found) {
            Some(settlement) => Watch::Restore {
                settlement,
                summary,
            },
            None => Watch::Escalate {
                reason: format!("released after \"unavailable\"; read-back {summary}"),
            },
        },
    }
}

/// Whether a pass may move its place past a release it decided this way: only a release
/// looked at for good may be left behind.
pub(crate) fn settled(decision: &Watch) -> bool {
    !matches!(decision, Watch::Again { .. } | Watch::ReadBack)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::identity::{Fingerprint, IdemKey, KeyMaterial, Scope};
    use crate::outcome::OutcomeClass;
    use crate::reconcile::plan::Limits;
    use crate::store::{AttemptKind, AttemptRecord, ClaimToken, Operation, Record, RecordState};
    use crate::tool::ToolSpec;

    fn at(secs: u64) -> Timestamp {
        Timestamp(secs * 1000)
    }

    /// Released at 100 s after one attempt at 90 s; timeout 10 s, bound 60 s: a copy may
    /// land until 90 + 10 + 2 × 60 = 220 s.
    fn release(by: &str) -> ReleaseRecord {
        let scope = Scope::run("run-1");
        let record = Record {
            key: IdemKey::derive(&scope, "charge", KeyMaterial::Intent("order-1")),
            fingerprint: Fingerprint::of_canonical(b"{\"order\":1}"),
            tool: "charge".into(),
            state: RecordState::Unknown,
            token: ClaimToken(7),
            lease_until: None,
            created_at: at(90),
            updated_at: at(100),
            payload: None,
            message: None,
            downstream_ref: None,
            result_expired: false,
            attempts: vec![AttemptRecord::new(
                1,
                at(90),
                at(91),
                AttemptKind::Returned,
                OutcomeClass::Unavailable,
                Some("503".to_owned()),
            )],
            operation: Some(Operation {
                scope,
                intent: Some("order-1".to_owned()),
                args: json!({"order": 1}).into(),
            }),
            read_backs: Vec::new(),
        };
        ReleaseRecord {
            at: at(100),
            by: by.to_owned(),
            note: "unavailable".to_owned(),
            record,
        }
    }

    fn facts() -> Facts {
        let spec = ToolSpec::new("charge")
            .timeout(Duration::from_secs(10))
            .in_flight_bound(Duration::from_secs(60));
        Facts::of(
            &spec,
            None,
            Limits {
                max_retries: 3,
                patience: Duration::from_secs(900),
                max_failed_read_backs: 10,
            },
            None,
        )
    }

    fn ok(found: ReadBack) -> Option<Result<ReadBack, ToolError>> {
        Some(Ok(found))
    }

    /// A row: its name, the trace, the tool's facts, whether the key is held again, the
    /// time in seconds, the read-back's answer, and the decision wanted.
    type Row<'a> = (
        &'a str,
        ReleaseRecord,
        Option<&'a Facts>,
        bool,
        u64,
        Option<Result<ReadBack, ToolError>>,
        Watch,
    );

    #[test]
    fn every_row_of_the_table() {
        let executor = release(ReleaseNote::EXECUTOR);
        let f = facts();
        let completed = ReadBack::Completed {
            downstream_ref: Some("ch_1".to_owned()),
            output: json!({"charge": "ch_1"}),
        };
        let rows: Vec<Row<'_>> = vec![
            (
                "a person's release",
                release("alice"),
                Some(&f),
                false,
                120,
                None,
                Watch::Ignore,
            ),
            (
                "the reconciler's release",
                release(super::super::RECONCILER),
                Some(&f),
                false,
                120,
                None,
                Watch::Ignore,
            ),
            (
                "tool not registered",
                executor.clone(),
                None,
                false,
                120,
                None,
                Watch::Ignore,
            ),
            (
                "key claimed again",
                executor.clone(),
                Some(&f),
                true,
                120,
                None,
                Watch::Done {
                    why: "the key holds a record again; it speaks for the operation".to_owned(),
                },
            ),
            (
                "read back first",
                executor.clone(),
                Some(&f),
                false,
                120,
                None,
                Watch::ReadBack,
            ),
            (
                "no read-back",
                executor.clone(),
                Some(&f),
                false,
                120,
                ok(ReadBack::Unsupported),
                Watch::Done {
                    why: "the tool has no read-back".to_owned(),
                },
            ),
            (
                "found completed",
                executor.clone(),
                Some(&f),
                false,
                120,
                ok(completed.clone()),
                Watch::Restore {
                    settlement: Settlement::new(RecordState::Completed)
                        .payload(json!({"charge": "ch_1"}))
                        .downstream_ref("ch_1"),
                    summary: completed.summary(),
                },
            ),
            (
                "found pending",
                executor.clone(),
                Some(&f),
                false,
                120,
                ok(ReadBack::Pending {
                    downstream_ref: "tr_1".to_owned(),
                }),
                Watch::Restore {
                    settlement: Settlement::new(RecordState::Pending).downstream_ref("tr_1"),
                    summary: "found pending tr_1".to_owned(),
                },
            ),
            (
                "read-back fails",
                executor.clone(),
                Some(&f),
                false,
                5000,
                Some(Err(ToolError::unknown("timeout"))),
                Watch::Again {
                    why:
                        "released after \"unavailable\"; read-back error: outcome unknown: timeout"
                            .to_owned(),
                },
            ),
            (
                "not found, a copy may still land",
                executor.clone(),
                Some(&f),
                false,
                219,
                ok(ReadBack::NotFound),
                Watch::Again {
                    why: format!(
                        "released after \"unavailable\"; not found yet, a copy may land until {}",
                        at(220)
                    ),
                },
            ),
            (
                "not found, every copy landed or never will",
                executor.clone(),
                Some(&f),
                false,
                220,
                ok(ReadBack::NotFound),
                Watch::Done {
                    why: "not found after every copy could have landed: nothing ran".to_owned(),
                },
            ),
        ];
        // An effect found is recorded whenever it is found, inside the horizon or after it.
        let found_late: Row<'_> = {
            let (_, release, tool, held, _, found, want) = rows
                .iter()
                .find(|r| r.0 == "found completed")
                .cloned()
                .expect("the row");
            (
                "found completed after the horizon",
                release,
                tool,
                held,
                5000,
                found,
                want,
            )
        };
        for (name, release, tool, held, now, found, want) in rows.into_iter().chain([found_late]) {
            let got = watch(&release, tool, held, at(now), found.as_ref());
            assert_eq!(got, want, "row: {name}");
        }
    }

    #[test]
    fn more_than_one_effect_is_escalated() {
        let found = ReadBack::Ambiguous {
            downstream_refs: vec!["ch_1".to_owned(), "ch_2".to_owned()],
        };
        let got = watch(
            &release(ReleaseNote::EXECUTOR),
            Some(&facts()),
            false,
            at(120),
            ok(found).as_ref(),
        );
        assert!(matches!(got, Watch::Escalate { .. }), "{got:?}");
    }

    #[test]
    fn only_decided_releases_are_left_behind() {
        assert!(!settled(&Watch::ReadBack));
        assert!(!settled(&Watch::Again { why: String::new() }));
        assert!(settled(&Watch::Ignore));
        assert!(settled(&Watch::Done { why: String::new() }));
        assert!(settled(&Watch::Escalate {
            reason: String::new()
        }));
    }
}
