//! The default store: in process memory, sharded, gone when the process exits.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;

use super::rules::{self, Aged};
use super::{
    async_trait_fns, AttemptRecord, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore,
    ListCursor, Record, RecordState, ReleaseNote, ReleaseRecord, Retention, Settlement, StoreError,
    StoreFuture, Swept, SystemClock, Timestamp,
};
use crate::identity::IdemKey;

const SHARDS: usize = 64;

/// How many records a [`MemoryStore`] holds at most unless told otherwise
/// ([`MemoryStore::capacity`]).
pub const DEFAULT_CAPACITY: usize = 100_000;

/// A shard is swept of lapsed tombstones (and the first shard's sweeps take the release
/// traces too) after at least this many new claims, and after as many new claims as it
/// kept records at its last sweep: a sweep walks the whole shard, so tying its cadence to
/// the shard's size keeps its cost to at most two records looked at per new claim, however
/// full the store is. Counted where no other thread writes.
const SWEEP_EVERY: usize = 256;

/// How many places of the capacity a shard takes at a time while plenty are free, so that
/// claims on different cores do not all write one shared count.
const PLACES_BATCH: usize = 16;

/// Below this many free places, shards take and give back places one at a time: a store
/// near its capacity holds no spare places in shards that are not using them.
const PLACES_LOW: usize = 2 * PLACES_BATCH * SHARDS;

#[derive(Debug)]
struct Slot {
    /// Shared with the claims that found it: a replay reads the record the store holds. A
    /// change copies it only while such a reader still holds the old one. While `packed`
    /// holds its payload, its own `payload` is `None`.
    record: Arc<Record>,
    /// The payload of a completed record, as JSON text, while nobody has read it back (see
    /// [`Slot::pack`]).
    packed: Option<Box<str>>,
    /// Created by the first waiter; woken when the record leaves `Running`.
    settled: Option<Arc<Notify>>,
}

/// How deep a payload may nest and still be packed: well inside serde_json's parser's limit
/// (128), so that what is packed always parses back.
const PACK_DEPTH: usize = 64;

impl Slot {
    /// A slot for a record just claimed.
    fn claimed(record: Record) -> Slot {
        Slot {
            record: Arc::new(record),
            packed: None,
            settled: None,
        }
    }

    /// Applies time as of `now` to the record (see [`rules::age_shared`]), waking waiters
    /// when it left `Running`, and dropping a packed payload with the result it expired.
    fn age(&mut self, now: Timestamp, retention: &Retention) -> Aged {
        let aged = rules::age_shared(&mut self.record, now, retention);
        if aged == Aged::Changed {
            if self.record.result_expired {
                self.packed = None;
            }
            if self.record.state != RecordState::Running {
                wake(self);
            }
        }
        aged
    }

    /// Keeps a completed record's output as JSON text instead of a tree of values.
    ///
    /// Most completed records are never read again: they stand in the store so that a
    /// repeat finds them. Held as a `Value`, a small object output costs a `BTreeMap` node
    /// (over 600 bytes) and a string per member; as text it costs its length. A record read
    /// back is unpacked in place ([`Slot::unpack`]), so repeats of one key parse it once.
    ///
    /// Only outputs that read back exactly are packed: containers within [`PACK_DEPTH`]
    /// holding no floating-point number (serde_json's default parser may round one off by
    /// a unit in the last place).
    fn pack(&mut self) {
        let packable = self.record.state == RecordState::Completed
            && self.record.payload.as_ref().is_some_and(packable);
        if !packable {
            return;
        }
        let record = Arc::make_mut(&mut self.record);
        let Some(payload) = record.payload.take() else {
            return;
        };
        match serde_json::to_string(&payload) {
            Ok(text) => self.packed = Some(text.into_boxed_str()),
            Err(_) => record.payload = Some(payload),
        }
    }

    /// Puts a packed payload back into the record, to be read or changed.
    fn unpack(&mut self) {
        if let Some(text) = self.packed.take() {
            Arc::make_mut(&mut self.record).payload = Some(unpacked(&text));
        }
    }

    /// A copy of the whole record, payload included, leaving the slot as it is.
    fn to_record(&self) -> Record {
        let mut record = Record::clone(&self.record);
        if let Some(text) = &self.packed {
            record.payload = Some(unpacked(text));
        }
        record
    }
}

