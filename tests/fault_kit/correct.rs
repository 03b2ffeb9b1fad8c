//! A correct keyed tool: every fault passes, and every bank holds exactly one charge.

use std::sync::Arc;

use idem::fault_kit::{Fault, FaultKit, FaultKitError, Subject, Verdict};
use idem::{tool, ReadCtx, ToolError};

use crate::bank::{args, changed_args, Bank, Banks, Billing};

#[tokio::test(start_paused = true)]
async fn a_keyed_tool_passes_every_fault_with_one_charge_in_each_bank() {
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || made.subject(Bank::keyed, "charge"))
        .changed_args(changed_args())
        .run()
        .await
        .expect("the tool registers");
    report.assert_all_pass();
    for (fault, charges) in banks.counts(&Fault::ALL) {
        assert_eq!(
            charges, 1,
            "{fault}: the bank holds {charges} charges\n{report}"
        );
    }
    for row in report.rows() {
        assert_eq!(row.verdict(), Verdict::Pass, "{report}");
    }
    // The changed call was refused, and the one charge is the first call's amount.
    let changed = report.row(Fault::ChangedParams).expect("ran");
    assert!(
        changed.told().contains("refused: changed params"),
        "{report}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shared_sandbox_counted_by_key_sees_one_charge_per_fault() {
    // One bank for every fault, as a sandbox that lives across runs: the ledger counts the
    // charges made under the operation's key.
    let bank = Bank::keyed();
    let shared = bank.clone();
    let report = FaultKit::new(args(), move || {
        let counted = shared.clone();
        Subject::toolbox(
            Arc::new(Billing {
                bank: shared.clone(),
            }),
            "charge",
            move |key| {
                counted
                    .charges()
                    .iter()
                    .filter(|c| c.key == key.as_str())
                    .count()
            },
        )
    })
    .faults([Fault::LostAck, Fault::Redelivery, Fault::Crash])
    .run()
    .await
    .expect("the tool registers");
    report.assert_all_pass();
    let charges = bank.charges();
    assert_eq!(charges.len(), 3, "one charge per fault: {charges:?}");
    let mut keys: Vec<&str> = charges.iter().map(|c| c.key.as_str()).collect();
    keys.dedup();
    assert_eq!(keys.len(), 3, "each fault's run has a key of its own");
}

#[tokio::test(start_paused = true)]
async fn changed_params_without_changed_arguments_is_skipped_not_passed() {
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || made.subject(Bank::keyed, "charge"))
        .faults([Fault::ChangedParams])
        .run()
        .await
        .expect("the tool registers");
    let row = report.row(Fault::ChangedParams).expect("listed");
    assert_eq!(row.verdict(), Verdict::Skipped);
    assert_eq!(
        banks.counts(&[Fault::ChangedParams]),
        [(Fault::ChangedParams, 0)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_the_toolbox_lacks_is_an_error_not_a_report() {
    let banks = Banks::default();
    let err = FaultKit::new(args(), move || banks.subject(Bank::keyed, "refund"))
        .run()
        .await
        .expect_err("no such tool");
    assert!(
        matches!(err, FaultKitError::NoSuchTool(ref n) if n == "refund"),
        "{err}"
    );
}

/// A sandbox's way: tokio's clock not paused, the tool's own short timeout, in-flight bound
/// and lease; the kit's waits scale with them.
#[tokio::test]
async fn in_real_time_with_short_timeouts_a_keyed_tool_passes() {
    let faults = [Fault::LostAck, Fault::LateCommit, Fault::Crash];
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || made.subject(Bank::keyed, "charge_quick"))
        .faults(faults)
        .run()
        .await
        .expect("the tool registers");
    report.assert_all_pass();
    for (fault, charges) in banks.counts(&faults) {
        assert_eq!(
            charges, 1,
            "{fault}: the bank holds {charges} charges\n{report}"
        );
    }
}

/// What is the balance?
#[tool(read)]
async fn balance(_ctx: ReadCtx) -> Result<u64, ToolError> {
    Ok(0)
}

#[tokio::test(start_paused = true)]
async fn a_read_tool_is_an_error_not_a_report() {
    let err = FaultKit::new(args(), || Subject::new(balance, |_key| 0))
        .run()
        .await
        .expect_err("a read tool has no effect to count");
    assert!(
        matches!(err, FaultKitError::NotAWriteTool(ref n) if n == "balance"),
        "{err}"
    );
}
