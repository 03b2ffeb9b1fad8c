//! A real TLS handshake with PostgreSQL under the `tls` feature, against the TLS-only
//! cluster `.ci/services.sh` starts: `IDEM_POSTGRES_TLS_URL` (a server that rejects clear
//! text in `pg_hba.conf`), `IDEM_POSTGRES_TLS_CA` (the CA that signed its certificate, for
//! 127.0.0.1) and `IDEM_POSTGRES_TLS_OTHER_CA` (a CA that did not).
//!
//! What is checked on the server, not on what the client says: `pg_stat_ssl` reports the
//! store's own pooled connections as TLS. Without those variables each test prints why it
//! skips, and fails under `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(feature = "tls")]

use std::time::Duration;

use idem_postgres::PostgresStore;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, StoreError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The TLS server's URL and CA files, or `None` after saying why (a failure under
/// `IDEM_REQUIRE_BACKENDS=1`).
struct Tls {
    url: String,
    ca: String,
    other_ca: String,
}

fn tls(check: &str) -> Option<Tls> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    match (
        var("IDEM_POSTGRES_TLS_URL"),
        var("IDEM_POSTGRES_TLS_CA"),
        var("IDEM_POSTGRES_TLS_OTHER_CA"),
    ) {
        (Some(url), Some(ca), Some(other_ca)) => Some(Tls { url, ca, other_ca }),
        _ => {
            conformance::skip(
                check,
                "IDEM_POSTGRES_TLS_URL, IDEM_POSTGRES_TLS_CA and IDEM_POSTGRES_TLS_OTHER_CA are \
                 not all set (`source .ci/services.sh && idem_services_start` starts a TLS-only \
                 PostgreSQL and sets them)",
            );
            None
        }
    }
}

/// A client configuration that trusts exactly the CA in `ca_file`.
fn trusting(ca_file: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).expect("read the CA file") {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a CA certificate rustls accepts");
    }
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// `url` with `sslmode` set.
fn with_sslmode(url: &str, mode: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode={mode}")
}

async fn connect(url: &str, ca_file: &str) -> Result<PostgresStore, StoreError> {
    PostgresStore::builder(url)
        .schema(format!("idem_tls_{}", std::process::id()))
        .tls_config(trusting(ca_file))
        .connect()
        .await
}

/// True when the server says the connection it serves this query on is TLS.
async fn server_says_tls(store: &PostgresStore) -> bool {
    let client = store.pool().get().await.expect("a pooled connection");
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0)
}

/// The store works end to end over the connection: a claim is granted and read back.
async fn claims_over(store: &PostgresStore, name: &str) {
    let req = ClaimRequest {
        key: conformance::key(name),
        fingerprint: conformance::fingerprint(name),
        tool: "tls".into(),
        lease: Duration::from_secs(10),
        operation: None,
    };
    match store.claim(&req).await {
        Ok(ClaimOutcome::Claimed(_)) | Ok(ClaimOutcome::Existing(_)) => {}
        other => panic!("a claim over TLS: {other:?}"),
    }
    assert!(store.get(&req.key).await.expect("get").is_some());
}

