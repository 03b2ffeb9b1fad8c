//! Broken set-ups the kit must catch, with the banks showing what it caught.

use idem::fault_kit::{Fault, FaultKit, Verdict};

use crate::bank::{args, changed_args, Bank, Banks};

#[tokio::test(start_paused = true)]
async fn a_handler_that_charges_twice_fails_every_fault() {
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || made.subject(Bank::keyed, "charge_twice"))
        .changed_args(changed_args())
        .run()
        .await
        .expect("the tool registers");
    assert!(!report.passed(), "{report}");
    for ((fault, charges), row) in banks.counts(&Fault::ALL).into_iter().zip(report.rows()) {
        assert_eq!(
            charges, 2,
            "{fault}: the bank holds {charges} charges\n{report}"
        );
        assert_eq!(row.effects(), 2, "{fault}\n{report}");
        assert_eq!(row.verdict(), Verdict::Fail, "{fault}\n{report}");
    }
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "the fault kit found 1 failing fault(s) (lost-ack)")]
async fn assert_all_pass_panics_with_the_table_on_a_failure() {
    let banks = Banks::default();
    FaultKit::new(args(), move || banks.subject(Bank::keyed, "charge_twice"))
        .faults([Fault::LostAck])
        .run()
        .await
        .expect("the tool registers")
        .assert_all_pass();
}

/// A tool that says its downstream honours keys when it does not: the executor retries an
/// unknown attempt with the same key, and the bank charges again.
#[tokio::test(start_paused = true)]
async fn a_keyed_claim_the_bank_does_not_keep_duplicates_under_the_faults_that_retry() {
    let retrying = [
        Fault::LostAck,
        Fault::LateCommit,
        Fault::Redelivery,
        Fault::TimeoutAfterEffect,
        Fault::ServerErrorAfterEffect,
    ];
    let harmless = [
        Fault::None,
        Fault::Reissue,
        Fault::Concurrent,
        Fault::Unavailable,
    ];
    let faults: Vec<Fault> = retrying.iter().chain(&harmless).copied().collect();
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || made.subject(Bank::unkeyed, "charge"))
        .faults(faults.clone())
        .run()
        .await
        .expect("the tool registers");
    for (fault, charges) in banks.counts(&faults) {
        let row = report.row(fault).expect("ran");
        if retrying.contains(&fault) {
            assert_eq!(charges, 2, "{fault}: the bank holds {charges}\n{report}");
            assert_eq!(row.verdict(), Verdict::Fail, "{fault}\n{report}");
        } else {
            assert_eq!(charges, 1, "{fault}: the bank holds {charges}\n{report}");
            assert_eq!(row.verdict(), Verdict::Pass, "{fault}\n{report}");
        }
    }
}
