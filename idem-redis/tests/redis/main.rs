//! `RedisStore` against the store contract and beyond it: the conformance suite on one
//! server, on a cluster and with reads before claims; the store's own faults; copies between
//! stores; and TLS to one server and to a cluster.

mod cluster;
mod copy;
mod decode_fuzz;
mod durable;
mod factory;
mod garbage;
mod read_first;
mod replica_wait;
mod store;
mod tls_cluster;
mod transport;
