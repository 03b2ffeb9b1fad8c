//! Compile-time guarantees of `#[tool]`, `#[toolbox]` and `#[idem::args]`: every refused
//! handler has a case whose `.stderr` pins the message and its span, and every `pass/` case
//! must compile warning-free. The cases: `tests/ui/` (what each macro refuses),
//! `tests/ui/edges/` (unusual but valid or subtly invalid forms) and `tests/ui/rules/` (the
//! rules the macro and `Registry::build` both check; `tests/macros/rules.rs` holds the
//! run-time half). One trybuild project builds them all, so their dependencies build once.
//!
//! The `.stderr` files depend on rustc's wording, hence the pinned toolchain, and on the
//! feature set of the dependencies rustc lists impls from: the feature `rig` turns on
//! serde_json's `raw_value` (rig-core needs it), which adds `RawValue` to the implementors
//! rustc lists, so under `rig` the cases are skipped and `.ci/run` runs them on their own
//! (`cargo test -p idem-rs --test ui`). After an intended change:
//! `TRYBUILD=overwrite cargo test -p idem-rs --test ui`, then review.

#[test]
fn ui() {
    if cfg!(feature = "rig") {
        eprintln!(
            "skipping: the feature `rig` changes serde_json's features and with them the \
             .stderr snapshots; run `cargo test -p idem-rs --test ui` without it"
        );
        return;
    }
    let t = trybuild::TestCases::new();
    for cases in ["tests/ui", "tests/ui/edges", "tests/ui/rules"] {
        t.compile_fail(format!("{cases}/*.rs"));
        t.pass(format!("{cases}/pass/*.rs"));
    }
}
