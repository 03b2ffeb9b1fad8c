//! The five client strategies: four hand-rolled retry loops from the seed experiment, and
//! idem (the charge tool called through a `Registry`).

use std::sync::Arc;
use std::time::Duration;

use idem::fault_kit::{Answer, Subject};
use idem::identity::canonical::to_canonical_vec;
use idem::{
    identity::Fingerprint, registry::RetryPolicy, toolbox, CallError, Outcome, ToolError,
    ToolResult, WriteCtx,
};
use serde_json::json;

use super::billing::{
    BillingService, Charge, ChargeRequest, Client, ClientError, Glitch, KeyContract, Network,
};

/// The task: charge this customer…
pub const CUSTOMER: &str = "acme";
/// …this many cents, exactly once.
pub const AMOUNT: u64 = 4900;
/// The task id (the intent the agent minted before its first send).
pub const TASK: &str = "task-42";
/// The agent run the idem calls belong to.
pub const RUN_ID: &str = "run-1";
/// Attempts per call, for every strategy (idem's executor included).
pub const ATTEMPTS: u32 = 3;
/// Pause between attempts.
pub const PAUSE: Duration = Duration::from_secs(1);
/// How long idem's executor may spend asking an unavailable service again (503: nothing
/// ran), pauses included; the hand-rolled loops have only [`ATTEMPTS`] and [`PAUSE`].
pub const BUDGET: Duration = Duration::from_secs(30);

/// A client strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Retry without a key.
    Naive,
    /// No key; after a failed attempt, list the customer's charges and take any charge of the
    /// same amount as proof that it went through.
    VerifyThenRetry,
    /// A new key on every attempt: `{task}-retry{i}`.
    NewKeyPerAttempt,
    /// One key from task + tool + canonical arguments, pinned before the first attempt; stop
    /// on an error response; "unknown: escalate" when every attempt timed out.
    PinnedKey,
    /// The charge tool through idem's `Registry`; the key comes from `WriteCtx`. Its runs go
    /// through idem's fault kit (`main::idem_run`), not [`Strategy::run`].
    Idem,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Strategy; 5] = [
        Strategy::Naive,
        Strategy::VerifyThenRetry,
        Strategy::NewKeyPerAttempt,
        Strategy::PinnedKey,
        Strategy::Idem,
    ];

    /// The seed experiment's four strategies.
    pub const SEED: [Strategy; 4] = [
        Strategy::Naive,
        Strategy::VerifyThenRetry,
        Strategy::NewKeyPerAttempt,
        Strategy::PinnedKey,
    ];

    /// The name printed in the table.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::VerifyThenRetry => "verify-then-retry",
            Strategy::NewKeyPerAttempt => "new-key-per-attempt",
            Strategy::PinnedKey => "pinned-key",
            Strategy::Idem => "idem",
        }
    }

    /// Carries out one turn of a hand-rolled strategy: the agent asks for the charge once;
    /// the strategy decides what goes over the wire and what the agent is told.
    pub async fn run(self, world: &World, turn: &Turn) -> Told {
        match self {
            Strategy::Naive => retry_loop(world, turn, |_| None, false).await,
            Strategy::VerifyThenRetry => retry_loop(world, turn, |_| None, true).await,
            Strategy::NewKeyPerAttempt => {
                retry_loop(world, turn, |i| Some(format!("{TASK}-retry{i}")), false).await
            }
            Strategy::PinnedKey => pinned_key(world, turn).await,
            Strategy::Idem => unreachable!("idem's runs go through the fault kit (main::idem_run)"),
        }
    }
}

/// One request of the agent for the charge, as a hand-rolled strategy gets it.
#[derive(Clone, Debug)]
pub struct Turn {
    /// The amount sent on attempt 1, 2, 3 (they differ only in the changed-params block).
    pub amounts: [u64; ATTEMPTS as usize],
}

impl Turn {
    /// The agent's first (and usually only) request.
    pub fn first() -> Self {
        Turn {
            amounts: [AMOUNT; ATTEMPTS as usize],
        }
    }

    /// The same request, re-issued by the model in a later turn (its new `tool_use_id` is
    /// nothing a hand-rolled loop looks at).
    pub fn reissued(&self) -> Self {
        self.clone()
    }

    /// The same request with attempt 1, 2, 3 sending these amounts.
    pub fn with_amounts(mut self, amounts: [u64; ATTEMPTS as usize]) -> Self {
        self.amounts = amounts;
        self
    }

    fn amount(&self, attempt: u32) -> u64 {
        self.amounts[(attempt - 1) as usize]
    }
}

