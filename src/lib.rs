//! idem: exactly-once tool calls for Rust AI agents.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// Turns an `async fn` into a tool the [`Registry`] can dispatch to.
///
/// ```
/// use idem::{tool, ReadCtx, Registry, ToolError, WriteCtx};
///
/// #[idem::args] // derives Deserialize, Serialize and JsonSchema through idem
/// struct ChargeArgs { customer: String, invoice: String, cents: u64 }
///
/// /// Charge a customer's card.        <- the description the model sees
/// #[tool(write, key(customer, invoice), downstream = "keyed", timeout = "10s")]
/// async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
///     // billing.create_charge(&args, ctx.key().as_str()).await
///     Ok(format!("charged {} cents under {}", args.cents, ctx.key()))
/// }
///
/// /// What time is it?
/// #[tool(read)]
/// async fn now(_ctx: ReadCtx) -> Result<u64, ToolError> {
///     Ok(1_700_000_000)
/// }
///
/// let registry = Registry::builder().tool(charge_card).tool(now).build()?;
/// assert_eq!(charge_card::NAME, "charge_card");
/// # Ok::<(), idem::BuildError>(())
/// ```
///
/// # The handler
///
/// `async fn name(ctx, args) -> Result<T, E>`:
///
/// - `ctx` is a [`WriteCtx`] for `#[tool(write)]` (it carries the idempotency key; only the
///   executor can make one) and a [`ReadCtx`] for `#[tool(read)]` (no key). The type checker
///   confirms it, so an alias works and a look-alike does not.
/// - `args` (optional) is any type with `Deserialize + Serialize + JsonSchema`; its schema is
///   the tool's input schema. Without it the tool takes `{}`.
/// - `T: Serialize` is the output the model sees (and, for writes, what repeats replay);
///   `E` is [`ToolError`] or any type with `impl From<E> for ToolError`.
///
/// # Output schema
///
/// When `T` implements `JsonSchema`, the tool's [`ToolSpec`](tool::ToolSpec) carries its schema
/// ([`ToolSpec::output_schema`](tool::ToolSpec::output_schema)): MCP clients get it as `outputSchema` and the output as
/// `structuredContent` (see [`definitions::mcp_output_schema`]); the OpenAI and Anthropic
/// formats have no place for it. When `T` does not, the tool simply has no output schema:
/// the macro detects it rather than asking for an option, so no existing tool needs a change
/// and none breaks. Detection is resolved at compile time by method resolution (an autoref
/// probe, as `key(..)` uses for serde names: a trait implemented for `T: JsonSchema` is found
/// before a fallback implemented for everything one reference further), not by
/// specialization, so it works on stable Rust for the concrete types handlers return.
/// `no_output_schema` leaves it out (for a type whose `Serialize` does not match its
/// `JsonSchema`: clients check structured content against the schema); to give another,
/// implement [`WriteTool`](tool::WriteTool)/[`ReadTool`](tool::ReadTool) by hand.
///
/// The fn becomes `fn charge_card() -> charge_card`, returning the tool (whose type is named
/// like the fn and has a `NAME` constant); `Registry::builder().tool(charge_card)` takes it.
/// The handler itself is reached through [`WriteTool::call`](tool::WriteTool::call) / [`ReadTool::call`](tool::ReadTool::call): in a test,
/// `charge_card().call(WriteCtx::for_test(key), args)` with the `testing` feature.
///
/// # Options
///
/// | option | tools | meaning |
/// |---|---|---|
/// | `read` / `write` | — | exactly one: does the tool change anything? |
/// | `name = "…"` | both | the name the model sees (default: the fn's); 1–64 of `[A-Za-z0-9_-]` |
/// | `description = "…"` | both | default: the doc comment, wrapped lines folded |
/// | `timeout = "30s"` | both | per attempt; `ms`, `s`, `m`, `h`, or sums like `"1h30m"` |
/// | `no_output_schema` | both | no output schema, even when `T` implements `JsonSchema` |
/// | `crate = "::idem2"` | both | where the facade is, for a crate that renames the `idem-rs` dependency (see below); default `::idem` |
/// | `key(field, "/json/pointer", …)` | write | key material: these fields of the args, by Rust field name or by JSON Pointer into the serialized args (default: all of them) |
/// | `exclude(field, "/json/pointer", …)` | write | parts left out of the fingerprint and of the key: a repeat differing only there is replayed, not refused as changed parameters |
/// | `key_name = "…"` | write | the name keys are derived under (default: the tool's name), so a renamed tool keeps its keys |
/// | `downstream = "keyed"` | write | the downstream honours idempotency keys (default `"unkeyed"`); the handler must name its context (to pass `ctx.key()` on) |
/// | `key_travels = "…"` | write | with `downstream = "keyed"`: the handler hands the key on without naming its context, and this says how |
/// | `window = "23h"` | write | safe retry window of a keyed downstream |
/// | `lease = "1m"` | write | claim lease (default: timeout + 30 s) |
/// | `destructive` | write | MCP `destructiveHint` |
/// | `reconcile = find_charge` | write | the read-back the [`Reconciler`] settles unknown and pending calls with: an async fn `(ReadBackCtx, Args) -> Result<ReadBack, ToolError>` (in a `#[toolbox]`, a `&self` method's name) |
/// | `in_flight = "2m"` | write | how long after its timeout a send can still land: a timed-out handler is dropped then, and a read-back's "not found" means "did not happen" only after twice that (default: the registry's `default_in_flight_bound`, else 4 × the timeout between 2 and 30 minutes) |
///
/// Every mistake (a write without `WriteCtx`, an unknown option, `key(nope)`, a malformed
/// pointer, a bad duration, a name outside the charset, a keyed handler that never names its
/// context, args that do not derive the traits, a return type that is not a `Result`) is a
/// compile error at the offending token saying what to write instead. A pointer into nested
/// args is checked against the args' schema when the registry is built.
///
/// # A renamed dependency
///
/// Generated code names the facade `::idem`, the library name of the `idem-rs` package, as
/// serde's derives name `::serde`: the macros read no manifest. A crate that renames the
/// dependency (`idem2 = { package = "idem-rs", … }`) says so on each macro, as with
/// `#[serde(crate = "…")]`: `#[tool(write, crate = "::idem2")]`, `#[toolbox(crate =
/// "::idem2")]` (once for all its methods), `#[idem2::args(crate = "::idem2")]`. Without it
/// the build stops with one error on the attribute: "cannot find `idem` in the crate root".
#[doc(inline)]
pub use idem_macros::tool;