/// The payload [`Slot::pack`] wrote as `text`.
fn unpacked(text: &str) -> Value {
    // Unreachable: `pack` only writes what parses back. Null rather than a panic.
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// True when [`Slot::pack`] keeps `payload` as text: a container that reads back exactly.
fn packable(payload: &Value) -> bool {
    (payload.is_object() || payload.is_array()) && reads_back_exactly(payload, PACK_DEPTH)
}

/// True when `value` nests at most `levels` deep and holds no floating-point number: its
/// JSON text parses back to an equal value.
fn reads_back_exactly(value: &Value, levels: usize) -> bool {
    match value {
        Value::Number(n) => !n.is_f64(),
        Value::Array(a) => levels > 0 && a.iter().all(|v| reads_back_exactly(v, levels - 1)),
        Value::Object(o) => levels > 0 && o.values().all(|v| reads_back_exactly(v, levels - 1)),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

// A slot is a few pointers (the record lives behind its `Arc`), so a growing map moves
// little on each resize.
type Map = HashMap<IdemKey, Slot, BuildHasherDefault<KeyHasher>>;

/// One shard's lock and map, alone on its cache lines (128 bytes: a line, and the one next
/// to it that the prefetcher pulls in with it): threads working on neighbouring shards do
/// not take each other's lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<ShardState>);

/// What a shard's lock guards: its records, and its counts, which only its lock holder
/// writes.
#[derive(Debug, Default)]
struct ShardState {
    map: Map,
    /// Places of the capacity this shard has taken for records it has not inserted yet
    /// (see [`Inner::take_place`]).
    spare: usize,
    /// New claims left before this shard is swept: as many as it kept records at its last
    /// sweep, and at least [`SWEEP_EVERY`].
    claims_to_sweep: usize,
}

/// Hashes an [`IdemKey`] by folding 16 of its hex digits, read as two machine words,
/// instead of running SipHash over all 69 bytes (or decoding the digits one by one).
///
/// A key's digits are a SHA-256 digest, so they are already uniform: 16 of them carry 64
/// random bits, spread over the 16 bytes that spell them, and one folded multiply (the
/// 128-bit product's halves XORed) mixes those bits into every bit of the hash, low bits
/// (the bucket) and high bits (hashbrown's tag) alike. (Flooding one bucket would mean
/// grinding SHA-256 preimages, one real call per colliding key.) The shard index uses
/// digits 0–1; the map uses digits 2–17, so keys in one shard still spread over its
/// buckets. Anything not shaped like a key (it cannot happen: `IdemKey` only holds keys)
/// falls back to a multiplicative fold.
#[derive(Default)]
struct KeyHasher(u64);

/// The 128-bit product of `a` and `b`, its halves XORed: every input bit reaches every
/// output bit.
fn fold_multiply(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() == IdemKey::LEN {
            if let (Some(lo), Some(hi)) = (bytes.get(7..15), bytes.get(15..23)) {
                let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
                self.0 ^= fold_multiply(
                    word(lo) ^ 0x243f_6a88_85a3_08d3,
                    word(hi) ^ 0x1319_8a2e_0370_7344,
                );
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
///
/// **Bounded.** It holds at most [`DEFAULT_CAPACITY`] records (100 000; set another with
/// [`MemoryStore::capacity`]), every state and tombstones included; a released key's trace
/// ([`IdemStore::releases`]) keeps the place its record had until the trace lapses. A claim
/// of a new key when the store is full first drops every lapsed tombstone (and release); if
/// that frees nothing it is refused with [`StoreError::Full`] (the call fails before its
/// handler runs). That walk over the records also learns when the first of those it kept
/// lapses, and until then a full store refuses new keys without walking them again. No
/// record is ever evicted to make room: an unsettled record, or a tombstone inside its
/// window, is the only thing standing between a repeat and a second effect. Lapsed
/// tombstones are also swept a shard at a time as new keys are claimed, and by
/// [`MemoryStore::sweep`].
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// The places of the capacity that no shard and no release trace holds, on cache lines of
/// their own: the fields every operation only reads (the shards, the clock, the retention)
/// stay valid in the other threads' caches.
///
/// Every place is in exactly one spot: `free`, a shard's `spare`, a record in a shard's map,
/// or a key's release trace; their sum is the capacity. Shards take places in batches while
/// plenty are free, so claims on different cores rarely write this count; near the capacity
/// they take and give back one at a time, and a claim that finds none free first gathers
/// every shard's spares (and sweeps) before it refuses.
#[derive(Debug)]
#[repr(align(128))]
struct FreePlaces(AtomicUsize);

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    clock: Arc<dyn Clock>,
    retention: Retention,
    capacity: usize,
    free: FreePlaces,
    /// The release traces, by key. Written under the key's shard lock (taken first), so a
    /// release and its trace are one step; bounded per key by `rules::keep_releases`, and
    /// lapsed traces go with the sweeps. Each key with a trace takes one place of the
    /// capacity (see [`FreePlaces`]), as its record did: a key released over and over, or
    /// many keys released, cannot grow the store past its bound.
    releases: Mutex<HashMap<IdemKey, Vec<ReleaseRecord>>>,
    /// What the last sweep of the whole store found: nothing it kept lapses before a time.
    /// A claim that finds no free place sweeps again only once that time has come; before,
    /// a sweep would walk every record to drop none, and a full store would spend that on
    /// every claim it refuses.
    lapse_floor: Mutex<Option<LapseFloor>>,
    /// Sweeps of the whole store, for the tests.
    #[cfg(test)]
    full_sweeps: AtomicUsize,
}

/// The earliest time anything a full sweep kept can lapse.
#[derive(Debug, Clone, Copy)]
struct LapseFloor {
    /// When the sweep began. A clock read before it (it went back) voids the floor.
    swept_at: Timestamp,
    /// The earliest tombstone or release trace lapse it saw, and at most a tombstone window
    /// after `swept_at`: what is settled or released later lapses later than that.
    until: Timestamp,
}

impl LapseFloor {
    /// True when, as of `now`, nothing has lapsed since the sweep.
    fn holds(&self, now: Timestamp) -> bool {
        self.swept_at <= now && now < self.until
    }
}

impl Inner {
    fn new(clock: Arc<dyn Clock>, retention: Retention, capacity: usize) -> Inner {
        Inner {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            clock,
            retention,
            capacity,
            free: FreePlaces(AtomicUsize::new(capacity)),
            releases: Mutex::new(HashMap::new()),
            lapse_floor: Mutex::new(None),
            #[cfg(test)]
            full_sweeps: AtomicUsize::new(0),
        }
    }

    /// Takes a place of the capacity for a new record in the shard whose spares are
    /// `spare`: one of them, or from the free places (a batch while plenty are free). False
    /// when none is free.
    fn take_place(&self, spare: &mut usize) -> bool {
        if *spare > 0 {
            *spare -= 1;
            return true;
        }
        let mut free = self.free.0.load(AtomicOrdering::Relaxed);
        loop {
            if free == 0 {
                return false;
            }
            let take = if free > PLACES_LOW { PLACES_BATCH } else { 1 };
            match self.free.0.compare_exchange_weak(
                free,
                free - take,
                AtomicOrdering::Relaxed,
                AtomicOrdering::Relaxed,
            ) {
                Ok(_) => {
                    *spare += take - 1;
                    return true;
                }
                Err(now) => free = now,
            }
        }
    }

    /// Gives back `n` places a shard's records held: kept as its spares while plenty are
    /// free (up to two batches), returned to the free places otherwise.
    fn give_back(&self, spare: &mut usize, n: usize) {
        *spare += n;
        let plenty = self.free.0.load(AtomicOrdering::Relaxed) > PLACES_LOW;
        let keep = if plenty { PLACES_BATCH } else { 0 };
        if *spare > keep && (!plenty || *spare > 2 * PLACES_BATCH) {
            self.free
                .0
                .fetch_add(*spare - keep, AtomicOrdering::Relaxed);
            *spare = keep;
        }
    }

    /// Applies time as of `now` to every record of a locked shard, dropping lapsed
    /// tombstones; returns how many it dropped.
    fn sweep_locked(&self, shard: &mut ShardState, now: Timestamp) -> usize {
        let mut next_lapse = Timestamp(u64::MAX);
        self.sweep_counted(shard, now, &mut next_lapse).tombstones as usize
    }

    /// [`Inner::sweep_locked`], counting the results it turned into tombstones too, and
    /// lowering `next_lapse` to the earliest lapse of the records it kept.
    fn sweep_counted(
        &self,
        shard: &mut ShardState,
        now: Timestamp,
        next_lapse: &mut Timestamp,
    ) -> Swept {
        let before = shard.map.len();
        let mut results = 0;
        shard.map.retain(|_, slot| {
            let kept = !slot.record.result_expired;
            let aged = slot.age(now, &self.retention);
            if aged == Aged::Changed
                && slot.record.state != RecordState::Running
                && kept
                && slot.record.result_expired
            {
                results += 1;
            }
            if let Some(lapse) = rules::lapses_at(&slot.record, &self.retention) {
                *next_lapse = (*next_lapse).min(lapse);
            }
            aged != Aged::Gone
        });
        let dropped = before - shard.map.len();
        shard.claims_to_sweep = SWEEP_EVERY.max(shard.map.len());
        self.give_back(&mut shard.spare, dropped);
        Swept::new(results, dropped as u64)
    }

    /// [`Inner::sweep_locked`] for one shard, locked here.
    fn sweep_shard(&self, shard: &Shard) -> usize {
        let now = self.clock.now();
        self.sweep_locked(&mut lock(&shard.0), now)
    }

    /// Drops lapsed releases from every trace, and traces left empty; returns how many
    /// traces it dropped.
    fn sweep_releases(&self) -> usize {
        self.sweep_releases_until(&mut Timestamp(u64::MAX))
    }

    /// [`Inner::sweep_releases`], lowering `next_lapse` to the earliest time a trace it
    /// kept lapses (its last release's lapse: the trace keeps its place until then).
    fn sweep_releases_until(&self, next_lapse: &mut Timestamp) -> usize {
        let now = self.clock.now();
        let mut traces = lock(&self.releases);
        let before = traces.len();
        traces.retain(|_, trace| {
            rules::keep_releases(trace, now, &self.retention);
            if let Some(last) = trace.last() {
                *next_lapse = (*next_lapse).min(rules::release_lapses_at(last, &self.retention));
            }
            !trace.is_empty()
        });
        let dropped = before - traces.len();
        self.free.0.fetch_add(dropped, AtomicOrdering::Relaxed);
        dropped
    }

    /// Moves every shard's spare places back to the free places.
    fn gather_spares(&self) {
        for shard in self.shards.iter() {
            self.give_all_spares(&mut lock(&shard.0));
        }
    }

    /// Moves a locked shard's spare places back to the free places.
    fn give_all_spares(&self, shard: &mut ShardState) {
        let spare = std::mem::take(&mut shard.spare);
        self.free.0.fetch_add(spare, AtomicOrdering::Relaxed);
    }
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
            inner: Arc::new(Inner::new(clock, Retention::default(), DEFAULT_CAPACITY)),
        }
    }

    /// Sets the retention windows. Call before sharing the store (the store returned is a
    /// new, empty one).
    pub fn retention(self, retention: Retention) -> Self {
        MemoryStore {
            inner: Arc::new(Inner::new(
                self.inner.clock.clone(),
                retention.normalized(),
                self.inner.capacity,
            )),
        }
    }

    /// Sets how many records the store holds at most (at least 1; default
    /// [`DEFAULT_CAPACITY`]). Call before sharing the store (the store returned is a new,
    /// empty one). Size it for the records of a tombstone window: every completed or failed
    /// call stays a record that long.
    pub fn capacity(self, records: usize) -> Self {
        MemoryStore {
            inner: Arc::new(Inner::new(
                self.inner.clock.clone(),
                self.inner.retention,
                records.max(1),
            )),
        }
    }

    /// How many records the store holds at most.
    pub fn max_records(&self) -> usize {
        self.inner.capacity
    }

    /// Applies time to every record: expired leases become unknown, expired results
    /// tombstones, and lapsed tombstones and release traces are deleted. Returns how many
    /// records and traces were deleted.
    /// Claims do this a shard at a time, and all at once when the store is full and something
    /// can have lapsed since the last time; call it on an interval to give memory back
    /// sooner in a store that takes few new keys.
    pub fn sweep(&self) -> usize {
        let swept = self.sweep_counted();
        swept.tombstones as usize
    }

    /// [`MemoryStore::sweep`], counting results turned into tombstones and records and
    /// traces deleted.
    fn sweep_counted(&self) -> Swept {
        let inner = &*self.inner;
        #[cfg(test)]
        inner.full_sweeps.fetch_add(1, AtomicOrdering::Relaxed);
        let swept_at = inner.clock.now();
        // What is settled or released from now on lapses a tombstone window from now, or
        // later. (A settlement that read the clock a moment before the sweep began may lapse
        // that moment sooner; its place then waits that moment for the next sweep.)
        let mut next_lapse = rules::tombstone_lapse(swept_at, &inner.retention);
        let mut results = 0;
        let dropped: u64 = inner
            .shards
            .iter()
            .map(|shard| {
                let now = inner.clock.now();
                let mut shard = lock(&shard.0);
                let swept = inner.sweep_counted(&mut shard, now, &mut next_lapse);
                results += swept.results;
                // Every spare back to the free places: a claim that found none free sweeps
                // to gather them.
                inner.give_all_spares(&mut shard);
                swept.tombstones
            })
            .sum();
        let traces = inner.sweep_releases_until(&mut next_lapse) as u64;
        *lock(&inner.lapse_floor) = Some(LapseFloor {
            swept_at,
            until: next_lapse,
        });
        Swept::new(results, dropped + traces)
    }

    /// Frees what time has freed, for a claim that found no free place: sweeps the whole
    /// store, unless the last such sweep found that nothing it kept lapses yet. Then only
    /// the shards' spare places are gathered: a full store refuses a claim in 64 lock
    /// acquisitions, not a walk over every record.
    fn make_room(&self) {
        let now = self.inner.clock.now();
        let floor = *lock(&self.inner.lapse_floor);
        if floor.is_some_and(|floor| floor.holds(now)) {
            self.inner.gather_spares();
        } else {
            self.sweep();
        }
    }

    /// Number of records held (all states, tombstones included).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(&s.0).map.len()).sum()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &IdemKey) -> MutexGuard<'_, ShardState> {
        lock(&self.inner.shards[shard_index(key)].0)
    }

    /// True when this store reads time from `clock` itself (the same `Arc`): a reading of
    /// it may stand for the store's own ([`MemoryStore::claim_now`]'s `now`).
    pub(crate) fn reads(&self, clock: &Arc<dyn Clock>) -> bool {
        Arc::ptr_eq(&self.inner.clock, clock)
    }

    /// [`IdemStore::claim`], as a plain call: nothing in it waits. The registry's executor
    /// calls it directly while nobody observes store operations, without the boxed future
    /// of a `dyn IdemStore` call.
    ///
    /// `now`: a reading of this store's clock the caller took just before and uses too (one
    /// reading for both), or `None` to read it here.
    pub(crate) fn claim_now(
        &self,
        req: &ClaimRequest,
        now: Option<Timestamp>,
    ) -> Result<ClaimOutcome, StoreError> {
        let inner = &*self.inner;
        let index = shard_index(&req.key);
        let mut swept = false;
        let token = loop {
            // One clock reading serves the aging, the decision and the insert. One probe finds
            // the key or the place to insert it; its clone is a reference count.
            let now = match now {
                Some(now) if !swept => now,
                _ => inner.clock.now(),
            };
            let mut shard = lock(&inner.shards[index].0);
            let ShardState {
                map,
                spare,
                claims_to_sweep,
            } = &mut *shard;
            let token = match map.entry(req.key.clone()) {
                Entry::Occupied(mut held) => {
                    let slot = held.get_mut();
                    if slot.age(now, &inner.retention) != Aged::Gone {
                        // A repeat reads the record: unpacked once, then shared.
                        slot.unpack();
                        return Ok(rules::judge(Arc::clone(&slot.record), req));
                    }
                    // A lapsed tombstone: the key is free again, and the new claim takes the
                    // place its record had.
                    let token = ClaimToken::fresh();
                    *slot = Slot::claimed(rules::new_claim(req, token, now));
                    token
                }
                // Take a place first, so concurrent claims never overshoot the capacity.
                Entry::Vacant(free) => {
                    if !inner.take_place(spare) {
                        drop(shard);
                        if swept {
                            return Err(StoreError::Full(format!(
                                "the in-memory store holds its maximum of {} records \
                                 (unsettled records and tombstones inside their window are \
                                 never evicted); raise MemoryStore::capacity, shorten \
                                 Retention, or use a durable store",
                                inner.capacity
                            )));
                        }
                        // None free: drop every lapsed tombstone, if one can have lapsed
                        // since the last look, and gather every shard's spare places (with
                        // no shard lock held), then look again.
                        self.make_room();
                        swept = true;
                        continue;
                    }
                    let token = ClaimToken::fresh();
                    free.insert(Slot::claimed(rules::new_claim(req, token, now)));
                    token
                }
            };
            // Now and then, sweep this shard of lapsed tombstones, so keys never seen again
            // do not stay for ever (the claim just inserted is running: it stays).
            *claims_to_sweep = claims_to_sweep.saturating_sub(1);
            if *claims_to_sweep == 0 {
                inner.sweep_locked(&mut shard, now);
                if index == 0 {
                    inner.sweep_releases();
                }
            }
            break token;
        };
        Ok(ClaimOutcome::Claimed(token))
    }

    /// [`IdemStore::settle`], as a plain call (see [`MemoryStore::claim_now`], and its
    /// `now`). A refused settlement's attempts come back with the error, for the caller's
    /// log.
    ///
    /// `output`, when given, is the settlement's payload, by reference: an output that can be
    /// packed ([`Slot::pack`]) is written as text straight from it (before the shard is
    /// locked), and only one that cannot is copied.
    pub(crate) fn settle_now(
        &self,
        key: &IdemKey,
        token: ClaimToken,
        mut settlement: Settlement,
        output: Option<&Value>,
        now: Option<Timestamp>,
    ) -> Result<(), (StoreError, Vec<AttemptRecord>)> {
        let packed = output
            .filter(|o| settlement.state == RecordState::Completed && packable(o))
            .and_then(|o| serde_json::to_string(o).ok());
        if let (Some(output), None) = (output, &packed) {
            settlement.payload = Some(output.clone());
        }
        let now = now.unwrap_or_else(|| self.inner.clock.now());
        let mut shard = self.shard(key);
        let Some(slot) = self.aged(&mut shard, key, now) else {
            return Err((rules::stale_absent(key), settlement.attempts));
        };
        if let Err(e) = rules::may_settle(&slot.record, token, &settlement) {
            return Err((e, settlement.attempts));
        }
        let settled = rules::apply_settlement(Arc::make_mut(&mut slot.record), settlement, now);
        match packed {
            // The output became the record's (a settlement that only adds evidence to one
            // settled before keeps the result it has).
            Some(text) if settled => slot.packed = Some(text.into_boxed_str()),
            // An output given here and found not packable above is not walked again.
            None if settled && output.is_some() => {}
            _ => slot.pack(),
        }
        wake(slot);
        Ok(())
    }

    /// Looks a key up with time applied as of `now`; removes it if its tombstone has lapsed.
    /// One lookup (the key is hashed once), for a record that stays and one that goes.
    /// Frees `key` (whose slot is in `map`, the shard still locked) and keeps `release` in
    /// its trace. Still under the shard lock: nobody sees the key free without its trace.
    /// The record's place in the capacity passes to the trace, unless the key has one.
    fn free_with_trace(
        &self,
        shard: &mut ShardState,
        key: &IdemKey,
        release: ReleaseRecord,
        now: Timestamp,
    ) {
        if let Some(mut slot) = shard.map.remove(key) {
            wake(&mut slot);
        }
        let mut traces = lock(&self.inner.releases);
        let trace = match traces.entry(key.clone()) {
            Entry::Occupied(e) => {
                self.inner.give_back(&mut shard.spare, 1);
                e.into_mut()
            }
            Entry::Vacant(e) => e.insert(Vec::new()),
        };
        trace.push(release);
        rules::keep_releases(trace, now, &self.inner.retention);
    }

    fn aged<'m>(
        &self,
        shard: &'m mut ShardState,
        key: &IdemKey,
        now: Timestamp,
    ) -> Option<&'m mut Slot> {
        match shard.map.entry(key.clone()) {
            Entry::Vacant(_) => None,
            Entry::Occupied(mut entry) => {
                if entry.get_mut().age(now, &self.inner.retention) == Aged::Gone {
                    entry.remove();
                    self.inner.give_back(&mut shard.spare, 1);
                    return None;
                }
                // Read or changed from here: the whole record.
                let slot = entry.into_mut();
                slot.unpack();
                Some(slot)
            }
        }
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

/// The shard of `key`: keys are SHA-256 hex, so their first digits are already uniformly
/// distributed.
fn shard_index(key: &IdemKey) -> usize {
    let hex = &key.as_str().as_bytes()[5..7];
    let n = hex
        .iter()
        .fold(0usize, |acc, b| (acc << 4) | usize::from(nibble(*b)));
    n % SHARDS
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

impl IdemStore for MemoryStore {
    fn backend_name(&self) -> &'static str {
        "memory"
    }
    fn durability(&self) -> super::Durability {
        super::Durability::Process
    }
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async_trait_fns! {
        fn sweep_expired(&self) -> StoreFuture<'async_trait, Swept> {
            Box::pin(async move { Ok(self.sweep_counted()) })
        }

        fn claim<'life1>(
            &self,
            req: &'life1 ClaimRequest,
        ) -> StoreFuture<'async_trait, ClaimOutcome> {
            Box::pin(async move { self.claim_now(req, None) })
        }

        fn renew<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ()> {
            Box::pin(async move {
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                match self.aged(&mut shard, key, now) {
                    Some(slot) => rules::renew(Arc::make_mut(&mut slot.record), token, lease, now),
                    None => Err(rules::stale_absent(key)),
                }
            })
        }

        fn settle<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
        ) -> StoreFuture<'async_trait, ()> {
            Box::pin(async move {
                self.settle_now(key, token, settlement, None, None)
                    .map_err(|(e, _)| e)
            })
        }

        fn release<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
        ) -> StoreFuture<'async_trait, ()> {
            Box::pin(async move {
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                let Some(slot) = self.aged(&mut shard, key, now) else {
                    return Err(rules::stale_absent(key));
                };
                rules::release(&slot.record, token)?;
                wake(slot);
                shard.map.remove(key);
                self.inner.give_back(&mut shard.spare, 1);
                Ok(())
            })
        }

        fn release_unsettled<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()> {
            Box::pin(async move {
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                let Some(slot) = self.aged(&mut shard, key, now) else {
                    return Err(StoreError::NotFound(key.clone()));
                };
                let release = rules::release_unsettled(&slot.record, expected, note, now)?;
                self.free_with_trace(&mut shard, key, release, now);
                Ok(())
            })
        }

        fn release_traced<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()> {
            Box::pin(async move {
                rules::releasable_settlement(key, &settlement)?;
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                let Some(slot) = self.aged(&mut shard, key, now) else {
                    return Err(rules::stale_absent(key));
                };
                let release = rules::release_traced(&slot.record, token, settlement, note, now)?;
                self.free_with_trace(&mut shard, key, release, now);
                Ok(())
            })
        }

        fn releases<'life1>(
            &self,
            key: &'life1 IdemKey,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>> {
            Box::pin(async move {
                let now = self.inner.clock.now();
                let mut traces = lock(&self.inner.releases);
                let Some(trace) = traces.get_mut(key) else {
                    return Ok(Vec::new());
                };
                rules::keep_releases(trace, now, &self.inner.retention);
                let out = trace.clone();
                if trace.is_empty() {
                    traces.remove(key);
                    self.inner.free.0.fetch_add(1, AtomicOrdering::Relaxed);
                }
                Ok(out)
            })
        }

        fn list_releases<'life1>(
            &self,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>> {
            Box::pin(async move {
                self.inner.sweep_releases();
                let traces = lock(&self.inner.releases);
                let mut page: Vec<ReleaseRecord> = traces
                    .values()
                    .flatten()
                    .filter(|r| after.is_none_or(|c| c.precedes_release(r)))
                    .cloned()
                    .collect();
                drop(traces);
                page.sort_by(ListCursor::cmp_releases);
                page.truncate(limit);
                Ok(page)
            })
        }

        fn reclaim<'life1>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ClaimToken> {
            Box::pin(async move {
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                let Some(slot) = self.aged(&mut shard, key, now) else {
                    return Err(StoreError::NotFound(key.clone()));
                };
                let fresh = ClaimToken::fresh();
                rules::reclaim(Arc::make_mut(&mut slot.record), expected, fresh, lease, now)?;
                Ok(fresh)
            })
        }

        fn get<'life1>(&self, key: &'life1 IdemKey) -> StoreFuture<'async_trait, Option<Record>> {
            Box::pin(async move {
                let mut shard = self.shard(key);
                let now = self.inner.clock.now();
                Ok(self
                    .aged(&mut shard, key, now)
                    .map(|s| Record::clone(&s.record)))
            })
        }

        fn list(&self, state: RecordState, limit: usize) -> StoreFuture<'async_trait, Vec<Record>> {
            Box::pin(async move { self.list_after(state, None, limit).await })
        }

        fn list_after<'life1>(
            &self,
            state: RecordState,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<Record>> {
            Box::pin(async move {
                // The `limit` smallest records after the cursor, largest on top: a page costs one
                // scan and clones only records that may make the page, not the whole state.
                let mut page: BinaryHeap<Listed> = BinaryHeap::new();
                for shard in self.inner.shards.iter() {
                    self.inner.sweep_shard(shard);
                    let shard = lock(&shard.0);
                    if limit == 0 {
                        continue;
                    }
                    for slot in shard.map.values() {
                        let r = &*slot.record;
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
                        page.push(Listed(slot.to_record()));
                    }
                }
                Ok(page.into_sorted_vec().into_iter().map(|l| l.0).collect())
            })
        }

        fn wait_settled<'life1>(
            &self,
            key: &'life1 IdemKey,
            timeout: Duration,
        ) -> StoreFuture<'async_trait, Option<Record>> {
            Box::pin(async move {
                let deadline = super::deadline_after(timeout);
                loop {
                    let notify = {
                        let mut shard = self.shard(key);
                        match self.aged(&mut shard, key, self.inner.clock.now()) {
                            Some(slot) if slot.record.state == RecordState::Running => slot
                                .settled
                                .get_or_insert_with(|| Arc::new(Notify::new()))
                                .clone(),
                            other => return Ok(other.map(|s| Record::clone(&s.record))),
                        }
                    };
                    let notified = notify.notified();
                    tokio::pin!(notified);
                    // Register before re-checking so a settle between the check and the await is
                    // seen.
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
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    fn request(name: &str) -> ClaimRequest {
        ClaimRequest {
            key: conformance::key(name),
            fingerprint: conformance::fingerprint("args"),
            tool: "t".into(),
            lease: Duration::from_secs(60),
            operation: None,
        }
    }

    fn names_in_shard(shard: usize) -> impl Iterator<Item = String> {
        (0..)
            .map(|i| format!("shard-{i}"))
            .filter(move |n| shard_index(&conformance::key(n)) == shard)
    }

    /// Claims `name` and settles it completed, without output, as the tests' filler.
    fn complete(store: &MemoryStore, name: &str) {
        let req = request(name);
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("{name} not claimed");
        };
        let done = Settlement::new(RecordState::Completed);
        store
            .settle_now(&req.key, token, done, None, None)
            .expect("settled");
    }

    impl MemoryStore {
        /// Every place of the capacity, wherever it is: free, spare in a shard, a record, or a
        /// key's release trace. Must always be the capacity.
        fn places_accounted(&self) -> usize {
            let inner = &*self.inner;
            let in_shards: usize = inner
                .shards
                .iter()
                .map(|s| {
                    let shard = lock(&s.0);
                    shard.spare + shard.map.len()
                })
                .sum();
            inner.free.0.load(AtomicOrdering::Relaxed) + in_shards + lock(&inner.releases).len()
        }
    }

    /// A small deterministic generator (xorshift64*): the churn below is the same every run.
    struct Draws(u64);

    impl Draws {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// Random claims, settles, releases (plain and traced), sweeps and time passing, on four
    /// threads at once over a store that crosses between batched and one-at-a-time places:
    /// afterwards no place is lost or counted twice, and once every record has lapsed the
    /// store takes exactly its capacity of new keys again.
    #[test]
    fn no_place_is_lost_or_doubled_under_concurrent_churn() {
        let capacity = 3000;
        let retention = Retention {
            results: Duration::from_secs(10),
            tombstones: Duration::from_secs(20),
        };
        let clock = Arc::new(crate::store::ManualClock::starting_now());
        let store = MemoryStore::with_clock(clock.clone())
            .retention(retention)
            .capacity(capacity);
        let note = ReleaseNote::new("test", "churn");
        std::thread::scope(|threads| {
            for t in 0..4_u64 {
                let (store, clock, note) = (&store, &clock, &note);
                threads.spawn(move || {
                    let mut draw = Draws(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .expect("a runtime");
                    for _ in 0..20_000 {
                        let req = request(&format!("churn-{}", draw.below(4000)));
                        let token = match store.claim_now(&req, None) {
                            Ok(ClaimOutcome::Claimed(token)) => token,
                            Ok(_) | Err(StoreError::Full(_)) => continue,
                            Err(e) => panic!("{e}"),
                        };
                        let settled = Settlement::new;
                        rt.block_on(async {
                            let done = match draw.below(6) {
                                0 => store.release(&req.key, token).await,
                                1 => match store
                                    .settle(&req.key, token, settled(RecordState::Unknown))
                                    .await
                                {
                                    Ok(()) => store.release_unsettled(&req.key, token, note).await,
                                    lapsed => lapsed,
                                },
                                2 => {
                                    store
                                        .settle(&req.key, token, settled(RecordState::Failed))
                                        .await
                                }
                                3 => Ok(()), // left running: its lease lapses to unknown
                                _ => {
                                    store
                                        .settle(&req.key, token, settled(RecordState::Completed))
                                        .await
                                }
                            };
                            // Other threads move the clock: a claim can lapse to unknown
                            // before its own thread settles it, and is then refused.
                            match done {
                                Ok(()) | Err(StoreError::StaleToken { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                            if draw.below(50) == 0 {
                                clock.advance(Duration::from_secs(3));
                            }
                            if draw.below(500) == 0 {
                                store.sweep();
                            }
                            if draw.below(20) == 0 {
                                store.releases(&req.key).await.expect("releases");
                            }
                        });
                    }
                });
            }
        });
        assert_eq!(store.places_accounted(), capacity);
        // Everything that can lapse does; what cannot (unknown records, kept for a person)
        // keeps its place. Then exactly the rest of the capacity takes new keys.
        clock.advance(Duration::from_secs(3600));
        store.sweep();
        assert_eq!(store.places_accounted(), capacity);
        let held = store.len() + lock(&store.inner.releases).len();
        for i in 0..capacity - held {
            let outcome = store.claim_now(&request(&format!("after-{i}")), None);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed(_))),
                "{i}: {outcome:?}"
            );
        }
        let refused = store.claim_now(&request("one more"), None);
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
        assert_eq!(store.places_accounted(), capacity);
    }

    /// The slot of `key`, as the store holds it.
    fn held(store: &MemoryStore, key: &IdemKey, look: impl FnOnce(&Slot)) {
        let shard = lock(&store.inner.shards[shard_index(key)].0);
        look(shard.map.get(key).expect("the key is held"));
    }

    /// A completed record's object or array output is held as text, not as a tree of
    /// values, until something reads it; every way of reading it back (a repeat's claim, a
    /// `get`, a listing) gives the output it was settled with, and the text goes with the
    /// result when it expires. Outputs that text would not give back exactly (a float,
    /// deep nesting) and payloads of other states stay as they are.
    #[tokio::test]
    async fn completed_outputs_are_held_as_text_and_read_back_equal() {
        let clock = Arc::new(crate::store::ManualClock::starting_now());
        let retention = Retention {
            results: Duration::from_secs(10),
            tombstones: Duration::from_secs(20),
        };
        let store = MemoryStore::with_clock(clock.clone()).retention(retention);
        let mut deep = serde_json::json!(1);
        for _ in 0..(PACK_DEPTH + 5) {
            deep = serde_json::json!([deep]);
        }
        let outputs = [
            (
                "object",
                serde_json::json!({"id": 7, "cents": 4900, "to": ["a", {"b": null}]}),
                true,
            ),
            (
                "array",
                serde_json::json!([1, -2, u64::MAX, "x", true]),
                true,
            ),
            ("float", serde_json::json!({"rate": 0.1 + 0.2}), false),
            ("deep", deep, false),
            ("string", serde_json::json!("done"), false),
        ];
        for (name, output, packed) in &outputs {
            let req = request(name);
            let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
                panic!("{name}: not claimed");
            };
            let settled = conformance::completed(output.clone());
            store
                .settle(&req.key, token, settled)
                .await
                .expect("settled");
            held(&store, &req.key, |slot| {
                assert_eq!(slot.packed.is_some(), *packed, "{name}");
                assert_eq!(slot.record.payload.is_none(), *packed, "{name}");
            });
            let listed = store
                .list(RecordState::Completed, 100)
                .await
                .expect("listed");
            let listed = listed
                .iter()
                .find(|r| r.key == req.key)
                .expect("in the listing");
            assert_eq!(listed.payload.as_ref(), Some(output), "{name}: listed");
            // Listing reads a copy: the slot stays packed.
            held(&store, &req.key, |slot| {
                assert_eq!(slot.packed.is_some(), *packed)
            });
            match store.claim_now(&req, None) {
                Ok(ClaimOutcome::Existing(record)) => {
                    assert_eq!(record.payload.as_ref(), Some(output), "{name}: replayed")
                }
                other => panic!("{name}: {other:?}"),
            }
            held(&store, &req.key, |slot| {
                assert!(slot.packed.is_none(), "{name}")
            });
            let got = store.get(&req.key).await.expect("get").expect("held");
            assert_eq!(got.payload.as_ref(), Some(output), "{name}: got");
        }
        // A pending record's detail is not packed: it may still change.
        let req = request("pending");
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("not claimed");
        };
        let detail = serde_json::json!({"job": "j-1"});
        let pending = Settlement::new(RecordState::Pending)
            .downstream_ref("j-1")
            .payload(detail.clone());
        store
            .settle(&req.key, token, pending)
            .await
            .expect("settled");
        held(&store, &req.key, |slot| assert!(slot.packed.is_none()));
        // A packed output goes with its result: the tombstone has neither.
        let req = request("expiring");
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("not claimed");
        };
        let output = serde_json::json!({"id": 1});
        store
            .settle(&req.key, token, conformance::completed(output))
            .await
            .expect("settled");
        clock.advance(Duration::from_secs(11));
        store.sweep();
        held(&store, &req.key, |slot| {
            assert!(slot.record.result_expired);
            assert!(slot.packed.is_none());
        });
        let tombstone = store.get(&req.key).await.expect("get").expect("held");
        assert_eq!(tombstone.payload, None);
    }

    /// The executor hands a completed output by reference: it is packed from there, the
    /// record reads back with it, and a second settle to the same state by the same holder
    /// (evidence only) keeps the first output.
    #[tokio::test]
    async fn an_output_settled_by_reference_is_the_records_once() {
        let store = MemoryStore::new();
        let req = request("by reference");
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("not claimed");
        };
        let first = serde_json::json!({"id": 1, "cents": 4900});
        let settle = |output| {
            let done = Settlement::new(RecordState::Completed);
            store.settle_now(&req.key, token, done, Some(output), None)
        };
        settle(&first).expect("settled");
        held(&store, &req.key, |slot| assert!(slot.packed.is_some()));
        settle(&serde_json::json!({"id": 2})).expect("settled again");
        let record = store.get(&req.key).await.expect("get").expect("held");
        assert_eq!(record.payload, Some(first));
        // An output that cannot be packed is copied in whole.
        let req = request("float by reference");
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("not claimed");
        };
        let float = serde_json::json!({"rate": 1.1});
        let done = Settlement::new(RecordState::Completed);
        store
            .settle_now(&req.key, token, done, Some(&float), None)
            .expect("settled");
        held(&store, &req.key, |slot| assert!(slot.packed.is_none()));
        let record = store.get(&req.key).await.expect("get").expect("held");
        assert_eq!(record.payload, Some(float));
    }

    /// The places other shards took in batches and have not used are the last free ones: a
    /// shard that needs them must get them, and then the store holds exactly its capacity.
    #[test]
    fn places_other_shards_hold_serve_a_claim_before_it_is_refused() {
        let capacity = 5000;
        let store = MemoryStore::new().capacity(capacity);
        // Spread claims take batches in every shard, until places are scarce.
        for i in 0..3000 {
            let outcome = store.claim_now(&request(&format!("spread-{i}")), None);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed(_))),
                "{outcome:?}"
            );
        }
        let stranded: usize = store.inner.shards[1..]
            .iter()
            .map(|s| lock(&s.0).spare)
            .sum();
        assert!(stranded > 0, "other shards hold spare places");
        // The rest all in shard 0: past the free places, only the others' spares are left.
        for name in names_in_shard(0).take(capacity - 3000) {
            let outcome = store.claim_now(&request(&name), None);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed(_))),
                "{outcome:?}"
            );
        }
        assert_eq!(store.len(), capacity);
        let refused = store.claim_now(&request("one more"), None);
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
    }

    /// A store of `capacity` on a manual clock, whose results last 10 s and tombstones
    /// 20 s, with `n` completed records in shard 0.
    fn shard_zero_of_completed(
        n: usize,
        capacity: usize,
    ) -> (MemoryStore, Arc<crate::store::ManualClock>, Vec<String>) {
        let clock = Arc::new(crate::store::ManualClock::starting_now());
        let retention = Retention {
            results: Duration::from_secs(10),
            tombstones: Duration::from_secs(20),
        };
        let store = MemoryStore::with_clock(clock.clone())
            .retention(retention)
            .capacity(capacity);
        let names: Vec<String> = names_in_shard(0).take(n).collect();
        for name in &names {
            complete(&store, name);
        }
        (store, clock, names)
    }

    /// A shard holding more records than the sweep's minimum cadence is still swept of its
    /// lapsed tombstones by new claims alone, within as many claims as it held records
    /// (twice that at most: the cadence was counted from the sweep before).
    #[test]
    fn new_claims_sweep_a_large_shard_of_lapsed_tombstones() {
        let held = 3 * SWEEP_EVERY;
        let (store, clock, _) = shard_zero_of_completed(held, DEFAULT_CAPACITY);
        clock.advance(Duration::from_secs(60));
        let in_shard_zero = || lock(&store.inner.shards[0].0).map.len();
        let mut claims = 0;
        for name in names_in_shard(0).skip(held).take(2 * held) {
            let outcome = store.claim_now(&request(&name), None);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed(_))),
                "{outcome:?}"
            );
            claims += 1;
            if in_shard_zero() == claims {
                break;
            }
        }
        assert_eq!(
            in_shard_zero(),
            claims,
            "the {held} lapsed tombstones are gone, the {claims} new claims stay"
        );
        assert_eq!(store.places_accounted(), store.max_records());
    }

    /// A claim of a key whose tombstone has lapsed is a new claim, and it takes the place
    /// the old record had: a full store takes it without sweeping, and still holds exactly
    /// its capacity.
    #[test]
    fn a_claim_of_a_lapsed_tombstones_key_takes_its_place() {
        let (store, clock, names) = shard_zero_of_completed(3, 3);
        let refused = store.claim_now(&request("a fourth"), None);
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
        clock.advance(Duration::from_secs(60));
        let again = request(&names[0]);
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&again, None) else {
            panic!("a lapsed key is free to claim");
        };
        held(&store, &again.key, |slot| {
            assert_eq!(slot.record.state, RecordState::Running);
            assert_eq!(slot.record.token, token);
        });
        assert_eq!(store.len(), 3, "two lapsed tombstones and the new claim");
        assert_eq!(store.places_accounted(), 3);
    }

    /// A claim refused by a full store: the number of whole-store sweeps it took.
    fn sweeps_to_refuse(store: &MemoryStore, name: &str) -> usize {
        let before = store.inner.full_sweeps.load(AtomicOrdering::Relaxed);
        let refused = store.claim_now(&request(name), None);
        assert!(matches!(refused, Err(StoreError::Full(_))), "{refused:?}");
        store.inner.full_sweeps.load(AtomicOrdering::Relaxed) - before
    }

    /// A full store walks its records once to learn that none can lapse yet; until the
    /// first of them can, it refuses claims without walking them again, and from that
    /// instant it takes exactly the places that lapsed.
    #[test]
    fn a_full_store_sweeps_again_only_when_something_can_have_lapsed() {
        // 30 completed records settled at t0 (tombstones lapse at t0 + 20 s), 20 at t0 + 5 s.
        let (store, clock, _) = shard_zero_of_completed(30, 50);
        clock.advance(Duration::from_secs(5));
        for i in 0..20 {
            complete(&store, &format!("later-{i}"));
        }
        assert_eq!(sweeps_to_refuse(&store, "refused-0"), 1);
        for i in 1..100 {
            assert_eq!(sweeps_to_refuse(&store, &format!("refused-{i}")), 0);
        }
        // A millisecond before the first lapse: still refused, still no walk.
        clock.advance(Duration::from_millis(15_000 - 1));
        assert_eq!(sweeps_to_refuse(&store, "a millisecond early"), 0);
        clock.advance(Duration::from_millis(1));
        for i in 0..30 {
            let outcome = store.claim_now(&request(&format!("after-{i}")), None);
            assert!(
                matches!(outcome, Ok(ClaimOutcome::Claimed(_))),
                "{i}: {outcome:?}"
            );
        }
        // The sweep that freed those 30 saw the other 20 lapse 5 s later.
        assert_eq!(sweeps_to_refuse(&store, "one more"), 1);
        assert_eq!(sweeps_to_refuse(&store, "and another"), 0);
        assert_eq!(store.len(), 50);
        assert_eq!(store.places_accounted(), 50);
    }

    /// A release trace keeps its key's place until its last release lapses, and a full
    /// store's refusals count it as the next thing to lapse.
    #[tokio::test]
    async fn a_full_store_counts_release_traces_among_what_can_lapse() {
        let (store, clock, _) = shard_zero_of_completed(1, 2);
        clock.advance(Duration::from_secs(5));
        let req = request("released");
        let Ok(ClaimOutcome::Claimed(token)) = store.claim_now(&req, None) else {
            panic!("not claimed");
        };
        let unknown = Settlement::new(RecordState::Unknown);
        store
            .settle(&req.key, token, unknown)
            .await
            .expect("unknown");
        let note = ReleaseNote::new("test", "settled by hand: not executed");
        store
            .release_unsettled(&req.key, token, &note)
            .await
            .expect("released");
        assert_eq!(store.len(), 1, "the trace, not a record, holds the place");
        // The completed record lapses at t0 + 20 s, the trace at t0 + 25 s.
        assert_eq!(sweeps_to_refuse(&store, "refused"), 1);
        clock.advance(Duration::from_secs(15));
        let first = store.claim_now(&request("first lapse"), None);
        assert!(matches!(first, Ok(ClaimOutcome::Claimed(_))), "{first:?}");
        assert_eq!(sweeps_to_refuse(&store, "between the lapses"), 1);
        clock.advance(Duration::from_millis(5000 - 1));
        assert_eq!(sweeps_to_refuse(&store, "a millisecond early"), 0);
        clock.advance(Duration::from_millis(1));
        let second = store.claim_now(&request("second lapse"), None);
        assert!(matches!(second, Ok(ClaimOutcome::Claimed(_))), "{second:?}");
        assert!(store.releases(&req.key).await.expect("releases").is_empty());
        assert_eq!(store.places_accounted(), 2);
    }
}
