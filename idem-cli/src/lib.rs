//! The `idem` operator CLI, as a library so a service can embed it with its own tools.
//!
//! The stock binary knows no tools, so its `reconcile` can only report what it would need;
//! the store-only commands (`list`, `show`, `resolve`) work everywhere. To reconcile with
//! read-backs and keyed retries, build a small binary that registers your tools:
//!
//! ```no_run
//! # async fn my_registry(store: std::sync::Arc<dyn idem_runtime::store::IdemStore>) -> idem_runtime::registry::Registry {
//! #     idem_runtime::registry::Registry::builder().shared_store(store).build().unwrap()
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

#[cfg(feature = "console")]
mod console;
mod cursor;
mod escape;
mod output;
mod resolve;
mod store_url;

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use idem_runtime::store::ListCursor;
use idem_runtime::{
    identity::IdemKey,
    reconcile::Reconciler,
    registry::Registry,
    store::{IdemStore, RecordState},
};

pub use store_url::{open_store, open_store_with, StoreOptions, StoreUrlError};

/// `idem`: inspect and settle idempotency records.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub struct Cli {
    /// The store (default: the `IDEM_STORE_URL` environment variable).
    ///
    /// SQLite: what follows `sqlite://` (or `sqlite:`) is a file path, taken literally, and
    /// the database must exist. `sqlite://./REL.db` or `sqlite://REL.db` is relative to the
    /// working directory; `sqlite:///ABS/PATH.db` (three slashes) or `sqlite:////ABS/PATH.db`
    /// (four) is absolute. `sqlite::memory:` is refused: a fresh in-memory database holds no
    /// records. Redis: `redis://[:PASSWORD@]HOST:PORT[/DB]`, or `rediss://…` for TLS; with
    /// `--cluster`, some nodes of a Redis Cluster, comma-separated. Postgres:
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DB`. The options below (`--prefix`,
    /// `--partitions`, `--schema`, `--tls-…`) must match what the service's store builder
    /// set, or the CLI looks at another, empty store.
    ///
    /// Arguments are visible to other users of the machine (`ps`, /proc, shell history):
    /// put a URL that holds a password in `IDEM_STORE_URL` instead. Given here, it draws a
    /// warning.
    #[arg(long, global = true, value_name = "URL")]
    pub store: Option<String>,
    /// What the service's store builder set beyond the URL.
    #[command(flatten)]
    pub store_options: StoreOptions,
    /// Print JSON instead of a table. The values are exact; characters a terminal would act
    /// on are written as `\u` escapes, which every JSON reader decodes.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List records in one state, oldest first, a page at a time; or, with `--released`,
    /// the releases the store keeps (every key a person or the reconciler freed in the
    /// tombstone window: who, when, why, what the record was), oldest first.
    ///
    /// When more records follow, the last line (`next_after` in `--json`) says what to pass
    /// as `--after` for the next page.
    List {
        /// The state to list.
        #[arg(long, value_enum, required_unless_present = "released")]
        state: Option<StateArg>,
        /// List the kept releases instead of records in a state.
        #[arg(long, conflicts_with = "state")]
        released: bool,
        /// At most this many records on the page (at least 1).
        #[arg(long, default_value_t = 100, value_parser = parse_limit, value_name = "N")]
        limit: usize,
        /// Start after this position: the `--after` value the previous page printed
        /// (`MILLIS:KEY`).
        #[arg(long, value_parser = cursor::parse, value_name = "CURSOR")]
        after: Option<ListCursor>,
    },
    /// Show one record with all its evidence, and the releases the store keeps for its key
    /// (who freed it, when, why, and the record as it was), even once the key is free.
    Show {
        /// The key (`idem:…`).
        key: String,
    },
    /// Settle an unknown, pending or escalated record as a person decided.
    ///
    /// The record keeps who decided, when, and why: `NOTE (by OPERATOR at TIME)`. A release
    /// frees the key, and the store keeps its trace (the operator, the note, the time and
    /// the whole record as it was): `idem show KEY` prints it. The record is also written
    /// to stderr as one JSON line (and, with `--json`, into the output) before the release.
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
        /// The effect never happened: free the key so the intent may run again. Refused
        /// while a send of the record may still land (until the last send + the tool's
        /// timeout + twice its in-flight bound; a tool this binary does not register is
        /// assumed to have the largest defaults, 30 minutes each), saying until when.
        #[arg(long, group = "decision")]
        release: bool,
        /// With --release: free the key even while a send may still land, because REASON
        /// (how you know it will not; kept in the release trace, marked as forced).
        #[arg(long, requires = "release", value_name = "REASON")]
        force: Option<String>,
        /// Why (required; kept in the record with who decided and when).
        #[arg(long, required = true)]
        note: String,
        /// Who decided (default: `$USER`).
        #[arg(long, env = "IDEM_OPERATOR", value_name = "NAME")]
        operator: Option<String>,
    },
    /// Look at every unknown and pending record once, oldest first, and settle what the
    /// registered tools can.
    ///
    /// Walks each state to its end, page by page, however many records there are (records
    /// created meanwhile are included when the walk reaches them). The stock binary
    /// registers no tools, so it reports each record as skipped: embed `idem_cli::run` in a
    /// binary that registers your tools to retry with the same key, read back or escalate.
    Reconcile,
    /// Copy every record and release trace of this Redis store into another Redis store,
    /// unchanged: how a store changes its partition count, prefix or server, which are
    /// otherwise fixed for its lifetime.
    ///
    /// Offline: stop every worker and reconciler that uses this store first, and start
    /// them on the new store only once the copy has finished. A copy refuses to start while
    /// a claim is running, and fails if the store changes during it; run again after an
    /// interruption, it keeps what it copied. A key the new store holds with another record
    /// stops it. The store options (`--prefix`, `--partitions`, `--cluster`) describe this
    /// store, the `--to-…` options the new one; TLS files apply to both.
    Copy {
        /// The new store: a Redis URL, or with `--to-cluster` some nodes of a Redis
        /// Cluster, comma-separated (default: the `IDEM_COPY_TO_URL` environment variable;
        /// put a URL holding a password there).
        #[arg(long, env = "IDEM_COPY_TO_URL", value_name = "URL")]
        to: String,
        /// The new store's key prefix (default `idem:`).
        #[arg(long, value_name = "PREFIX")]
        to_prefix: Option<String>,
        /// How many partitions the new store is spread over (default 1).
        #[arg(long, value_name = "N")]
        to_partitions: Option<u16>,
        /// The new store lives on a Redis Cluster.
        #[arg(long)]
        to_cluster: bool,
    },
    /// Serve the operator console: a web page on which a person lists the escalated,
    /// unknown and pending records, reads one's evidence and settles it with the decisions
    /// `resolve` offers (through the same checks), each confirmed and signed with the
    /// operator's name.
    ///
    /// Prints the address to open, with the token every request needs. Listens on
    /// loopback unless `--listen` says otherwise. Runs until interrupted (Ctrl-C).
    #[cfg(feature = "console")]
    Console {
        /// Where to listen. Another address than loopback serves the console to the
        /// network (a warning says so); port 0 picks a free port.
        #[arg(long, default_value = "127.0.0.1:8087", value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// The access token (at least 16 characters of A-Z, a-z, 0-9, `-_.~`); default:
        /// the `IDEM_CONSOLE_TOKEN` environment variable, else 32 random bytes in hex,
        /// printed at start. Arguments are visible to other users of the machine: prefer
        /// the variable.
        #[arg(
            long,
            env = "IDEM_CONSOLE_TOKEN",
            hide_env_values = true,
            value_name = "TOKEN"
        )]
        token: Option<String>,
        /// The name the decision forms are prefilled with (default: `$USER`).
        #[arg(long, env = "IDEM_OPERATOR", value_name = "NAME")]
        operator: Option<String>,
    },
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

fn parse_limit(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("want a whole number of records, at least 1".into()),
    }
}

/// Prints `message` (escaped: it may quote a record or a store's reply) and returns the
/// usage-error exit code.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("idem: {}", escape::Esc(&message.to_string()));
    ExitCode::from(2)
}

/// The store URL: `--store`, else `IDEM_STORE_URL`. A password given as an argument is
/// visible to every user of the machine while the command runs, so it draws a warning.
fn store_url(given: Option<String>) -> Result<String, String> {
    if let Some(url) = given {
        if store_url::has_password(&url) {
            eprintln!(
                "idem: warning: the --store URL holds a password, and arguments are visible \
                 to other users of this machine (ps, /proc, shell history); set \
                 IDEM_STORE_URL instead"
            );
        }
        return Ok(url);
    }
    match std::env::var("IDEM_STORE_URL") {
        Ok(url) if !url.is_empty() => Ok(url),
        Err(std::env::VarError::NotUnicode(_)) => Err("IDEM_STORE_URL is not valid UTF-8".into()),
        _ => Err("no store given: set IDEM_STORE_URL or pass --store URL".into()),
    }
}

/// A command with its input checked: what runs once the store is open.
enum Plan {
    List {
        state: RecordState,
        limit: usize,
        after: Option<ListCursor>,
    },
    Released {
        limit: usize,
        after: Option<ListCursor>,
    },
    Show(IdemKey),
    Resolve(resolve::Request),
    Reconcile,
}

/// What a command asks for: something done on the store, or a copy of it (which opens
/// both stores itself, as Redis stores).
enum Job {
    OnStore(Plan),
    Copy {
        to: String,
        options: StoreOptions,
    },
    /// The console opens the store itself (and again later, if it cannot at start).
    #[cfg(feature = "console")]
    Console(console::Settings),
}

impl Plan {
    fn of(command: Command) -> Result<Job, String> {
        Ok(Job::OnStore(match command {
            Command::List {
                state,
                released,
                limit,
                after,
            } => match state {
                Some(state) if !released => Plan::List {
                    state: state.into(),
                    limit,
                    after,
                },
                None if released => Plan::Released { limit, after },
                _ => return Err("say one of --state STATE or --released".into()),
            },
            Command::Show { key } => Plan::Show(IdemKey::parse(&key).map_err(|e| e.to_string())?),
            Command::Resolve {
                key,
                completed,
                output,
                failed,
                release,
                force,
                note,
                operator,
            } => Plan::Resolve(resolve::Request::check(
                &key,
                completed,
                output.as_deref(),
                failed,
                (release, force),
                &note,
                operator,
            )?),
            Command::Reconcile => Plan::Reconcile,
            #[cfg(feature = "console")]
            Command::Console {
                listen,
                token,
                operator,
            } => {
                return Ok(Job::Console(console::Settings {
                    listen,
                    token,
                    operator: operator
                        .filter(|o| !o.trim().is_empty())
                        .or_else(|| std::env::var("USER").ok().filter(|u| !u.trim().is_empty())),
                }))
            }
            Command::Copy {
                to,
                to_prefix,
                to_partitions,
                to_cluster,
            } => {
                return Ok(Job::Copy {
                    to,
                    options: StoreOptions {
                        prefix: to_prefix,
                        partitions: to_partitions,
                        cluster: to_cluster,
                        ..StoreOptions::default()
                    },
                })
            }
        }))
    }
}

/// Runs the CLI. `registry` builds the registry (your tools) on the opened store; it is only
/// called for `reconcile`, `resolve` and `console` (a release is held to the in-flight bound
/// its tool declares there).
///
/// Input is checked before the store is opened: a bad key, a missing note or decision
/// touches nothing.
pub async fn run<F, Fut>(cli: Cli, registry: F) -> ExitCode
where
    F: FnOnce(Arc<dyn IdemStore>) -> Fut,
    Fut: Future<Output = Registry>,
{
    let url = match store_url(cli.store) {
        Ok(u) => u,
        Err(e) => return fail(e),
    };
    let json = cli.json;
    let plan = match Plan::of(cli.command) {
        Ok(Job::OnStore(p)) => p,
        Ok(Job::Copy { to, options }) => {
            let options = StoreOptions {
                tls_ca: cli.store_options.tls_ca.clone(),
                tls_cert: cli.store_options.tls_cert.clone(),
                tls_key: cli.store_options.tls_key.clone(),
                ..options
            };
            return match store_url::copy_redis(&url, &cli.store_options, &to, &options).await {
                Ok(copied) => {
                    output::copied(&copied, json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            };
        }
        #[cfg(feature = "console")]
        Ok(Job::Console(settings)) => {
            return console::serve(url, cli.store_options, settings, registry).await
        }
        Err(e) => return fail(e),
    };
    let store = match open_store_with(&url, &cli.store_options).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    match plan {
        Plan::List {
            state,
            limit,
            after,
        } => {
            // One more than the page, to know whether another page follows.
            match store
                .list_after(state, after.as_ref(), limit.saturating_add(1))
                .await
            {
                Ok(mut records) => {
                    let next = if records.len() > limit {
                        records.truncate(limit);
                        records.last().map(ListCursor::of)
                    } else {
                        None
                    };
                    output::records(&records, next.as_ref(), json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Plan::Released { limit, after } => {
            match store
                .list_releases(after.as_ref(), limit.saturating_add(1))
                .await
            {
                Ok(mut releases) => {
                    let next = if releases.len() > limit {
                        releases.truncate(limit);
                        releases.last().map(ListCursor::of_release)
                    } else {
                        None
                    };
                    output::releases(&releases, next.as_ref(), json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Plan::Show(key) => {
            let shown = async {
                Ok::<_, idem_runtime::store::StoreError>((
                    store.get(&key).await?,
                    store.releases(&key).await?,
                ))
            }
            .await;
            match shown {
                Ok((None, releases)) if releases.is_empty() => fail(format!("no record for {key}")),
                Ok((record, releases)) => {
                    output::shown(&key, record.as_ref(), &releases, json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Plan::Resolve(request) => match request.apply(&registry(store).await, json).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Plan::Reconcile => {
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
                    output::decisions(&decisions, json);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}