/// Turns the `#[tool(..)]` methods of an inherent impl block into tools that share `&self`.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// use idem::{toolbox, ReadCtx, Registry, ToolError, WriteCtx};
///
/// #[derive(Default)]
/// struct Counter { hits: AtomicU64 }
///
/// #[toolbox]
/// impl Counter {
///     /// Count a hit.
///     #[tool(write)]
///     async fn hit(&self, _ctx: WriteCtx) -> Result<u64, ToolError> {
///         Ok(self.hits.fetch_add(1, Ordering::SeqCst) + 1)
///     }
///
///     /// How many hits so far?
///     #[tool(read)]
///     async fn hits(&self, _ctx: ReadCtx) -> Result<u64, ToolError> {
///         Ok(self.hits.load(Ordering::SeqCst))
///     }
/// }
///
/// let registry = Registry::builder().toolbox(Arc::new(Counter::default())).build()?;
/// assert_eq!(registry.tools().count(), 2);
/// # Ok::<(), idem::BuildError>(())
/// ```
///
/// The toolbox reads and removes its methods' `#[tool(..)]` attributes itself, so they need
/// no `use idem::tool`. The methods stay callable as written. Generic impl blocks are not
/// supported: implement the tools for a concrete type. Its one option, `crate = "::idem2"`,
/// is for a crate that renames the dependency (see [`tool`](macro@tool)).
#[doc(inline)]
pub use idem_macros::toolbox;

/// Derives what a tool's arguments need — `Deserialize`, `Serialize` and `JsonSchema` —
/// through idem's own serde and schemars, so a project needs no direct dependency on them.
///
/// ```
/// /// Arguments of `charge_card`.
/// #[idem::args]
/// #[serde(deny_unknown_fields)] // serde and schemars options work as usual
/// struct ChargeArgs {
///     /// The customer to charge (field docs become schema descriptions).
///     customer: String,
///     cents: u64,
///     memo: Option<String>,
/// }
/// ```
///
/// Equivalent to `#[derive(Deserialize, Serialize, JsonSchema)]` with `#[serde(crate = …)]`
/// and `#[schemars(crate = …)]` pointing into idem; deriving them yourself works just as well.
/// Its one option, `crate = "::idem2"`, is for a crate that renames the dependency (see
/// [`tool`](macro@tool)).
#[doc(inline)]
pub use idem_macros::args;

