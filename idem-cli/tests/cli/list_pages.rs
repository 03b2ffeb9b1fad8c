//! `idem list` pages with `--limit` and `--after`: a walk visits every record of a state once,
//! in the store's order, and says where the next page starts (in `--json` too).

use std::collections::HashSet;

use crate::support::{idem_at, stderr, stdout, unknown_record, RecordText, TempDb};
use idem_runtime::store::RecordState;
use serde_json::Value;

/// The cursor the human listing offers for the next page, if any.
fn next_after_human(out: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.split_once("--after ").map(|(_, c)| c.trim().to_owned()))
}

/// The keys of a human listing's rows.
fn keys_human(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("idem:"))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walk_by_pages_lists_every_record_once_in_order() {
    let db = TempDb::new("idem-cli-pages").await;
    for i in 0..5 {
        unknown_record(&*db.store, &RecordText::plain(&format!("run-{i}"), "lost")).await;
    }
    let expected: Vec<String> = db
        .store
        .list(RecordState::Unknown, 100)
        .await
        .unwrap()
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(expected.len(), 5);
    let url = db.url();

    // Human tables: pages of 2, 2, 1; the last one offers no next page.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = vec!["list", "--state", "unknown", "--limit", "2"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = idem_at(&url, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let keys = keys_human(&text);
        pages += 1;
        assert!(keys.len() <= 2, "a page holds at most --limit rows: {text}");
        seen.extend(keys);
        after = next_after_human(&text);
        if after.is_none() {
            break;
        }
        assert!(pages < 10, "the walk does not end");
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, expected, "every record once, in the store's order");

    // JSON: the same walk, the cursor in `next_after` (null on the last page).
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["--json", "list", "--state", "unknown", "--limit", "2"];
        if let Some(a) = &after {
            args.extend(["--after", a.as_str()]);
        }
        let out = idem_at(&url, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let page: Value = serde_json::from_slice(&out.stdout).unwrap();
        let records = page["records"].as_array().expect("records is an array");
        seen.extend(
            records
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_owned()),
        );
        match &page["next_after"] {
            Value::Null => break,
            Value::String(c) => after = Some(c.clone()),
            other => panic!("next_after is {other}"),
        }
        assert!(seen.len() <= 5, "the walk does not end");
    }
    assert_eq!(seen, expected);
    let distinct: HashSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), 5);

    // Exactly `limit` rows left: no next page is offered for an empty one.
    let all = idem_at(
        &url,
        &["--json", "list", "--state", "unknown", "--limit", "5"],
    );
    let page: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(page["records"].as_array().unwrap().len(), 5);
    assert_eq!(page["next_after"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_cursor_or_limit_is_a_clear_error() {
    let db = TempDb::new("idem-cli-bad-cursor").await;
    let url = db.url();
    for bad in ["yesterday", "12:not-a-key", "x:idem:00", ""] {
        let out = idem_at(&url, &["list", "--state", "unknown", "--after", bad]);
        assert_eq!(out.status.code(), Some(2), "--after {bad:?}: {out:?}");
        assert!(
            stderr(&out).contains("--after"),
            "--after {bad:?}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty());
    }
    let zero = idem_at(&url, &["list", "--state", "unknown", "--limit", "0"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(stderr(&zero).contains("--limit"), "{}", stderr(&zero));
}
