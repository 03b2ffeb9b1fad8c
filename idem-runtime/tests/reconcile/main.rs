//! The reconciler's decisions against a stub downstream's ledger, and the JSON-lines sink
//! its escalations go to.

mod decisions;
mod escalation_sink;
mod resolutions;