/// The error's text, with its kind, lowercased for matching.
fn text(e: &StoreError) -> String {
    format!("{e:?} {e}").to_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_connects_over_tls() {
    let Some(t) = tls("sslmode_require_connects_over_tls") else {
        return;
    };
    let store = connect(&with_sslmode(&t.url, "require"), &t.ca)
        .await
        .unwrap_or_else(|e| panic!("sslmode=require with the server's CA must connect: {e}"));
    claims_over(&store, "tls-require").await;
    assert!(
        server_says_tls(&store).await,
        "pg_stat_ssl must report the store's connection as TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_the_right_ca_connects() {
    let Some(t) = tls("verify_full_with_the_right_ca_connects") else {
        return;
    };
    let store = connect(&with_sslmode(&t.url, "verify-full"), &t.ca)
        .await
        .unwrap_or_else(|e| panic!("sslmode=verify-full with the server's CA must connect: {e}"));
    claims_over(&store, "tls-verify-full").await;
    assert!(server_says_tls(&store).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_a_wrong_ca_is_refused() {
    let Some(t) = tls("verify_full_with_a_wrong_ca_is_refused") else {
        return;
    };
    for mode in ["verify-full", "require"] {
        let e = connect(&with_sslmode(&t.url, mode), &t.other_ca)
            .await
            .expect_err("a server whose certificate no trusted CA signed must be refused");
        assert!(
            text(&e).contains("certificate") && text(&e).contains("unknownissuer"),
            "sslmode={mode}: the error must say the certificate is not trusted: {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_with_a_wrong_host_name_is_refused() {
    let Some(t) = tls("verify_full_with_a_wrong_host_name_is_refused") else {
        return;
    };
    // `hostaddr` keeps the connection on 127.0.0.1 while the name checked against the
    // certificate (issued for the address 127.0.0.1 alone) is another one.
    let url = with_sslmode(&t.url, "verify-full").replace("@127.0.0.1:", "@idem.invalid:");
    let url = format!("{url}&hostaddr=127.0.0.1");
    let e = connect(&url, &t.ca)
        .await
        .expect_err("a certificate for another name must be refused");
    assert!(
        text(&e).contains("certificate not valid for name"),
        "the error must say the certificate is not valid for the name: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_text_is_refused_by_a_server_that_requires_tls() {
    let Some(t) = tls("clear_text_is_refused_by_a_server_that_requires_tls") else {
        return;
    };
    let e = connect(&with_sslmode(&t.url, "disable"), &t.ca)
        .await
        .expect_err("a clear-text connection to a TLS-only server must be refused");
    assert!(
        text(&e).contains("pg_hba.conf") && text(&e).contains("no encryption"),
        "the server's refusal must come through: {e}"
    );
}

/// The PEM bytes of the file an environment variable names, or `None` after skipping.
fn pem_of(var: &str, check: &str) -> Option<Vec<u8>> {
    let path = conformance::backend_url(var, check)?;
    Some(std::fs::read(&path).unwrap_or_else(|e| panic!("{var}={path}: {e}")))
}

/// The short form: the private CA's PEM through `tls_root_certificates`, no rustls types in
/// the caller's code. The right CA gets through (the server reports TLS); another is
/// refused as untrusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_certificates_as_pem_verify_the_server() {
    let check = "root_certificates_as_pem_verify_the_server";
    let Some(t) = tls(check) else {
        return;
    };
    let (Some(ca), Some(other_ca)) = (
        pem_of("IDEM_POSTGRES_TLS_CA", check),
        pem_of("IDEM_POSTGRES_TLS_OTHER_CA", check),
    ) else {
        return;
    };
    let url = with_sslmode(&t.url, "verify-full");
    let schema = format!("idem_tls_pem_{}", std::process::id());
    let store = PostgresStore::builder(url.as_str())
        .schema(schema.as_str())
        .tls_root_certificates(ca)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the server's CA as PEM must connect: {e}"));
    claims_over(&store, "tls-pem").await;
    assert!(server_says_tls(&store).await);
    let e = PostgresStore::builder(url.as_str())
        .schema(schema.as_str())
        .tls_root_certificates(other_ca)
        .connect()
        .await
        .expect_err("another CA must be refused");
    assert!(text(&e).contains("unknownissuer"), "{e}");
}

/// A database that wants a client certificate (`clientcert=verify-ca`): refused without
/// one, served with the one the CA signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_when_given() {
    let check = "a_client_certificate_is_presented_when_given";
    let Some(url) = conformance::backend_url("IDEM_POSTGRES_TLS_MTLS_URL", check) else {
        return;
    };
    let (Some(ca), Some(cert), Some(key)) = (
        pem_of("IDEM_POSTGRES_TLS_CA", check),
        pem_of("IDEM_POSTGRES_TLS_CLIENT_CERT", check),
        pem_of("IDEM_POSTGRES_TLS_CLIENT_KEY", check),
    ) else {
        return;
    };
    let url = with_sslmode(&url, "verify-full");
    let schema = format!("idem_mtls_{}", std::process::id());
    let e = PostgresStore::builder(url.as_str())
        .schema(schema.as_str())
        .tls_root_certificates(ca.clone())
        .connect()
        .await
        .expect_err("without a client certificate the server must refuse");
    assert!(text(&e).contains("certificate"), "{e}");
    let store = PostgresStore::builder(url.as_str())
        .schema(schema.as_str())
        .tls_root_certificates(ca)
        .tls_client_certificate(cert, key)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("with the client certificate the server must serve: {e}"));
    claims_over(&store, "tls-mtls").await;
    assert!(server_says_tls(&store).await);
}

/// Certificates the connection might not use are refused before connecting: a URL that
/// does not require TLS (`prefer` falls back to clear text), and certificates beside a
/// whole `tls_config`.
#[tokio::test]
async fn certificates_that_could_go_unused_are_refused() {
    let pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
    // Port 9 on loopback: nothing is reached, the refusal comes first.
    for url in [
        "postgres://idem@127.0.0.1:9/db",
        "postgres://idem@127.0.0.1:9/db?sslmode=prefer",
        "postgres://idem@127.0.0.1:9/db?sslmode=disable",
    ] {
        match PostgresStore::builder(url)
            .tls_root_certificates(pem.clone())
            .connect()
            .await
        {
            Err(StoreError::Backend(msg)) => assert!(msg.contains("sslmode"), "{url}: {msg}"),
            other => panic!("{url}: certificates without required TLS: {other:?}"),
        }
    }
    let both = PostgresStore::builder("postgres://idem@127.0.0.1:9/db?sslmode=require")
        .tls_config(
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
        .tls_root_certificates(pem)
        .connect()
        .await;
    match both {
        Err(StoreError::Backend(msg)) => assert!(msg.contains("tls_config"), "{msg}"),
        other => panic!("tls_config and certificates together: {other:?}"),
    }
}