// The names a tool author and an agent loop use live at the root; every other item has one
// path, in the module named for its concept below. Nothing is in both places.
pub use idem_runtime::call::{CallError, ToolCall, ToolResult};
pub use idem_runtime::definitions::Format;
pub use idem_runtime::identity::{IdemKey, Scope};
pub use idem_runtime::outcome::{Outcome, OutcomeClass};
pub use idem_runtime::reconcile::Reconciler;
pub use idem_runtime::registry::{BuildError, Registry, RegistryBuilder};
pub use idem_runtime::store::{IdemStore, MemoryStore};
pub use idem_runtime::tool::{ReadBack, ReadBackCtx, ReadCtx, ToolError, WriteCtx};

pub mod identity {
    //! Identity: canonical JSON, the idempotency key's parts and formats, and the fingerprint
    //! of the arguments. The key itself and its [`Scope`](crate::Scope) are at the root
    //! ([`IdemKey`](crate::IdemKey)).
    pub use idem_runtime::identity::{
        canonical, identify, identify_value, identify_value_with, identify_with, ArgsIdentity,
        ArgsPath, ArgsPathError, CanonicalJson, Fingerprint, IdentityError, IdentityRules,
        KeyFormat, KeyMaterial, KeyMigration, ParseKeyError, ParseKeyFormatError,
    };
}

pub mod outcome {
    //! Outcomes: the bound on what the model is told. The classes themselves are at the root
    //! ([`Outcome`](crate::Outcome), [`OutcomeClass`](crate::OutcomeClass)).
    pub use idem_runtime::outcome::MAX_MODEL_DETAIL;
}

pub mod store {
    //! Claims: the records a store keeps, its errors, clocks and retention. The contract and
    //! the in-memory store are at the root ([`IdemStore`](crate::IdemStore),
    //! [`MemoryStore`](crate::MemoryStore)); what only a backend author needs is in
    //! [`backend`].
    pub use idem_runtime::store::{
        AttemptKind, AttemptRecord, ClaimToken, Clock, Durability, HeldClaim, Instrumented,
        ListCursor, ManualClock, Operation, OperationDraft, ReadBackRecord, Record, RecordState,
        ReleaseNote, ReleaseRecord, Retention, StoreError, StoreFuture, Swept, SystemClock,
        Timestamp, TokioClock, TxError, DEFAULT_CAPACITY,
    };

    #[doc(inline)]
    pub use idem_runtime::store::backend;

    #[cfg(feature = "testing")]
    #[doc(inline)]
    pub use idem_runtime::store::conformance;
}

pub mod escalation {
    //! Escalations: what a person gets when nobody else can settle an operation, and the
    //! sinks that deliver it.
    pub use idem_runtime::escalation::{
        CallbackSink, Escalation, EscalationDetail, EscalationSink, JsonLinesSink, LogSink,
        ReasonKind, Redactor,
    };
}

pub mod tool {
    //! Tools: what a tool declares ([`ToolSpec`]), the traits `#[tool]` and `#[toolbox]`
    //! implement, and its schemas. What a handler receives and returns is at the root
    //! ([`WriteCtx`](crate::WriteCtx), [`ReadCtx`](crate::ReadCtx),
    //! [`ToolError`](crate::ToolError), [`ReadBack`](crate::ReadBack)).
    pub use idem_runtime::tool::{
        default_in_flight_bound, input_schema_for, output_schema_for, Downstream, DynMarker,
        DynTool, IntoDynTool, ReadMarker, ReadTool, ToolKind, ToolSpec, Toolbox, WriteMarker,
        WriteTool, DEFAULT_TIMEOUT, DEFAULT_WINDOW, MAX_DEFAULT_IN_FLIGHT_BOUND,
        MIN_DEFAULT_IN_FLIGHT_BOUND,
    };
}

pub mod definitions {
    //! Tool definitions in the shapes OpenAI, Anthropic and MCP clients expect. The
    //! [`Format`](crate::Format) is at the root.
    pub use idem_runtime::definitions::{
        definition, into_mcp_structured_content, mcp_output_schema, mcp_structured_content,
        to_strict, DefinitionOptions, MCP_RESULT_PROPERTY,
    };
}

pub mod registry {
    //! The registry's limits, defaults and retry policy. The
    //! [`Registry`](crate::Registry) and its builder are at the root.
    pub use idem_runtime::registry::{
        RetryPolicy, CHANGED_PARAMS_NOTICE_WINDOW, DEFAULT_IN_FLIGHT_WAIT, DEFAULT_MAX_ARGS_BYTES,
        MAX_ARGS_DEPTH,
    };
}

