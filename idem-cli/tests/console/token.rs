//! Every request needs the console's token: without it (or with a wrong one) the console
//! answers 401 and shows nothing of the store; `?token=` on the first visit sets an
//! `HttpOnly`, `SameSite=Strict` cookie and redirects to the same address without it;
//! `Authorization: Bearer` works too. The log holds method, path and status only.

use idem_runtime::store::RecordState;
use serde_json::json;

use crate::support::{record, request, sqlite, unique, Console, Made, LONG_AGO, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_needs_the_token() {
    let target = sqlite("console-token").await;
    let run = unique("console-token");
    let key = record(
        &*target.store,
        Made {
            tool: "charge",
            run: &run,
            args: json!({"card": "secret-card-4242"}),
            state: RecordState::Escalated,
            message: "gateway timeout",
            sent_ago: LONG_AGO,
        },
    )
    .await;
    let console = Console::start(&target.url, &target.options, &[]);
    let port = console.addr.port();
    assert!(
        console.url == format!("http://127.0.0.1:{port}/?token={TOKEN}"),
        "{}",
        console.url
    );
    let record_path = format!("/records/{key}");
    let before = target.store.get(&key).await.unwrap();

    // Nothing without the token, or with a wrong one.
    let bearer_wrong = format!("Bearer {TOKEN}x");
    let cookie_wrong = format!("idem_console_{port}={TOKEN}x");
    let cookie_other_port = format!("idem_console_{}={TOKEN}", port.wrapping_add(1));
    for (path, headers) in [
        ("/", vec![]),
        (record_path.as_str(), vec![]),
        (
            record_path.as_str(),
            vec![("Authorization", bearer_wrong.as_str())],
        ),
        (
            record_path.as_str(),
            vec![("Cookie", cookie_wrong.as_str())],
        ),
        (
            record_path.as_str(),
            vec![("Cookie", cookie_other_port.as_str())],
        ),
        ("/?token=wrong-token-0123456789", vec![]),
    ] {
        let r = request(console.addr, "GET", path, &headers, None).await;
        assert_eq!(r.status, 401, "{path} {headers:?}");
        assert!(r.header("set-cookie").is_none(), "{path}");
        assert!(
            !r.body.contains(key.as_str()) && !r.body.contains("secret-card"),
            "{path}: {}",
            r.body
        );
    }
    let r = request(
        console.addr,
        "POST",
        &format!("{record_path}/resolve"),
        &[],
        Some("decision=failed&reason=x&operator=o&note=n"),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(target.store.get(&key).await.unwrap(), before, "unchanged");

    // The first visit: a cookie, and the same address without the token.
    let r = request(
        console.addr,
        "GET",
        &format!("/?state=escalated&token={TOKEN}&tool=charge"),
        &[],
        None,
    )
    .await;
    assert_eq!(r.status, 303);
    assert_eq!(r.header("location"), Some("/?state=escalated&tool=charge"));
    let cookie = r.header("set-cookie").unwrap();
    assert!(
        cookie.starts_with(&format!("idem_console_{port}={TOKEN};"))
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().unwrap();
    let page = request(console.addr, "GET", "/", &[("Cookie", cookie)], None).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(key.as_str()), "{}", page.body);
    let bearer = format!("Bearer {TOKEN}");
    let page = request(
        console.addr,
        "GET",
        &record_path,
        &[("Authorization", &bearer)],
        None,
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("secret-card-4242"));

    // The log: one line per request, method, path and status; no token, no argument.
    let log = console.log();
    assert!(
        log.contains(&format!("idem console: GET {record_path} 401"))
            && log.contains(&format!("idem console: GET {record_path} 200"))
            && log.contains("idem console: GET / 303"),
        "{log}"
    );
    assert!(
        !log.contains(TOKEN) && !log.contains("secret-card") && !log.contains("state="),
        "{log}"
    );
}
