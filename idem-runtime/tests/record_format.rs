//! Records written before attempts carried their kind still read, with the kind the
//! executor of that version meant (it wrote it only into the message).

use idem_runtime::store::{AttemptKind, AttemptRecord};
use serde_json::json;

fn legacy(message: Option<&str>) -> AttemptRecord {
    serde_json::from_value(json!({
        "attempt": 1, "started_at": 10, "finished_at": 20, "class": "unknown",
        "message": message,
    }))
    .expect("a record-format-1 attempt reads")
}

#[test]
fn legacy_attempts_get_their_kind_from_the_old_wording() {
    assert_eq!(
        legacy(Some("timed out after 30s")).kind,
        AttemptKind::TimedOut
    );
    assert_eq!(
        legacy(Some("handler panicked: boom")).kind,
        AttemptKind::Panicked
    );
    assert_eq!(
        legacy(Some("late result after timeout: completed")).kind,
        AttemptKind::Late
    );
    assert_eq!(legacy(Some("503 from billing")).kind, AttemptKind::Returned);
    assert_eq!(legacy(None).kind, AttemptKind::Returned);
}

#[test]
fn new_attempts_keep_their_kind_whatever_the_message_says() {
    let a: AttemptRecord = serde_json::from_value(json!({
        "attempt": 2, "started_at": 10, "finished_at": 20, "class": "unknown",
        "kind": "returned", "message": "timed out after 5s (the downstream said so)",
    }))
    .unwrap();
    assert_eq!(a.kind, AttemptKind::Returned);
    let round = serde_json::to_value(&a).unwrap();
    assert_eq!(round["kind"], "returned");
    assert_eq!(serde_json::from_value::<AttemptRecord>(round).unwrap(), a);
}
