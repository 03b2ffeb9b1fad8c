//! An honest unkeyed tool: what no client can prevent is reported as such, what nobody can
//! tell is left to a person, and nothing is failed.

use idem::fault_kit::{Fault, FaultKit, Verdict};

use crate::bank::{args, changed_args, Bank, Banks};

#[tokio::test(start_paused = true)]
async fn redelivery_to_an_unkeyed_bank_is_not_preventable_and_nothing_fails() {
    let banks = Banks::default();
    let made = banks.clone();
    let report = FaultKit::new(args(), move || {
        made.subject(Bank::unkeyed, "charge_unkeyed")
    })
    .changed_args(changed_args())
    .run()
    .await
    .expect("the tool registers");
    report.assert_all_pass();
    for (fault, charges) in banks.counts(&Fault::ALL) {
        let row = report.row(fault).expect("ran");
        match fault {
            Fault::Redelivery => {
                assert_eq!(charges, 2, "the bank executed both copies\n{report}");
                assert_eq!(row.verdict(), Verdict::NotPreventable, "{report}");
            }
            // The answer was lost after the charge: nobody can tell, nothing is sent again.
            Fault::LostAck | Fault::TimeoutAfterEffect | Fault::ServerErrorAfterEffect => {
                assert_eq!(charges, 1, "{fault}\n{report}");
                assert_eq!(row.verdict(), Verdict::Escalated, "{fault}\n{report}");
            }
            // Nothing ran, and nobody can tell that either: not sent again, not charged.
            Fault::TimeoutBeforeEffect | Fault::ServerErrorBeforeEffect => {
                assert_eq!(charges, 0, "{fault}\n{report}");
                assert_eq!(row.verdict(), Verdict::Escalated, "{fault}\n{report}");
            }
            _ => assert!(charges <= 1, "{fault}: {charges} charges\n{report}"),
        }
    }
}
