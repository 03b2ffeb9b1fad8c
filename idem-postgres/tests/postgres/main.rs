//! `PostgresStore` against the store contract and beyond it: the conformance suite, the
//! store's own behaviour, the upgrade of older layouts, and TLS.

mod durable;
mod store;
mod tls;
mod transport;
mod upgrade;