pub mod reconcile {
    //! Reconciliation: the decisions a [`Reconciler`](crate::Reconciler) pass records, and a
    //! person's [`resolve`].
    pub use idem_runtime::reconcile::{
        class_of, releasable_at, resolve, resolve_as, resolve_in, Action, Decision, Resolution,
        ResolveError, DEFAULT_MAX_FAILED_READ_BACKS, DEFAULT_PATIENCE, DEFAULT_WATCH_RELEASED_FOR,
        RECONCILER, RETRY_BACKOFF_FIRST, RETRY_BACKOFF_MAX,
    };
}

pub mod observe {
    //! Observe: the names of the spans and metrics idem records (metrics with the feature
    //! `metrics`; docs/observability.md).
    #[cfg(feature = "metrics")]
    pub use idem_runtime::observe::describe_metrics;
    pub use idem_runtime::observe::{
        CALLS, CALL_DURATION, CHANGED_PARAMS, ESCALATIONS, RECONCILE_DECISIONS, RECONCILE_PASSES,
        RECONCILE_PASS_DURATION, REFUSALS, REPLAYS, STORE_OP_DURATION, UNKNOWN_OUTCOMES,
        UNREGISTERED_TOOL,
    };
}

#[cfg(feature = "testing")]
pub mod fault_kit {
    //! The fault kit (feature `testing`): prove exactly-once on *your* write tool, against
    //! your own fake downstream or sandbox, under every fault of the retry matrix, judged on
    //! *your* ledger.
    //!
    //! ```
    //! use std::sync::{Arc, Mutex};
    //!
    //! use idem::fault_kit::{FaultKit, Subject};
    //! use idem::{toolbox, ToolError, WriteCtx};
    //! use serde_json::json;
    //!
    //! /// Your test double: a bank that charges once per idempotency key.
    //! #[derive(Default)]
    //! struct FakeBank { charges: Mutex<Vec<(String, u64)>> }
    //!
    //! #[idem::args]
    //! struct ChargeArgs { customer: String, cents: u64 }
    //!
    //! #[toolbox]
    //! impl FakeBank {
    //!     /// Charge a customer's card.
    //!     #[tool(write, downstream = "keyed")]
    //!     async fn charge(&self, ctx: WriteCtx, args: ChargeArgs) -> Result<u64, ToolError> {
    //!         let mut charges = self.charges.lock().unwrap();
    //!         if !charges.iter().any(|(key, _)| key == ctx.key().as_str()) {
    //!             charges.push((ctx.key().to_string(), args.cents));
    //!         }
    //!         Ok(args.cents)
    //!     }
    //! }
    //!
    //! // In your tests: `#[tokio::test(start_paused = true)]`.
    //! async fn charge_is_exactly_once_under_every_fault() {
    //!     let report = FaultKit::new(json!({ "customer": "acme", "cents": 4900 }), || {
    //!         let bank = Arc::new(FakeBank::default());
    //!         Subject::toolbox(bank.clone(), "charge", move |_key| bank.charges.lock().unwrap().len())
    //!     })
    //!     .changed_args(json!({ "customer": "acme", "cents": 9900 }))
    //!     .run()
    //!     .await
    //!     .expect("the tool registers");
    //!     report.assert_all_pass(); // panics with the table when a fault fails
    //! }
    //! # #[tokio::main(flavor = "current_thread", start_paused = true)]
    //! # async fn main() { charge_is_exactly_once_under_every_fault().await }
    //! ```
    //!
    //! For each [`Fault`] the kit asks for a fresh [`Subject`] (your tool, and a ledger: a
    //! closure that counts the effects your downstream holds for the operation's key, or
    //! the tool's own read-back, [`Subject::counted_by_read_back`]),
    //! registers the tool behind an injector under its own name, so its keys are the ones it
    //! always has, drives the registry through the fault as a model and a harness would,
    //! waits until everything in flight has landed or been dropped, lets a
    //! [`Reconciler`](crate::Reconciler) settle the unknowns, calls once more as the model
    //! would, and counts your ledger. The [`FaultReport`] prints as a table, a row per
    //! fault: the effects counted, what the model was told, the [`Verdict`].
    //!
    //! # Where the faults are injected
    //!
    //! The kit cannot reach into your downstream, so it breaks things at the handler
    //! boundary: it runs your handler and drops its answer (lost ack), starts it past the
    //! timeout (late commit, late tail), runs it twice with the same context (redelivery),
    //! answers for it before or after it ran (timeouts, 5xx, 503 with and without
    //! `Retry-After`, an outage), drops its future mid-way (a crashed worker, restarted on
    //! the same store), and drives the registry the way a model and a harness would (a call
    //! re-issued with a new call id, concurrent copies, changed arguments). Each [`Fault`]
    //! says what it does. Every call of a fault's run carries one intent, so all of them
    //! are one operation, with one key, whatever the arguments.
    //!
    //! # Judgement
    //!
    //! [`Verdict::Pass`] is exactly one effect in your ledger with nothing the model was
    //! told contradicting it: never "failed" or "rejected" (a timeout is *unknown*), never
    //! "completed" before anything happened, never "nothing was done" after something did,
    //! and the call with changed arguments refused. Two verdicts are not failures:
    //!
    //! - [`Verdict::Escalated`]: nobody could tell whether the effect happened (an unkeyed
    //!   downstream without a read-back), so the operation waits for a person and the model
    //!   is told so. A read-back (`reconcile = …`) lets the reconciler settle it instead.
    //! - [`Verdict::NotPreventable`]: a redelivered request reached a downstream with no key
    //!   contract (`downstream = "unkeyed"`) twice and it executed both. No client can
    //!   prevent that: the two copies are one request to everyone but the downstream, which
    //!   is the only party that could tell them apart, by a key. The kit reports it, so the
    //!   table shows what the missing contract costs, instead of failing a tool that is as
    //!   safe as its downstream lets it be.
    //!
    //! [`FaultReport::assert_all_pass`] panics with the table when any row failed;
    //! [`FaultReport::rows`] and [`FaultReport::failures`] give the same without panicking.
    //!
    //! # Time
    //!
    //! Every wait is on tokio's clock, sized from the tool's spec (its timeout, in-flight
    //! bound and lease): a late commit starts half a timeout after the timeout, a crashed
    //! worker restarts once its lease has lapsed, and the kit waits twice the in-flight
    //! bound past the timeout before it reconciles. For an in-process test double, run it
    //! under tokio's paused clock (`#[tokio::test(start_paused = true)]`): those minutes
    //! cost no real time and every run is the same. Against a sandbox on the network, run
    //! it in real time and give the tool a short timeout, in-flight bound and lease of its
    //! own (`timeout = "500ms"`, `in_flight = "1s"`, `lease = "2s"`; the default lease is the
    //! timeout plus 30 s); count the ledger by the key then (each fault's run has its own
    //! key, and [`FaultKit::run_id`] changes them all between runs).
    pub use idem_runtime::fault_kit::{
        Answer, Fault, FaultKit, FaultKitError, FaultReport, Row, Subject, Turn, Verdict,
    };
}

