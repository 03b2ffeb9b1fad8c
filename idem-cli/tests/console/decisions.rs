//! The decisions, over HTTP, on every store: a POST without the CSRF token, with a wrong
//! one or from another origin is refused (403) and the raw record is unchanged; the
//! confirmation page changes nothing; bad answers are refused as `idem resolve` refuses
//! them; a confirmed completed or failed decision settles the record, signed with the
//! operator; a release inside the in-flight bound is refused unless forced with a reason,
//! and the forced one leaves its trace. The console's log holds no argument or output.

use std::time::Duration;

use idem_runtime::store::RecordState;
use serde_json::json;

use crate::support::{every_store, record, unique, Console, Made, Target, LONG_AGO, TOKEN};

async fn decisions_on(target: &Target) {
    let name = target.name;
    let store = &*target.store;
    let run = unique("console-decisions");
    let made = |order: &'static str, sent_ago: Duration| Made {
        tool: "charge",
        run: &run,
        args: json!({"order": order, "card": "arg-marker-5555"}),
        state: RecordState::Escalated,
        message: "gateway timeout after sending",
        sent_ago,
    };
    let done = record(store, made("o-done", LONG_AGO)).await;
    let failed = record(store, made("o-failed", LONG_AGO)).await;
    // Sent just now: a send may still land, so only a forced release frees it.
    let fresh = record(store, made("o-fresh", Duration::ZERO)).await;
    let console = Console::start(&target.url, &target.options, &[]);
    let session = console.session().await;
    let csrf = session.csrf(&done).await;
    let done_path = format!("/records/{done}");
    fn completed(csrf: &str) -> Vec<(&str, &str)> {
        vec![
            ("csrf", csrf),
            ("decision", "completed"),
            ("downstream_ref", "ch_77"),
            ("output", r#"{"id":"ch_77","output-marker":1}"#),
            ("operator", "ops-http"),
            ("note", "found in the dashboard"),
        ]
    }
    let csrf = csrf.as_str();
    let before = store.get(&done).await.unwrap();

    // Refused: no CSRF token, a wrong one, another origin; the record is as it was.
    let no_csrf: Vec<_> = completed(csrf).into_iter().skip(1).collect();
    for step in ["confirm", "resolve"] {
        let path = format!("{done_path}/{step}");
        let r = session.post(&path, &no_csrf).await;
        assert_eq!(r.status, 403, "{name} {step}: {}", r.body);
        let r = session.post(&path, &completed("0123abcd")).await;
        assert_eq!(r.status, 403, "{name} {step}");
        let r = session
            .post_with(
                &path,
                &[("Origin", "http://evil.example")],
                &completed(csrf),
            )
            .await;
        assert_eq!(r.status, 403, "{name} {step}");
        assert_eq!(store.get(&done).await.unwrap(), before, "{name} {step}");
    }

    // Bad answers: refused, unchanged.
    let mut no_operator = completed(csrf);
    no_operator[4].1 = "  ";
    let mut no_note = completed(csrf);
    no_note[5].1 = "";
    let mut bad_output = completed(csrf);
    bad_output[3].1 = "{not json";
    let mut no_ref = completed(csrf);
    no_ref[2].1 = " ";
    let mut no_decision = completed(csrf);
    no_decision[1].1 = "maybe";
    for bad in [&no_operator, &no_note, &bad_output, &no_ref, &no_decision] {
        for step in ["confirm", "resolve"] {
            let r = session.post(&format!("{done_path}/{step}"), bad).await;
            assert_eq!(r.status, 400, "{name} {step} {bad:?}: {}", r.body);
        }
    }
    assert_eq!(store.get(&done).await.unwrap(), before, "{name}");

    // The confirmation page says what will happen, and changes nothing.
    let r = session
        .post(&format!("{done_path}/confirm"), &completed(csrf))
        .await;
    assert_eq!(r.status, 200, "{name}");
    assert!(
        r.body.contains("ch_77") && r.body.contains("ops-http") && r.body.contains("/resolve"),
        "{name}: {}",
        r.body
    );
    assert_eq!(store.get(&done).await.unwrap(), before, "{name}");

    // Confirmed: settled, signed, shown.
    let r = session
        .post(&format!("{done_path}/resolve"), &completed(csrf))
        .await;
    assert_eq!(r.status, 303, "{name}: {}", r.body);
    assert_eq!(r.header("location"), Some(done_path.as_str()), "{name}");
    let settled = store.get(&done).await.unwrap().unwrap();
    assert_eq!(settled.state, RecordState::Completed, "{name}");
    assert_eq!(settled.downstream_ref.as_deref(), Some("ch_77"), "{name}");
    assert_eq!(
        settled.payload,
        Some(json!({"id": "ch_77", "output-marker": 1})),
        "{name}"
    );
    let message = settled.message.clone().unwrap_or_default();
    assert!(
        message.contains("found in the dashboard") && message.contains("by ops-http"),
        "{name}: {message}"
    );
    let page = session.get(&done_path).await;
    assert!(
        page.body.contains("completed") && page.body.contains("by ops-http"),
        "{name}: {}",
        page.body
    );
    assert!(!page.body.contains("decide-completed"), "{name}: no forms");
    // Settled for good: a second decision is refused, and changes nothing.
    let mut again = completed(csrf);
    again[2].1 = "ch_other";
    let r = session.post(&format!("{done_path}/resolve"), &again).await;
    assert_eq!(r.status, 409, "{name}");
    assert_eq!(store.get(&done).await.unwrap().unwrap(), settled, "{name}");

    // Failed.
    let r = session
        .post(
            &format!("/records/{failed}/resolve"),
            &[
                ("csrf", csrf),
                ("decision", "failed"),
                ("reason", "card declined"),
                ("operator", "ops-http"),
                ("note", "the bank says so"),
            ],
        )
        .await;
    assert_eq!(r.status, 303, "{name}: {}", r.body);
    let f = store.get(&failed).await.unwrap().unwrap();
    assert_eq!(f.state, RecordState::Failed, "{name}");
    assert!(
        f.message.as_deref().unwrap_or("").contains("by ops-http"),
        "{name}: {:?}",
        f.message
    );

    // A release inside the in-flight bound: refused, unchanged; forced with a reason: the
    // key is free and the store keeps the trace, which the page shows.
    let fresh_path = format!("/records/{fresh}");
    let release = |force| {
        vec![
            ("csrf", csrf),
            ("decision", "release"),
            ("force_reason", force),
            ("operator", "ops-http"),
            ("note", "never arrived"),
        ]
    };
    let fresh_before = store.get(&fresh).await.unwrap();
    let r = session
        .post(&format!("{fresh_path}/resolve"), &release(""))
        .await;
    assert_eq!(r.status, 409, "{name}: {}", r.body);
    assert!(
        r.body.contains("may still be committed"),
        "{name}: {}",
        r.body
    );
    assert_eq!(store.get(&fresh).await.unwrap(), fresh_before, "{name}");
    assert!(store.releases(&fresh).await.unwrap().is_empty(), "{name}");
    let r = session
        .post(
            &format!("{fresh_path}/resolve"),
            &release("the provider's log shows it was never accepted"),
        )
        .await;
    assert_eq!(r.status, 303, "{name}: {}", r.body);
    assert!(store.get(&fresh).await.unwrap().is_none(), "{name}");
    let traces = store.releases(&fresh).await.unwrap();
    assert_eq!(traces.len(), 1, "{name}");
    assert_eq!(traces[0].by, "ops-http", "{name}");
    let page = session.get(&fresh_path).await;
    assert_eq!(page.status, 200, "{name}");
    assert!(
        page.body.contains("key is free") && page.body.contains("ops-http"),
        "{name}: {}",
        page.body
    );

    // The log never held an argument, an output or the token.
    let log = console.log();
    assert!(
        !log.contains("arg-marker") && !log.contains("output-marker") && !log.contains(TOKEN),
        "{name}: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_on_every_store() {
    for target in every_store("console-decisions").await {
        decisions_on(&target).await;
    }
}
