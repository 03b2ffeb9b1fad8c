//! The outcome matrix: every row of what can happen to a call (refused, shed, lost after
//! commit, still pending, duplicated, replayed after a restart…) asserted on the stub
//! payment service's ledger, the outcome classes a handler's errors map to, unavailable
//! downstreams, the keyed retry window, and the retry example's matrix.

mod in_process;
mod keyed_window;
mod outcome_classes;
mod restarts;
mod retry_example;
mod unavailable;
mod world;
