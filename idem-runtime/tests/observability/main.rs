//! What leaves the process about a call: redacted escalations and errors, the spans idem
//! opens, and (with the `metrics` feature) the metrics it records, each captured during one
//! scripted sequence ([`observed`]).

#[cfg(feature = "metrics")]
mod metrics;
mod observed;
mod redaction;
mod spans;
