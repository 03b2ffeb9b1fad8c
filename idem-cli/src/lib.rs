//! The `idem` operator CLI, as a library so a service can embed it with its own tools.
//!
//! The stock binary knows no tools, so its `reconcile` can only report what it would need;
//! the store-only commands (`list`, `show`, `resolve`) work everywhere. To reconcile with
//! read-backs and keyed retries, build a small binary that registers your tools:
//!
//! ```no_run
//! # async fn my_registry(store: std::sync::Arc<dyn idem_runtime::IdemStore>) -> idem_runtime::Registry {
//! #     idem_runtime::Registry::builder().shared_store(store).build().unwrap()
//! # }
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     use clap::Parser;
//!     let cli = idem_cli::Cli::parse();
//!     idem_cli::run(cli, |store| async move { my_registry(store).await }).await
//! }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod output;
mod store_url;

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use idem_runtime::reconcile::{resolve, Resolution};
use idem_runtime::{IdemKey, IdemStore, Reconciler, RecordState, Registry};

pub use store_url::{open_store, StoreUrlError};

/// `idem`: inspect and settle idempotency records.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    /// The store: `sqlite://PATH`, `redis://HOST:PORT[/DB]`, `postgres://USER@HOST:PORT/DB`.
    #[arg(long, env = "IDEM_STORE_URL", global = true)]
    pub store: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List records in one state, oldest first.
    List {
        /// The state to list.
        #[arg(long, value_enum)]
        state: StateArg,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one record with all its evidence.
    Show {
        /// The key (`idem:…`).
        key: String,
    },
    /// Settle an unknown, pending or escalated record as a person decided.
    Resolve {
        /// The key (`idem:…`).
        key: String,
        /// The effect happened; this is the downstream's id for it.
        #[arg(long, group = "decision", value_name = "REF")]
        completed: Option<String>,
        /// The result repeats get, as JSON (with --completed).
        #[arg(long, requires = "completed", value_name = "JSON")]
        output: Option<String>,
        /// The effect failed terminally, for this reason.
        #[arg(long, group = "decision", value_name = "REASON")]
        failed: Option<String>,
        /// The effect never happened: free the key so the intent may run again.
        #[arg(long, group = "decision")]
        release: bool,
        /// Who decided and why (kept in the record).
        #[arg(long, default_value = "")]
        note: String,
    },
    /// One reconciliation pass over unknown and pending records.
    Reconcile,
}

/// A record state on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    /// Nobody knows whether the effect happened.
    Unknown,
    /// Recorded downstream, not terminal.
    Pending,
    /// A person must decide.
    Escalated,
    /// Claimed, handler running.
    Running,
    /// Terminal success.
    Completed,
    /// Terminal failure.
    Failed,
}

impl From<StateArg> for RecordState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Unknown => RecordState::Unknown,
            StateArg::Pending => RecordState::Pending,
            StateArg::Escalated => RecordState::Escalated,
            StateArg::Running => RecordState::Running,
            StateArg::Completed => RecordState::Completed,
            StateArg::Failed => RecordState::Failed,
        }
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("idem: {message}");
    ExitCode::from(2)
}

/// Runs the CLI. `registry` builds the registry (your tools) on the opened store; it is only
/// called for `reconcile`.
pub async fn run<F, Fut>(cli: Cli, registry: F) -> ExitCode
where
    F: FnOnce(Arc<dyn IdemStore>) -> Fut,
    Fut: Future<Output = Registry>,
{
    let Some(url) = cli.store.as_deref() else {
        return fail("no store given: pass --store URL or set IDEM_STORE_URL");
    };
    let store = match open_store(url).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    match cli.command {
        Command::List { state, limit } => match store.list(state.into(), limit).await {
            Ok(records) => {
                output::records(&records, cli.json);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
        Command::Show { key } => {
            let key = match IdemKey::parse(&key) {
                Ok(k) => k,
                Err(e) => return fail(e),
            };
            match store.get(&key).await {
                Ok(Some(record)) => {
                    output::record(&record, cli.json);
                    ExitCode::SUCCESS
                }
                Ok(None) => fail(format!("no record for {key}")),
                Err(e) => fail(e),
            }
        }
        Command::Resolve {
            key,
            completed,
            output,
            failed,
            release,
            note,
        } => {
            let key = match IdemKey::parse(&key) {
                Ok(k) => k,
                Err(e) => return fail(e),
            };
            let output = match output.as_deref().map(serde_json::from_str) {
                None => None,
                Some(Ok(v)) => Some(v),
                Some(Err(e)) => return fail(format!("--output is not valid JSON: {e}")),
            };
            let resolution = match (completed, failed, release) {
                (Some(downstream_ref), None, false) => Resolution::Completed {
                    downstream_ref,
                    output,
                },
                (None, Some(reason), false) => Resolution::Failed { reason },
                (None, None, true) => Resolution::Release,
                _ => return fail("say exactly one of --completed REF, --failed REASON, --release"),
            };
            match resolve(&*store, &key, resolution, &note).await {
                Ok(Some(record)) => {
                    output::record(&record, cli.json);
                    ExitCode::SUCCESS
                }
                Ok(None) => {
                    if cli.json {
                        println!("{}", serde_json::json!({"key": key, "released": true}));
                    } else {
                        println!("{key} released: the intent may run again");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Reconcile => {
            let registry = registry(store).await;
            if registry.tools().next().is_none() {
                eprintln!(
                    "idem: note: no tools are registered in this binary, so records can only be \
                     listed, not settled; embed `idem_cli::run` in a binary that registers your tools"
                );
            }
            // Every record once, not only the oldest `batch`: a one-shot run has no next pass.
            match Reconciler::new(&registry).run_all().await {
                Ok(decisions) => {
                    output::decisions(&decisions, cli.json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}
