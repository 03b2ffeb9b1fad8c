//! `idem resolve --release` while a send of the record may still land is refused, saying
//! until when, and frees nothing: the record stays, no release is kept, nothing is logged
//! as released. `--force REASON` frees it, and the release trace keeps the reason.

use std::time::Duration;

use crate::support::{idem, stderr, unknown_record, RecordText, TempDb};
use idem_runtime::store::ReleaseNote;

/// Sent a minute ago: inside the 90 minutes the stock binary assumes.
fn recent(run: &str) -> RecordText {
    let mut text = RecordText::plain(run, "response lost");
    text.sent_ago = Duration::from_secs(60);
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_the_bound_is_refused_unless_forced() {
    let db = TempDb::new("idem-cli-release-bound").await;
    let url = db.url();
    let key = unknown_record(&*db.store, &recent("bound")).await;
    let before = db.store.get(&key).await.unwrap().unwrap();
    let sent = before.attempts[0].started_at;

    let out = idem()
        .args(["--store", &url, "resolve", key.as_str(), "--release"])
        .args(["--note", "not in the ledger", "--operator", "erin"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "released inside the bound");
    let err = stderr(&out);
    // The largest defaults: the send + 30 min timeout + twice a 30 min bound.
    let until = sent.plus(Duration::from_secs(90 * 60));
    assert!(
        err.contains(&format!("until {until}")) && err.contains("--force"),
        "{err}"
    );
    assert!(!err.contains("\"previous\""), "logged as released:\n{err}");
    assert_eq!(db.store.get(&key).await.unwrap(), Some(before.clone()));
    assert!(db.store.releases(&key).await.unwrap().is_empty());

    // A force with nothing said for it is refused before the store is touched.
    let out = idem()
        .args(["--store", &url, "resolve", key.as_str(), "--release"])
        .args(["--force", " ", "--note", "n", "--operator", "erin"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    assert_eq!(db.store.get(&key).await.unwrap(), Some(before.clone()));

    let reason = "the bank says request 77 never reached its ledger";
    let out = idem()
        .args(["--store", &url, "resolve", key.as_str(), "--release"])
        .args(["--force", reason, "--note", "not in the ledger"])
        .args(["--operator", "erin"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(db.store.get(&key).await.unwrap(), None, "released");
    let trace = db.store.releases(&key).await.unwrap();
    assert_eq!(trace.len(), 1, "{trace:?}");
    assert_eq!(trace[0].by, "erin");
    assert!(ReleaseNote::is_forced(&trace[0].note), "{}", trace[0].note);
    assert!(
        trace[0].note.contains(reason) && trace[0].note.contains("not in the ledger"),
        "{}",
        trace[0].note
    );
    assert_eq!(trace[0].record, before);
}
