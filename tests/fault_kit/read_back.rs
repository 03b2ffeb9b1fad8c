//! The tool's own read-back as the ledger: it counts what it can name.

use idem::fault_kit::{Fault, FaultKit, FaultKitError, Subject, Verdict};

use crate::bank::{args, changed_args, tool, Bank, Banks};

#[tokio::test(start_paused = true)]
async fn counted_by_its_read_back_a_keyed_tool_passes_every_fault() {
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || {
        made.read_back_subject(Bank::keyed, "charge_found")
    })
    .changed_args(changed_args())
    .run()
    .await
    .expect("the tool registers and has a read-back");
    report.assert_all_pass();
    for (fault, charges) in banks.counts(&Fault::ALL) {
        assert_eq!(
            charges, 1,
            "{fault}: the bank holds {charges} charges\n{report}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_read_back_that_names_two_charges_fails_the_row() {
    // The tool claims a key contract its bank does not keep: the executor's same-key retry
    // after the lost answer charges again, and the read-back finds both charges.
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || {
        made.read_back_subject(Bank::unkeyed, "charge_found")
    })
    .faults([Fault::LostAck])
    .run()
    .await
    .expect("the tool registers and has a read-back");
    assert_eq!(banks.counts(&[Fault::LostAck]), [(Fault::LostAck, 2)]);
    let row = report.row(Fault::LostAck).expect("ran");
    assert_eq!(row.effects(), 2, "{report}");
    assert_eq!(row.verdict(), Verdict::Fail, "{report}");
}

#[tokio::test(start_paused = true)]
async fn a_tool_without_a_read_back_cannot_be_counted_by_one() {
    let err = FaultKit::new(args(), || {
        Subject::counted_by_read_back(tool(Bank::keyed(), "charge"))
    })
    .faults([Fault::None])
    .run()
    .await
    .expect_err("no read-back");
    assert!(
        matches!(err, FaultKitError::NoReadBack(ref n) if n == "charge"),
        "{err}"
    );
}
