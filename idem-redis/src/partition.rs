//! Where a [`RedisStore`](crate::RedisStore)'s keys live: its partitions.
//!
//! Every script touches the record's key *and* the indexes it is listed in, so on a Redis
//! Cluster all of them must hash to one slot. One set of indexes for the whole store would put
//! the whole store in one slot, on one shard. A partitioned store has `P` sets of indexes,
//! each behind its own hash tag; a key belongs to one partition (by a hash of the key), so
//! every per-key script still names keys of one slot, and the partitions spread over the
//! cluster's shards. Listings walk every partition and merge.

use sha2::{Digest, Sha256};

use idem_runtime::store::StoreError;

/// The number of hash slots of a Redis Cluster.
const SLOTS: u32 = 16_384;

/// The most partitions a store may have. A listing makes a script call per partition, so
/// more than a few per shard only costs; and every partition's slot range must be wide
/// enough to find a tag in.
pub const MAX_PARTITIONS: u16 = 1024;

/// The names of one partition's keys.
#[derive(Debug)]
pub(super) struct Part {
    /// The prefix of every key of this partition: the store's prefix itself when there is
    /// one partition, else the store's prefix followed by `{tag}:`.
    pub(super) prefix: String,
    /// `prefix` `r:`: the record keys.
    pub(super) record_prefix: String,
    /// The per-state, lease and expiry index keys, in the script's `KEYS[2..9]` order.
    pub(super) index_keys: [String; 8],
    /// The sorted set listing this partition's kept releases.
    pub(super) releases_key: String,
}

impl Part {
    fn new(prefix: String) -> Part {
        let p = &prefix;
        let index_keys = [
            format!("{p}s:running"),
            format!("{p}s:completed"),
            format!("{p}s:failed"),
            format!("{p}s:pending"),
            format!("{p}s:unknown"),
            format!("{p}s:escalated"),
            format!("{p}leases"),
            format!("{p}expiry"),
        ];
        Part {
            record_prefix: format!("{p}r:"),
            releases_key: format!("{p}releases"),
            index_keys,
            prefix,
        }
    }

    /// The key of `key`'s record in this partition.
    pub(super) fn record_key(&self, key: &str) -> String {
        format!("{}{key}", self.record_prefix)
    }

    /// The key of `key`'s release trace in this partition.
    pub(super) fn release_key(&self, key: &str) -> String {
        format!("{}rel:{key}", self.prefix)
    }
}

/// Every partition of one store.
#[derive(Debug)]
pub(super) struct Layout {
    pub(super) parts: Vec<Part>,
}

impl Layout {
    /// The layout of `partitions` partitions under `prefix`; refuses a count out of range and,
    /// when partitioned, a prefix holding a brace (Redis Cluster hashes only the first `{…}`
    /// of a name: a tag in the prefix would pull every partition back into one slot).
    pub(super) fn new(prefix: &str, partitions: u16) -> Result<Layout, StoreError> {
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(StoreError::Backend(format!(
                "a Redis store has 1 to {MAX_PARTITIONS} partitions, not {partitions}"
            )));
        }
        if partitions == 1 {
            return Ok(Layout {
                parts: vec![Part::new(prefix.to_owned())],
            });
        }
        if prefix.contains(['{', '}']) {
            return Err(StoreError::Backend(format!(
                "the prefix `{prefix}` holds a brace: a partitioned store puts each partition's \
                 hash tag after the prefix, and Redis Cluster would hash the prefix's tag \
                 instead; drop the braces (partitioning spreads the store over the cluster)"
            )));
        }
        let parts = (0..partitions)
            .map(|i| Part::new(format!("{prefix}{{{}}}:", tag(i, partitions))))
            .collect();
        Ok(Layout { parts })
    }

    /// The partition `key` lives in.
    pub(super) fn part(&self, key: &str) -> &Part {
        &self.parts[self.index(key)]
    }

    /// The number of the partition `key` lives in: the first 8 bytes of the key's SHA-256,
    /// modulo the partition count. Part of the stored layout: never change it.
    pub(super) fn index(&self, key: &str) -> usize {
        let n = self.parts.len() as u64;
        if n == 1 {
            return 0;
        }
        let digest = Sha256::digest(key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        // n <= MAX_PARTITIONS, so the remainder fits any usize.
        (u64::from_be_bytes(first) % n) as usize
    }
}

