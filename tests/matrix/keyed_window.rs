//! A keyed downstream is sent the same key again only inside its safe retry window: the
//! window is how long the downstream keeps deduplicating on the key (its key retention
//! minus a margin), so a send after it may be a second effect. Black-box through the
//! facade, asserted on a downstream that forgets keys after its retention.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::{Clock, Timestamp, TokioClock};
use idem::{registry::RetryPolicy, toolbox, MemoryStore, Registry, ToolCall, ToolError, WriteCtx};
use serde_json::json;
use tokio::time::Instant;

/// A payment service that deduplicates on the idempotency key for `retention` after the
/// key's first request, and forgets it after that. Each request takes `latency`, and the
/// answer is lost (the caller sees an error it cannot read as "nothing happened").
struct Bank {
    retention: Duration,
    latency: Duration,
    /// (key, first seen) of every charge, and when each request arrived.
    charges: Mutex<Vec<(String, Instant)>>,
    requests: Mutex<Vec<Instant>>,
    start: Instant,
    /// Requests (by arrival order, from 0) answered 503 with this Retry-After, without
    /// doing anything.
    shed: Mutex<Vec<(usize, Duration)>>,
}

impl Bank {
    fn new(retention: Duration, latency: Duration) -> Arc<Bank> {
        Arc::new(Bank {
            retention,
            latency,
            charges: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            start: Instant::now(),
            shed: Mutex::new(Vec::new()),
        })
    }

    fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    fn request_times(&self) -> Vec<Duration> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|t| *t - self.start).collect()
    }
}

#[idem::args]
struct PayArgs {
    customer: String,
    cents: u64,
}

struct Payments {
    bank: Arc<Bank>,
}

#[toolbox]
impl Payments {
    /// Charge a customer; the bank keeps idempotency keys for 1 s, so the safe window is
    /// shorter.
    #[tool(write, downstream = "keyed", window = "1s", timeout = "10s")]
    async fn pay(&self, ctx: WriteCtx, _args: PayArgs) -> Result<String, ToolError> {
        let bank = &self.bank;
        let arrived = Instant::now();
        let n = {
            let mut requests = bank.requests.lock().unwrap();
            requests.push(arrived);
            requests.len() - 1
        };
        let shed = bank
            .shed
            .lock()
            .unwrap()
            .iter()
            .find(|(i, _)| *i == n)
            .map(|s| s.1);
        if let Some(wait) = shed {
            tokio::time::sleep(bank.latency).await;
            return Err(ToolError::unavailable_for(
                "503 overloaded; not executed",
                wait,
            ));
        }
        {
            let mut charges = bank.charges.lock().unwrap();
            let key = ctx.key().as_str();
            let known = charges
                .iter()
                .any(|(k, first)| k == key && arrived - *first <= bank.retention);
            if !known {
                charges.push((key.to_owned(), arrived));
            }
        }
        tokio::time::sleep(bank.latency).await;
        Err(ToolError::unknown("502 bad gateway: the answer was lost"))
    }
}

fn registry(bank: &Arc<Bank>) -> Registry {
    // The store and the executor read time from tokio's paused clock.
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(Timestamp(1_800_000_000_000)));
    Registry::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .clock(clock)
        .retry_policy(
            RetryPolicy::default()
                .max_attempts(5)
                .initial_backoff(Duration::from_millis(400))
                .max_backoff(Duration::from_millis(400))
                .jitter(0.0),
        )
        .toolbox(Arc::new(Payments { bank: bank.clone() }))
        .build()
        .unwrap()
}

/// An attempt ends inside the window, and the backoff before the next one would cross it:
/// the executor must not send after the window has passed.
#[tokio::test(start_paused = true)]
async fn no_retry_is_sent_after_the_window_has_passed() {
    // Sends at 0 s and 0.65 s; the second ends at 0.9 s, inside the window, and the next
    // would go at 1.3 s, past it.
    let bank = Bank::new(Duration::from_secs(1), Duration::from_millis(250));
    let r = registry(&bank)
        .call(ToolCall::new(
            "run-1",
            "pay",
            json!({"customer": "acme", "cents": 4900}),
        ))
        .await;
    assert_eq!(r.class(), Some(idem::OutcomeClass::Unknown), "{}", r.text());
    let sent = bank.request_times();
    assert!(
        sent.iter().all(|t| *t <= Duration::from_secs(1)),
        "a request was sent after the 1 s window: {sent:?}"
    );
    assert_eq!(bank.charges(), 1, "one charge: {sent:?}");
}

/// The first attempt's answer is lost (it may have charged), the second is refused as
/// unavailable with a Retry-After that ends past the window: asking again after it would
/// rely on a key the downstream may have forgotten, so the call must stop, unknown.
#[tokio::test(start_paused = true)]
async fn an_unavailable_retry_after_an_unknown_attempt_stays_inside_the_window() {
    let bank = Bank::new(Duration::from_secs(1), Duration::from_millis(250));
    bank.shed.lock().unwrap().push((1, Duration::from_secs(1)));
    let r = registry(&bank)
        .call(ToolCall::new(
            "run-1",
            "pay",
            json!({"customer": "acme", "cents": 4900}),
        ))
        .await;
    assert_eq!(r.class(), Some(idem::OutcomeClass::Unknown), "{}", r.text());
    let sent = bank.request_times();
    assert!(
        sent.iter().all(|t| *t <= Duration::from_secs(1)),
        "a request was sent after the 1 s window: {sent:?}"
    );
    assert_eq!(bank.charges(), 1, "one charge: {sent:?}");
}
