//! "Unavailable, not executed" (503, 429 with Retry-After) through the facade, on tokio's
//! paused clock: asked again within the call's budget and never before Retry-After; a
//! Retry-After the budget cannot cover is not waited out; then released, and the model is
//! told nothing was done. Checked on the service's request log, its ledger and the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{
    registry::RetryPolicy, toolbox, IdemStore, OutcomeClass, ReadCtx, Registry, ToolCall,
    ToolError, WriteCtx,
};
use serde_json::json;
use tokio::time::Instant;

#[idem::args]
struct Charge {
    customer: String,
    cents: u64,
}

/// What the service answers next: `Some(wait)` is a 429 with that Retry-After, `None` a
/// plain 503; an empty script serves.
#[derive(Default)]
struct Service {
    script: Mutex<VecDeque<Option<Duration>>>,
    requests: Mutex<Vec<Instant>>,
    ledger: Mutex<Vec<String>>,
}

impl Service {
    fn scripted(script: impl IntoIterator<Item = Option<Duration>>) -> Arc<Service> {
        Arc::new(Service {
            script: Mutex::new(script.into_iter().collect()),
            ..Service::default()
        })
    }
    fn requests(&self) -> Vec<Instant> {
        self.requests.lock().unwrap().clone()
    }
    fn ledger(&self) -> Vec<String> {
        self.ledger.lock().unwrap().clone()
    }
    fn answer(&self) -> Result<(), ToolError> {
        self.requests.lock().unwrap().push(Instant::now());
        match self.script.lock().unwrap().pop_front() {
            Some(Some(wait)) => Err(ToolError::unavailable_for("429 Too Many Requests", wait)),
            Some(None) => Err(ToolError::unavailable("503 Service Unavailable")),
            None => Ok(()),
        }
    }
}

#[toolbox]
impl Service {
    /// Charge a customer (no key contract).
    #[tool(write)]
    async fn charge(&self, _ctx: WriteCtx, args: Charge) -> Result<String, ToolError> {
        self.answer()?;
        self.ledger
            .lock()
            .unwrap()
            .push(format!("{} {}", args.customer, args.cents));
        Ok("ch_1".into())
    }

    /// Read a balance.
    #[tool(read)]
    async fn balance(&self, _ctx: ReadCtx, args: Charge) -> Result<u64, ToolError> {
        self.answer()?;
        Ok(args.cents)
    }
}

fn registry(service: &Arc<Service>, budget: Duration) -> Registry {
    Registry::builder()
        .toolbox(service.clone())
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(6)
                .initial_backoff(Duration::from_millis(100))
                .budget(budget),
        )
        .build()
        .unwrap()
}

fn call(tool: &str) -> ToolCall {
    ToolCall::new("run-1", tool, json!({"customer": "acme", "cents": 4900}))
}

/// Each pause is at least the Retry-After the service gave with the answer before it, and
/// the one effect is recorded with every attempt that led to it.
#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_between_every_pair_of_attempts() {
    let waits = [
        Some(Duration::from_secs(3)),
        Some(Duration::from_secs(1)),
        None,
    ];
    let service = Service::scripted(waits);
    let registry = registry(&service, Duration::from_secs(30));
    let r = registry.call(call("charge")).await;
    assert!(r.is_completed(), "{}", r.text());
    assert_eq!(service.ledger(), ["acme 4900"]);
    let requests = service.requests();
    assert_eq!(requests.len(), 4);
    for (i, wait) in waits.iter().enumerate() {
        let gap = requests[i + 1] - requests[i];
        assert!(
            gap >= wait.unwrap_or(Duration::ZERO),
            "request {} came {gap:?} after one answered with Retry-After {wait:?}",
            i + 1
        );
    }
    let record = registry
        .store()
        .get(r.key().unwrap())
        .await
        .unwrap()
        .unwrap();
    let classes: Vec<OutcomeClass> = record.attempts.iter().map(|a| a.class).collect();
    assert_eq!(
        classes,
        [
            OutcomeClass::Unavailable,
            OutcomeClass::Unavailable,
            OutcomeClass::Unavailable,
            OutcomeClass::Completed
        ]
    );
}

/// A Retry-After longer than what is left of the budget is not waited out: the call ends at
/// once, the key is released, the model is told nothing was done and when to call again; a
/// call after that time runs, once, under the same key.
#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_budget_is_not_waited_out() {
    let service = Service::scripted([Some(Duration::from_secs(60))]);
    let registry = registry(&service, Duration::from_secs(30));
    let started = Instant::now();
    let r = registry.call(call("charge")).await;
    let took = started.elapsed();
    assert_eq!(r.class(), Some(OutcomeClass::Unavailable));
    assert!(r.is_error());
    assert_eq!(service.requests().len(), 1, "not asked again");
    assert!(
        took < Duration::from_secs(30),
        "the call waited {took:?} for nothing"
    );
    let text = r.text();
    assert!(text.contains("nothing was done"), "{text}");
    assert!(text.contains("in 60s or later"), "{text}");
    assert_eq!(registry.store().get(r.key().unwrap()).await.unwrap(), None);
    assert!(service.ledger().is_empty());

    tokio::time::advance(Duration::from_secs(60)).await;
    let later = registry.call(call("charge")).await;
    assert!(
        later.is_completed() && !later.replayed(),
        "{}",
        later.text()
    );
    assert_eq!(later.key(), r.key());
    assert_eq!(service.ledger(), ["acme 4900"]);
}

/// The budget counts from the first attempt: with Retry-After 10 s and a 25 s budget, the
/// service is asked at 0, 10 and 20 s, and not at 30.
#[tokio::test(start_paused = true)]
async fn the_budget_counts_from_the_first_attempt() {
    let service = Service::scripted(vec![Some(Duration::from_secs(10)); 5]);
    let registry = registry(&service, Duration::from_secs(25));
    let r = registry.call(call("charge")).await;
    assert_eq!(r.class(), Some(OutcomeClass::Unavailable));
    let requests = service.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(requests[2] - requests[0] <= Duration::from_secs(25));
    assert!(service.ledger().is_empty());
    assert_eq!(registry.store().get(r.key().unwrap()).await.unwrap(), None);
}

/// A read is asked again the same way.
#[tokio::test(start_paused = true)]
async fn a_read_is_asked_again_after_its_retry_after() {
    let service = Service::scripted([Some(Duration::from_secs(2))]);
    let registry = registry(&service, Duration::from_secs(30));
    let r = registry.call(call("balance")).await;
    assert_eq!(r.output(), Some(&json!(4900)), "{}", r.text());
    let requests = service.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1] - requests[0] >= Duration::from_secs(2));
}
