//! Observe: the spans idem opens and the metrics it records, by name.
//!
//! Everything here is off until a program asks for it. Spans go through `tracing`: without
//! a subscriber interested in them they are not built, and without the `metrics` feature a
//! store operation nobody traces (the store spans are at level `DEBUG`, so under an `INFO`
//! filter too) goes to the store untouched: no span, no timer, no extra allocation.
//! Metrics go through the
//! [`metrics`](https://docs.rs/metrics) facade, compiled in only with the cargo feature
//! `metrics` (`idem/metrics`), and recorded by whatever recorder the program installs (a
//! Prometheus exporter, StatsD, a test's debugging recorder); with none installed they cost
//! a lookup and are dropped.
//!
//! **What is never recorded**: a call's arguments, a handler's output or error text, the
//! tenant and the principal. Spans and metrics carry keys (a SHA-256 digest), tool names,
//! states, classes, attempt numbers, store and operation names, and error *kinds*. Metric
//! labels are bounded: tool names come from the registry (a call naming no registered tool
//! is counted under [`UNREGISTERED_TOOL`]), every other label value is one of a fixed set
//! listed below; a key, run id or argument never becomes a label. Text from outside idem
//! that a span or log field does carry (a run id, a call id, an error's or an operator's
//! text, attempt evidence, an escalation's reason) is cut to 256 bytes, with a note of how
//! much was cut, before it is recorded; a requested tool name to 64.
//!
//! # Spans
//!
//! | name | level | fields | where |
//! |---|---|---|---|
//! | `idem.call` | INFO | `tool`, `run_id`, `call_id`, `key`, `class` | each [`Registry::call`](crate::registry::Registry::call) |
//! | `idem.attempt` | INFO | `attempt`, `class` | each send of a handler (inside `idem.call`) |
//! | `idem.store` | DEBUG | `op`, `backend`, `key`, `tool`, `state`, `outcome`, `attempt`, `count`, `error` | each store operation of a registry, its reconciler and its late-result watcher (see [`crate::store::Instrumented`]) |
//! | `idem.reconcile.pass` | INFO | `mode` (`once`, `all`), `decisions`, `escalated`, `error` | each [`Reconciler::run_once`](crate::reconcile::Reconciler::run_once) / [`run_all`](crate::reconcile::Reconciler::run_all) |
//! | `idem.reconcile.decision` | INFO | `key`, `tool`, `from`, `attempts`, `action` | each record a pass decides on (inside `idem.reconcile.pass`) |
//!
//! In `idem.store`, `state` is the record state a claim found or a settle writes, `outcome`
//! what the operation answered (`claimed`, `existing`, `mismatch`; `found`, `absent`; `ok`),
//! `attempt` the number of the last attempt a settle records, `count` how many records a
//! listing returned, and `error` the [`StoreError`](crate::store::StoreError)'s kind (the store
//! `result` values in [Labels](#labels), never its text). `tool` is filled in where the
//! operation names it (a claim).
//!
//! # Metrics (feature `metrics`)
//!
//! | name | type | labels | unit | counts |
//! |---|---|---|---|---|
//! | [`CALLS`] | counter | `tool`, `class` | calls | every [`Registry::call`](crate::registry::Registry::call), by the class it ended in, or `refused` |
//! | [`CALL_DURATION`] | histogram | `tool`, `class` | seconds | the same calls, from dispatch to answer |
//! | [`REPLAYS`] | counter | `tool`, `class` | calls | calls answered from a saved record: the handler did not run |
//! | [`UNKNOWN_OUTCOMES`] | counter | `tool` | calls | calls that ran and ended *unknown* (timeout, panic, result not saved) |
//! | [`CHANGED_PARAMS`] | counter | `tool` | calls | "same key, changed parameters" refusals |
//! | [`REFUSALS`] | counter | `tool`, `reason` | calls | every refused call (nothing ran), by reason |
//! | [`ESCALATIONS`] | counter | `tool`, `reason` | records | records the reconciler handed to a person, by reason kind |
//! | [`STORE_OP_DURATION`] | histogram | `backend`, `op`, `result` | seconds | every store operation of a registry and its reconciler |
//! | [`RECONCILE_PASSES`] | counter | `mode`, `result` | passes | reconciliation passes |
//! | [`RECONCILE_PASS_DURATION`] | histogram | `mode` | seconds | the same passes |
//! | [`RECONCILE_DECISIONS`] | counter | `tool`, `action` | records | each record a pass decided on, by what it did |
//!
//! A histogram's count is also the number of events, so store operations per backend and
//! operation are `count(idem_store_op_duration_seconds)`. `describe_metrics()` gives the
//! recorder each metric's unit and help text.
//!
//! # Labels
//!
//! | label | values |
//! |---|---|
//! | `tool` | a registered tool's name, or [`UNREGISTERED_TOOL`] |
//! | `class` | `completed`, `failed`, `pending`, `unknown`, `escalated`, `rejected`, `unavailable` ([`OutcomeClass`](crate::outcome::OutcomeClass)), or `refused` |
//! | `reason` ([`ESCALATIONS`]) | a [`ReasonKind`](crate::escalation::ReasonKind)'s name: `window_passed`, `patience_exhausted`, `partial_effects`, `conflicting_evidence`, `no_key_no_read_back`, `read_back_failing`, `no_in_flight_bound`, `unreadable`, `claimed_twice`, `unspecified` |
//! | `reason` ([`REFUSALS`]) | `unknown_tool`, `invalid_call`, `args_too_large`, `malformed_json`, `invalid_args`, `changed_params`, `in_flight`, `store` ([`CallError`](crate::call::CallError)), `other` |
//! | `backend` | `memory`, `sqlite`, `redis`, `postgres` ([`IdemStore::backend_name`](crate::store::IdemStore::backend_name)), `custom` for a store that does not name itself |
//! | `op` | `claim`, `renew`, `settle`, `release`, `release_unsettled`, `release_traced`, `releases`, `list_releases`, `reclaim`, `get`, `list`, `list_after`, `wait_settled` |
//! | `result` (store) | `ok`, or the error kind: `stale_token`, `not_found`, `unavailable`, `corrupt`, `full`, `backend`, `other` |
//! | `mode` | `once`, `all` |
//! | `result` (reconcile) | `ok`, `error` |
//! | `action` | `retried`, `settled`, `released`, `waiting`, `escalated`, `skipped` ([`Action`](crate::reconcile::Action)) |

