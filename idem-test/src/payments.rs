//! An in-process payment service with a Stripe-v1-like idempotency contract, and a proxy in
//! front of it that can delay or drop requests and responses.
//!
//! The contract (each clause has a test in `tests/matrix/in_process.rs`, `stub_contract`):
//! - **(A)** a repeat with the same key and the same request gets the saved response — server
//!   errors included, once execution had started;
//! - **(B)** a request with a key whose first request is still executing gets `409`, and
//!   nothing is saved for it;
//! - **(C)** the same key with another request is refused with `400`, nothing executed;
//! - **(D)** keys are pruned after a configurable retention (Stripe: 24 h): after that the
//!   same key executes again;
//! - **(E)** refunds are asynchronous: created `pending`, they end `succeeded`, `failed` or
//!   `canceled`, and never leave a terminal state.
//!
//! Time is tokio's clock, so tests run it paused. Tests count the service's objects
//! ([`Payments::charges`], [`Payments::refunds`]): that is what happened, whatever a tool
//! reported.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Key retention of the real Stripe API.
pub const STRIPE_KEY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How long executing a request takes unless told otherwise.
pub const EXECUTION: Duration = Duration::from_millis(50);

/// A charge object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Charge {
    /// `ch_1`, `ch_2`, … in creation order.
    pub id: String,
    /// The customer charged.
    pub customer: String,
    /// Amount in cents.
    pub amount: u64,
}

/// Where a refund is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    /// Accepted, not final.
    Pending,
    /// Terminal: the money went back.
    Succeeded,
    /// Terminal: it did not.
    Failed,
    /// Terminal: canceled before it went through.
    Canceled,
}

impl RefundStatus {
    /// Whether the refund can no longer change.
    pub fn is_terminal(self) -> bool {
        self != RefundStatus::Pending
    }
}

/// A refund object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Refund {
    /// `re_1`, `re_2`, …
    pub id: String,
    /// The charge refunded.
    pub charge: String,
    /// Amount in cents.
    pub amount: u64,
    /// Where it is.
    pub status: RefundStatus,
}

/// A request to the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `POST /v1/charges`
    CreateCharge {
        /// Who to charge.
        customer: String,
        /// Amount in cents.
        amount: u64,
    },
    /// `POST /v1/refunds`
    CreateRefund {
        /// The charge to refund.
        charge: String,
        /// Amount in cents.
        amount: u64,
    },
}

/// What the service returns on success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    /// A created (or replayed) charge.
    Charge(Charge),
    /// A created (or replayed) refund, in the state it had when the response was made.
    Refund(Refund),
}

/// An error response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Stripe's error type: `idempotency_error`, `invalid_request_error`, `rate_limit_error`,
    /// `api_error`.
    pub kind: &'static str,
    /// What the service said.
    pub message: String,
    /// The `Retry-After` header, when the service sent one.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.message)
    }
}

/// A response.
pub type Response = Result<Object, ApiError>;

/// A scripted misbehaviour of the service for the next request it executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misstep {
    /// Refuse before executing anything (`429` rate limit). Nothing is saved under the key:
    /// a retry executes.
    RejectBeforeExecution,
    /// Execute (the object is created), then answer `500`. The `500` is saved under the key.
    ErrorAfterCommit,
    /// Execute, taking this long instead of [`EXECUTION`].
    Slow(Duration),
    /// Shed load before executing anything: `503 Service Unavailable` with this
    /// `Retry-After`. Nothing is saved under the key: a retry executes.
    Unavailable(Duration),
}

/// Does the service honour the `Idempotency-Key` header?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// The contract in the module docs.
    Honoured,
    /// Ignored: every request that arrives executes.
    Ignored,
}

enum KeyState {
    Executing,
    Saved(Response),
}

struct KeyEntry {
    request: Request,
    created: Instant,
    state: KeyState,
}

#[derive(Default)]
struct State {
    charges: Vec<Charge>,
    refunds: Vec<Refund>,
    keys: HashMap<String, KeyEntry>,
    missteps: VecDeque<Misstep>,
    requests: usize,
}

struct Inner {
    keys: Keys,
    retention: Duration,
    state: Mutex<State>,
    /// Objects created so far (charges plus refunds), for tests that wait for an effect.
    created: watch::Sender<usize>,
}

