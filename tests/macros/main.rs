//! The `#[tool]`, `#[toolbox]` and `#[args]` macros: the tools they generate, their edge
//! cases, the rules they enforce and the reconcile hooks they wire (compile errors are in
//! `tests/ui.rs`).

mod edges;
mod reconcile;
mod rules;
mod tools;
