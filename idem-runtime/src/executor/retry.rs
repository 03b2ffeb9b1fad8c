//! When the executor may try an attempt again.

use std::time::Duration;

/// Bounded retries of *unknown* attempts, with exponential backoff.
///
/// Applied only where a repeat is harmless: write tools whose downstream honours keys
/// (`Downstream::Keyed`, same key on every attempt, inside the safe window) and read tools.
/// An unkeyed write is never retried by the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (≥ 1).
    pub max_attempts: u32,
    /// Pause before the second attempt.
    pub initial_backoff: Duration,
    /// Upper bound of a pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn never() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The pause after attempt number `attempt` (1-based) failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }
}
