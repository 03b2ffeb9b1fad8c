//! When the executor may try an attempt again.

use std::time::Duration;

/// Bounded retries of *unknown* attempts, with exponential backoff and jitter.
///
/// Applied only where a repeat is harmless: write tools whose downstream honours keys
/// (`Downstream::Keyed`, same key on every attempt, inside the safe window), read tools,
/// and any write whose downstream answered *unavailable, not executed* (503, 429), within
/// [`RetryPolicy::budget`]. An unkeyed write whose outcome is unknown is never retried by the
/// executor. An attempt that **panicked** is not
/// retried either, keyed or not: a panic is a defect in the handler rather than a transient
/// fault, and would most likely recur. Its record stays *unknown*, and the reconciler
/// (which retries keyed records with the same key) or a person settles it.
///
/// Built from [`RetryPolicy::default`] and the setters, so new knobs can be added without
/// breaking callers:
///
/// ```
/// # use idem_runtime::registry::RetryPolicy;
/// # use std::time::Duration;
/// let policy = RetryPolicy::default()
///     .max_attempts(5)
///     .initial_backoff(Duration::from_millis(100))
///     .max_backoff(Duration::from_secs(2));
/// assert_eq!(policy.max_attempts, 5);
/// assert!(policy.backoff(2) <= Duration::from_millis(200));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Attempts in total, the first included (≥ 1).
    pub max_attempts: u32,
    /// Pause before the second attempt (before jitter).
    pub initial_backoff: Duration,
    /// Upper bound of a pause.
    pub max_backoff: Duration,
    /// The fraction of each pause drawn at random (0 to 1, default 0.5): a pause of `p` is
    /// `p × (1 − jitter)` plus a uniform draw from `[0, p × jitter]`. Without it, workers
    /// that failed together retry together, and a downstream that was overloaded gets the
    /// same burst again.
    pub jitter: f64,
    /// How long one call may spend asking an *unavailable* downstream again (503, 429:
    /// provably not executed), pauses included (default 30 s). A pause that would end past
    /// it, a `Retry-After` included, is not taken: the claim is released and the model is
    /// told to try again later.
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            jitter: 0.5,
            budget: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// No retries.
    pub fn never() -> Self {
        RetryPolicy::default().max_attempts(1)
    }

    /// Sets the number of attempts in total, the first included (0 counts as 1).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Sets the pause before the second attempt.
    pub fn initial_backoff(mut self, pause: Duration) -> Self {
        self.initial_backoff = pause;
        self
    }

    /// Sets the upper bound of a pause.
    pub fn max_backoff(mut self, pause: Duration) -> Self {
        self.max_backoff = pause;
        self
    }

    /// Sets the random fraction of each pause (clamped to 0..=1; 0 for fixed pauses, as a
    /// deterministic test may want).
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Sets how long one call may spend asking an unavailable downstream again.
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The pause before asking an unavailable downstream again after attempt `attempt`, or
    /// `None` when the call must give up: attempts exhausted, or the pause (the backoff, or
    /// the downstream's `retry_after` if longer) would end past the budget, `spent` of which
    /// is gone.
    pub fn unavailable_pause(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        spent: Duration,
    ) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        let pause = self
            .backoff(attempt)
            .max(retry_after.unwrap_or(Duration::ZERO));
        (spent.saturating_add(pause) <= self.budget).then_some(pause)
    }

    /// The pause after attempt number `attempt` (1-based) failed: exponential, capped at
    /// [`RetryPolicy::max_backoff`], with [`RetryPolicy::jitter`] of it drawn at random.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let full = self
            .initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff);
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        if jitter == 0.0 || full.is_zero() {
            return full;
        }
        let spread = full.mul_f64(jitter);
        full - spread + spread.mul_f64(unit_random())
    }
}

/// A uniform draw from `[0, 1)`. Not for secrets: it only has to differ between workers
/// and between calls, which the standard library's randomly keyed hasher gives without a
/// dependency.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_spread_within_the_jitter_band() {
        let policy = RetryPolicy::default()
            .initial_backoff(Duration::from_millis(400))
            .jitter(0.5);
        let pauses: Vec<Duration> = (0..200).map(|_| policy.backoff(2)).collect();
        let full = Duration::from_millis(800);
        assert!(
            pauses.iter().all(|p| *p >= full / 2 && *p <= full),
            "{pauses:?}"
        );
        let distinct: std::collections::HashSet<_> = pauses.iter().collect();
        assert!(
            distinct.len() > 50,
            "workers retrying together must not stay in lockstep: {} distinct pauses of 200",
            distinct.len()
        );
    }

    #[test]
    fn no_jitter_is_exact_and_capped() {
        let policy = RetryPolicy::default()
            .initial_backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_millis(300))
            .jitter(0.0);
        assert_eq!(policy.backoff(1), Duration::from_millis(100));
        assert_eq!(policy.backoff(2), Duration::from_millis(200));
        assert_eq!(policy.backoff(3), Duration::from_millis(300));
        assert_eq!(policy.backoff(40), Duration::from_millis(300));
        assert_eq!(RetryPolicy::default().jitter(f64::NAN).jitter, 0.0);
        assert_eq!(RetryPolicy::default().max_attempts(0).max_attempts, 1);
    }
}
