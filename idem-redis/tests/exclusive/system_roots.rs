//! A real TLS handshake with the `tls` feature: a `rediss://` store against a local
//! `redis-server` serving TLS with a certificate from a throw-away CA, trusted through
//! `SSL_CERT_FILE` (this test binary's own process: nothing else reads it).
//!
//! Needs `redis-server` built with TLS and the `openssl` command on `PATH`; without them it
//! prints why it skips (a missing `redis-server` fails under `IDEM_REQUIRE_BACKENDS=1`).
#![cfg(all(unix, feature = "tls"))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_redis::RedisStore;
use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, RecordState};

fn have(cmd: &str) -> bool {
    Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl {args:?} failed");
}

/// A CA, and a server certificate for 127.0.0.1 signed by it.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=idem test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            "server.pem",
            "-extfile",
            "ext.cnf",
        ],
    );
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_talks_tls_to_a_server_with_a_trusted_certificate() {
    if !have("redis-server") {
        assert!(
            std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() != Ok("1"),
            "IDEM_REQUIRE_BACKENDS=1, but redis-server is not on PATH"
        );
        eprintln!("skipping: redis-server is not on PATH");
        return;
    }
    if !have("openssl") {
        eprintln!("skipping: the openssl command is not on PATH (needed to make certificates)");
        return;
    }
    let dir = idem_test::stores::TempDir::new("redis_roots");
    certificates(dir.path());
    let port = free_port();
    let p = |f: &str| dir.path().join(f).display().to_string();
    let server = Server(
        Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-port", &port.to_string()])
            .args([
                "--tls-cert-file",
                &p("server.pem"),
                "--tls-key-file",
                &p("server.key"),
            ])
            .args([
                "--tls-ca-cert-file",
                &p("ca.pem"),
                "--tls-auth-clients",
                "no",
            ])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    // The store reads the system's roots, which rustls-native-certs takes from here.
    std::env::set_var("SSL_CERT_FILE", p("ca.pem"));
    let url = format!("rediss://127.0.0.1:{port}/");
    let mut store = None;
    for _ in 0..100 {
        match RedisStore::builder(url.as_str())
            .reconnect_retries(0)
            .connect()
            .await
        {
            Ok(s) => {
                store = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let store = store.unwrap_or_else(|| panic!("no TLS connection to {url}"));
    let req = ClaimRequest {
        key: conformance::key("tls"),
        fingerprint: conformance::fingerprint("tls"),
        tool: "t".into(),
        lease: Duration::from_secs(10),
        operation: None,
    };
    assert!(matches!(
        store.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    let record = store.get(&req.key).await.expect("get").expect("record");
    assert_eq!(record.state, RecordState::Running);

    // A plain-text client is turned away by the TLS port: the data only went over TLS.
    let plain = RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .reconnect_retries(0)
        .connect()
        .await;
    assert!(plain.is_err(), "a clear-text client must not get through");
    drop(server);
}
