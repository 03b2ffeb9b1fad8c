//! The rules `#[tool]` checks at compile time and `Registry::build` checks at run time — the
//! shortest lease (10 ms) and the tool-name charset (1–64 of `[A-Za-z0-9_-]`) — are written
//! in both crates, since the macro crate cannot depend on the runtime. This pins them equal:
//! every `lease = "…"` and `name = "…"` in `tests/ui/rules/` is refused by both (the
//! compile-fail cases, which `tests/ui.rs` compiles) or accepted by both (`pass/`, whose
//! `main` also builds a registry).

use std::path::Path;
use std::time::Duration;

use idem::{
    tool::{ToolSpec, WriteTool},
    BuildError, Registry, ToolError, WriteCtx,
};

/// A tool with a hand-made spec, so the runtime sees values the macro would refuse.
struct HandMade(ToolSpec);

impl WriteTool for HandMade {
    type Args = serde_json::Value;
    type Output = ();

    fn spec(&self) -> ToolSpec {
        self.0.clone()
    }

    async fn call(&self, _ctx: WriteCtx, _args: Self::Args) -> Result<(), ToolError> {
        Ok(())
    }
}

fn build(spec: ToolSpec) -> Result<Registry, BuildError> {
    Registry::builder().tool(HandMade(spec)).build()
}

/// Every `option = "…"` literal in the `.rs` files of `dir` (not recursive).
fn literals(dir: &str, option: &str) -> Vec<String> {
    let needle = format!("{option} = \"");
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices(&needle) {
            let rest = &text[at + needle.len()..];
            found.push(rest[..rest.find('"').unwrap()].to_owned());
        }
    }
    found
}

/// `"9ms"` or `"2s"`: the forms the rule cases use.
fn duration(text: &str) -> Duration {
    match text.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse().unwrap()),
        None => Duration::from_secs(text.strip_suffix('s').unwrap().parse().unwrap()),
    }
}

#[test]
fn the_runtime_refuses_every_lease_the_macro_refuses_and_accepts_the_rest() {
    let refused = literals("tests/ui/rules", "lease");
    let accepted = literals("tests/ui/rules/pass", "lease");
    // The boundary itself must be among the cases, on both sides.
    assert!(refused.contains(&"9ms".to_owned()), "{refused:?}");
    assert!(accepted.contains(&"10ms".to_owned()), "{accepted:?}");
    for lease in &refused {
        let built = build(ToolSpec::new("t").lease(duration(lease)));
        assert!(
            matches!(&built, Err(BuildError::InvalidSpec { message, .. }) if message.contains("lease")),
            "lease = {lease:?}: the macro refuses it, build() says {:?}",
            built.err()
        );
    }
    for lease in &accepted {
        let built = build(ToolSpec::new("t").lease(duration(lease)));
        assert!(
            built.is_ok(),
            "lease = {lease:?}: the macro accepts it, build() says {:?}",
            built.err()
        );
    }
}

#[test]
fn the_runtime_refuses_every_name_the_macro_refuses_and_accepts_the_rest() {
    let refused = literals("tests/ui/rules", "name");
    let accepted = literals("tests/ui/rules/pass", "name");
    let lengths = |names: &[String]| names.iter().map(|n| n.len()).collect::<Vec<_>>();
    assert!(lengths(&refused).contains(&65), "{refused:?}");
    assert!(lengths(&refused).contains(&0), "{refused:?}");
    assert!(lengths(&accepted).contains(&64), "{accepted:?}");
    assert!(lengths(&accepted).contains(&1), "{accepted:?}");
    for name in &refused {
        let built = build(ToolSpec::new(name.clone()));
        assert!(
            matches!(&built, Err(BuildError::InvalidName(_))),
            "name = {name:?}: the macro refuses it, build() says {:?}",
            built.err()
        );
    }
    for name in &accepted {
        let built = build(ToolSpec::new(name.clone()));
        assert!(
            built.is_ok(),
            "name = {name:?}: the macro accepts it, build() says {:?}",
            built.err()
        );
    }
}
