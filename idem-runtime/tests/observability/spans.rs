//! The spans idem opens, captured by a recording `tracing` layer during a scripted
//! sequence: store operations with their key, tool, state, attempt and backend, the
//! reconcile pass and its decisions, and nowhere a value of the call's arguments, tenant,
//! principal or output.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::observed::SECRET;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span or an event as recorded: its name and every field it was given, as text.
#[derive(Clone, Debug, Default)]
struct Seen {
    name: String,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Records every span (with the fields recorded on it later) and every event.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
    /// Span id → index in `spans`.
    ids: Arc<Mutex<BTreeMap<u64, usize>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_owned(),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let mut spans = self.spans.lock().unwrap();
        self.ids.lock().unwrap().insert(id.into_u64(), spans.len());
        spans.push(seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(&i) = self.ids.lock().unwrap().get(&id.into_u64()) {
            values.record(&mut Fields(&mut self.spans.lock().unwrap()[i].fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut seen = Seen {
            name: event.metadata().name().to_owned(),
            ..Seen::default()
        };
        event.record(&mut Fields(&mut seen.fields));
        self.events.lock().unwrap().push(seen);
    }
}

fn capture() -> (crate::observed::Ran, Vec<Seen>, Vec<Seen>) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let ran = tracing::subscriber::with_default(subscriber, || {
        crate::observed::runtime().block_on(crate::observed::run())
    });
    let spans = capture.spans.lock().unwrap().clone();
    let events = capture.events.lock().unwrap().clone();
    (ran, spans, events)
}

fn store_ops<'a>(spans: &'a [Seen], op: &str, key: &str) -> Vec<&'a Seen> {
    spans
        .iter()
        .filter(|s| {
            s.name == "idem.store" && s.field("op") == Some(op) && s.field("key") == Some(key)
        })
        .collect()
}

#[test]
fn store_operations_have_spans_with_key_tool_state_attempt_and_backend() {
    let (ran, spans, _) = capture();
    let charge = ran.charge_key().as_str();
    let slow = ran.slow_key().as_str();

    // Every store span names its backend.
    let store_spans: Vec<&Seen> = spans.iter().filter(|s| s.name == "idem.store").collect();
    assert!(!store_spans.is_empty());
    assert!(store_spans
        .iter()
        .all(|s| s.field("backend") == Some("memory")));

    // The charge's key was claimed three times: the fresh call, its replay, the changed
    // repeat; what each claim found is on its span.
    let claims = store_ops(&spans, "claim", charge);
    let found: Vec<(Option<&str>, Option<&str>, Option<&str>)> = claims
        .iter()
        .map(|s| (s.field("tool"), s.field("outcome"), s.field("state")))
        .collect();
    assert_eq!(
        found,
        [
            (Some("charge"), Some("claimed"), None),
            (Some("charge"), Some("existing"), Some("completed")),
            (Some("charge"), Some("mismatch"), Some("completed")),
        ]
    );
    // Settled once, as completed, by attempt 1.
    let settles = store_ops(&spans, "settle", charge);
    assert_eq!(settles.len(), 1);
    assert_eq!(settles[0].field("state"), Some("completed"));
    assert_eq!(settles[0].field("attempt"), Some("1"));
    assert_eq!(settles[0].field("outcome"), Some("ok"));

    // The timed-out call settled unknown; the reconciler took it over and escalated it.
    let slow_settles: Vec<Option<&str>> = store_ops(&spans, "settle", slow)
        .iter()
        .map(|s| s.field("state"))
        .collect();
    assert_eq!(slow_settles, [Some("unknown"), Some("escalated")]);
    assert_eq!(store_ops(&spans, "reclaim", slow).len(), 1);

    // The attempt and the call spans around them.
    assert!(spans.iter().any(|s| s.name == "idem.attempt"
        && s.field("attempt") == Some("1")
        && s.field("class") == Some("unknown")));
    assert!(spans.iter().any(|s| s.name == "idem.call"
        && s.field("key") == Some(slow)
        && s.field("class") == Some("unknown")));
}

