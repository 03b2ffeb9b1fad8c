//! Compile-time guarantees of `#[tool]` and `#[toolbox]`: every refused handler has a case in
//! `tests/ui/*.rs` whose `.stderr` pins the message and its span; `tests/ui/pass/*.rs` must
//! compile warning-free.
//!
//! The `.stderr` files depend on rustc's wording, hence the pinned toolchain, and on the
//! feature set of the dependencies rustc lists impls from: the feature `rig` turns on
//! serde_json's `raw_value` (rig-core needs it), which adds `RawValue` to the implementors
//! rustc lists, so under `rig` the cases are skipped and `.ci/run` runs them on their own
//! (`cargo test -p idem --test ui`). After an intended change:
//! `TRYBUILD=overwrite cargo test -p idem --test ui`, then review.

#[test]
fn ui() {
    if cfg!(feature = "rig") {
        eprintln!(
            "skipping: the feature `rig` changes serde_json's features and with them the \
             .stderr snapshots; run `cargo test -p idem --test ui` without it"
        );
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
