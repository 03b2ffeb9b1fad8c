//! Transport security of the network stores: a URL that asks for TLS gets TLS or a clear
//! error, never a silent clear-text connection.
//!
//! Without the `tls` feature: `sslmode=require|verify-ca|verify-full` and `rediss://` are
//! refused before any connection, saying to enable `tls`. With it: `sslmode=require`
//! against a server without TLS fails instead of falling back, and `prefer` still connects.
//! The checks that need a server read `IDEM_POSTGRES_URL` (a server without TLS, as
//! `.ci/services.sh` starts it) and skip without it, except under
//! `IDEM_REQUIRE_BACKENDS=1`.

use idem_postgres::PostgresStore;
use idem_runtime::store::StoreError;

fn server(var: &str) -> Option<String> {
    let url = std::env::var(var).ok().filter(|s| !s.trim().is_empty());
    if url.is_none() {
        assert!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() != Ok("1"),
            "IDEM_REQUIRE_BACKENDS=1, but {var} is not set"
        );
        eprintln!("skipping: {var} is not set");
    }
    url
}

/// `url` with `sslmode` set (replacing any the URL had).
#[allow(dead_code)]
fn with_sslmode(url: &str, mode: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode={mode}")
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_tls_a_url_requiring_tls_is_refused_before_connecting() {
    // A closed port: were the URL not refused first, this would be `Unavailable`.
    for mode in ["require", "verify-ca", "verify-full"] {
        let url = format!("postgres://idem@127.0.0.1:1/postgres?sslmode={mode}");
        match PostgresStore::builder(url).connect().await {
            Err(StoreError::Backend(msg)) => {
                assert!(msg.contains("`tls` feature"), "{mode}: {msg}");
            }
            other => panic!("sslmode={mode} without TLS must be refused, got {other:?}"),
        }
    }
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn without_tls_prefer_and_disable_connect_in_clear_text() {
    let Some(url) = server("IDEM_POSTGRES_URL") else {
        return;
    };
    for mode in ["prefer", "disable"] {
        PostgresStore::builder(with_sslmode(&url, mode))
            .schema("idem_transport_test")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
    }
}

/// The local test server has no TLS: `require` (and the stricter modes, which mean
/// `require` with full verification) must fail rather than talk in clear text; `prefer`
/// falls back as libpq's does.
#[cfg(feature = "tls")]
#[tokio::test]
async fn with_tls_require_is_enforced_and_prefer_falls_back() {
    let Some(url) = server("IDEM_POSTGRES_URL") else {
        return;
    };
    for mode in ["require", "verify-ca", "verify-full"] {
        let r = PostgresStore::builder(with_sslmode(&url, mode))
            .schema("idem_transport_test")
            .connect()
            .await;
        match r {
            Err(StoreError::Unavailable(msg)) => {
                assert!(!msg.contains("`tls` feature"), "{mode}: {msg}");
            }
            other => {
                panic!("sslmode={mode} against a server without TLS must fail, got {other:?}")
            }
        }
    }
    let store = PostgresStore::builder(with_sslmode(&url, "prefer"))
        .schema("idem_transport_test")
        .connect()
        .await
        .expect("prefer falls back to clear text on a server without TLS");
    drop(store);
}
