//! What the `metrics` feature records, read back from the metrics facade's debugging
//! recorder after a scripted sequence: exact counts per tool, class, reason and operation,
//! and labels drawn only from bounded sets.

use std::collections::BTreeMap;

use crate::observed::SECRET;
use idem_runtime::observe;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

/// name + sorted labels → counter value, or number of samples for a histogram.
type Seen = BTreeMap<(String, Vec<(String, String)>), u64>;

fn record_sequence() -> (crate::observed::Ran, Seen) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let ran = metrics::with_local_recorder(&recorder, || {
        crate::observed::runtime().block_on(crate::observed::run())
    });
    let mut seen = Seen::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let n = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => n,
            (MetricKind::Histogram, DebugValue::Histogram(samples)) => samples.len() as u64,
            (kind, value) => panic!("unexpected {kind:?} {value:?} for {}", key.name()),
        };
        seen.insert((key.name().to_owned(), labels), n);
    }
    (ran, seen)
}

fn get(seen: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    seen.get(&(name.to_owned(), labels)).copied().unwrap_or(0)
}

/// Sum of a metric over every label set.
fn total(seen: &Seen, name: &str) -> u64 {
    seen.iter()
        .filter(|((n, _), _)| n == name)
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn a_scripted_sequence_is_counted_exactly() {
    let (ran, seen) = record_sequence();
    // The ledger: the charge ran once (its replay and the changed repeat did not), the slow
    // charge once (it timed out and was not retried).
    assert_eq!(ran.sends, 2);

    // Calls by tool and class.
    assert_eq!(
        get(
            &seen,
            observe::CALLS,
            &[("tool", "charge"), ("class", "completed")]
        ),
        2
    );
    assert_eq!(
        get(
            &seen,
            observe::CALLS,
            &[("tool", "charge"), ("class", "refused")]
        ),
        1
    );
    assert_eq!(
        get(
            &seen,
            observe::CALLS,
            &[("tool", "slow_charge"), ("class", "unknown")]
        ),
        1
    );
    assert_eq!(
        get(
            &seen,
            observe::CALLS,
            &[("tool", observe::UNREGISTERED_TOOL), ("class", "refused")]
        ),
        1
    );
    assert_eq!(total(&seen, observe::CALLS), 5);
    assert_eq!(
        total(&seen, observe::CALL_DURATION),
        5,
        "one latency sample per call"
    );

    // Replays, unknowns, refusals.
    assert_eq!(
        get(
            &seen,
            observe::REPLAYS,
            &[("tool", "charge"), ("class", "completed")]
        ),
        1
    );
    assert_eq!(total(&seen, observe::REPLAYS), 1);
    assert_eq!(
        get(&seen, observe::UNKNOWN_OUTCOMES, &[("tool", "slow_charge")]),
        1
    );
    assert_eq!(total(&seen, observe::UNKNOWN_OUTCOMES), 1);
    assert_eq!(
        get(&seen, observe::CHANGED_PARAMS, &[("tool", "charge")]),
        1
    );
    assert_eq!(total(&seen, observe::CHANGED_PARAMS), 1);
    assert_eq!(
        get(
            &seen,
            observe::REFUSALS,
            &[("tool", "charge"), ("reason", "changed_params")]
        ),
        1
    );
    assert_eq!(
        get(
            &seen,
            observe::REFUSALS,
            &[
                ("tool", observe::UNREGISTERED_TOOL),
                ("reason", "unknown_tool")
            ]
        ),
        1
    );
    assert_eq!(total(&seen, observe::REFUSALS), 2);

    // The reconciliation pass: one decision, an escalation.
    assert_eq!(ran.decisions.len(), 1);
    assert_eq!(
        get(
            &seen,
            observe::RECONCILE_PASSES,
            &[("mode", "once"), ("result", "ok")]
        ),
        1
    );
    assert_eq!(total(&seen, observe::RECONCILE_PASSES), 1);
    assert_eq!(
        get(&seen, observe::RECONCILE_PASS_DURATION, &[("mode", "once")]),
        1
    );
    assert_eq!(
        get(
            &seen,
            observe::RECONCILE_DECISIONS,
            &[("tool", "slow_charge"), ("action", "escalated")]
        ),
        1
    );
    assert_eq!(total(&seen, observe::RECONCILE_DECISIONS), 1);
    assert_eq!(
        get(
            &seen,
            observe::ESCALATIONS,
            &[("tool", "slow_charge"), ("reason", "no_key_no_read_back")]
        ),
        1
    );
    assert_eq!(total(&seen, observe::ESCALATIONS), 1);

    // Store operations, by operation: four claims (fresh, replay, changed, slow), three
    // settles (the charge, the timeout, the escalation), one read (the late-result watcher
    // looks up the timed-out claim; the reconciler builds the escalation from the record it
    // took over, delivers it, then settles), the reconciler's takeover, its two listings
    // (unknown, pending) and its look at the release traces (for keys freed after
    // "unavailable").
    let op = |op: &str| {
        get(
            &seen,
            observe::STORE_OP_DURATION,
            &[("backend", "memory"), ("op", op), ("result", "ok")],
        )
    };
    assert_eq!(op("claim"), 4);
    assert_eq!(op("settle"), 3);
    assert_eq!(op("reclaim"), 1);
    assert_eq!(op("get"), 1);
    assert_eq!(op("list_after"), 2);
    assert_eq!(op("list_releases"), 1);
    assert_eq!(total(&seen, observe::STORE_OP_DURATION), 12, "{seen:#?}");
}

#[test]
fn labels_come_from_bounded_sets_and_carry_nothing_of_a_call() {
    let (ran, seen) = record_sequence();
    let allowed: &[(&str, &[&str])] = &[
        (
            "tool",
            &["charge", "slow_charge", observe::UNREGISTERED_TOOL],
        ),
        (
            "class",
            &[
                "completed",
                "failed",
                "pending",
                "unknown",
                "escalated",
                "rejected",
                "unavailable",
                "refused",
            ],
        ),
        (
            "reason",
            &["unknown_tool", "changed_params", "no_key_no_read_back"],
        ),
        ("backend", &["memory"]),
        (
            "op",
            &[
                "claim",
                "settle",
                "reclaim",
                "get",
                "list_after",
                "list_releases",
            ],
        ),
        ("result", &["ok"]),
        ("mode", &["once"]),
        ("action", &["escalated"]),
    ];
    let keys = [ran.charge_key().as_str(), ran.slow_key().as_str()];
    for (name, labels) in seen.keys() {
        assert!(name.starts_with("idem_"), "{name}");
        for (k, v) in labels {
            let values = allowed
                .iter()
                .find(|(label, _)| label == k)
                .unwrap_or_else(|| panic!("unexpected label {k} on {name}"))
                .1;
            assert!(
                values.contains(&v.as_str()),
                "{name}: {k}={v} is not a bounded value"
            );
            assert!(!v.contains(SECRET) && !keys.contains(&v.as_str()));
        }
    }
    // Every documented metric but the store's error results was recorded.
    for name in [
        observe::CALLS,
        observe::CALL_DURATION,
        observe::REPLAYS,
        observe::UNKNOWN_OUTCOMES,
        observe::CHANGED_PARAMS,
        observe::REFUSALS,
        observe::ESCALATIONS,
        observe::STORE_OP_DURATION,
        observe::RECONCILE_PASSES,
        observe::RECONCILE_PASS_DURATION,
        observe::RECONCILE_DECISIONS,
    ] {
        assert!(total(&seen, name) > 0, "{name} not recorded");
    }
}
