//! Support for idem's own test binaries (never published).
//!
//! - [`stores`]: temporary SQLite, Redis and Postgres stores (a directory, a key prefix, a
//!   schema of the test's own), opened as often as a test needs a new worker and removed
//!   afterwards;
//! - [`payments`]: an in-process payment service with a Stripe-like idempotency contract,
//!   behind a proxy that can delay or drop requests and responses;
//! - [`tools`]: idem tools that call that service;
//! - [`crash`]: the real-process harness of the crash tests (a worker is the test binary
//!   itself, re-executed and `kill -9`ed at its effect);
//! - [`decode_fuzz`]: every store's check that a damaged record is corrupt, never a panic;
//! - [`old_records`]: records in the shapes earlier versions wrote, for the SQL stores'
//!   upgrade checks.
//!
//! The crate's features mirror the facade's backends: a backend the build leaves out has
//! nothing here either, so every test binary compiles under partial feature sets.

pub mod crash;
pub mod decode_fuzz;
pub mod old_records;
pub mod payments;
pub mod stores;
pub mod tools;
