//! The faults: the seed experiment's three (plus its no-fault baseline) and the extended ones.

use std::time::Duration;

use idem::fault_kit::{Fault as KitFault, FaultKit};

use super::billing::{Glitch, KeyContract};
use super::strategies::Strategy;

/// One way the world breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing breaks: the baseline every strategy must get right.
    None,
    /// The charge commits; the client sees a timeout (30 s pass).
    LostAck,
    /// The request is still in flight when the client times out; the charge lands 90 s after
    /// it was sent.
    LateCommit,
    /// The transport delivers the one request twice; the client sees one success.
    Redelivery,
    /// Timed out, never executed: the request was lost on the way in.
    TimeoutPre,
    /// Executed, then the service answered `500`.
    Http500Post,
    /// Like late-commit, but the charge lands anywhere from 40 s to 2 h later (seeded).
    LateTail,
    /// Two workers send the same call at once.
    Concurrent,
    /// The call completes; the model calls again next turn with a new `tool_use_id`.
    Reissue,
    /// The worker dies after the charge committed, before it recorded the result; it comes
    /// back two minutes later and is asked again.
    Crash,
    /// The response to the first attempt is lost; the retry says 9900 instead of 4900.
    ChangedParams,
    /// The service ignores idempotency keys; the response to the first attempt is lost.
    Unkeyed,
    /// The service sheds load: its first two requests get `503 Service Unavailable` with
    /// `Retry-After: 2`, at once and without executing; then it serves normally.
    Unavailable503,
    /// The service answers `503` with `Retry-After: 20` to every request for 35 s, longer
    /// than idem's retry budget (`strategies::BUDGET`, 30 s); the model calls again a minute after its first turn
    /// ended.
    Outage503,
}

/// How long after a late-commit request its charge lands.
const LATE_COMMIT: Duration = Duration::from_secs(90);
/// Bounds of the late-tail delay.
const LATE_TAIL_MIN_SECS: u64 = 40;
const LATE_TAIL_MAX_SECS: u64 = 2 * 3600;
/// How many requests the `unavailable-503` service turns away, and its `Retry-After`.
const UNAVAILABLE_REQUESTS: u32 = 2;
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long the `outage-503` service turns every request away, and its `Retry-After`.
const OUTAGE: Duration = Duration::from_secs(35);
const OUTAGE_RETRY_AFTER: Duration = Duration::from_secs(20);
/// How long after its first turn the model calls again in the `outage-503` block.
const OUTAGE_LATER_CALL: Duration = Duration::from_secs(60);
/// The seed of the late-tail delays.
const SEED: u64 = 42;

impl Fault {
    /// The seed experiment's block: its three faults and the no-fault baseline. Four faults
    /// times four strategies are the seed's "16 runs".
    pub const SEED: [Fault; 4] = [
        Fault::None,
        Fault::LostAck,
        Fault::LateCommit,
        Fault::Redelivery,
    ];

    /// The faults beyond the seed.
    pub const EXTENDED: [Fault; 10] = [
        Fault::TimeoutPre,
        Fault::Http500Post,
        Fault::LateTail,
        Fault::Concurrent,
        Fault::Reissue,
        Fault::Crash,
        Fault::ChangedParams,
        Fault::Unkeyed,
        Fault::Unavailable503,
        Fault::Outage503,
    ];

