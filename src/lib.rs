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
/// When `T` implements `JsonSchema`, the tool's [`ToolSpec`] carries its schema
/// ([`ToolSpec::output_schema`]): MCP clients get it as `outputSchema` and the output as
/// `structuredContent` (see [`definitions::mcp_output_schema`]); the OpenAI and Anthropic
/// formats have no place for it. When `T` does not, the tool simply has no output schema:
/// the macro detects it rather than asking for an option, so no existing tool needs a change
/// and none breaks. Detection is resolved at compile time by method resolution (an autoref
/// probe, as `key(..)` uses for serde names: a trait implemented for `T: JsonSchema` is found
/// before a fallback implemented for everything one reference further), not by
/// specialization, so it works on stable Rust for the concrete types handlers return.
/// `no_output_schema` leaves it out (for a type whose `Serialize` does not match its
/// `JsonSchema`: clients check structured content against the schema); to give another,
/// implement [`WriteTool`]/[`ReadTool`] by hand.
///
/// The fn becomes `fn charge_card() -> charge_card`, returning the tool (whose type is named
/// like the fn and has a `NAME` constant); `Registry::builder().tool(charge_card)` takes it.
/// The handler itself is reached through [`WriteTool::call`] / [`ReadTool::call`]: in a test,
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
/// | `key(field, …)` | write | key material: these fields of the args (default: all of them) |
/// | `downstream = "keyed"` | write | the downstream honours idempotency keys (default `"unkeyed"`) |
/// | `window = "23h"` | write | safe retry window of a keyed downstream |
/// | `lease = "1m"` | write | claim lease (default: timeout + 30 s) |
/// | `destructive` | write | MCP `destructiveHint` |
/// | `reconcile = find_charge` | write | the read-back the [`Reconciler`] settles unknown and pending calls with: an async fn `(ReadBackCtx, Args) -> Result<ReadBack, ToolError>` (in a `#[toolbox]`, a `&self` method's name) |
/// | `in_flight = "2m"` | write | how long after its timeout a send can still land: a timed-out handler is dropped then, and a read-back's "not found" means "did not happen" only after twice that (default: the registry's `default_in_flight_bound`, else 4 × the timeout between 2 and 30 minutes) |
///
/// Every mistake (a write without `WriteCtx`, an unknown option, `key(nope)`, a bad duration,
/// a name outside the charset, args that do not derive the traits, a return type that is not
/// a `Result`) is a compile error at the offending token saying what to write instead.
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
/// supported: implement the tools for a concrete type.
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
#[doc(inline)]
pub use idem_macros::args;

pub use idem_runtime::*;

/// The SQLite store's crate (`idem-sqlite`, feature `sqlite`): [`SqliteStore`] and its
/// builder.
#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use idem_sqlite as sqlite;
#[cfg(feature = "sqlite")]
pub use idem_sqlite::{SqliteStore, SqliteSync};

/// The Redis store's crate (`idem-redis`, feature `redis`): [`RedisStore`], its builder and
/// [`RedisCopy`](redis::RedisCopy).
#[cfg(feature = "redis")]
#[doc(inline)]
pub use idem_redis as redis;
#[cfg(feature = "redis")]
pub use idem_redis::RedisStore;

/// The PostgreSQL store's crate (`idem-postgres`, feature `postgres`): [`PostgresStore`]
/// (with its transactional handlers) and its builder.
#[cfg(feature = "postgres")]
#[doc(inline)]
pub use idem_postgres as postgres;
#[cfg(feature = "postgres")]
pub use idem_postgres::PostgresStore;

#[cfg(feature = "mcp")]
pub mod mcp;

#[cfg(any(feature = "openai", feature = "anthropic"))]
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
