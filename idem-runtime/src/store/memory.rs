//! The default store: in process memory, sharded, gone when the process exits.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::rules::{self, Aged};
use super::{
    ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore, ListCursor, Record, RecordState,
    Retention, Settlement, StoreError, SystemClock,
};
use crate::identity::IdemKey;

const SHARDS: usize = 64;

#[derive(Debug)]
struct Slot {
    record: Record,
    /// Created by the first waiter; woken when the record leaves `Running`.
    settled: Option<Arc<Notify>>,
}

// Boxed: a record is a few hundred bytes, and a growing map moves every entry on each
// resize; moving pointers instead keeps a store that takes new keys all day cheap to grow.
type Map = HashMap<IdemKey, Box<Slot>, BuildHasherDefault<KeyHasher>>;
type Shard = Mutex<Map>;

/// Hashes an [`IdemKey`] by reading 16 of its hex digits instead of running SipHash over
/// all 69 bytes.
///
/// A key's digits are a SHA-256 digest, so they are already uniform: decoding them is as
/// good a hash as any. (Flooding one bucket would mean grinding SHA-256 preimages, one real
/// call per colliding key.) The shard index uses digits 0–1; the map uses digits 2–17, so
/// keys in one shard still spread over its buckets. Anything not shaped like a key (it
/// cannot happen: `IdemKey` only holds keys) falls back to a multiplicative fold.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() == IdemKey::LEN {
            if let Some(digits) = bytes.get(7..23) {
                let n = digits
                    .iter()
                    .fold(0u64, |acc, b| (acc << 4) | u64::from(nibble(*b)));
                self.0 ^= n;
                return;
            }
        }
        for b in bytes {
            self.write_u8(*b);
        }
    }

    fn write_u8(&mut self, b: u8) {
        // A bijection of the state: uniform stays uniform (`str`'s hash ends with 0xff).
        self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// An in-memory [`IdemStore`]: the default, for one process.
///
/// Records live in 64 independently locked shards chosen by the key's digest, so unrelated
/// keys never contend on one lock; each lock is held only for a map operation, never across
/// an `.await`. It survives nothing: a crashed process forgets its claims, so a resumed run
/// may re-execute. Use a durable store (SQLite, Redis, Postgres) when that matters.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    clock: Arc<dyn Clock>,
    retention: Retention,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store with the system clock and default retention.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }

    /// An empty store reading time from `clock` (a [`super::ManualClock`] in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
                clock,
                retention: Retention::default(),
            }),
        }
    }

    /// Sets the retention windows. Call before sharing the store.
    pub fn retention(self, retention: Retention) -> Self {
        let inner = Inner {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
            clock: self.inner.clock.clone(),
            retention: retention.normalized(),
        };
        MemoryStore {
            inner: Arc::new(inner),
        }
    }

    /// Number of records held (all states, tombstones included).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &IdemKey) -> MutexGuard<'_, Map> {
        // Keys are SHA-256 hex: their digits are already uniformly distributed.
        let hex = &key.as_str().as_bytes()[5..7];
        let n = hex
            .iter()
            .fold(0usize, |acc, b| (acc << 4) | usize::from(nibble(*b)));
        lock(&self.inner.shards[n % SHARDS])
    }

    /// Looks a key up with time applied; removes it if its tombstone has lapsed.
    fn aged<'m>(&self, map: &'m mut Map, key: &IdemKey) -> Option<&'m mut Slot> {
        let now = self.inner.clock.now();
        let gone = match map.get_mut(key) {
            None => return None,
            Some(slot) => {
                let aged = rules::age(&mut slot.record, now, &self.inner.retention);
                if aged == Aged::Changed && slot.record.state != RecordState::Running {
                    wake(slot);
                }
                aged == Aged::Gone
            }
        };
        if gone {
            map.remove(key);
            return None;
        }
        map.get_mut(key).map(|slot| &mut **slot)
    }
}

/// A record in a listing page, ordered as listings are (`created_at`, then key).
struct Listed(Record);