/// What the agent ended up believing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Belief {
    /// "It's done."
    Completed,
    /// An error it may act on (retry, give up, tell the user).
    Failed,
    /// "Nobody knows yet; do not retry" (idem's unknown or pending, the pinned key's escalation).
    Unknown,
    /// "Refused: this action was already requested with other parameters."
    Refused,
    /// The worker died before it could tell the agent anything.
    Crashed,
}

/// What the agent was told at the end of a turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    /// The gist.
    pub belief: Belief,
    /// The short text printed in the table.
    pub text: String,
}

impl Told {
    /// What the agent was told, and its gist.
    pub fn new(belief: Belief, text: impl Into<String>) -> Self {
        Told {
            belief,
            text: text.into(),
        }
    }

    /// The report of a worker that died mid-call.
    pub fn crashed() -> Self {
        Told::new(Belief::Crashed, "(worker crashed)")
    }
}

/// Everything one run touches: a fresh billing service and the network to it. Cheap to
/// clone; clones share everything.
#[derive(Clone)]
pub struct World {
    /// The service whose ledger is counted.
    pub service: Arc<BillingService>,
    client: Client,
    contract: KeyContract,
}

impl World {
    /// A fresh world. `glitch` breaks the first request; `contract` says whether the service
    /// honours keys (idem's charge tool declares the same).
    pub fn new(contract: KeyContract, glitch: Option<Glitch>) -> Self {
        let service = BillingService::new(contract);
        let client = Client::new(Network::new(service.clone(), glitch), service.clone());
        World {
            service,
            client,
            contract,
        }
    }

    /// The charge tool over this world's client, for the fault kit, counted on the
    /// service's ledger. The tool declares the service's key contract truthfully.
    pub fn subject(&self) -> Subject {
        let service = self.service.clone();
        let ledger = move |_key: &idem::IdemKey| service.ledger_snapshot().len();
        let client = self.client.clone();
        match self.contract {
            KeyContract::Honoured => {
                Subject::toolbox(Arc::new(KeyedBilling { client }), "charge", ledger)
            }
            KeyContract::Ignored => {
                Subject::toolbox(Arc::new(UnkeyedBilling { client }), "charge", ledger)
            }
        }
    }

    /// The client the hand-rolled strategies (and the charge tool) use.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// idem's retry policy: the hand-rolled loops' attempts and pause, no jitter, and a budget
/// for asking an unavailable service again.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(ATTEMPTS)
        .initial_backoff(PAUSE)
        .max_backoff(PAUSE)
        .jitter(0.0)
        .budget(BUDGET)
}

/// Arguments of the charge tool.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The customer to charge.
    pub customer: String,
    /// The amount in cents.
    pub amount: u64,
}

/// The charge tool's state when the billing service honours keys: the tool says so
/// (`downstream = "keyed"`), so the executor may retry an unknown attempt with the same key.
struct KeyedBilling {
    client: Client,
}

#[toolbox]
impl KeyedBilling {
    /// Charge a customer's card (amount in cents).
    ///
    /// The timeout (45 s) is above the client's own 30 s, so the handler sees that timeout
    /// and reports it as *unknown* itself.
    #[tool(write, downstream = "keyed", timeout = "45s")]
    async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        charge_with_key(&self.client, ctx, args).await
    }
}

/// The charge tool's state when the service ignores keys: the tool declares no key contract
/// (the default, `downstream = "unkeyed"`), so an unknown attempt is never sent again.
struct UnkeyedBilling {
    client: Client,
}

#[toolbox]
impl UnkeyedBilling {
    /// Charge a customer's card (amount in cents).
    #[tool(write, timeout = "45s")]
    async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<Charge, ToolError> {
        charge_with_key(&self.client, ctx, args).await
    }
}

/// The handler of both: passes the operation's key downstream and says what the answer
/// proves.
async fn charge_with_key(
    client: &Client,
    ctx: WriteCtx,
    args: ChargeArgs,
) -> Result<Charge, ToolError> {
    let req = ChargeRequest {
        customer: args.customer,
        amount: args.amount,
        idempotency_key: Some(ctx.key().as_str().to_owned()),
    };
    client.create_charge(req).await.map_err(|e| match e {
        // A 503 or 429 is load shedding: the service turned the request away before it
        // executed anything, so asking again (after its Retry-After) is harmless.
        ClientError::Api(ref api) if api.status == 503 || api.status == 429 => {
            let said = format!("{} {}", api.status, api.message);
            match api.retry_after {
                Some(wait) => ToolError::unavailable_for(said, wait),
                None => ToolError::unavailable(said),
            }
        }
        // Silence, another 5xx, or "the first request with this key is still running": the
        // charge may have happened. Only a 4xx that says "not executed" is a rejection.
        ClientError::Timeout => ToolError::unknown(&e),
        ClientError::Api(ref api) if api.status == 409 || api.status >= 500 => {
            ToolError::unknown(&e)
        }
        ClientError::Api(_) => ToolError::rejected(&e),
    })
}

