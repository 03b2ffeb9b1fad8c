//! The list on every store: the counts of escalated, unknown and pending records at the
//! top; records newest first, a page at a time, every record exactly once however the
//! pages fall; filtered by tool and by state; a bad filter is refused with a 400 page.

use idem_runtime::identity::IdemKey;
use idem_runtime::store::{ListCursor, Record, RecordState};
use serde_json::json;

use crate::support::Console;
use crate::support::{every_store, record, unique, Made, Session, Target, LONG_AGO};

/// The keys a page lists, in order, and the address of the next page.
fn listed(body: &str) -> (Vec<String>, Option<String>) {
    let keys = body
        .split("<a href=\"/records/")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().to_owned())
        .collect();
    let next = body
        .split("id=\"next-page\" href=\"")
        .nth(1)
        .map(|s| s.split('"').next().unwrap().replace("&amp;", "&"));
    (keys, next)
}

/// Every key of the list at `first`, following the next-page links.
async fn walk(session: &Session, first: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut next = Some(first.to_owned());
    while let Some(path) = next {
        let page = session.get(&path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        let (mut k, n) = listed(&page.body);
        assert!(k.len() <= 2, "{path}: a page holds at most its limit");
        keys.append(&mut k);
        next = n;
    }
    keys
}

fn count(body: &str, state: &str) -> usize {
    body.split(&format!("id=\"count-{state}\"><b>"))
        .nth(1)
        .and_then(|s| s.split('<').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no {state} count in {body}"))
}

async fn lists_on(target: &Target) {
    let name = target.name;
    let run = unique("console-list");
    let mut made: Vec<IdemKey> = Vec::new();
    for (i, (tool, state)) in [
        ("charge", RecordState::Escalated),
        ("refund", RecordState::Escalated),
        ("charge", RecordState::Escalated),
        ("charge", RecordState::Unknown),
        ("refund", RecordState::Unknown),
        ("refund", RecordState::Unknown),
    ]
    .into_iter()
    .enumerate()
    {
        made.push(
            record(
                &*target.store,
                Made {
                    tool,
                    run: &run,
                    args: json!({ "n": i }),
                    state,
                    message: "lost",
                    sent_ago: LONG_AGO,
                },
            )
            .await,
        );
    }
    let mut records: Vec<Record> = Vec::new();
    for k in &made {
        records.push(target.store.get(k).await.unwrap().unwrap());
    }
    records.sort_by(|a, b| ListCursor::cmp_records(b, a));
    let expected = |keep: &dyn Fn(&Record) -> bool| -> Vec<String> {
        records
            .iter()
            .filter(|r| keep(r))
            .map(|r| r.key.to_string())
            .collect()
    };
    let console = Console::start(&target.url, &target.options, &[]);
    let session = console.session().await;

    let top = session.get("/").await;
    assert_eq!(count(&top.body, "escalated"), 3, "{name}");
    assert_eq!(count(&top.body, "unknown"), 3, "{name}");
    assert_eq!(count(&top.body, "pending"), 0, "{name}");
    assert_eq!(
        listed(&top.body).0,
        expected(&|_| true),
        "{name}: newest first"
    );

    assert_eq!(
        walk(&session, "/?limit=2").await,
        expected(&|_| true),
        "{name}: pages"
    );
    assert_eq!(
        walk(&session, "/?limit=2&tool=refund").await,
        expected(&|r| &*r.tool == "refund"),
        "{name}: by tool"
    );
    assert_eq!(
        walk(&session, "/?limit=2&state=escalated").await,
        expected(&|r| r.state == RecordState::Escalated),
        "{name}: by state"
    );
    assert_eq!(
        walk(&session, "/?limit=2&state=unknown&tool=charge").await,
        expected(&|r| r.state == RecordState::Unknown && &*r.tool == "charge"),
        "{name}: by both"
    );

    for bad in [
        "/?state=running",
        "/?limit=0",
        "/?limit=many",
        "/?before=yesterday",
    ] {
        let r = session.get(bad).await;
        assert_eq!(r.status, 400, "{name} {bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_on_every_store() {
    for target in every_store("console-list").await {
        lists_on(&target).await;
    }
}
