//! The JSON-lines escalation sink: off the runtime's workers, owner-only, no symlinks.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use idem_runtime::store::backend::ClaimRequest;
use idem_runtime::store::{IdemStore, Timestamp};
use idem_runtime::{
    escalation::{Escalation, EscalationSink, JsonLinesSink},
    identity::{IdemKey, Scope},
    store::MemoryStore,
};

async fn an_escalation() -> Escalation {
    let store = MemoryStore::new();
    let key = IdemKey::derive(
        &Scope::run("r"),
        "charge",
        idem_runtime::identity::KeyMaterial::Intent("i-1"),
    );
    let req = ClaimRequest {
        key: key.clone(),
        fingerprint: idem_runtime::identity::Fingerprint::of_canonical(b"{}"),
        tool: "charge".into(),
        lease: Duration::from_secs(30),
        operation: None,
    };
    store.claim(&req).await.expect("claim");
    let record = store.get(&key).await.expect("get").expect("record");
    Escalation::from_record(&record, "a person must look", Timestamp(1))
}

/// A FIFO with no reader blocks `open` until one comes. Delivered on the only worker of a
/// current-thread runtime, a blocking open would stall the runtime, and the task that opens
/// the reader (on the same runtime) would never run: the delivery must happen elsewhere.
#[test]
fn a_blocked_file_does_not_stall_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("escalations.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let fifo_for_runtime = fifo.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(async move {
            let escalation = an_escalation().await;
            let sink = JsonLinesSink::new(&fifo_for_runtime);
            let reader_path = fifo_for_runtime.clone();
            // Runs on this runtime's only thread: only if `deliver` yields it.
            let reader = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                tokio::task::spawn_blocking(move || std::fs::read(reader_path))
                    .await
                    .unwrap()
            });
            // The line is written; syncing a FIFO then fails (EINVAL), which is fine here.
            let _ = sink.deliver(&escalation).await;
            reader.await.unwrap()
        });
        let _ = done_tx.send(result);
    });
    let read = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the delivery blocked the runtime: the reader never got to open the FIFO")
        .expect("read the FIFO");
    let text = String::from_utf8(read).unwrap();
    assert!(text.contains("a person must look"), "{text:?}");
}

#[tokio::test]
async fn the_file_is_owner_only_and_holds_one_line_per_escalation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("escalations.jsonl");
    let sink = JsonLinesSink::new(&path);
    let escalation = an_escalation().await;
    sink.deliver(&escalation).await.unwrap();
    sink.deliver(&escalation).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "escalations hold arguments: owner-only, got {mode:o}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Escalation> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, vec![escalation.clone(), escalation]);
}

#[tokio::test]
async fn an_existing_file_open_to_others_is_made_owner_only_before_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("escalations.jsonl");
    std::fs::write(&path, "").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    let sink = JsonLinesSink::new(&path);
    let escalation = an_escalation().await;
    sink.deliver(&escalation).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "group/other bits must be cleared, got {mode:o}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let line: Escalation = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(line, escalation);
}

#[tokio::test]
async fn a_symbolic_link_is_refused_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("precious.txt");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.path().join("escalations.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let sink = JsonLinesSink::new(&link);
    let result = sink.deliver(&an_escalation().await).await;
    assert!(
        result.is_err(),
        "a symlinked escalation file must be refused"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
}
