//! The main job's numbers, asserted: `retry_matrix` always exits 0 and prints whatever its
//! runs produced, so this test reads the very JSON its `--json` prints and checks it against
//! the known result. The seed block's four hand-rolled strategies under its four faults are
//! 16 runs with 7 duplicates, every one reported "completed" to the agent; idem charges
//! exactly once in every run of both blocks.
//!
//! The example is compiled in as a module (its `main` is not called): the JSON is built by
//! the same `render` the binary prints.

#[allow(dead_code)]
#[path = "../../examples/retry_matrix/main.rs"]
mod retry_matrix;

use serde_json::Value;

/// One run of the `--json` output.
struct Run {
    block: String,
    fault: String,
    strategy: String,
    /// The service's ledger for this run: each committed charge's customer and amount.
    ledger: Vec<(String, u64)>,
    /// When each of those charges committed, in simulated milliseconds since the run began.
    committed_at_ms: Vec<u64>,
    /// The ledger's size when each of the agent's turns ended.
    charges_after_turn: Vec<u64>,
    /// What the agent was told, turn by turn.
    report: String,
    reported_completed: bool,
    /// idem's runs only: the fault kit's verdict (idem's row runs through the kit).
    kit_verdict: Option<String>,
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
    let committed_at_ms = v["ledger"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["at_ms"].as_u64().expect("a commit time"))
        .collect();
    let charges_after_turn = v["charges_after_turn"]
        .as_array()
        .unwrap_or_else(|| panic!("no charges_after_turn in {line}"))
        .iter()
        .map(|n| n.as_u64().expect("a count"))
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
        committed_at_ms,
        charges_after_turn,
        report: text("report"),
        reported_completed: v["reported_completed"].as_bool().expect("a bool"),
        kit_verdict: v["kit_verdict"].as_str().map(str::to_owned),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn seed_block_reproduces_7_duplicates_of_16_and_idem_charges_once_everywhere() {
    let out = retry_matrix::render(true).await;
    let runs: Vec<Run> = out.lines().map(parse).collect();
    assert_eq!(
        runs.len(),
        4 * 5 + 10 * 5 + 1,
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
        10,
        "idem runs under each of the 10 extended faults"
    );
    for r in &idem {
        assert_eq!(
            r.ledger,
            vec![("acme".to_owned(), 4900)],
            "idem must charge acme 4900 cents exactly once under {} ({})",
            r.fault,
            r.block
        );
        // The fault kit judged the run on the same ledger: a pass, except where nobody can
        // tell (the unkeyed service without a read-back), which waits for a person.
        let expected = if r.fault == "unkeyed" {
            "escalated"
        } else {
            "pass"
        };
        assert_eq!(r.kit_verdict.as_deref(), Some(expected), "{}", r.fault);
    }
    assert!(
        runs.iter()
            .filter(|r| r.strategy != "idem")
            .all(|r| r.kit_verdict.is_none()),
        "only idem's runs go through the kit"
    );

    // The seed's closing check: the pinned key reused with another amount is refused.
    let reuse: Vec<&Run> = runs.iter().filter(|r| r.block == "seed-check").collect();
    assert_eq!(reuse.len(), 1);
    assert_eq!(reuse[0].ledger, vec![("acme".to_owned(), 4900)]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_503_without_execution_never_duplicates_and_idem_waits_out_retry_after() {
    let out = retry_matrix::render(true).await;
    let runs: Vec<Run> = out.lines().map(parse).collect();
    let block = |fault: &str| -> Vec<&Run> { runs.iter().filter(|r| r.fault == fault).collect() };

    // The service turns its first two requests away (503, Retry-After: 2) and executes
    // nothing for them: no strategy can end with two charges.
    let brief = block("unavailable-503");
    assert_eq!(brief.len(), 5, "every strategy runs the block");
    for r in &brief {
        assert!(
            r.ledger.len() <= 1,
            "{} charged {} times after 503s that executed nothing",
            r.strategy,
            r.ledger.len()
        );
    }
    // The loops that retry on any error get through on their third request.
    for name in ["naive", "verify-then-retry", "new-key-per-attempt"] {
        let r = brief.iter().find(|r| r.strategy == name).expect("a row");
        assert_eq!(r.ledger, vec![("acme".to_owned(), 4900)], "{name}");
    }
    // idem charges once, and only after waiting out both Retry-Afters (2 s each): its third
    // attempt goes out at t+4 s, not at t+2 s as the 1 s backoff alone would have it.
    let idem = brief
        .iter()
        .find(|r| r.strategy == "idem")
        .expect("an idem row");
    assert_eq!(idem.ledger, vec![("acme".to_owned(), 4900)]);
    assert_eq!(
        idem.charges_after_turn,
        vec![1],
        "charged within its one turn"
    );
    assert!(
        idem.committed_at_ms[0] >= 4000,
        "idem sent again before Retry-After: charge committed at {} ms",
        idem.committed_at_ms[0]
    );

    // The service stays unavailable for 35 s, past idem's 30 s budget; the model calls again
    // a minute after its first turn.
    let outage = block("outage-503");
    assert_eq!(outage.len(), 5, "every strategy runs the block");
    for r in &outage {
        assert_eq!(
            r.charges_after_turn,
            vec![0, 1],
            "{}: nothing charged during the outage, one charge on the later call",
            r.strategy
        );
        assert_eq!(r.ledger, vec![("acme".to_owned(), 4900)], "{}", r.strategy);
        assert!(
            r.committed_at_ms[0] >= 35_000,
            "{}: a charge committed during the outage",
            r.strategy
        );
    }
    // idem gave up within its budget and said so: nothing was done, try later.
    let idem = outage
        .iter()
        .find(|r| r.strategy == "idem")
        .expect("an idem row");
    let first_turn = idem.report.split(" | ").next().unwrap_or_default();
    assert!(
        first_turn.starts_with("unavailable, not executed")
            && first_turn.contains("nothing was done"),
        "idem's first turn: {first_turn}"
    );
    assert!(!idem.reported_completed);
}
