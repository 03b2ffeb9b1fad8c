//! `RedisStore` built with `read_before_claim(true)` against the whole store conformance
//! suite: a claim that reads the record first (and answers a settled one without a script)
//! keeps every rule the script keeps — atomic claims, lapsed leases turning unknown,
//! results and tombstones expiring on time, changed parameters refused.
//!
//! Needs a Redis (`IDEM_REDIS_URL`); without it every check prints why it is skipped, and
//! fails when `IDEM_REQUIRE_BACKENDS=1`.

use crate::factory::Redis;

idem_runtime::store_conformance_tests!(Redis {
    read_before_claim: true
});