/// What the agent is told of one of idem's answers (a crashed worker tells it nothing).
pub fn told_of(answer: &Answer) -> Told {
    let result: &ToolResult = match answer {
        Answer::Returned(result) => result,
        Answer::Crashed => return Told::crashed(),
    };
    let attempts = match result.attempts() {
        0 if result.replayed() => " (replayed)".to_owned(),
        0 | 1 => String::new(),
        n => format!(" ({n} attempts)"),
    };
    match result.as_result() {
        Ok(Outcome::Completed { output }) => {
            let id = output["id"].as_str().unwrap_or("?");
            Told::new(Belief::Completed, format!("completed {id}{attempts}"))
        }
        Ok(Outcome::ResultExpired { .. }) => Told::new(Belief::Completed, "already done"),
        Ok(Outcome::Unknown { .. }) => Told::new(
            Belief::Unknown,
            format!("unknown: not sent again{attempts}"),
        ),
        Ok(Outcome::Pending { downstream_ref, .. }) => {
            Told::new(Belief::Unknown, format!("pending {downstream_ref}"))
        }
        Ok(Outcome::Escalated { .. }) => Told::new(Belief::Unknown, "escalated"),
        Ok(Outcome::Failed { message, .. }) => {
            Told::new(Belief::Failed, format!("failed: {message}"))
        }
        Ok(Outcome::Rejected { message }) => {
            Told::new(Belief::Failed, format!("rejected: {message}"))
        }
        // What the model reads: "unavailable, not executed (…); nothing was done. You may
        // call again in 20s or later."
        Ok(Outcome::Unavailable { .. }) => {
            Told::new(Belief::Failed, format!("{}{attempts}", result.text()))
        }
        Ok(other) => Told::new(Belief::Failed, format!("{other:?}")),
        Err(CallError::ChangedParams { .. }) => {
            Told::new(Belief::Refused, "refused: same intent, changed params")
        }
        Err(e) => Told::new(Belief::Failed, format!("error: {e}")),
    }
}

/// Naive, verify-then-retry and new-key-per-attempt: retry on any failure.
async fn retry_loop(
    world: &World,
    turn: &Turn,
    key: impl Fn(u32) -> Option<String>,
    verify: bool,
) -> Told {
    let mut last = ClientError::Timeout;
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            tokio::time::sleep(PAUSE).await;
        }
        let amount = turn.amount(attempt);
        let req = ChargeRequest {
            customer: CUSTOMER.into(),
            amount,
            idempotency_key: key(attempt),
        };
        match world.client.create_charge(req).await {
            Ok(charge) => return Told::new(Belief::Completed, format!("completed {}", charge.id)),
            Err(e) => last = e,
        }
        if verify {
            if let Some(found) = world
                .client
                .list_charges(CUSTOMER)
                .into_iter()
                .find(|c| c.amount == amount)
            {
                return Told::new(Belief::Completed, format!("completed (found {})", found.id));
            }
        }
    }
    Told::new(Belief::Failed, format!("failed: {last}"))
}

/// The pinned intent key: one key, every attempt; stop on an error response.
async fn pinned_key(world: &World, turn: &Turn) -> Told {
    let args = json!({ "customer": CUSTOMER, "amount": turn.amount(1) });
    let digest = Fingerprint::of_canonical(&to_canonical_vec(&args)).to_hex();
    let key = format!("{TASK}-charge-{}", &digest[..16]);
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            tokio::time::sleep(PAUSE).await;
        }
        let req = ChargeRequest {
            customer: CUSTOMER.into(),
            amount: turn.amount(attempt),
            idempotency_key: Some(key.clone()),
        };
        match world.client.create_charge(req).await {
            Ok(charge) => return Told::new(Belief::Completed, format!("completed {}", charge.id)),
            Err(ClientError::Timeout) => continue,
            Err(ClientError::Api(e)) if e.status == 400 => {
                return Told::new(Belief::Refused, format!("refused: {e}"))
            }
            Err(ClientError::Api(e)) => return Told::new(Belief::Failed, format!("error {e}")),
        }
    }
    Told::new(Belief::Unknown, "unknown: escalate")
}
