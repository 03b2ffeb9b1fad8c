//! [`RedisStore`]: many workers on many machines sharing one Redis, or a Redis Cluster.
//!
//! Every operation is one `FCALL` of one Lua function (`script.lua`, loaded once per server
//! as a Function library; see `library`) that implements the contract's rules
//! ([`rules`](idem_runtime::store::backend::rules)) atomically inside Redis. See
//! [`RedisStore`] for the data layout and what Redis persistence means for the guarantees.
//!
//! Users reach it through the `idem` facade (feature `redis`) as `idem::RedisStore`; this
//! crate is built on `idem_runtime::store::backend` alone, like any other backend. Its
//! modules, bottom-up: `connection` (one server or a cluster, one type), `partition` (where
//! a store's keys live: its layout on the server), `codec` (hashes ↔ records, replies and
//! errors), `library` (the Lua function library and its loading, including the upgrade from
//! a server that only runs scripts), `builder`, `store` (the
//! [`IdemStore`](idem_runtime::store::IdemStore) implementation), `sweep` (retention applied
//! without a read, and the task that runs it) and `copy` (a store copied into another).

mod builder;
mod codec;
mod connection;
mod copy;
mod library;
mod partition;
mod store;
mod sweep;

pub use builder::RedisStoreBuilder;
pub use copy::RedisCopy;
pub use store::{RedisStore, DEFAULT_PREFIX};
