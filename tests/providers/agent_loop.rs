//! The agent loop of `examples/agent_loop.rs`, run over both recorded transcripts: the model
//! re-issues a charge after a lost answer and retries with changed parameters; the ledger
//! holds exactly one charge each time.

#[path = "../../examples/agent_loop/run.rs"]
#[allow(dead_code)]
mod run;

use idem::{CallError, Scope};
use run::{billing, run_anthropic, run_openai, Run, Transcript};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agent_loop");

fn transcript(file: &str) -> Transcript {
    Transcript::load(&format!("{DIR}/{file}")).unwrap()
}

/// The call ids of the transcript's charges, in the model's order.
fn charge_ids(t: &Transcript, pointer: &str, id: &str, name: &str) -> Vec<String> {
    t.replies
        .iter()
        .flat_map(|r| {
            r.pointer(pointer)
                .and_then(|v| v.as_array())
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| c.pointer(name).and_then(|n| n.as_str()) == Some("charge_card"))
        .map(|c| c[id].as_str().unwrap().to_owned())
        .collect()
}

fn check(run: &Run, charges: &[String], billing: &run::Billing) {
    // One effect, although the model asked three times.
    let ledger = billing.ledger();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].cents, 4900);
    assert_eq!(billing.handler_runs(), 1);

    let [first, reissued, changed] = charges else {
        panic!("the transcript has three charges: {charges:?}")
    };
    let by_id = |id: &String| run.told.iter().find(|t| &t.call_id == id).unwrap();
    // The first answer was lost: the model was told it timed out.
    assert!(by_id(first).is_error && by_id(first).result.is_completed());
    // The re-issue under a new call id replayed the first charge.
    let again = by_id(reissued);
    assert!(again.result.replayed() && !again.is_error, "{again:?}");
    assert_eq!(again.result.output(), by_id(first).result.output());
    // Changed parameters under the same key: refused, is_error, nothing executed.
    let refused = by_id(changed);
    assert!(refused.is_error, "{refused:?}");
    assert!(matches!(
        refused.result.error(),
        Some(CallError::ChangedParams { .. })
    ));
    assert_eq!(refused.result.attempts(), 0);
    assert!(!run.answer.is_empty());
}

#[tokio::test]
async fn openai_chat_transcript_charges_once() {
    let t = transcript("openai_chat.json");
    let charges = charge_ids(&t, "/choices/0/message/tool_calls", "id", "/function/name");
    let (billing, registry) = billing();
    let run = run_openai(&registry, &Scope::run("run-openai"), t)
        .await
        .unwrap();
    check(&run, &charges, &billing);
}

#[tokio::test]
async fn anthropic_transcript_charges_once() {
    let t = transcript("anthropic_messages.json");
    let charges = charge_ids(&t, "/content", "id", "/name");
    let (billing, registry) = billing();
    let run = run_anthropic(&registry, &Scope::run("run-anthropic"), t)
        .await
        .unwrap();
    check(&run, &charges, &billing);
}
