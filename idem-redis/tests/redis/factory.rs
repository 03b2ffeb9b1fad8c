//! The Redis store factory of the conformance runs (`store.rs`, `read_first.rs`): a fresh
//! key prefix per check, deleted afterwards.

use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::conformance::{StoreFactory, StoreOptions};
use idem_runtime::store::StoreError;
use idem_test::stores::RedisPrefix;

use crate::garbage;

/// The variable that names the server.
pub const VAR: &str = "IDEM_REDIS_URL";

/// The server, when the environment names one.
pub fn url() -> Option<String> {
    std::env::var(VAR).ok().filter(|s| !s.trim().is_empty())
}

/// Why the Redis checks skip without one.
pub fn skip_reason() -> String {
    format!(
        "{VAR} not set; start a Redis and export {VAR}=redis://127.0.0.1:6379/ to run the Redis \
         checks (.ci/run does this)"
    )
}

/// The store conformance suite's Redis: a fresh prefix per check.
pub struct Redis {
    /// Builds every store with `RedisStoreBuilder::read_before_claim`.
    pub read_before_claim: bool,
}

impl StoreFactory for Redis {
    type Store = RedisStore;
    type Location = RedisPrefix;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        url().is_none().then(skip_reason)
    }

    async fn location(&self) -> Result<RedisPrefix, StoreError> {
        let url = url().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(RedisPrefix::on(url, "redis_conformance"))
    }

    async fn open(
        &self,
        at: &RedisPrefix,
        options: &StoreOptions,
    ) -> Result<RedisStore, StoreError> {
        RedisStore::builder(at.url.as_str())
            .prefix(at.prefix.as_str())
            .clock(options.clock())
            .retention(options.retention)
            .sweep_every(options.sweep_every)
            .read_before_claim(self.read_before_claim)
            .connect()
            .await
    }

    fn corruptions(&self) -> &'static [&'static str] {
        crate::durable::CORRUPTIONS
    }

    async fn break_record(&self, at: &RedisPrefix, store: &RedisStore, key: &IdemKey, how: &str) {
        let rows = crate::durable::RedisRows {
            url: &at.url,
            store,
        };
        rows.corrupt(key, how).await;
    }

    async fn raw_record(
        &self,
        at: &RedisPrefix,
        store: &RedisStore,
        key: &IdemKey,
    ) -> Option<String> {
        let rows = crate::durable::RedisRows {
            url: &at.url,
            store,
        };
        rows.raw(key).await
    }

    async fn corrupt(&self, at: &RedisPrefix, key: &IdemKey) -> Result<bool, StoreError> {
        let client =
            redis::Client::open(at.url.as_str()).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let record_key = format!("{}r:{}", at.prefix, key.as_str());
        garbage::overwrite_with_garbage(&mut conn, &record_key).await
    }
}
