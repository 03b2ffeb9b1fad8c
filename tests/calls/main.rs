//! Call semantics through the public API: what a registry does with each call, bad input,
//! extreme values, concurrent duplicates, and generated calls (properties of the registry).

mod bad_input;
mod concurrency;
mod extremes;
mod registry_properties;
mod semantics;
