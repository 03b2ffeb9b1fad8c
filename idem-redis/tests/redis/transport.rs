//! Transport security of the network stores: a URL that asks for TLS gets TLS or a clear
//! error, never a silent clear-text connection.
//!
//! Without the `tls` feature: `sslmode=require|verify-ca|verify-full` and `rediss://` are
//! refused before any connection, saying to enable `tls`. With it: `sslmode=require`
//! against a server without TLS fails instead of falling back, and `prefer` still connects.
//! The checks that need a server read `IDEM_POSTGRES_URL` (a server without TLS, as
//! `.ci/services.sh` starts it) and skip without it, except under
//! `IDEM_REQUIRE_BACKENDS=1`.

use idem_redis::RedisStore;
use idem_runtime::store::StoreError;

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_tls_rediss_is_refused_before_connecting() {
    for url in ["rediss://127.0.0.1:1/", "REDISS://:secret@127.0.0.1:1/0"] {
        match RedisStore::connect(url).await {
            Err(StoreError::Backend(msg)) => {
                assert!(msg.contains("`tls` feature"), "{url}: {msg}");
                assert!(!msg.contains("secret"), "the password is not echoed: {msg}");
            }
            other => panic!("{url} without TLS must be refused, got {other:?}"),
        }
    }
}

/// With `tls`, a `rediss://` URL is taken (not refused as unsupported): against a
/// closed port it is only unreachable.
#[cfg(feature = "tls")]
#[tokio::test]
async fn with_tls_rediss_is_accepted() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let r = RedisStore::builder(format!("rediss://127.0.0.1:{port}/"))
        .connection_timeout(std::time::Duration::from_millis(500))
        .reconnect_retries(0)
        .connect()
        .await;
    match r {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("rediss:// to a closed port must be Unavailable, got {other:?}"),
    }
}
