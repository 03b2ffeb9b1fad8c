//! The invariants, checked on the downstream's ledger and the store's records at the end of
//! every seed.

use std::time::Duration;

use idem::escalation::{EscalationDetail, ReasonKind};
use idem::{store::RecordState, CallError, IdemStore, Outcome};
use serde_json::Value;

use crate::downstream::{Charge, DECLINE_DIVISOR};
use crate::faults::{Fault, FaultSet};
use crate::report::{Final, IntentReport, SeedReport};
use crate::rng::SplitMix64;
use crate::sim::Config;
use crate::world::World;

/// What the model intends for one intent, and how it will misbehave.
#[derive(Clone, Debug)]
pub struct IntentPlan {
    /// The intent's number (also its order number).
    pub intent: usize,
    /// Keyed or unkeyed downstream.
    pub keyed: bool,
    /// The amounts to charge.
    pub items: Vec<u64>,
    /// Whether calls carry an explicit intent id (else the key comes from `key(order)`).
    pub with_intent_id: bool,
    /// When the first call goes out.
    pub start: Duration,
    /// Copies of the first call sent at once.
    pub concurrent: usize,
    /// Calls again with a new call id after the answer.
    pub reissue: bool,
    /// Calls again with changed parameters after the answer.
    pub change_params: bool,
    /// Resumes after its worker died mid-call.
    pub resume: bool,
    /// Calls again after "unknown".
    pub after_unknown: bool,
}

impl IntentPlan {
    /// Draws intent `intent`'s plan; model faults apply only when `faults` has them.
    pub fn draw(intent: usize, rng: &mut SplitMix64, faults: FaultSet) -> Self {
        let n = rng.range(1, 4) as usize;
        let items = (0..n)
            .map(|_| {
                // Now and then an amount the downstream declines.
                if rng.chance(0.05) {
                    DECLINE_DIVISOR * rng.range(1, 50)
                } else {
                    let a = rng.range(100, 10_000);
                    if a % DECLINE_DIVISOR == 0 {
                        a + 1
                    } else {
                        a
                    }
                }
            })
            .collect();
        let mut pick = |f: Fault, p: f64| faults.has(f) && rng.chance(p);
        let concurrent = pick(Fault::ConcurrentDuplicates, 0.3);
        let reissue = pick(Fault::Reissue, 0.4);
        let change_params = pick(Fault::ChangedParams, 0.3);
        let resume = pick(Fault::ResumeCrashed, 0.8);
        let after_unknown = pick(Fault::CallAfterUnknown, 0.7);
        IntentPlan {
            intent,
            keyed: rng.chance(0.5),
            items,
            with_intent_id: rng.chance(0.5),
            start: rng.millis(Duration::ZERO, Duration::from_secs(120)),
            concurrent: if concurrent {
                rng.range(2, 4) as usize
            } else {
                1
            },
            reissue,
            change_params,
            resume,
            after_unknown,
        }
    }
}

/// What the model was told by one call.
#[derive(Clone, Debug)]
pub enum Told {
    /// The worker died before answering.
    Killed,
    /// An answer, to a call with these arguments.
    Answer {
        /// The arguments the call carried.
        args: Value,
        /// What it was told.
        result: Result<Outcome, CallError>,
    },
}