/// Counter: calls, by `tool` and `class` (an outcome class, or `refused`).
pub const CALLS: &str = "idem_calls_total";
/// Histogram, seconds: how long calls took, by `tool` and `class`.
pub const CALL_DURATION: &str = "idem_call_duration_seconds";
/// Counter: calls answered from a saved record without running the handler, by `tool` and
/// `class`.
pub const REPLAYS: &str = "idem_replays_total";
/// Counter: calls that ran and ended *unknown*, by `tool`.
pub const UNKNOWN_OUTCOMES: &str = "idem_unknown_outcomes_total";
/// Counter: "same key, changed parameters" refusals, by `tool`.
pub const CHANGED_PARAMS: &str = "idem_changed_params_total";
/// Counter: refused calls (nothing ran), by `tool` and `reason`.
pub const REFUSALS: &str = "idem_refusals_total";
/// Counter: records the reconciler escalated to a person, by `tool` and `reason` (a
/// [`ReasonKind`](crate::escalation::ReasonKind)'s name).
pub const ESCALATIONS: &str = "idem_escalations_total";
/// Histogram, seconds: store operations, by `backend`, `op` and `result`.
pub const STORE_OP_DURATION: &str = "idem_store_op_duration_seconds";
/// Counter: reconciliation passes, by `mode` and `result`.
pub const RECONCILE_PASSES: &str = "idem_reconcile_passes_total";
/// Histogram, seconds: reconciliation passes, by `mode`.
pub const RECONCILE_PASS_DURATION: &str = "idem_reconcile_pass_duration_seconds";
/// Counter: records a reconciliation pass decided on, by `tool` and `action`.
pub const RECONCILE_DECISIONS: &str = "idem_reconcile_decisions_total";

/// The `tool` label of a call that names no registered tool: the name a model made up must
/// not become a label (its values would be unbounded). Not a valid tool name, so it never
/// collides with one.
pub const UNREGISTERED_TOOL: &str = "<unregistered>";

/// The most bytes of one span or log field (or log message) that carries text from outside
/// idem: a run id, a call id, an error's or a person's text, a record's evidence. Longer text
/// is cut there, saying how much was cut, so a caller's megabyte is not written into every
/// trace. A tool name is cut to the 64 bytes a tool name can have.
pub(crate) const MAX_FIELD_BYTES: usize = 256;

/// `value`'s text as a span or log field records it: whole up to [`MAX_FIELD_BYTES`], else
/// cut there at a character boundary with `… (N more bytes)`. Formats into a bounded buffer:
/// a huge value is measured, never copied.
pub(crate) fn field(value: &dyn std::fmt::Display) -> String {
    bounded(|w| std::fmt::write(w, format_args!("{value}")))
}

