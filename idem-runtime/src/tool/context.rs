//! The contexts handlers receive. A `WriteCtx` carries the idempotency key, and only the
//! executor can make one: a write cannot run without its key.

use std::sync::Arc;

use tokio::time::Instant;

use crate::identity::{IdemKey, Scope};
use crate::store::{ClaimToken, HeldClaim};

#[derive(Debug)]
struct CallInfo {
    scope: Scope,
    call_id: Option<String>,
    tool: Arc<str>,
}

/// Context of a read tool call: who is calling and until when.
#[derive(Clone, Debug)]
pub struct ReadCtx {
    info: Arc<CallInfo>,
    deadline: Instant,
    attempt: u32,
}

impl ReadCtx {
    pub(crate) fn new(
        scope: Scope,
        call_id: Option<String>,
        tool: Arc<str>,
        deadline: Instant,
        attempt: u32,
    ) -> Self {
        ReadCtx {
            info: Arc::new(CallInfo {
                scope,
                call_id,
                tool,
            }),
            deadline,
            attempt,
        }
    }

    /// The run this call belongs to.
    pub fn run_id(&self) -> &str {
        self.info.scope.run_id()
    }

    /// The full scope (run, tenant, principal).
    pub fn scope(&self) -> &Scope {
        &self.info.scope
    }

    /// The model's id for this call (`tool_use_id`), when the caller gave one. It changes when
    /// the model re-issues a call, so it is never part of a key.
    pub fn call_id(&self) -> Option<&str> {
        self.info.call_id.as_deref()
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        &self.info.tool
    }

    /// When this attempt times out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Time left until the deadline (zero once it has passed).
    pub fn remaining(&self) -> std::time::Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Attempt number within this call, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A context for unit-testing a read handler directly.
    #[cfg(feature = "testing")]
    pub fn for_test(run_id: impl Into<String>) -> Self {
        ReadCtx::new(
            Scope::run(run_id),
            None,
            Arc::from("test"),
            Instant::now() + crate::tool::DEFAULT_TIMEOUT,
            1,
        )
    }
}

/// Context of a write tool call: a [`ReadCtx`] plus the operation's idempotency key.
///
/// Pass [`WriteCtx::key`] to the downstream (e.g. as the `Idempotency-Key` header) so that a
/// retry of the same operation is deduplicated there too. User code cannot construct a
/// `WriteCtx`; the executor makes one after it has claimed the key.
#[derive(Clone, Debug)]
pub struct WriteCtx {
    read: ReadCtx,
    key: IdemKey,
    token: ClaimToken,
}

impl WriteCtx {
    pub(crate) fn new(read: ReadCtx, key: IdemKey, token: ClaimToken) -> Self {
        WriteCtx { read, key, token }
    }

    /// The token of the claim this attempt runs under. Only needed by handlers that settle
    /// their own record in the same transaction as their effect (see the Postgres store).
    pub fn claim_token(&self) -> ClaimToken {
        self.token
    }

    /// The operation's idempotency key: the same on every attempt, every re-issue by the model
    /// and every resumed run of the same operation.
    pub fn key(&self) -> &IdemKey {
        &self.key
    }

    /// The run this call belongs to.
    pub fn run_id(&self) -> &str {
        self.read.run_id()
    }

    /// The full scope (run, tenant, principal).
    pub fn scope(&self) -> &Scope {
        self.read.scope()
    }

    /// The model's id for this call (`tool_use_id`), when given.
    pub fn call_id(&self) -> Option<&str> {
        self.read.call_id()
    }

    /// The tool's name.
    pub fn tool(&self) -> &str {
        self.read.tool()
    }

    /// When this attempt times out.
    pub fn deadline(&self) -> Instant {
        self.read.deadline()
    }

    /// Time left until the deadline.
    pub fn remaining(&self) -> std::time::Duration {
        self.read.remaining()
    }

    /// Attempt number within this call, starting at 1. Every attempt uses the same key.
    pub fn attempt(&self) -> u32 {
        self.read.attempt()
    }

    /// A context for unit-testing a write handler directly, outside the executor.
    ///
    /// Only available with the `testing` feature, so production code cannot forge a key.
    #[cfg(feature = "testing")]
    pub fn for_test(key: IdemKey) -> Self {
        WriteCtx::new(ReadCtx::for_test("test"), key, ClaimToken::fresh())
    }
}

/// Lets a store settle this attempt's record inside the transaction of its effect.
impl HeldClaim for WriteCtx {
    fn key(&self) -> &IdemKey {
        &self.key
    }

    fn claim_token(&self) -> ClaimToken {
        self.token
    }
}
