//! Support shared by the integration tests: a Stripe-like payment service behind a faulty
//! proxy ([`payments`]), idem tools that call it ([`tools`]), and the real-process crash
//! harness ([`crash`]).
//!
//! Use it with `mod support;` from a test file.

// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

pub mod crash;
pub mod payments;
pub mod tools;