#[test]
fn a_reconcile_pass_and_its_decisions_have_spans() {
    let (ran, spans, _) = capture();
    let slow = ran.slow_key().as_str();
    let passes: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.name == "idem.reconcile.pass")
        .collect();
    assert_eq!(passes.len(), 1);
    assert_eq!(passes[0].field("mode"), Some("once"));
    assert_eq!(passes[0].field("decisions"), Some("1"));
    assert_eq!(passes[0].field("escalated"), Some("1"));
    let decisions: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.name == "idem.reconcile.decision")
        .collect();
    assert_eq!(decisions.len(), 1);
    let d = decisions[0];
    assert_eq!(d.field("key"), Some(slow));
    assert_eq!(d.field("tool"), Some("slow_charge"));
    assert_eq!(d.field("from"), Some("unknown"));
    assert_eq!(d.field("attempts"), Some("1"));
    assert_eq!(d.field("action"), Some("escalated"));
    assert_eq!(
        ran.decisions[0].action,
        idem_runtime::reconcile::Action::Escalated
    );
}

#[test]
fn no_argument_tenant_principal_or_output_is_recorded() {
    let (ran, spans, events) = capture();
    assert!(
        ran.fresh.output().unwrap().to_string().contains(SECRET),
        "the output holds it"
    );
    let mut fields = 0;
    for seen in spans.iter().chain(&events) {
        for (name, value) in &seen.fields {
            fields += 1;
            assert!(
                !value.contains(SECRET),
                "{} recorded {name} = {value}",
                seen.name
            );
        }
    }
    // The made-up tool name is kept to the 64 bytes a tool name can have.
    assert!(spans.iter().any(|s| s.name == "idem.call"
        && s.field("tool")
            .is_some_and(|t| t.starts_with("nope_x") && t.len() == 64)));
    // Something was recorded: spans with fields, and events (the escalation's log line).
    assert!(fields > 50, "only {fields} fields recorded");
    assert!(events
        .iter()
        .any(|e| e.field("message") == Some("escalated to a person")));
}

/// Text from outside idem in a span or log field is bounded before it is recorded: a run id
/// and a call id of 100 kB (the call span is opened before the registry refuses them), and
/// an escalation whose reason quotes a caller's 100 kB, logged by the log sink.
#[test]
fn caller_text_in_span_and_log_fields_is_bounded() {
    use idem_runtime::escalation::{Escalation, EscalationSink, LogSink};
    use idem_runtime::store::{IdemStore, MemoryStore};
    use idem_runtime::{call::ToolCall, registry::Registry};

    let long = "\u{e9}x".repeat(33_333);
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::with_default(subscriber, || {
        crate::observed::runtime().block_on(async {
            let store = Arc::new(MemoryStore::new());
            let registry = Registry::builder()
                .shared_store(store.clone())
                .tool(crate::observed::Charge(Default::default()))
                .build()
                .unwrap();
            let args = serde_json::json!({"card": "4242", "cents": 1});
            let refused = registry
                .call(ToolCall::new(long.clone(), "charge", args.clone()).call_id(long.clone()))
                .await;
            assert!(refused.error().is_some(), "a 100 kB run id is refused");
            let done = registry.call(ToolCall::new("run-1", "charge", args)).await;
            let record = store.get(done.key().unwrap()).await.unwrap().unwrap();
            let escalation = Escalation::from_record(&record, long.clone(), record.created_at);
            LogSink.deliver(&escalation).await.unwrap();
        })
    });
    let spans = capture.spans.lock().unwrap().clone();
    let events = capture.events.lock().unwrap().clone();
    let mut cut = 0;
    for seen in spans.iter().chain(&events) {
        for (name, value) in &seen.fields {
            assert!(
                value.len() <= 300,
                "{} recorded {name} of {} bytes",
                seen.name,
                value.len()
            );
            if value.starts_with("\u{e9}x") && value.ends_with("more bytes)") {
                cut += 1;
            }
        }
    }
    // The run id, the call id and the reason, each cut with a note of how much.
    assert!(cut >= 3, "only {cut} fields were cut");
}