#[cfg(feature = "sqlite")]
pub use idem_sqlite::{SqliteStore, SqliteSync};

/// The SQLite store's builder (feature `sqlite`, the `idem-sqlite` crate); the store is
/// [`SqliteStore`].
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use idem_sqlite::SqliteStoreBuilder;
}

#[cfg(feature = "redis")]
pub use idem_redis::RedisStore;

/// The Redis store's builder and copier (feature `redis`, the `idem-redis` crate); the store
/// is [`RedisStore`].
#[cfg(feature = "redis")]
pub mod redis {
    pub use idem_redis::{RedisCopy, RedisStoreBuilder, DEFAULT_PREFIX};
}

#[cfg(feature = "postgres")]
pub use idem_postgres::PostgresStore;

/// The PostgreSQL store's builder (feature `postgres`, the `idem-postgres` crate); the store,
/// with its transactional handlers, is [`PostgresStore`].
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use idem_postgres::{PostgresStoreBuilder, DEFAULT_SCHEMA};
}

#[cfg(feature = "mcp")]
pub mod mcp;

#[cfg(any(feature = "openai", feature = "anthropic", feature = "async-openai"))]
pub mod providers;

#[cfg(feature = "rig")]
pub mod rig;

/// The serde idem uses (for `#[serde(crate = "idem::serde")]` and friends).
pub use serde;

/// The schemars idem uses.
pub use schemars;

#[doc(hidden)]
pub mod __private {
    pub use idem_runtime;
    pub use schemars;
    pub use serde;
    pub use serde_json;
}

/// The README's quick start, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