/// [`field`] of `value`'s `Debug` text.
pub(crate) fn debug_field(value: &dyn std::fmt::Debug) -> String {
    bounded(|w| std::fmt::write(w, format_args!("{value:?}")))
}

/// The longest prefix of `text` of at most `max` bytes that ends at a character boundary.
pub(crate) fn prefix(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn bounded(write: impl FnOnce(&mut Bounded) -> std::fmt::Result) -> String {
    let mut w = Bounded {
        kept: String::new(),
        cut: 0,
    };
    let _ = write(&mut w);
    if w.cut > 0 {
        use std::fmt::Write as _;
        let _ = write!(w.kept, "… ({} more bytes)", w.cut);
    }
    w.kept
}

/// Keeps the first [`MAX_FIELD_BYTES`] of what is written, counting the rest.
struct Bounded {
    kept: String,
    cut: usize,
}

impl std::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.cut > 0 {
            self.cut += s.len();
            return Ok(());
        }
        let room = MAX_FIELD_BYTES - self.kept.len();
        let kept = prefix(s, room);
        self.kept.push_str(kept);
        self.cut += s.len() - kept.len();
        Ok(())
    }
}

/// Starts timing when metrics are compiled in; a zero-sized no-op otherwise.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timer {
    #[cfg(feature = "metrics")]
    started: std::time::Instant,
}

impl Timer {
    pub(crate) fn start() -> Timer {
        Timer {
            #[cfg(feature = "metrics")]
            started: std::time::Instant::now(),
        }
    }

    /// Seconds since [`Timer::start`] (0 without the `metrics` feature, where nothing reads it).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn seconds(self) -> f64 {
        #[cfg(feature = "metrics")]
        {
            self.started.elapsed().as_secs_f64()
        }
        #[cfg(not(feature = "metrics"))]
        {
            0.0
        }
    }
}

/// A label value: a fixed name, or a tool's name (bounded by the registry).
#[cfg(feature = "metrics")]
pub(crate) type Label = metrics::SharedString;

/// Adds `n` to counter `name` with `labels`.
#[cfg(feature = "metrics")]
pub(crate) fn count(name: &'static str, labels: &[(&'static str, Label)], n: u64) {
    metrics::counter!(name, labels_of(labels)).increment(n);
}

/// Records `value` in histogram `name` with `labels`.
#[cfg(feature = "metrics")]
pub(crate) fn observe(name: &'static str, labels: &[(&'static str, Label)], value: f64) {
    metrics::histogram!(name, labels_of(labels)).record(value);
}

#[cfg(feature = "metrics")]
fn labels_of(labels: &[(&'static str, Label)]) -> Vec<metrics::Label> {
    labels
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, v.clone()))
        .collect()
}

/// Describes every idem metric to the installed recorder: its unit and a one-line help
/// text (a Prometheus exporter prints them as `# HELP` and uses the unit). Call it once,
/// after installing the recorder; metrics are recorded whether or not it was called.
#[cfg(feature = "metrics")]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        CALLS,
        Unit::Count,
        "Tool calls, by tool and outcome class (or `refused`)."
    );
    describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "How long tool calls took, by tool and class."
    );
    describe_counter!(
        REPLAYS,
        Unit::Count,
        "Calls answered from a saved record without running the handler."
    );
    describe_counter!(
        UNKNOWN_OUTCOMES,
        Unit::Count,
        "Calls that ran and ended with an unknown outcome."
    );
    describe_counter!(
        CHANGED_PARAMS,
        Unit::Count,
        "Same key, changed parameters: refused calls."
    );
    describe_counter!(
        REFUSALS,
        Unit::Count,
        "Refused calls (nothing ran), by reason."
    );
    describe_counter!(
        ESCALATIONS,
        Unit::Count,
        "Records the reconciler handed to a person."
    );
    describe_histogram!(
        STORE_OP_DURATION,
        Unit::Seconds,
        "Store operations, by backend, operation and result."
    );
    describe_counter!(
        RECONCILE_PASSES,
        Unit::Count,
        "Reconciliation passes, by mode and result."
    );
    describe_histogram!(
        RECONCILE_PASS_DURATION,
        Unit::Seconds,
        "How long reconciliation passes took."
    );
    describe_counter!(
        RECONCILE_DECISIONS,
        Unit::Count,
        "Records a reconciliation pass decided on, by action."
    );
}
