//! The write executor: each row of the outcome table against a counting fake downstream,
//! the edges where a retry or a late result could make one operation two, in-flight bounds,
//! unavailable downstreams, and results that arrive after a person released the key.

mod edges;
mod in_flight_bound;
mod in_flight_bound_slow_store;
mod outcome_table;
mod unavailable;
mod unavailable_redelivered;
