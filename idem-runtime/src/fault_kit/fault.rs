//! The faults the kit injects, each one way the world breaks around a write.

use std::fmt;

/// One way the world breaks around a write tool's call. The kit injects each at the
/// handler boundary (it cannot reach into your downstream) or drives the registry the way a
/// model or a harness would; see [the module docs](super) for the time each one takes.
///
/// Unless a fault says otherwise it breaks the *first* attempt of the first call only;
/// every attempt after it runs your handler as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// Nothing breaks: the baseline every tool must get right.
    None,
    /// Your handler runs (the effect happens), then its answer is lost: the executor hears
    /// nothing until the tool's timeout, and the outcome is unknown.
    LostAck,
    /// The request reaches your handler late: it starts half a timeout after the tool's
    /// timeout has passed (the executor has already given the attempt up), then commits.
    LateCommit,
    /// Like [`Fault::LateCommit`], at the far end of the tail: the handler starts just
    /// before the tool's in-flight bound, the latest the executor still lets it commit.
    LateTail,
    /// The request is delivered twice: your handler runs twice with the same context, key
    /// and arguments, one after the other; the executor gets the first answer. No client
    /// can prevent this one; only a downstream that honours the key makes it harmless (see
    /// [`Verdict::NotPreventable`](super::Verdict::NotPreventable)).
    Redelivery,
    /// The request is lost on its way: your handler never runs, and the executor hears
    /// nothing until the tool's timeout.
    TimeoutBeforeEffect,
    /// Your handler runs (the effect happens); then the client in it times out waiting for
    /// the answer and reports the outcome unknown, half the remaining time later.
    TimeoutAfterEffect,
    /// A `500` before anything ran: the attempt reports an unknown outcome at once, without
    /// running your handler (a 5xx does not say whether it ran).
    ServerErrorBeforeEffect,
    /// A `500` after the effect: your handler runs, then the attempt reports an unknown
    /// outcome instead of its answer.
    ServerErrorAfterEffect,
    /// `503 Service Unavailable` without `Retry-After`: the first attempt is turned away
    /// without running your handler (nothing ran); the executor asks again after its
    /// backoff.
    Unavailable,
    /// `503 Service Unavailable` with a `Retry-After`
    /// ([`FaultKit::retry_after`](super::FaultKit::retry_after)) for the first two attempts,
    /// nothing ran; the executor must wait it out before it asks again.
    UnavailableRetryAfter,
    /// Every attempt within the outage ([`FaultKit::outage`](super::FaultKit::outage),
    /// longer than the retry budget) is answered `503` with a `Retry-After`, nothing ran:
    /// the executor gives up, releases the key and tells the model nothing was done; the
    /// model calls again later ([`FaultKit::later_call`](super::FaultKit::later_call)).
    Outage,
    /// The worker dies mid-call: your handler runs (the effect happens), then its future is
    /// dropped before it answers, with the call that ran it; the lease lapses, and the
    /// restarted run issues the same call (same call id) on the same store.
    Crash,
    /// The call completes; the model calls again in a later turn with a new call id
    /// (`tool_use_id`).
    Reissue,
    /// Two workers send the same call at the same time.
    Concurrent,
    /// The call completes; the model then calls again under the same intent with other
    /// arguments ([`FaultKit::changed_args`](super::FaultKit::changed_args)). That call
    /// must be refused ("same key, changed parameters") and execute nothing.
    ChangedParams,
}

impl Fault {
    /// Every fault, in the order the report lists them.
    pub const ALL: [Fault; 16] = [
        Fault::None,
        Fault::LostAck,
        Fault::LateCommit,
        Fault::LateTail,
        Fault::Redelivery,
        Fault::TimeoutBeforeEffect,
        Fault::TimeoutAfterEffect,
        Fault::ServerErrorBeforeEffect,
        Fault::ServerErrorAfterEffect,
        Fault::Unavailable,
        Fault::UnavailableRetryAfter,
        Fault::Outage,
        Fault::Crash,
        Fault::Reissue,
        Fault::Concurrent,
        Fault::ChangedParams,
    ];

    /// The fault's name in the report (`lost-ack`, `timeout-pre`, …).
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::LostAck => "lost-ack",
            Fault::LateCommit => "late-commit",
            Fault::LateTail => "late-tail",
            Fault::Redelivery => "redelivery",
            Fault::TimeoutBeforeEffect => "timeout-pre",
            Fault::TimeoutAfterEffect => "timeout-post",
            Fault::ServerErrorBeforeEffect => "http500-pre",
            Fault::ServerErrorAfterEffect => "http500-post",
            Fault::Unavailable => "unavailable-503",
            Fault::UnavailableRetryAfter => "retry-after-503",
            Fault::Outage => "outage-503",
            Fault::Crash => "crash",
            Fault::Reissue => "reissue",
            Fault::Concurrent => "concurrent",
            Fault::ChangedParams => "changed-params",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
