//! Real crashes: a worker (this test binary, re-executed) is `kill -9`ed at its effect, and
//! a new process on the same store finds the record unknown, never runs the handler again.
//! One module per backend; each module's `crash_worker` test is the worker's body.

mod postgres;
mod redis;
mod sqlite;
