//! The main job's numbers, asserted: `retry_matrix` always exits 0 and prints whatever its
//! runs produced, so this test reads the very JSON its `--json` prints and checks it against
//! the known result. The seed block's four hand-rolled strategies under its four faults are
//! 16 runs with 7 duplicates, every one reported "completed" to the agent; idem charges
//! exactly once in every run of both blocks.
//!
//! The example is compiled in as a module (its `main` is not called): the JSON is built by
//! the same `render` the binary prints.

#[allow(dead_code)]
#[path = "../examples/retry_matrix/main.rs"]
mod retry_matrix;

use serde_json::Value;

/// One run of the `--json` output.
struct Run {
    block: String,
    fault: String,
    strategy: String,
    /// The service's ledger for this run: each committed charge's customer and amount.
    ledger: Vec<(String, u64)>,
    reported_completed: bool,
}

fn parse(line: &str) -> Run {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let text = |field: &str| {
        v[field]
            .as_str()
            .unwrap_or_else(|| panic!("`{field}` is not a string in {line}"))
            .to_owned()
    };
    let ledger: Vec<(String, u64)> = v["ledger"]
        .as_array()
        .unwrap_or_else(|| panic!("no ledger in {line}"))
        .iter()
        .map(|c| {
            (
                c["customer"].as_str().expect("a customer").to_owned(),
                c["amount"].as_u64().expect("an amount"),
            )
        })
        .collect();
    // The summary column must agree with the ledger it summarises.
    assert_eq!(
        v["charges"].as_u64(),
        Some(ledger.len() as u64),
        "`charges` disagrees with the ledger in {line}"
    );
    Run {
        block: text("block"),
        fault: text("fault"),
        strategy: text("strategy"),
        ledger,
        reported_completed: v["reported_completed"].as_bool().expect("a bool"),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn seed_block_reproduces_7_duplicates_of_16_and_idem_charges_once_everywhere() {
    let out = retry_matrix::render(true).await;
    let runs: Vec<Run> = out.lines().map(parse).collect();
    assert_eq!(
        runs.len(),
        4 * 5 + 8 * 5 + 1,
        "every fault x strategy, and the key reuse"
    );

    let seed: Vec<&Run> = runs.iter().filter(|r| r.block == "seed").collect();
    let hand_rolled: Vec<&&Run> = seed.iter().filter(|r| r.strategy != "idem").collect();
    assert_eq!(hand_rolled.len(), 16, "the seed's 16 runs");
    let duplicates: Vec<&&&Run> = hand_rolled.iter().filter(|r| r.ledger.len() > 1).collect();
    let which: Vec<String> = duplicates
        .iter()
        .map(|r| format!("{}/{}", r.fault, r.strategy))
        .collect();
    assert_eq!(
        duplicates.len(),
        7,
        "the seed's known result is 7 duplicates of 16, got {which:?}"
    );
    assert!(
        duplicates.iter().all(|r| r.reported_completed),
        "every seed duplicate was reported \"completed\" to the agent: {which:?}"
    );

    let idem: Vec<&Run> = runs.iter().filter(|r| r.strategy == "idem").collect();
    assert_eq!(
        idem.iter().filter(|r| r.block == "seed").count(),
        4,
        "idem runs under each of the seed's 4 faults"
    );
    assert_eq!(
        idem.iter().filter(|r| r.block == "extended").count(),
        8,
        "idem runs under each of the 8 extended faults"
    );
    for r in &idem {
        assert_eq!(
            r.ledger,
            vec![("acme".to_owned(), 4900)],
            "idem must charge acme 4900 cents exactly once under {} ({})",
            r.fault,
            r.block
        );
    }

    // The seed's closing check: the pinned key reused with another amount is refused.
    let reuse: Vec<&Run> = runs.iter().filter(|r| r.block == "seed-check").collect();
    assert_eq!(reuse.len(), 1);
    assert_eq!(reuse[0].ledger, vec![("acme".to_owned(), 4900)]);
}
