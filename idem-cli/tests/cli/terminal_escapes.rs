//! What a record holds came from a model, a downstream or a stuck dependency: the CLI shows
//! it with control characters escaped, so a message cannot move the cursor, clear the screen,
//! retitle the window or reorder text on the operator's terminal. `--json` stays exact JSON.

use crate::support::{idem_at, stderr, stdout, unknown_record, RecordText, TempDb};
use idem_runtime::store::Record;
use serde_json::{json, Value};

/// Characters a terminal acts on or that reorder what is shown: C0 (but the newlines
/// between lines), DEL, C1, and the bidirectional overrides, embeddings, isolates and marks.
fn is_dangerous(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{2028}' | '\u{2029}')
}

fn assert_inert(what: &str, out: &std::process::Output) {
    for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = String::from_utf8(bytes.clone()).expect("UTF-8 output");
        let bad: Vec<char> = text.chars().filter(|c| is_dangerous(*c)).collect();
        assert!(bad.is_empty(), "{what}: {name} holds {bad:?}:\n{text:?}");
    }
}

fn hostile() -> RecordText {
    RecordText {
        tool: "evil\u{1b}[2Jtool".into(),
        run: "run\r\u{202E}".into(),
        tenant: Some("tenant\u{7}".into()),
        intent: Some("intent\u{9B}31m".into()),
        args: json!({"s": "\u{1b}]0;pwned\u{7}", "b": "\u{2066}x\u{2069}", "c": "\u{85}\u{7f}"}),
        message: "\u{1b}[31mred\ngone\r\u{202E}evil\u{85}".into(),
        attempt_message: "attempt\u{1b}[1A\u{8}\u{8}".into(),
        read_back: Some("read-back\u{1b}[K\u{200F}\u{2028}".into()),
        sent_ago: crate::support::LONG_AGO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_is_shown_escaped_and_json_stays_exact() {
    let db = TempDb::new("idem-cli-escapes").await;
    let url = db.url();
    let text = hostile();
    let key = unknown_record(&*db.store, &text).await;
    let stored: Record = db.store.get(&key).await.unwrap().unwrap();

    let list = idem_at(&url, &["list", "--state", "unknown"]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert_inert("list", &list);
    // One row: the message's newline did not start a second one.
    let listed = stdout(&list);
    let rows: Vec<&str> = listed.lines().filter(|l| l.starts_with("idem:")).collect();
    assert_eq!(rows.len(), 1, "{listed}");
    assert!(
        rows[0].contains("red") && rows[0].contains("evil"),
        "{}",
        rows[0]
    );

    let show = idem_at(&url, &["show", key.as_str()]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert_inert("show", &show);
    let shown = stdout(&show);
    // Escaped, not dropped: the operator still sees that something was there.
    let reason = shown.lines().find(|l| l.starts_with("reason")).unwrap();
    assert!(
        reason.contains("red") && reason.contains("evil"),
        "{reason}"
    );
    assert!(shown.contains("\\u{1b}"), "{shown}");
    for field in ["attempt", "read-back", "pwned", "tenant", "intent", "run"] {
        assert!(shown.contains(field), "{field} missing:\n{shown}");
    }

    // The stock binary skips the record; the decision names the hostile tool.
    let reconcile = idem_at(&url, &["reconcile"]);
    assert!(reconcile.status.success(), "{}", stderr(&reconcile));
    assert_inert("reconcile", &reconcile);
    assert!(
        stdout(&reconcile).contains("evil"),
        "{}",
        stdout(&reconcile)
    );

    // A person's resolution shows the record afterwards; the note is hostile too.
    let resolved = idem_at(
        &url,
        &[
            "resolve",
            key.as_str(),
            "--failed",
            "declined\u{1b}[8m",
            "--note",
            "\u{202E}looks fine",
            "--operator",
            "ops",
        ],
    );
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    assert_inert("resolve", &resolved);

    // JSON: the very values stored, with no raw control character in the bytes.
    let key2 = unknown_record(&*db.store, &{
        let mut t = hostile();
        t.run = "second\u{1b}[2J".into();
        t
    })
    .await;
    let stored2: Record = db.store.get(&key2).await.unwrap().unwrap();
    let show = idem_at(&url, &["--json", "show", key2.as_str()]);
    assert_inert("--json show", &show);
    // Read back as a `Record`: its claim token is a 128-bit number a `Value` cannot hold.
    let shown: Record = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown, stored2);
    assert_eq!(shown.message.as_deref(), Some(text.message.as_str()));

    let list = idem_at(&url, &["--json", "list", "--state", "unknown"]);
    assert_inert("--json list", &list);
    #[derive(serde::Deserialize)]
    struct Page {
        records: Vec<Record>,
    }
    let page: Page = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(
        page.records,
        vec![stored2],
        "the first record was resolved; the second is listed exactly"
    );

    let reconcile = idem_at(&url, &["--json", "reconcile"]);
    assert_inert("--json reconcile", &reconcile);
    let v: Value = serde_json::from_slice(&reconcile.stdout).unwrap();
    assert_eq!(v[0]["tool"], &*stored.tool);
}
