//! `idem resolve` keeps a person's decision reviewable: a note is required, the record says
//! who decided and when, and a release (which frees the key) leaves a trace in the store,
//! with the whole previous record, that `idem show` prints; it also writes that record out
//! as one JSON line first.

use crate::support::{idem, stderr, stdout, unknown_record, RecordText, TempDb};
use idem_runtime::{
    identity::IdemKey,
    store::{Clock, IdemStore, Record, RecordState, SystemClock},
};
use serde_json::Value;

/// Command-line arguments, or environment variables as (name, value).
type Args<'a> = &'a [&'a str];
type Env<'a> = &'a [(&'a str, &'a str)];

async fn record(store: &dyn IdemStore, key: &IdemKey) -> Option<Record> {
    store.get(key).await.unwrap()
}

/// The `at <time>` of a `(by NAME at TIME)` in `message`, checked to lie between `before`
/// and the record's last change.
fn assert_signed(message: &str, by: &str, before: &str, rec: &Record) {
    let marker = format!("(by {by} at ");
    let start = message
        .find(&marker)
        .unwrap_or_else(|| panic!("{message:?} does not say `{marker}`"))
        + marker.len();
    let at = &message[start..start + before.len()];
    // RFC 3339 in UTC at fixed width orders like the times it names.
    assert!(
        before <= at && at <= rec.updated_at.to_string().as_str(),
        "{at} is not between {before} and {}",
        rec.updated_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_needs_a_note_and_a_name() {
    let db = TempDb::new("idem-cli-note").await;
    let url = db.url();
    let key = unknown_record(&*db.store, &RecordText::plain("note", "lost")).await;
    let before = record(&*db.store, &key).await.unwrap();

    let cases: [(Args, Env, &str); 4] = [
        (&["--completed", "ch_1"], &[("USER", "carol")], "--note"),
        (
            &["--completed", "ch_1", "--note", "  "],
            &[("USER", "carol")],
            "--note",
        ),
        (&["--release"], &[("USER", "carol")], "--note"),
        (
            &["--failed", "declined", "--note", "seen"],
            &[],
            "--operator",
        ),
    ];
    for (args, env, says) in cases {
        let out = idem()
            .envs(env.iter().copied())
            .args(["--store", &url, "resolve", key.as_str()])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert_eq!(
            record(&*db.store, &key).await.as_ref(),
            Some(&before),
            "{args:?} changed the record"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_says_who_decided_and_when() {
    let db = TempDb::new("idem-cli-who").await;
    let url = db.url();
    // --operator beats IDEM_OPERATOR beats USER.
    let cases: [(&str, Args, Env); 3] = [
        (
            "alice",
            &["--operator", "alice"],
            &[("IDEM_OPERATOR", "bob"), ("USER", "carol")],
        ),
        ("bob", &[], &[("IDEM_OPERATOR", "bob"), ("USER", "carol")]),
        ("carol", &[], &[("USER", "carol")]),
    ];
    for (i, (who, args, env)) in cases.into_iter().enumerate() {
        let key = unknown_record(&*db.store, &RecordText::plain(&format!("who-{i}"), "lost")).await;
        let before = SystemClock.now().to_string();
        let out = idem()
            .envs(env.iter().copied())
            .args([
                "--store",
                &url,
                "resolve",
                key.as_str(),
                "--completed",
                "ch_9",
            ])
            .args(["--note", "seen in the dashboard"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{who}: {}", stderr(&out));
        let rec = record(&*db.store, &key).await.unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        let message = rec.message.clone().unwrap();
        assert!(message.contains("seen in the dashboard"), "{message}");
        assert_signed(&message, who, &before, &rec);
    }

    // A failure keeps the reason, the note and the name.
    let key = unknown_record(&*db.store, &RecordText::plain("who-failed", "lost")).await;
    let before = SystemClock.now().to_string();
    let out = idem()
        .args(["--store", &url, "resolve", key.as_str()])
        .args(["--failed", "card declined", "--note", "bank says no"])
        .args(["--operator", "dora"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = record(&*db.store, &key).await.unwrap();
    assert_eq!(rec.state, RecordState::Failed);
    let message = rec.message.clone().unwrap();
    assert!(message.contains("card declined") && message.contains("bank says no"));
    assert_signed(&message, "dora", &before, &rec);
}

/// The JSON line of the release evidence on stderr, and the record in it. (The record is
/// read as a `Record`, not a `Value`: its claim token is a 128-bit number.)
fn evidence_line(err: &str) -> (Value, Record) {
    err.lines()
        .find_map(|l| {
            let v = serde_json::from_str::<Value>(l).ok()?;
            v.get("previous")?;
            let previous: Previous = serde_json::from_str(l).unwrap();
            Some((v, previous.previous))
        })
        .unwrap_or_else(|| panic!("no release evidence on stderr:\n{err}"))
}

#[derive(serde::Deserialize)]
struct Previous {
    previous: Record,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_first_writes_out_the_whole_previous_record() {
    let db = TempDb::new("idem-cli-release").await;
    let url = db.url();
    for json in [false, true] {
        let mut text = RecordText::plain(&format!("release-{json}"), "lost");
        text.read_back = Some("not found".into());
        let key = unknown_record(&*db.store, &text).await;
        let previous = record(&*db.store, &key).await.unwrap();
        let before = SystemClock.now().to_string();

        let mut cmd = idem();
        cmd.args(["--store", &url]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .args(["resolve", key.as_str(), "--release"])
            .args(["--note", "not in the ledger", "--operator", "erin"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(record(&*db.store, &key).await, None, "released");

        let (ev, was) = evidence_line(&stderr(&out));
        assert_eq!(was, previous, "the whole record, as it was");
        assert_eq!(ev["key"], key.as_str());
        assert_eq!(ev["operator"], "erin");
        assert_eq!(ev["note"], "not in the ledger");
        let at = ev["at"].as_str().unwrap();
        assert!(before.as_str() <= at, "{at} before {before}");
        if json {
            let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(printed["released"], true);
            let was: Previous = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(was.previous, previous);
            assert_eq!(printed["operator"], "erin");
        } else {
            assert!(stdout(&out).contains("released"), "{}", stdout(&out));
        }

        // The store keeps the release: who, why, and the record exactly as it was.
        let trace = db.store.releases(&key).await.unwrap();
        assert_eq!(trace.len(), 1, "{trace:?}");
        assert_eq!(
            (trace[0].by.as_str(), trace[0].note.as_str()),
            ("erin", "not in the ledger")
        );
        assert_eq!(trace[0].record, previous);
        assert!(before.as_str() <= trace[0].at.to_string().as_str());

        // `idem show` prints it, although the key has no record now.
        let shown = idem()
            .args(["--store", &url, "show", key.as_str()])
            .output()
            .unwrap();
        assert!(shown.status.success(), "{}", stderr(&shown));
        let text = stdout(&shown);
        assert!(
            text.contains("no record: released") && text.contains("by erin: not in the ledger"),
            "{text}"
        );
        let shown = idem()
            .args(["--store", &url, "--json", "show", key.as_str()])
            .output()
            .unwrap();
        assert!(shown.status.success(), "{}", stderr(&shown));
        let v: Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(v["free"], true);
        assert_eq!(v["key"], key.as_str());
        assert_eq!(v["releases"][0]["by"], "erin");
        assert_eq!(v["releases"][0]["record"]["state"], "unknown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_keys_are_listed_page_by_page() {
    let db = TempDb::new("idem-cli-released").await;
    let url = db.url();
    let mut keys = Vec::new();
    for name in ["listed-1", "listed-2"] {
        let key = unknown_record(&*db.store, &RecordText::plain(name, "lost")).await;
        let out = idem()
            .args(["--store", &url, "resolve", key.as_str(), "--release"])
            .args([
                "--note",
                &format!("{name} not in the ledger"),
                "--operator",
                "finn",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        keys.push(key);
    }

    let out = idem()
        .args(["--store", &url, "list", "--released"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    for (key, name) in keys.iter().zip(["listed-1", "listed-2"]) {
        let line = table
            .lines()
            .find(|l| l.contains(key.as_str()))
            .unwrap_or_else(|| panic!("{key} not listed:\n{table}"));
        assert!(
            line.contains("finn") && line.contains("unknown") && line.contains(name),
            "{line}"
        );
    }

    // One a page: the first page says where the next starts, and the two pages hold both.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..3 {
        let mut cmd = idem();
        cmd.args([
            "--store",
            &url,
            "--json",
            "list",
            "--released",
            "--limit",
            "1",
        ]);
        if let Some(a) = &after {
            cmd.args(["--after", a]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let page: Value = serde_json::from_slice(&out.stdout).unwrap();
        for r in page["releases"].as_array().unwrap() {
            seen.push(r["record"]["key"].as_str().unwrap().to_owned());
            assert_eq!(r["by"], "finn");
        }
        match page["next_after"].as_str() {
            Some(a) => after = Some(a.to_owned()),
            None => break,
        }
    }
    seen.sort();
    let mut want: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
    want.sort();
    assert_eq!(seen, want);

    // A listing names one thing to list.
    let out = idem().args(["--store", &url, "list"]).output().unwrap();
    assert!(!out.status.success());
    let out = idem()
        .args(["--store", &url, "list", "--released", "--state", "unknown"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