/// The hash slot Redis Cluster puts a name with this hash tag in.
pub(super) fn slot(tag: &str) -> u32 {
    u32::from(crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes())) % SLOTS
}

/// The hash tag of partition `i` of `n`: `i.m`, with the smallest `m` that puts the tag's
/// slot in the `i`-th of `n` equal slot ranges. `redis-cli --cluster create` gives each of
/// `k` masters one of `k` equal ranges, so `n` a multiple of `k` puts `n / k` partitions on
/// every master. Part of the stored layout: never change it.
fn tag(i: u16, n: u16) -> String {
    let (i, n) = (u32::from(i), u32::from(n));
    let range = (i * SLOTS / n)..((i + 1) * SLOTS / n);
    // Each range holds at least 16 slots, so a tag in it turns up within a few thousand
    // tries; the bound only guards the loop.
    for m in 0..1_000_000u32 {
        let t = format!("{i}.{m}");
        if range.contains(&slot(&t)) {
            return t;
        }
    }
    format!("{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One partition keeps the names an unpartitioned store always had.
    #[test]
    fn one_partition_keeps_the_old_names() {
        let l = Layout::new("idem:", 1).expect("layout");
        assert_eq!(l.parts.len(), 1);
        assert_eq!(l.part("k").record_key("k"), "idem:r:k");
        assert_eq!(l.part("k").release_key("k"), "idem:rel:k");
        assert_eq!(l.parts[0].index_keys[0], "idem:s:running");
        assert_eq!(l.parts[0].index_keys[7], "idem:expiry");
        assert_eq!(l.parts[0].releases_key, "idem:releases");
    }

    /// Each partition's tag lands in its own slot range, so `n` partitions over `n` equal
    /// ranges (one per master) put one partition on each master.
    #[test]
    fn partition_tags_spread_over_the_slot_ranges() {
        for n in [2u16, 3, 7, 16, 100, MAX_PARTITIONS] {
            let l = Layout::new("idem:", n).expect("layout");
            for (i, p) in l.parts.iter().enumerate() {
                let t = p
                    .prefix
                    .strip_prefix("idem:{")
                    .and_then(|r| r.strip_suffix("}:"))
                    .expect("a tagged prefix");
                let s = slot(t);
                let i = i as u32;
                let n = u32::from(n);
                assert!(
                    s >= i * SLOTS / n && s < (i + 1) * SLOTS / n,
                    "partition {i} of {n}: tag {t} in slot {s}"
                );
            }
        }
    }

    /// The names are part of the stored layout: a change would hide every partitioned
    /// store's data from the new version. Pinned here so that it cannot change unnoticed.
    #[test]
    fn partitioned_names_are_stable() {
        let l = Layout::new("idem:", 3).expect("layout");
        let prefixes: Vec<&str> = l.parts.iter().map(|p| p.prefix.as_str()).collect();
        assert_eq!(prefixes, ["idem:{0.1}:", "idem:{1.0}:", "idem:{2.0}:"]);
        let key = "idem:v2:stable";
        let part = l.part(key);
        assert_eq!(
            part.record_key(key),
            format!("{}r:{key}", l.parts[l.index(key)].prefix)
        );
        let digest = Sha256::digest(key.as_bytes());
        let first = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
        assert_eq!(l.index(key) as u64, first % 3);
    }

    /// Keys spread over the partitions, and a key always maps to the same one.
    #[test]
    fn keys_spread_over_partitions() {
        let l = Layout::new("idem:", 4).expect("layout");
        let mut seen = [0usize; 4];
        for i in 0..400 {
            let k = format!("idem:v2:key-{i}");
            let p = l.index(&k);
            assert_eq!(p, l.index(&k));
            seen[p] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "{seen:?}");
    }

    /// Out-of-range counts and a braced prefix on a partitioned store are refused.
    #[test]
    fn bad_settings_are_refused() {
        assert!(Layout::new("idem:", 0).is_err());
        assert!(Layout::new("idem:", MAX_PARTITIONS + 1).is_err());
        assert!(Layout::new("{idem}:", 4).is_err());
        assert!(Layout::new("{idem}:", 1).is_ok());
    }
}
