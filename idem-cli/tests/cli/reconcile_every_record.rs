//! `idem reconcile` looks at every unknown and pending record once — past the reconciler's
//! batch — and its help says so.

use std::collections::HashSet;

use crate::support::{idem_at, stderr, unknown_record, RecordText, TempDb};
use clap::CommandFactory;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_visits_every_record_as_its_help_says() {
    let help = idem_cli::Cli::command()
        .find_subcommand("reconcile")
        .expect("a reconcile subcommand")
        .get_about()
        .expect("reconcile has help")
        .to_string();
    assert!(
        help.contains("every") && !help.contains("one pass"),
        "reconcile's help: {help:?}"
    );

    // More than one batch (the reconciler's default is 500).
    let db = TempDb::new("idem-cli-every").await;
    let mut keys = HashSet::new();
    for i in 0..501 {
        keys.insert(
            unknown_record(
                &*db.store,
                &RecordText::plain(&format!("every-{i}"), "lost"),
            )
            .await
            .to_string(),
        );
    }
    let out = idem_at(&db.url(), &["--json", "reconcile"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let decisions: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let decided: Vec<String> = decisions
        .iter()
        .map(|d| d["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(decided.len(), 501, "each record once");
    assert_eq!(decided.into_iter().collect::<HashSet<_>>(), keys);
}