impl PartialEq for Listed {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Listed {}

impl PartialOrd for Listed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Listed {
    fn cmp(&self, other: &Self) -> Ordering {
        ListCursor::cmp_records(&self.0, &other.0)
    }
}

fn nibble(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock cannot leave a record half-written (every mutation
    // is a single assignment or goes through `rules`, which validate before they write), so
    // the data is still consistent and poisoning can be ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn wake(slot: &mut Slot) {
    if let Some(n) = slot.settled.take() {
        n.notify_waiters();
    }
}

#[async_trait::async_trait]
impl IdemStore for MemoryStore {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let mut map = self.shard(&req.key);
        if let Some(outcome) =
            rules::claim_against(self.aged(&mut map, &req.key).map(|s| &s.record), req)
        {
            return Ok(outcome);
        }
        let token = ClaimToken::fresh();
        let record = rules::new_claim(req, token, self.inner.clock.now());
        map.insert(
            req.key.clone(),
            Box::new(Slot {
                record,
                settled: None,
            }),
        );
        Ok(ClaimOutcome::Claimed(token))
    }

    async fn renew(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut map = self.shard(key);
        let now = self.inner.clock.now();
        match self.aged(&mut map, key) {
            Some(slot) => rules::renew(&mut slot.record, token, lease, now),
            None => Err(rules::stale_absent(key)),
        }
    }

    async fn settle(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        settlement: Settlement,
    ) -> Result<(), StoreError> {
        let mut map = self.shard(key);
        let now = self.inner.clock.now();
        let Some(slot) = self.aged(&mut map, key) else {
            return Err(rules::stale_absent(key));
        };
        rules::settle(&mut slot.record, token, settlement, now)?;
        wake(slot);
        Ok(())
    }

    async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
        let mut map = self.shard(key);
        let Some(slot) = self.aged(&mut map, key) else {
            return Err(rules::stale_absent(key));
        };
        rules::release(&slot.record, token)?;
        wake(slot);
        map.remove(key);
        Ok(())
    }

    async fn reclaim(
        &self,
        key: &IdemKey,
        expected: ClaimToken,
        lease: Duration,
    ) -> Result<ClaimToken, StoreError> {
        let mut map = self.shard(key);
        let now = self.inner.clock.now();
        let Some(slot) = self.aged(&mut map, key) else {
            return Err(StoreError::NotFound(key.clone()));
        };
        let fresh = ClaimToken::fresh();
        rules::reclaim(&mut slot.record, expected, fresh, lease, now)?;
        Ok(fresh)
    }

    async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
        let mut map = self.shard(key);
        Ok(self.aged(&mut map, key).map(|s| s.record.clone()))
    }

    async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list_after(state, None, limit).await
    }

    async fn list_after(
        &self,
        state: RecordState,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.inner.clock.now();
        // The `limit` smallest records after the cursor, largest on top: a page costs one
        // scan and clones only records that may make the page, not the whole state.
        let mut page: BinaryHeap<Listed> = BinaryHeap::new();
        for shard in self.inner.shards.iter() {
            let mut map = lock(shard);
            map.retain(|_, slot| {
                let aged = rules::age(&mut slot.record, now, &self.inner.retention);
                if aged == Aged::Changed && slot.record.state != RecordState::Running {
                    wake(slot);
                }
                aged != Aged::Gone
            });
            if limit == 0 {
                continue;
            }
            for slot in map.values() {
                let r = &slot.record;
                if r.state != state || after.is_some_and(|c| !c.precedes(r)) {
                    continue;
                }
                if page.len() == limit {
                    match page.peek() {
                        Some(top) if ListCursor::cmp_records(r, &top.0).is_lt() => {
                            page.pop();
                        }
                        _ => continue,
                    }
                }
                page.push(Listed(r.clone()));
            }
        }
        Ok(page.into_sorted_vec().into_iter().map(|l| l.0).collect())
    }

    async fn wait_settled(
        &self,
        key: &IdemKey,
        timeout: Duration,
    ) -> Result<Option<Record>, StoreError> {
        let deadline = super::deadline_after(timeout);
        loop {
            let notify = {
                let mut map = self.shard(key);
                match self.aged(&mut map, key) {
                    Some(slot) if slot.record.state == RecordState::Running => slot
                        .settled
                        .get_or_insert_with(|| Arc::new(Notify::new()))
                        .clone(),
                    other => return Ok(other.map(|s| s.record.clone())),
                }
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            // Register before re-checking so a settle between the check and the await is seen.
            notified.as_mut().enable();
            if let Some(r) = self.get(key).await? {
                if r.state != RecordState::Running {
                    return Ok(Some(r));
                }
            } else {
                return Ok(None);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return self.get(key).await;
            }
            // Wake at least every 50 ms: lease expiry is noticed by looking, not pushed.
            let nap = (deadline - now).min(Duration::from_millis(50));
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }
}
