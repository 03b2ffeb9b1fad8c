//! The SQLite store's files: owner-only, and never through a symbolic link.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest};
use idem_runtime::store::conformance;
use idem_runtime::store::{IdemStore, StoreError};
use idem_sqlite::SqliteStore;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Under the common umask 022 (which would give 0644), the database, its write-ahead log
/// and its shared-memory index are all created 0600: the records hold arguments and outputs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_wal_and_shm_are_owner_only() {
    // This test binary holds only tests that want this umask; the store must not rely on it.
    // SAFETY: umask only swaps the process's file-creation mask.
    unsafe { libc::umask(0o022) };
    let dir = idem_test::stores::TempDir::new("sqlite");
    let path = dir.path().join("idem.sqlite3");
    let store = SqliteStore::open(&path).await.expect("open");
    let req = ClaimRequest {
        key: conformance::key("files"),
        fingerprint: conformance::fingerprint("files"),
        tool: "t".into(),
        lease: Duration::from_secs(10),
        operation: None,
    };
    assert!(matches!(
        store.claim(&req).await,
        Ok(ClaimOutcome::Claimed(_))
    ));
    for suffix in ["", "-wal", "-shm"] {
        let file = dir.path().join(format!("idem.sqlite3{suffix}"));
        assert!(
            file.exists(),
            "{} must exist while the store is open",
            file.display()
        );
        assert_eq!(
            mode(&file),
            0o600,
            "{} must be owner-only, got {:o}",
            file.display(),
            mode(&file)
        );
    }
    drop(store);
}

/// A symbolic link in place of the database is refused with a clear error, and nothing is
/// written where it points.
#[tokio::test]
async fn a_symlinked_database_is_refused() {
    let dir = idem_test::stores::TempDir::new("sqlite");
    let target = dir.path().join("elsewhere.sqlite3");
    let link = dir.path().join("idem.sqlite3");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    match SqliteStore::open(&link).await {
        Err(StoreError::Backend(msg)) => {
            assert!(msg.contains("symbolic link"), "{msg}");
        }
        other => panic!("opening through a symlink must be refused, got {other:?}"),
    }
    assert!(!target.exists(), "nothing may be created through the link");

    // A link to an existing database is refused too, and the database is left alone.
    std::fs::write(&target, b"").expect("write");
    assert!(matches!(
        SqliteStore::open(&link).await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(std::fs::read(&target).expect("read").len(), 0);
}

/// An existing database keeps the permissions its operator gave it.
#[tokio::test]
async fn an_existing_database_keeps_its_mode() {
    let dir = idem_test::stores::TempDir::new("sqlite");
    let path = dir.path().join("idem.sqlite3");
    drop(SqliteStore::open(&path).await.expect("open"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    drop(SqliteStore::open(&path).await.expect("reopen"));
    assert_eq!(mode(&path), 0o640);
}
