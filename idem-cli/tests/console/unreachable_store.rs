//! A store the console cannot reach: every page that needs it is a 503 saying the store is
//! unreachable, the console keeps running, and it opens the store on the next request once
//! it can. Without the token, the answer is still 401: nothing is asked of the store.

use crate::support::{request, unique, Console};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_stores_get_a_page_saying_so() {
    // Nothing listens on port 1 of loopback.
    for (url, options) in [
        ("redis://127.0.0.1:1/".to_owned(), vec![]),
        (
            "postgres://idem@127.0.0.1:1/idem".to_owned(),
            vec!["--schema".to_owned(), "idem".to_owned()],
        ),
    ] {
        let console = Console::start(&url, &options, &[]);
        let session = console.session().await;
        for _ in 0..2 {
            for path in [
                "/",
                "/records/idem:0000000000000000000000000000000000000000000000000000000000000000",
            ] {
                let r = session.get(path).await;
                assert_eq!(r.status, 503, "{url} {path}: {}", r.body);
                assert!(
                    r.body.contains("The store is unreachable"),
                    "{url}: {}",
                    r.body
                );
            }
        }
        let r = request(console.addr, "GET", "/", &[], None).await;
        assert_eq!(r.status, 401, "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_comes_up_later_is_opened_on_the_next_request() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("console-later")));
    let url = format!("sqlite://{}", path.display());
    let console = Console::start(&url, &[], &[]);
    let session = console.session().await;
    let r = session.get("/").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(console.log().contains("unreachable"), "{}", console.log());

    let store = idem_sqlite::SqliteStore::builder(&path)
        .open()
        .await
        .unwrap();
    let r = session.get("/").await;
    assert_eq!(r.status, 200, "{}", r.body);
    drop(store);
    drop(console);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(std::path::PathBuf::from(p));
    }
}
