//! The mock billing service, the network in front of it, and the HTTP-like client every
//! strategy uses.
//!
//! Time is tokio's paused clock: a 30 s timeout or a commit that lands 90 s late costs no
//! real time, and every run is the same. The service honours idempotency keys the Stripe
//! way:
//! - same key, same parameters: the first response is replayed (server errors included);
//! - same key while the first request still executes: `409`, nothing saved;
//! - same key, other parameters: `400`, nothing executed;
//! - no key (or a service that ignores keys): a new charge every time.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// How long the service takes to execute a charge when nothing is wrong.
pub const EXECUTION: Duration = Duration::from_millis(100);

/// How long a client waits for a response before it gives up.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A charge committed to the ledger.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Charge {
    /// The service's id, `ch_1`, `ch_2`, … in commit order.
    pub id: String,
    /// Who was charged.
    pub customer: String,
    /// How much, in cents.
    pub amount: u64,
    /// When it committed, in milliseconds since the run started.
    pub at_ms: u64,
}

/// An error response of the service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What the service said.
    pub message: String,
    /// The `Retry-After` header: how long the service asks the client to wait.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    fn new(status: u16, message: &str) -> Self {
        ApiError {
            status,
            message: message.to_owned(),
            retry_after: None,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)?;
        match self.retry_after {
            Some(wait) => write!(f, " (Retry-After: {})", wait.as_secs()),
            None => Ok(()),
        }
    }
}

/// What the service answers to a create-charge request.
pub type Response = Result<Charge, ApiError>;

/// A create-charge request as it travels over the network.
#[derive(Clone, Debug)]
pub struct ChargeRequest {
    /// Who to charge.
    pub customer: String,
    /// How much, in cents.
    pub amount: u64,
    /// The `Idempotency-Key` header, when the client sends one.
    pub idempotency_key: Option<String>,
}

/// Does the service honour the `Idempotency-Key` header?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyContract {
    /// Stripe's contract (see the module docs).
    Honoured,
    /// The header is ignored: every request that arrives is executed.
    Ignored,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Params {
    customer: String,
    amount: u64,
}

enum KeyEntry {
    Executing(Params),
    Done(Params, Response),
}

#[derive(Default)]
struct Ledger {
    charges: Vec<Charge>,
    keys: HashMap<String, KeyEntry>,
}

/// The billing service: a ledger of charges and the idempotency keys it has seen.
pub struct BillingService {
    contract: KeyContract,
    started: Instant,
    ledger: Mutex<Ledger>,
    /// Number of committed charges, for whoever waits for a commit (the crash injector).
    commits: watch::Sender<usize>,
}

impl BillingService {
    /// An empty service whose clock starts now.
    pub fn new(contract: KeyContract) -> Arc<Self> {
        Arc::new(BillingService {
            contract,
            started: Instant::now(),
            ledger: Mutex::new(Ledger::default()),
            commits: watch::Sender::new(0),
        })
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Each critical section is a single insert or push, so a poisoned lock still guards
        // consistent data.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Executes one request: takes `took` to commit, and with `fail_after_commit` answers
    /// `500` although the charge committed (the `500` is saved under the key, as Stripe does).
    async fn execute(
        &self,
        req: &ChargeRequest,
        took: Duration,
        fail_after_commit: bool,
    ) -> Response {
        let params = Params {
            customer: req.customer.clone(),
            amount: req.amount,
        };
        let key = match self.contract {
            KeyContract::Honoured => req.idempotency_key.clone(),
            KeyContract::Ignored => None,
        };
        if let Some(key) = &key {
            let mut ledger = self.ledger();
            match ledger.keys.get(key) {
                Some(KeyEntry::Executing(p) | KeyEntry::Done(p, _)) if *p != params => {
                    return Err(ApiError::new(
                        400,
                        "idempotency key reused with different parameters",
                    ));
                }
                Some(KeyEntry::Executing(_)) => {
                    return Err(ApiError::new(
                        409,
                        "another request with this key is in progress",
                    ));
                }
                Some(KeyEntry::Done(_, saved)) => return saved.clone(),
                None => {
                    ledger
                        .keys
                        .insert(key.clone(), KeyEntry::Executing(params.clone()));
                }
            }
        }
        tokio::time::sleep(took).await;
        let charge = {
            let mut ledger = self.ledger();
            let charge = Charge {
                id: format!("ch_{}", ledger.charges.len() + 1),
                customer: params.customer.clone(),
                amount: params.amount,
                at_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            };
            ledger.charges.push(charge.clone());
            charge
        };
        self.commits.send_modify(|n| *n += 1);
        let response = if fail_after_commit {
            Err(ApiError::new(500, "internal error"))
        } else {
            Ok(charge)
        };
        if let Some(key) = key {
            self.ledger()
                .keys
                .insert(key, KeyEntry::Done(params, response.clone()));
        }
        response
    }

    /// The customer's charges (a read: never faulted).
    pub fn list_charges(&self, customer: &str) -> Vec<Charge> {
        self.ledger()
            .charges
            .iter()
            .filter(|c| c.customer == customer)
            .cloned()
            .collect()
    }

    /// The whole ledger: what the experiment counts.
    pub fn ledger_snapshot(&self) -> Vec<Charge> {
        self.ledger().charges.clone()
    }

    /// Resolves once at least one charge has committed.
    pub async fn first_commit(&self) {
        let mut commits = self.commits.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = commits.wait_for(|n| *n >= 1).await;
    }
}

/// How the fault injector breaks the first request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glitch {
    /// The charge commits; the response is lost.
    LostAck,
    /// The service executes slowly: the charge lands this long after it was sent.
    SlowCommit(Duration),
    /// The transport delivers the request twice; the client sees the first response.
    Redelivery,
    /// The request is lost before it reaches the service: nothing executes.
    DropRequest,
    /// The charge commits, then the service answers `500`.
    ServerErrorAfterCommit,
    /// The service sheds load: the first `requests` requests are answered `503 Service
    /// Unavailable` with this `Retry-After`, at once and without executing (nothing reaches
    /// the ledger or the key table); the ones after are served normally.
    Unavailable {
        /// How many requests are turned away.
        requests: u32,
        /// The `Retry-After` of each `503`.
        retry_after: Duration,
    },
    /// Like [`Glitch::Unavailable`], for every request that arrives within `lasts` of the
    /// network's creation, however many.
    Outage {
        /// How long the service turns requests away.
        lasts: Duration,
        /// The `Retry-After` of each `503`.
        retry_after: Duration,
    },
}

