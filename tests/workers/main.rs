//! Many workers on one durable store: workers in one process, two processes racing, and
//! Postgres handlers whose effect commits in the claim's transaction.

mod many;
mod processes;
mod transactions;
