//! What the CLI tests share: running the binary with a clean environment, a fresh SQLite
//! database, and records made through the store's public API.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
use idem_runtime::store::{AttemptKind, AttemptRecord, OperationDraft, ReadBackRecord};
use idem_runtime::{
    identity::{Fingerprint, IdemKey, Scope},
    outcome::OutcomeClass,
    store::{Clock, IdemStore, RecordState, SystemClock, Timestamp},
};
use idem_sqlite::{SqliteStore, SqliteSync};
use serde_json::Value;

/// The `idem` binary with none of its environment variables set (and `USER` as given by
/// the caller, or removed), so a test sees only what it passes.
pub fn idem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idem"));
    c.env_remove("IDEM_STORE_URL")
        .env_remove("IDEM_OPERATOR")
        .env_remove("USER");
    c
}

/// Runs `idem --store URL ARGS…`.
pub fn idem_at(url: &str, args: &[&str]) -> Output {
    idem()
        .arg("--store")
        .arg(url)
        .args(args)
        .output()
        .expect("run the idem binary")
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub use idem_test::stores::unique;

/// A fresh SQLite database in the temp dir, removed (with its -wal/-shm) on drop.
pub struct TempDb {
    /// The database file.
    pub path: PathBuf,
    /// The store on it.
    pub store: Arc<dyn IdemStore>,
}

impl TempDb {
    /// Creates the database.
    pub async fn new(tag: &str) -> TempDb {
        let path = std::env::temp_dir().join(format!("{}.db", unique(tag)));
        TempDb::at(path).await
    }

    /// Creates the database at `path`.
    pub async fn at(path: PathBuf) -> TempDb {
        let store = SqliteStore::builder(&path)
            .sync(SqliteSync::Normal)
            .open()
            .await
            .unwrap();
        TempDb {
            path,
            store: Arc::new(store),
        }
    }

    /// `sqlite://` + the absolute path (three slashes).
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(Path::new(&p));
        }
    }
}

/// Past any in-flight bound the stock binary assumes (90 minutes after the send).
pub const LONG_AGO: Duration = Duration::from_secs(2 * 3600);

/// Every text field a record can carry, for [`unknown_record`].
#[derive(Clone, Debug)]
pub struct RecordText {
    pub tool: String,
    pub run: String,
    pub tenant: Option<String>,
    pub intent: Option<String>,
    pub args: Value,
    pub message: String,
    pub attempt_message: String,
    pub read_back: Option<String>,
    /// How long ago its one send went out: by default long enough (2 hours) that no send
    /// can land any more, so a plain `--release` of it is not refused.
    pub sent_ago: Duration,
}

impl RecordText {
    /// A plain record of tool `charge` in run `run`.
    pub fn plain(run: &str, message: &str) -> RecordText {
        RecordText {
            tool: "charge".into(),
            run: run.into(),
            tenant: None,
            intent: None,
            args: serde_json::json!({"cents": 100}),
            message: message.into(),
            attempt_message: message.into(),
            read_back: None,
            sent_ago: LONG_AGO,
        }
    }
}

/// Claims a key through the store and settles it *unknown* with `text` as its evidence, as
/// an executor whose response was lost would; returns the key.
pub async fn unknown_record(store: &dyn IdemStore, text: &RecordText) -> IdemKey {
    let mut scope = Scope::run(text.run.clone());
    if let Some(t) = &text.tenant {
        scope = scope.with_tenant(t.clone());
    }
    let args = idem_runtime::identity::CanonicalJson::from_value(&text.args);
    let key = IdemKey::derive(
        &scope,
        &text.tool,
        idem_runtime::identity::KeyMaterial::Args(args.as_str().as_bytes()),
    );
    let req = ClaimRequest {
        key: key.clone(),
        fingerprint: Fingerprint::of_canonical(args.as_str().as_bytes()),
        tool: text.tool.as_str().into(),
        lease: Duration::from_secs(60),
        operation: Some(OperationDraft::new(scope, text.intent.clone(), args)),
    };
    let ClaimOutcome::Claimed(token) = store.claim(&req).await.unwrap() else {
        panic!("{key} was already claimed");
    };
    let now = SystemClock.now();
    let sent = Timestamp(now.0.saturating_sub(text.sent_ago.as_millis() as u64));
    let mut settlement = Settlement::new(RecordState::Unknown)
        .message(text.message.clone())
        .attempts(vec![AttemptRecord::new(
            1,
            sent,
            sent,
            AttemptKind::Returned,
            OutcomeClass::Unknown,
            Some(text.attempt_message.clone()),
        )]);
    if let Some(rb) = &text.read_back {
        settlement = settlement.read_backs(vec![ReadBackRecord {
            at: now,
            result: rb.clone(),
        }]);
    }
    store.settle(&key, token, settlement).await.unwrap();
    key
}
