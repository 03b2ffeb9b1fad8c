//! What a record holds reaches the page as text, never as markup: arguments, reasons and
//! attempt messages come from a model or a downstream, and a `<script>` in one of them is
//! shown escaped on the list and on the record's page.

use idem_runtime::store::RecordState;
use serde_json::json;

use crate::support::{every_store, record, unique, Console, Made, LONG_AGO};

/// What a browser shows of `html`'s character references.
fn text(html: &str) -> String {
    let mut out = html.to_owned();
    for (entity, c) in [
        ("&#60;", "<"),
        ("&lt;", "<"),
        ("&#62;", ">"),
        ("&gt;", ">"),
        ("&#34;", "\""),
        ("&quot;", "\""),
        ("&#39;", "'"),
        ("&#38;", "&"),
        ("&amp;", "&"),
    ] {
        out = out.replace(entity, c);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_text_is_escaped() {
    for target in every_store("console-escape").await {
        let name = target.name;
        let run = unique("console-escape");
        let key = record(
            &*target.store,
            Made {
                tool: "charge",
                run: &run,
                args: json!({"memo": "<script>alert('args')</script>"}),
                state: RecordState::Escalated,
                message: "<img src=x onerror=alert(1)> \"quoted\"",
                sent_ago: LONG_AGO,
            },
        )
        .await;
        let console = Console::start(&target.url, &target.options, &[]);
        let session = console.session().await;
        for path in ["/".to_owned(), format!("/records/{key}")] {
            let page = session.get(&path).await;
            assert_eq!(page.status, 200, "{name} {path}");
            assert!(
                !page.body.contains("<script") && !page.body.contains("<img"),
                "{name} {path}: {}",
                page.body
            );
            assert!(
                text(&page.body).contains("<img src=x onerror=alert(1)> \"quoted\""),
                "{name} {path}: shown as text: {}",
                page.body
            );
        }
        let page = session.get(&format!("/records/{key}")).await;
        assert!(
            text(&page.body).contains("<script>alert('args')</script>"),
            "{name}: shown as text: {}",
            page.body
        );
    }
}
