//! Wall-clock time for leases and retention.
//!
//! Stores read time through [`Clock`] so that tests can move it (lease expiry, retention)
//! without sleeping, and so every backend agrees on one unit: milliseconds since the Unix
//! epoch, which survives a restart and means the same on every machine.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// This time plus `d` (saturating).
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(
            self.0
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // RFC 3339 in UTC without pulling in a date crate: civil-from-days (H. Hinnant).
        let secs = self.0 / 1000;
        let ms = self.0 % 1000;
        let days = (secs / 86_400) as i64;
        let rem = secs % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            rem / 3600,
            (rem / 60) % 60,
            rem % 60
        )
    }
}

/// `now + d` on tokio's clock, saturating at a deadline a century away: a caller's
/// `Duration::MAX` ("wait as long as it takes") must not overflow `Instant` and panic.
/// Backends bound their waits (e.g. [`IdemStore::wait_settled`](super::IdemStore::wait_settled))
/// with it.
pub fn deadline_after(d: Duration) -> tokio::time::Instant {
    instant_after(tokio::time::Instant::now(), d)
}

/// `at + d`, or a century after `at` when that overflows (a bound of `Duration::MAX` means
/// "never"; `Instant + Duration` would panic on it).
pub(crate) fn instant_after(at: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(at)
}

/// A source of wall-clock time: what leases, retention and retry windows are measured by.
///
/// Give one clock to the store; a registry built over the store uses the store's
/// ([`crate::store::IdemStore::clock`]).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_runtime::{store::{Clock, ManualClock, MemoryStore, Timestamp}, registry::Registry};
///
/// let clock = ManualClock::new(Timestamp(1_700_000_000_000));
/// let registry = Registry::builder()
///     .store(MemoryStore::with_clock(Arc::new(clock.clone())))
///     .build()?;
/// clock.advance(Duration::from_secs(3600)); // leases and retention see the hour pass
/// assert_eq!(clock.now(), Timestamp(1_700_003_600_000));
/// # Ok::<(), idem_runtime::registry::BuildError>(())
/// ```
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock (the default everywhere).
///
/// ```
/// use idem_runtime::store::{Clock, SystemClock};
/// assert!(SystemClock.now().0 > 1_600_000_000_000); // milliseconds since the epoch
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to; for tests of leases and retention.
///
/// Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::store::{Clock, ManualClock, Timestamp};
/// let clock = ManualClock::new(Timestamp(0));
/// let same = clock.clone();
/// same.advance(Duration::from_millis(250));
/// assert_eq!(clock.now(), Timestamp(250));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock set to `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.0)))
    }

    /// A clock set to the current system time.
    pub fn starting_now() -> Self {
        ManualClock::new(SystemClock.now())
    }

    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// Wall-clock time that advances with tokio's clock, from a chosen start.
///
/// With tokio's paused time (`#[tokio::test(start_paused = true)]`,
/// `tokio::time::advance`), leases and retention then move together with timeouts and
/// sleeps, so a simulation needs one clock instead of two kept in step by hand.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::store::{Clock, Timestamp, TokioClock};
/// # tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(async {
/// let clock = TokioClock::starting_at(Timestamp(1_000));
/// tokio::time::sleep(Duration::from_secs(2)).await; // paused time: returns at once
/// assert_eq!(clock.now(), Timestamp(3_000));
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct TokioClock {
    start: Timestamp,
    started: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `start` now and moves with tokio's clock from here.
    pub fn starting_at(start: Timestamp) -> Self {
        TokioClock {
            start,
            started: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.start.plus(self.started.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            Timestamp(1_795_000_000_123).to_string(),
            "2026-11-18T11:06:40.123Z"
        );
    }
}
