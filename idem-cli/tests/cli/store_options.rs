//! The store options beyond the URL (`--prefix`, `--partitions`, `--cluster`, `--schema`,
//! `--tls-ca`, `--tls-cert`, `--tls-key`): the CLI opens the very store a service built with
//! them, and an option that does not apply to the URL's backend is refused, not ignored.
//!
//! The server checks need the TLS services `.ci/services.sh` starts (a TLS-only Redis
//! Cluster and a PostgreSQL database that wants a client certificate); without them they
//! print why they skip, and fail when `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(all(
    feature = "sqlite",
    feature = "redis",
    feature = "postgres",
    feature = "tls"
))]

use crate::support::{idem, stderr, stdout, unique, unknown_record, RecordText, TempDb};

/// The keys a `--json list` printed.
fn listed_keys(out: &std::process::Output) -> Vec<String> {
    assert!(out.status.success(), "{}", stderr(out));
    let page: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", stdout(out), stderr(out)));
    page["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().expect("a key").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_option_for_another_backend_is_refused_before_anything_opens() {
    let db = TempDb::new("idem-cli-options").await;
    let refused = |url: &str, args: &[&str], says: &str| {
        let out = idem()
            .args(["--store", url])
            .args(args)
            .args(["list", "--state", "unknown"])
            .output()
            .expect("run idem");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}: nothing listed");
    };
    let sqlite = db.url();
    refused(
        &sqlite,
        &["--prefix", "app:"],
        "--prefix does not apply to a SQLite store",
    );
    refused(
        &sqlite,
        &["--tls-ca", "/dev/null"],
        "--tls-ca does not apply to a SQLite store",
    );
    // Port 9 on loopback: were the store opened, it would fail differently.
    refused(
        "redis://127.0.0.1:9/",
        &["--schema", "app"],
        "--schema does not apply to a Redis store",
    );
    refused(
        "postgres://idem@127.0.0.1:9/db",
        &["--partitions", "3", "--cluster"],
        "--partitions, --cluster do not apply to a Postgres store",
    );
    refused(
        "redis://127.0.0.1:9/",
        &["--tls-ca", "/nonexistent/ca.pem"],
        "reading --tls-ca /nonexistent/ca.pem",
    );
    // A client certificate without its key is a usage error.
    let half = idem()
        .args([
            "--store",
            "rediss://127.0.0.1:9/",
            "--tls-cert",
            "/dev/null",
        ])
        .args(["list", "--state", "unknown"])
        .output()
        .expect("run idem");
    assert_eq!(half.status.code(), Some(2), "{}", stderr(&half));
    assert!(stderr(&half).contains("--tls-key"), "{}", stderr(&half));
}

/// The environment variable's value, or `None` after skipping `check`.
fn var(name: &str, check: &str) -> Option<String> {
    idem_runtime::store::conformance::backend_url(name, check)
}

/// A service's store on a TLS-only Redis Cluster (client certificate required), spread over
/// three partitions under a prefix of its own: the CLI finds its record only when told all
/// of that, and finds nothing under the default prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_store_on_a_tls_cluster() {
    let check = "the CLI on a TLS Redis Cluster";
    let (Some(urls), Some(ca), Some(cert), Some(key)) = (
        var("IDEM_REDIS_TLS_CLUSTER_URLS", check),
        var("IDEM_REDIS_TLS_CA", check),
        var("IDEM_REDIS_TLS_CLIENT_CERT", check),
        var("IDEM_REDIS_TLS_CLIENT_KEY", check),
    ) else {
        return;
    };
    let prefix = format!("{}:", unique("idem-cli-tls"));
    let store = idem_redis::RedisStore::cluster(urls.split(','))
        .prefix(prefix.as_str())
        .partitions(3)
        .tls_root_certificates(std::fs::read(&ca).expect("CA"))
        .tls_client_certificate(
            std::fs::read(&cert).expect("client certificate"),
            std::fs::read(&key).expect("client key"),
        )
        .connect()
        .await
        .expect("the service's store");
    let record = unknown_record(&store, &RecordText::plain("tls-run", "lost")).await;

    let list = |extra: &[&str]| {
        idem()
            .args(["--store", urls.as_str(), "--cluster", "--json"])
            .args(["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key])
            .args(extra)
            .args(["list", "--state", "unknown"])
            .output()
            .expect("run idem")
    };
    let found = list(&["--prefix", &prefix, "--partitions", "3"]);
    assert_eq!(listed_keys(&found), vec![record.to_string()]);

    let shown = idem()
        .args(["--store", urls.as_str(), "--cluster", "--json"])
        .args(["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key])
        .args(["--prefix", &prefix, "--partitions", "3"])
        .args(["show", record.as_ref()])
        .output()
        .expect("run idem");
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(stdout(&shown).contains("lost"), "{}", stdout(&shown));

    // The same servers under the default prefix hold another store: not this record.
    let elsewhere = idem()
        .args(["--store", urls.as_str(), "--cluster", "--json"])
        .args(["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key])
        .args(["--prefix", "{idem-cli-default}:"])
        .args(["list", "--state", "unknown"])
        .output()
        .expect("run idem");
    assert!(!listed_keys(&elsewhere).contains(&record.to_string()));

    // Without the client certificate the servers turn the CLI away.
    let no_cert = idem()
        .args(["--store", urls.as_str(), "--cluster", "--tls-ca", &ca])
        .args(["--prefix", &prefix, "--partitions", "3"])
        .args(["list", "--state", "unknown"])
        .output()
        .expect("run idem");
    assert!(!no_cert.status.success(), "{}", stdout(&no_cert));
}

/// A service's store in a schema of its own, on a PostgreSQL database that wants a client
/// certificate: found with `--schema` and the TLS files, and not in the default schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_in_its_own_schema_over_mutual_tls() {
    let check = "the CLI on PostgreSQL with a client certificate";
    let (Some(url), Some(ca), Some(cert), Some(key)) = (
        var("IDEM_POSTGRES_TLS_MTLS_URL", check),
        var("IDEM_POSTGRES_TLS_CA", check),
        var("IDEM_POSTGRES_TLS_CLIENT_CERT", check),
        var("IDEM_POSTGRES_TLS_CLIENT_KEY", check),
    ) else {
        return;
    };
    let url = format!("{url}?sslmode=verify-full");
    let schema = format!("cli_{}", std::process::id());
    let store = idem_postgres::PostgresStore::builder(url.as_str())
        .schema(schema.as_str())
        .tls_root_certificates(std::fs::read(&ca).expect("CA"))
        .tls_client_certificate(
            std::fs::read(&cert).expect("client certificate"),
            std::fs::read(&key).expect("client key"),
        )
        .connect()
        .await
        .expect("the service's store");
    let record = unknown_record(&store, &RecordText::plain("pg-tls-run", "lost")).await;

    let list = |extra: &[&str]| {
        idem()
            .args(["--store", url.as_str(), "--json"])
            .args(["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key])
            .args(extra)
            .args(["list", "--state", "unknown"])
            .output()
            .expect("run idem")
    };
    assert_eq!(
        listed_keys(&list(&["--schema", &schema])),
        vec![record.to_string()]
    );
    assert!(!listed_keys(&list(&[])).contains(&record.to_string()));
}
