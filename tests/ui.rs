//! Compile-time guarantees of `#[tool]` and `#[toolbox]`: every refused handler has a case in
//! `tests/ui/*.rs` whose `.stderr` pins the message and its span; `tests/ui/pass/*.rs` must
//! compile warning-free.
//!
//! The `.stderr` files depend on rustc's wording, hence the pinned toolchain. After an
//! intended change: `TRYBUILD=overwrite cargo test --all-features --test ui`, then review.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