    /// The name printed in the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::LostAck => "lost-ack",
            Fault::LateCommit => "late-commit",
            Fault::Redelivery => "redelivery",
            Fault::TimeoutPre => "timeout-pre",
            Fault::Http500Post => "http500-post",
            Fault::LateTail => "late-tail",
            Fault::Concurrent => "concurrent",
            Fault::Reissue => "reissue",
            Fault::Crash => "crash",
            Fault::ChangedParams => "changed-params",
            Fault::Unkeyed => "unkeyed",
            Fault::Unavailable503 => "unavailable-503",
            Fault::Outage503 => "outage-503",
        }
    }

    /// The fault kit's fault that breaks idem's run the way this one breaks the hand-rolled
    /// strategies' (at the charge tool's handler, not in the network).
    pub fn kit_fault(self) -> KitFault {
        match self {
            Fault::None => KitFault::None,
            // Unkeyed: the lost ack, to a service that ignores keys.
            Fault::LostAck | Fault::Unkeyed => KitFault::LostAck,
            Fault::LateCommit => KitFault::LateCommit,
            Fault::Redelivery => KitFault::Redelivery,
            Fault::TimeoutPre => KitFault::TimeoutBeforeEffect,
            Fault::Http500Post => KitFault::ServerErrorAfterEffect,
            Fault::LateTail => KitFault::LateTail,
            Fault::Concurrent => KitFault::Concurrent,
            Fault::Reissue => KitFault::Reissue,
            Fault::Crash => KitFault::Crash,
            Fault::ChangedParams => KitFault::ChangedParams,
            Fault::Unavailable503 => KitFault::UnavailableRetryAfter,
            Fault::Outage503 => KitFault::Outage,
        }
    }

    /// `kit` with this block's `503`s: their `Retry-After`, and for the outage its length
    /// and when the model calls again.
    pub fn tune(self, kit: FaultKit) -> FaultKit {
        match self {
            Fault::Unavailable503 => kit.retry_after(UNAVAILABLE_RETRY_AFTER),
            Fault::Outage503 => kit
                .retry_after(OUTAGE_RETRY_AFTER)
                .outage(OUTAGE)
                .later_call(OUTAGE_LATER_CALL),
            _ => kit,
        }
    }

    /// How the network breaks the first request of a run of `strategy`.
    pub fn glitch(self, strategy: Strategy) -> Option<Glitch> {
        match self {
            Fault::None | Fault::Concurrent | Fault::Reissue => None,
            // A crashed worker never sees its response: the injector kills it at the commit.
            Fault::LostAck | Fault::Crash | Fault::ChangedParams | Fault::Unkeyed => {
                Some(Glitch::LostAck)
            }
            Fault::LateCommit => Some(Glitch::SlowCommit(LATE_COMMIT)),
            Fault::Redelivery => Some(Glitch::Redelivery),
            Fault::TimeoutPre => Some(Glitch::DropRequest),
            Fault::Http500Post => Some(Glitch::ServerErrorAfterCommit),
            Fault::LateTail => Some(Glitch::SlowCommit(late_tail(strategy))),
            Fault::Unavailable503 => Some(Glitch::Unavailable {
                requests: UNAVAILABLE_REQUESTS,
                retry_after: UNAVAILABLE_RETRY_AFTER,
            }),
            Fault::Outage503 => Some(Glitch::Outage {
                lasts: OUTAGE,
                retry_after: OUTAGE_RETRY_AFTER,
            }),
        }
    }

    /// When the model calls again (with a new `tool_use_id`) after its first turn ended,
    /// in the blocks where it does so because it was told to try later.
    pub fn later_call(self) -> Option<Duration> {
        match self {
            Fault::Outage503 => Some(OUTAGE_LATER_CALL),
            _ => None,
        }
    }

    /// Whether the table shows, after each turn, the simulated time and the ledger's size
    /// (the blocks where waiting is the point).
    pub fn stamps_turns(self) -> bool {
        matches!(self, Fault::Unavailable503 | Fault::Outage503)
    }

    /// Whether the service honours idempotency keys in this block.
    pub fn contract(self) -> KeyContract {
        match self {
            Fault::Unkeyed => KeyContract::Ignored,
            _ => KeyContract::Honoured,
        }
    }

    /// How far the clock advances after the strategy is done, so everything in flight lands:
    /// an hour, as in the seed; three for the late tail, which reaches two.
    pub fn settle_time(self) -> Duration {
        match self {
            Fault::LateTail => Duration::from_secs(3 * 3600),
            _ => Duration::from_secs(3600),
        }
    }
}

/// The late-tail delay of `strategy`'s run: seeded per strategy, so adding a strategy or
/// reordering the table does not move the others' numbers.
pub fn late_tail(strategy: Strategy) -> Duration {
    let index = Strategy::ALL
        .iter()
        .position(|s| *s == strategy)
        .unwrap_or(0) as u64;
    let span = LATE_TAIL_MAX_SECS - LATE_TAIL_MIN_SECS + 1;
    Duration::from_secs(LATE_TAIL_MIN_SECS + splitmix64(SEED ^ index) % span)
}

/// SplitMix64: a tiny, well-mixed, seedable generator; enough for one draw per run.
fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