/// The `503` a load-shedding service answers without executing.
fn unavailable(retry_after: Duration) -> Response {
    Err(ApiError {
        retry_after: Some(retry_after),
        ..ApiError::new(503, "Service Unavailable")
    })
}

/// The network between clients and the service; breaks the first request it carries (the
/// first few, or every one for a while, when the service is unavailable).
pub struct Network {
    service: Arc<BillingService>,
    first: Mutex<Option<Glitch>>,
    started: Instant,
}

impl Network {
    /// A network to `service` that applies `glitch` (if any) to the first request.
    pub fn new(service: Arc<BillingService>, glitch: Option<Glitch>) -> Arc<Self> {
        Arc::new(Network {
            service,
            first: Mutex::new(glitch),
            started: Instant::now(),
        })
    }

    /// The glitch for the request being sent now: taken, unless it lasts beyond one request.
    fn next_glitch(&self) -> Option<Glitch> {
        let mut first = self.first.lock().unwrap_or_else(|e| e.into_inner());
        match *first {
            Some(
                now @ Glitch::Unavailable {
                    requests,
                    retry_after,
                },
            ) if requests > 1 => {
                *first = Some(Glitch::Unavailable {
                    requests: requests - 1,
                    retry_after,
                });
                Some(now)
            }
            Some(now @ Glitch::Outage { lasts, .. }) if self.started.elapsed() < lasts => Some(now),
            Some(Glitch::Outage { .. }) => first.take().and(None),
            _ => first.take(),
        }
    }

    /// Carries `req` to the service. The service works in its own task, so a client that
    /// gives up (or dies) never cancels it. The receiver yields nothing if the response is
    /// lost.
    fn carry(&self, req: ChargeRequest) -> oneshot::Receiver<Response> {
        let glitch = self.next_glitch();
        let (tx, rx) = oneshot::channel();
        let service = self.service.clone();
        tokio::spawn(async move {
            match glitch {
                None => {
                    let _ = tx.send(service.execute(&req, EXECUTION, false).await);
                }
                Some(Glitch::LostAck) => {
                    service.execute(&req, EXECUTION, false).await.ok();
                    drop(tx);
                }
                Some(Glitch::SlowCommit(took)) => {
                    let _ = tx.send(service.execute(&req, took, false).await);
                }
                Some(Glitch::Redelivery) => {
                    let _ = tx.send(service.execute(&req, EXECUTION, false).await);
                    service.execute(&req, EXECUTION, false).await.ok();
                }
                Some(Glitch::DropRequest) => drop(tx),
                Some(Glitch::ServerErrorAfterCommit) => {
                    let _ = tx.send(service.execute(&req, EXECUTION, true).await);
                }
                Some(
                    Glitch::Unavailable { retry_after, .. } | Glitch::Outage { retry_after, .. },
                ) => {
                    let _ = tx.send(unavailable(retry_after));
                }
            }
        });
        rx
    }
}

/// Why a create-charge call did not return a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// No response within [`CLIENT_TIMEOUT`]: the charge may or may not have happened.
    Timeout,
    /// The service answered with an error.
    Api(ApiError),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Timeout => write!(f, "timeout after {}s", CLIENT_TIMEOUT.as_secs()),
            ClientError::Api(e) => write!(f, "{e}"),
        }
    }
}

/// The client every strategy (and idem's charge tool) talks to the service with.
#[derive(Clone)]
pub struct Client {
    net: Arc<Network>,
    service: Arc<BillingService>,
}

impl Client {
    /// A client of `service` over `net`.
    pub fn new(net: Arc<Network>, service: Arc<BillingService>) -> Self {
        Client { net, service }
    }

    /// `POST /v1/charges`, waiting at most [`CLIENT_TIMEOUT`] for the response.
    pub async fn create_charge(&self, req: ChargeRequest) -> Result<Charge, ClientError> {
        let rx = self.net.carry(req);
        let response = async {
            match rx.await {
                Ok(response) => response,
                // A lost response looks like silence, not like a closed connection.
                Err(_) => std::future::pending().await,
            }
        };
        match tokio::time::timeout(CLIENT_TIMEOUT, response).await {
            Ok(response) => response.map_err(ClientError::Api),
            Err(_) => Err(ClientError::Timeout),
        }
    }

    /// `GET /v1/charges?customer=…` (reads are not faulted).
    pub fn list_charges(&self, customer: &str) -> Vec<Charge> {
        self.service.list_charges(customer)
    }
}