/// Checks one seed. Every violation is a sentence that names the intent.
#[allow(clippy::too_many_arguments)]
pub async fn check(
    cfg: &Config,
    faults: FaultSet,
    calls: u64,
    plans: &[IntentPlan],
    told: &[Vec<Told>],
    world: &World,
    ledger: &[Charge],
    store: &dyn IdemStore,
) -> SeedReport {
    let fired = world.fired_per_intent();
    let keys = world.keys();
    let mut violations = Vec::new();
    let mut intents = Vec::with_capacity(plans.len());
    for plan in plans {
        let i = plan.intent;
        let mut v = |msg: String| violations.push(format!("intent {i}: {msg}"));
        let fired = fired.get(i).copied().unwrap_or_default();
        let mine: Vec<&Charge> = ledger.iter().filter(|c| c.order == i).collect();
        let mut per_item = vec![0usize; plan.items.len()];
        let mut declines = 0;
        for c in &mine {
            if c.declined {
                declines += 1;
            } else {
                per_item[c.item] += 1;
            }
            if c.amount != plan.items[c.item] {
                v(format!(
                    "charge {} of item {} has amount {}, not the intended {}: changed parameters executed",
                    c.id, c.item, c.amount, plan.items[c.item]
                ));
            }
        }
        let most = per_item.iter().copied().max().unwrap_or(0).max(declines);
        let duplicate = most > 1;
        let unpreventable = fired.iter().any(Fault::unpreventable_unkeyed);
        if duplicate && (plan.keyed || !unpreventable) {
            v(format!(
                "{} effects for one intent on a {} downstream ({:?} charges per item, {declines} declines); faults fired: {fired}",
                most,
                if plan.keyed { "keyed" } else { "unkeyed" },
                per_item
            ));
        }

        // Everything the model was told "completed" is in the ledger, as told.
        for t in told.get(i).into_iter().flatten() {
            if let Told::Answer {
                result: Ok(Outcome::Completed { output }),
                ..
            } = t
            {
                if let Err(e) = output_matches(output, plan, ledger) {
                    v(format!("told completed with {output}, but {e}"));
                }
            }
            if let Told::Answer {
                args,
                result: Err(CallError::ChangedParams { .. }),
            } = t
            {
                if *args == plan_args(plan) {
                    v("its own unchanged parameters were refused as changed".to_owned());
                }
            }
        }

        // The intent's final state, after reconciliation.
        let key = keys.iter().find(|(_, o)| **o == i).map(|(k, _)| k.clone());
        let record = match &key {
            Some(k) => match store.get(k).await {
                Ok(r) => r,
                Err(e) => {
                    v(format!("its record cannot be read: {e}"));
                    None
                }
            },
            None => None,
        };
        let mut reason = None;
        let fin = match &record {
            None => {
                if !mine.is_empty() && (plan.keyed || !unpreventable) {
                    v(format!(
                        "silently lost: {} effect(s) downstream but no record; faults fired: {fired}",
                        mine.len()
                    ));
                }
                Final::NotExecuted
            }
            Some(r) => match r.state {
                RecordState::Completed => {
                    match &r.payload {
                        Some(out) => {
                            if let Err(e) = output_matches(out, plan, ledger) {
                                v(format!("recorded completed with {out}, but {e}"));
                            }
                        }
                        None if r.result_expired => {}
                        None => v("recorded completed without its output".to_owned()),
                    }
                    Final::Completed
                }
                RecordState::Failed => {
                    if mine.is_empty() {
                        v(
                            "recorded failed after execution, but nothing happened downstream"
                                .to_owned(),
                        );
                    }
                    Final::Failed
                }
                RecordState::Escalated => {
                    let detail = EscalationDetail::of(r);
                    reason = Some(detail.reason_kind);
                    if detail.reason_kind == ReasonKind::Unspecified {
                        v(format!(
                            "escalated ({}) without a reason kind",
                            r.message.as_deref().unwrap_or("no reason")
                        ));
                    }
                    let charged = per_item.iter().filter(|n| **n > 0).count();
                    // What landed when it was read back; a late commit may land more since.
                    if detail.reason_kind == ReasonKind::PartialEffects
                        && (detail.landed.is_empty() || detail.landed.len() > charged)
                    {
                        v(format!(
                            "escalated as a partial batch landing {:?}, but {charged} item(s) are charged",
                            detail.landed
                        ));
                    }
                    if r.attempts.is_empty() && r.read_backs.is_empty() {
                        v("escalated without evidence (no attempt, no read-back)".to_owned());
                    }
                    if !world.was_escalated(&r.key) {
                        v(format!(
                            "escalated ({}), but no escalation reached the sink; attempts: {:?}",
                            r.message.as_deref().unwrap_or("no reason"),
                            r.attempts
                                .iter()
                                .map(|a| format!("{:?}/{}", a.kind, a.class))
                                .collect::<Vec<_>>()
                        ));
                    }
                    Final::Escalated
                }
                s @ (RecordState::Running | RecordState::Unknown | RecordState::Pending) => {
                    v(format!(
                        "still {s} after reconciliation with read-backs; faults fired: {fired}"
                    ));
                    Final::Unsettled
                }
            },
        };
        // A completed record and a completed answer must agree with each other too.
        if fin != Final::Completed {
            let told_completed = told.get(i).into_iter().flatten().any(|t| {
                matches!(
                    t,
                    Told::Answer {
                        result: Ok(Outcome::Completed { .. }),
                        ..
                    }
                )
            });
            if told_completed {
                v(format!("told completed, but the record ends {fin:?}"));
            }
        }
        let exactly_once = match fin {
            Final::Completed => declines == 0 && per_item.iter().all(|n| *n == 1),
            Final::Failed => declines == 1 && per_item.iter().all(|n| *n == 0),
            _ => false,
        };
        intents.push(IntentReport {
            keyed: plan.keyed,
            fired,
            duplicate,
            exactly_once,
            effects: mine.len(),
            fin,
            reason,
        });
    }
    SeedReport {
        config: cfg.clone(),
        faults,
        calls,
        intents,
        violations,
    }
}

fn plan_args(plan: &IntentPlan) -> Value {
    serde_json::json!({ "order": plan.intent, "items": plan.items })
}

/// An output names one charge per item, each in the ledger under this order, for its
/// intended amount, not declined.
fn output_matches(output: &Value, plan: &IntentPlan, ledger: &[Charge]) -> Result<(), String> {
    let ids: Vec<u64> = output
        .get("charges")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .ok_or("the output names no charges")?;
    if ids.len() != plan.items.len() {
        return Err(format!(
            "it names {} charges for {} items",
            ids.len(),
            plan.items.len()
        ));
    }
    for (item, id) in ids.iter().enumerate() {
        let c = ledger
            .iter()
            .find(|c| c.id == *id)
            .ok_or_else(|| format!("charge {id} is not in the ledger"))?;
        if c.order != plan.intent || c.item != item || c.declined || c.amount != plan.items[item] {
            return Err(format!("charge {id} in the ledger is {c:?}"));
        }
    }
    Ok(())
}