/// The payment service. Cheap to clone; clones share the service.
#[derive(Clone)]
pub struct Payments {
    inner: Arc<Inner>,
}

impl Default for Payments {
    fn default() -> Self {
        Payments::new()
    }
}

impl Payments {
    /// A service that honours keys for [`STRIPE_KEY_RETENTION`].
    pub fn new() -> Self {
        Payments::with(Keys::Honoured, STRIPE_KEY_RETENTION)
    }

    /// A service with the given key contract and key retention.
    pub fn with(keys: Keys, retention: Duration) -> Self {
        Payments {
            inner: Arc::new(Inner {
                keys,
                retention,
                state: Mutex::new(State::default()),
                created: watch::Sender::new(0),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a handful of plain assignments: a panic cannot leave
        // the state half-written, so poisoning carries no information here.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Scripts the next request the service executes (in order, one misstep per request).
    pub fn script(&self, misstep: Misstep) {
        self.state().missteps.push_back(misstep);
    }

    /// Handles one request the way the real service would, `key` being its
    /// `Idempotency-Key` header.
    pub async fn handle(&self, key: Option<&str>, request: Request) -> Response {
        let key = match self.inner.keys {
            Keys::Honoured => key.map(str::to_owned),
            Keys::Ignored => None,
        };
        let misstep = {
            let mut state = self.state();
            state.requests += 1;
            if let Some(key) = &key {
                let now = Instant::now();
                let retention = self.inner.retention;
                // (D) Keys older than the retention are forgotten.
                state
                    .keys
                    .retain(|_, e| now.saturating_duration_since(e.created) < retention);
                if let Some(entry) = state.keys.get(key) {
                    if entry.request != request {
                        // (C)
                        return Err(ApiError::new(
                            400,
                            "idempotency_error",
                            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
                        ));
                    }
                    match &entry.state {
                        // (B) Not saved: the key still belongs to the first request.
                        KeyState::Executing => {
                            return Err(ApiError::new(
                                409,
                                "idempotency_error",
                                "There is currently another in-progress request using this idempotency key.",
                            ))
                        }
                        // (A)
                        KeyState::Saved(response) => return response.clone(),
                    }
                }
            }
            let misstep = state.missteps.pop_front();
            if let Some(Misstep::Unavailable(retry_after)) = misstep {
                // Like a rate limit: turned away before execution, nothing saved.
                return Err(ApiError {
                    retry_after: Some(retry_after),
                    ..ApiError::new(
                        503,
                        "api_error",
                        "Service Unavailable; nothing was executed.",
                    )
                });
            }
            if misstep == Some(Misstep::RejectBeforeExecution) {
                // Validation failures and rate limits are not saved: execution never began.
                return Err(ApiError::new(
                    429,
                    "rate_limit_error",
                    "Too many requests; nothing was executed.",
                ));
            }
            if let Some(key) = &key {
                state.keys.insert(
                    key.clone(),
                    KeyEntry {
                        request: request.clone(),
                        created: Instant::now(),
                        state: KeyState::Executing,
                    },
                );
            }
            misstep
        };

        let took = match misstep {
            Some(Misstep::Slow(took)) => took,
            _ => EXECUTION,
        };
        tokio::time::sleep(took).await;

        let mut state = self.state();
        let object = match &request {
            Request::CreateCharge { customer, amount } => {
                let charge = Charge {
                    id: format!("ch_{}", state.charges.len() + 1),
                    customer: customer.clone(),
                    amount: *amount,
                };
                state.charges.push(charge.clone());
                Object::Charge(charge)
            }
            Request::CreateRefund { charge, amount } => {
                let refund = Refund {
                    id: format!("re_{}", state.refunds.len() + 1),
                    charge: charge.clone(),
                    amount: *amount,
                    status: RefundStatus::Pending,
                };
                state.refunds.push(refund.clone());
                Object::Refund(refund)
            }
        };
        let response = match misstep {
            Some(Misstep::ErrorAfterCommit) => Err(ApiError::new(
                500,
                "api_error",
                "An unexpected error occurred.",
            )),
            _ => Ok(object),
        };
        if let Some(entry) = key.and_then(|k| state.keys.get_mut(&k)) {
            entry.state = KeyState::Saved(response.clone());
        }
        let created = state.charges.len() + state.refunds.len();
        drop(state);
        self.inner.created.send_replace(created);
        response
    }

    /// Every charge object, in creation order.
    pub fn charges(&self) -> Vec<Charge> {
        self.state().charges.clone()
    }

    /// Every refund object, in creation order, as it is now.
    pub fn refunds(&self) -> Vec<Refund> {
        self.state().refunds.clone()
    }

    /// How many requests reached the service (executed, replayed or refused).
    pub fn requests(&self) -> usize {
        self.state().requests
    }

    /// `GET /v1/refunds/{id}`.
    pub fn refund(&self, id: &str) -> Option<Refund> {
        self.state().refunds.iter().find(|r| r.id == id).cloned()
    }

    /// The bank answers: moves a pending refund to a terminal `status`. A terminal refund
    /// never changes again (`Err` with its status).
    pub fn finish_refund(&self, id: &str, status: RefundStatus) -> Result<Refund, RefundStatus> {
        assert!(
            status.is_terminal(),
            "finish a refund with a terminal status"
        );
        let mut state = self.state();
        let refund = state
            .refunds
            .iter_mut()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no refund {id}"));
        if refund.status.is_terminal() {
            return Err(refund.status);
        }
        refund.status = status;
        Ok(refund.clone())
    }

    /// Whether the service still remembers `key` (it prunes keys after the retention).
    pub fn remembers_key(&self, key: &str) -> bool {
        let now = Instant::now();
        let retention = self.inner.retention;
        self.state()
            .keys
            .get(key)
            .is_some_and(|e| now.saturating_duration_since(e.created) < retention)
    }

    /// Resolves once at least `n` objects (charges plus refunds) exist.
    pub async fn created(&self, n: usize) {
        let mut created = self.inner.created.subscribe();
        // The sender lives as long as `self`: the channel cannot close while we wait.
        let _ = created.wait_for(|c| *c >= n).await;
    }
}

/// What the proxy does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// Forward it and return the response.
    Pass,
    /// Lose the request on the way in: nothing executes, the caller hears nothing.
    DropRequest,
    /// Forward it; lose the response: the effect happens, the caller hears nothing.
    DropResponse,
    /// Hold the request this long before forwarding it.
    DelayRequest(Duration),
    /// Forward it; hold the response this long.
    DelayResponse(Duration),
}

/// The network in front of [`Payments`]. Requests get the scripted [`Leg`]s in order, then
/// [`Leg::Pass`]. Cheap to clone; clones share the script.
#[derive(Clone)]
pub struct Proxy {
    payments: Payments,
    legs: Arc<Mutex<VecDeque<Leg>>>,
}

impl Proxy {
    /// A proxy to `payments` that passes everything until told otherwise.
    pub fn new(payments: Payments) -> Self {
        Proxy {
            payments,
            legs: Arc::default(),
        }
    }

    /// Scripts the next request's leg.
    pub fn then(&self, leg: Leg) -> &Self {
        self.legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(leg);
        self
    }

    /// The service behind the proxy.
    pub fn payments(&self) -> &Payments {
        &self.payments
    }

    /// Sends a request. The service works in its own task, so a caller that gives up (or is
    /// dropped) never cancels it. A lost request or response never resolves: the caller's
    /// timeout decides.
    pub async fn send(&self, key: Option<&str>, request: Request) -> Response {
        let leg = self
            .legs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .unwrap_or(Leg::Pass);
        let (tx, rx) = oneshot::channel();
        let payments = self.payments.clone();
        let key = key.map(str::to_owned);
        tokio::spawn(async move {
            match leg {
                Leg::DropRequest => return,
                Leg::DelayRequest(d) => tokio::time::sleep(d).await,
                _ => {}
            }
            let response = payments.handle(key.as_deref(), request).await;
            match leg {
                Leg::DropResponse => {}
                Leg::DelayResponse(d) => {
                    tokio::time::sleep(d).await;
                    let _ = tx.send(response);
                }
                _ => {
                    let _ = tx.send(response);
                }
            }
        });
        match rx.await {
            Ok(response) => response,
            Err(_) => std::future::pending().await,
        }
    }
}
