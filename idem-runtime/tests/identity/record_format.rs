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

/// A release trace as stores write it (`IdemStore::release_unsettled`), pinned: who, when,
/// why, and a whole record. The record inside is an ordinary record, so one written before
/// `operation` and `read_backs` existed reads too.
#[test]
fn release_traces_read_and_hold_an_old_record() {
    use idem_runtime::store::{RecordState, ReleaseRecord};
    let r: ReleaseRecord = serde_json::from_value(json!({
        "at": 1_700_000_000_500u64, "by": "alice", "note": "not in the ledger",
        "record": {
            "key": format!("idem:{}", "ab".repeat(32)),
            "fingerprint": "cd".repeat(32),
            "tool": "refund", "state": "unknown", "token": 7,
            "lease_until": null, "created_at": 1_700_000_000_000u64,
            "updated_at": 1_700_000_000_100u64, "payload": null,
            "message": "timed out after 30s", "downstream_ref": null,
            "result_expired": false,
            "attempts": [{"attempt": 1, "started_at": 10, "finished_at": 20,
                          "class": "unknown", "message": "timed out after 30s"}],
        },
    }))
    .expect("a release trace reads");
    assert_eq!(
        (r.by.as_str(), r.at.as_millis()),
        ("alice", 1_700_000_000_500)
    );
    assert_eq!(r.record.state, RecordState::Unknown);
    assert_eq!(r.record.attempts[0].kind, AttemptKind::TimedOut);
    assert_eq!(r.record.operation, None);
    assert!(r.record.read_backs.is_empty());
}
