//! The Redis store factory of the conformance runs (`store_redis.rs`,
//! `store_redis_read_first.rs`): a fresh key prefix per check, deleted afterwards.
#![allow(dead_code)] // each test binary uses its own part of this

use std::sync::atomic::{AtomicU64, Ordering};

use idem_redis::RedisStore;
use idem_runtime::identity::IdemKey;
use idem_runtime::store::conformance::{StoreFactory, StoreOptions};
use idem_runtime::store::StoreError;

use super::redis_garbage;

pub const VAR: &str = "IDEM_REDIS_URL";

pub fn url() -> Option<String> {
    std::env::var(VAR).ok().filter(|s| !s.trim().is_empty())
}

pub fn skip_reason() -> String {
    format!(
        "{VAR} not set; start a Redis and export {VAR}=redis://127.0.0.1:6379/ to run the Redis \
         checks (.ci/run does this)"
    )
}

/// A key prefix of its own, deleted with everything under it when dropped.
pub struct Prefix {
    pub url: String,
    pub prefix: String,
}

impl Prefix {
    pub fn fresh(url: &str) -> Prefix {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Prefix {
            url: url.to_owned(),
            prefix: format!(
                "idem-test:{}-{nanos}-{}:",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = match redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
        {
            Ok(k) => k,
            Err(_) => return,
        };
        if !keys.is_empty() {
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

/// The store conformance suite's Redis: a fresh prefix per check.
pub struct Redis {
    /// Builds every store with `RedisStoreBuilder::read_before_claim`.
    pub read_before_claim: bool,
}

impl StoreFactory for Redis {
    type Store = RedisStore;
    type Location = Prefix;

    fn durable(&self) -> bool {
        true
    }

    fn unavailable(&self) -> Option<String> {
        url().is_none().then(skip_reason)
    }

    async fn location(&self) -> Result<Prefix, StoreError> {
        let url = url().ok_or_else(|| StoreError::Unavailable(skip_reason()))?;
        Ok(Prefix::fresh(&url))
    }

    async fn open(&self, at: &Prefix, options: &StoreOptions) -> Result<RedisStore, StoreError> {
        RedisStore::builder(at.url.as_str())
            .prefix(at.prefix.as_str())
            .clock(options.clock())
            .retention(options.retention)
            .read_before_claim(self.read_before_claim)
            .connect()
            .await
    }

    fn corruptions(&self) -> &'static [&'static str] {
        crate::durable::CORRUPTIONS
    }

    async fn break_record(&self, at: &Prefix, store: &RedisStore, key: &IdemKey, how: &str) {
        let rows = crate::durable::RedisRows {
            url: &at.url,
            store,
        };
        rows.corrupt(key, how).await;
    }

    async fn raw_record(&self, at: &Prefix, store: &RedisStore, key: &IdemKey) -> Option<String> {
        let rows = crate::durable::RedisRows {
            url: &at.url,
            store,
        };
        rows.raw(key).await
    }

    async fn corrupt(&self, at: &Prefix, key: &IdemKey) -> Result<bool, StoreError> {
        let client =
            redis::Client::open(at.url.as_str()).map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let record_key = format!("{}r:{}", at.prefix, key.as_str());
        redis_garbage::overwrite_with_garbage(&mut conn, &record_key).await
    }
}
