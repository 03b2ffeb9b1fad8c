//! Expose: the [`Registry`] that dispatches calls by name and exports tool definitions.

mod error;
mod observe;
mod size;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

pub use crate::executor::RetryPolicy;
pub use error::BuildError;
pub use size::MAX_ARGS_DEPTH;

use crate::call::{CallArgs, CallError, ToolCall, ToolResult};
use crate::definitions::{definition, DefinitionOptions, Format};
use crate::escalation::{Escalation, EscalationSink, LogSink, NoticeGate, RedactingSink, Redactor};
use crate::executor::{Executed, Executor};
use crate::identity::{ArgsPath, KeyMigration};
use crate::store::{Clock, IdemStore, Instrumented, MemoryStore, SystemClock};
use crate::tool::erased::{DecodeError, RawArgs};
use crate::tool::{DynTool, IntoDynTool, ToolKind, ToolSpec, Toolbox};

/// Default limit on the size of a call's arguments (JSON text): 1 MiB.
pub const DEFAULT_MAX_ARGS_BYTES: usize = crate::identity::ARGS_BYTES_DEFAULT;

/// How far apart a registry's clock and its store's may read at `build()`: two readings of
/// one clock, or of two system clocks, are milliseconds apart; a test clock left at another
/// time is not.
const CLOCK_TOLERANCE_MS: u64 = 1000;

/// How often the escalation sink hears of refused "same key, changed parameters" repeats of
/// one key: once per hour, the next notice saying how many were held back.
pub const CHANGED_PARAMS_NOTICE_WINDOW: Duration = Duration::from_secs(3600);

/// Default time a duplicate waits for the call that holds its key to finish.
pub const DEFAULT_IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);

/// Dispatches tool calls by name and exports tool definitions.
///
/// Cheap to clone (one `Arc`); share it between tasks.
#[derive(Clone, Debug)]
pub struct Registry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The tools, sorted by name once at `build()`: a call finds its tool by binary search,
    /// comparing names, instead of hashing the name it asked for with a keyed hasher.
    tools: Box<[DynTool]>,
    /// Registration order, for definitions.
    order: Vec<String>,
    /// The store as given; the executor's is the same one behind [`Instrumented`].
    store: Arc<dyn IdemStore>,
    executor: Executor,
    max_args_bytes: usize,
    require_tenant: bool,
    /// The [`RegistryBuilder::redact`] hook, for sinks attached elsewhere
    /// ([`crate::reconcile::Reconciler::sink`]) to be redacted too.
    redact: Option<RedactHook>,
}

/// Builds a [`Registry`]. See [`Registry::builder`].
#[derive(Debug, Default)]
pub struct RegistryBuilder {
    tools: Vec<DynTool>,
    store: Option<Arc<dyn IdemStore>>,
    /// `store`, when it is a [`MemoryStore`] (see the executor's `memory`).
    memory: Option<MemoryStore>,
    clock: Option<Arc<dyn Clock>>,
    retry: Option<RetryPolicy>,
    in_flight_wait: Option<Duration>,
    default_in_flight_bound: Option<Duration>,
    max_args_bytes: Option<usize>,
    sink: Option<Arc<dyn EscalationSink>>,
    redact: Option<RedactHook>,
    require_tenant: bool,
    key_migration: KeyMigration,
}

/// The builder's redaction hook, with a `Debug` that does not try to print a closure.
#[derive(Clone)]
struct RedactHook(Arc<Redactor>);

impl std::fmt::Debug for RedactHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedactHook")
    }
}

impl RegistryBuilder {
    /// Registers a tool: a `#[tool]` fn, a [`crate::tool::ReadTool`] or [`crate::tool::WriteTool`] value,
    /// or a [`DynTool`].
    pub fn tool<M, T: IntoDynTool<M>>(mut self, tool: T) -> Self {
        self.tools.push(tool.into_dyn_tool());
        self
    }

    /// Registers every tool of a toolbox (a `#[toolbox]` impl block).
    pub fn toolbox<B: Toolbox>(mut self, toolbox: Arc<B>) -> Self {
        self.tools.extend(toolbox.tools());
        self
    }

    /// The store claims and results live in (default: a fresh [`MemoryStore`]).
    pub fn store<S: IdemStore>(mut self, store: S) -> Self {
        self.memory = (&store as &dyn std::any::Any)
            .downcast_ref::<MemoryStore>()
            .cloned();
        self.store = Some(Arc::new(store));
        self
    }

    /// A store shared with other registries or with code that inspects it.
    pub fn shared_store(mut self, store: Arc<dyn IdemStore>) -> Self {
        self.store = Some(store);
        self.memory = None;
        self
    }

    /// The clock attempts are stamped and windows measured with. Without it the registry
    /// uses its store's clock ([`IdemStore::clock`]); with it and no store, the default
    /// in-memory store ages by it too. Given both a store and a clock that read different
    /// times (more than a second apart), `build()` refuses them: one clock must reach
    /// everything.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Retries of unknown attempts, for keyed writes and for reads (default: 3 attempts).
    pub fn retry_policy(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// How long a duplicate call waits for the call holding its key (default: 10 s); past it
    /// the duplicate gets [`CallError::InFlight`].
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = Some(wait);
        self
    }

    /// The in-flight bound of every tool that declares none (`in_flight = "…"`,
    /// [`ToolSpec::in_flight_bound`]). Without it each such tool gets
    /// [`crate::tool::default_in_flight_bound`] of its timeout (4 × the timeout, between 2
    /// and 30 minutes).
    ///
    /// A timed-out handler is dropped this long after its timeout, and the
    /// [`crate::reconcile::Reconciler`] built from this registry waits as long for its late result and
    /// twice as long before a read-back's "not found" frees the key
    /// ([`ToolSpec::effective_in_flight_bound`]). Set the same value on every registry that
    /// shares the store, the `idem` CLI's included.
    pub fn default_in_flight_bound(mut self, bound: Duration) -> Self {
        self.default_in_flight_bound = Some(bound);
        self
    }

    /// Where escalations go (default: [`LogSink`], the `tracing` error log). The
    /// [`crate::reconcile::Reconciler`] built from this registry uses it too.
    pub fn escalation_sink(mut self, sink: Arc<dyn EscalationSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Masks what escalations must not carry (arguments, refused arguments, reasons quoting
    /// them) before any sink sees them — the default log, a JSON-lines file, a pager — and
    /// before the [`crate::reconcile::Reconciler`] built from this registry sends its own.
    ///
    /// ```
    /// # use idem_runtime::{identity::CanonicalJson, registry::Registry};
    /// # use serde_json::json;
    /// let registry = Registry::builder()
    ///     .redact(|e| {
    ///         if let Some(op) = e.operation.as_mut() {
    ///             op.args = CanonicalJson::from_value(&json!("[redacted]"));
    ///         }
    ///         e.refused_args = None;
    ///     })
    ///     .build()?;
    /// # Ok::<(), idem_runtime::registry::BuildError>(())
    /// ```
    pub fn redact(mut self, redact: impl Fn(&mut Escalation) + Send + Sync + 'static) -> Self {
        self.redact = Some(RedactHook(Arc::new(redact)));
        self
    }

    /// Refuse every call whose scope names no tenant (default: `false`).
    ///
    /// The key is derived from the call's [`Scope`](crate::identity::Scope): run id, tenant and
    /// principal. [`ToolCall::new`] scopes by run id alone, so two tenants whose hosts happen
    /// to use the same run id (a counter, a conversation number, a resumed checkpoint's id)
    /// derive the same keys in a shared store: one tenant's repeat would be answered with the
    /// other's saved result. With this set, a call without a tenant (or with an empty one) is
    /// refused with [`CallError::InvalidCall`] before anything runs or is claimed, reads
    /// included; give every call its tenant with [`ToolCall::tenant`] (or a whole
    /// [`Scope`](crate::identity::Scope) with [`ToolCall::scope`]). Set it whenever one store serves
    /// several tenants.
    pub fn require_tenant(mut self, require: bool) -> Self {
        self.require_tenant = require;
        self
    }

    /// Limit on a call's arguments as JSON text (default: 1 MiB).
    pub fn max_args_bytes(mut self, limit: usize) -> Self {
        self.max_args_bytes = Some(limit);
        self
    }

    /// Moves this registry's claims from one key format to another (see [`KeyMigration`]).
    ///
    /// Only for an upgrade across a key-format change, and only for its duration: by default
    /// a registry claims under [`crate::identity::KeyFormat::CURRENT`] and honours nothing else. With
    /// a migration it also finds a claim made under the other format's key, so a repeat of
    /// an operation claimed before the upgrade is replayed (or waited for, or refused), never
    /// run again. `docs/keys.md` says how to roll an upgrade out in two phases.
    pub fn key_migration(mut self, migration: KeyMigration) -> Self {
        self.key_migration = migration;
        self
    }

    /// Checks names and options and builds the registry.
    pub fn build(self) -> Result<Registry, BuildError> {
        let mut names = HashSet::with_capacity(self.tools.len());
        let mut key_names = HashMap::with_capacity(self.tools.len());
        let mut tools = Vec::with_capacity(self.tools.len());
        let mut order = Vec::with_capacity(self.tools.len());
        for tool in self.tools {
            let spec = tool.spec();
            ToolSpec::validate_name(spec.name()).map_err(BuildError::InvalidName)?;
            if spec.timeout_duration().is_zero() {
                return Err(BuildError::InvalidSpec {
                    tool: spec.name().to_owned(),
                    message: "timeout must be greater than zero".to_owned(),
                });
            }
            if spec.lease_duration() < MIN_LEASE {
                return Err(BuildError::InvalidSpec {
                    tool: spec.name().to_owned(),
                    message: format!(
                        "lease must be at least {MIN_LEASE:?} (it is renewed every third of \
                         itself while the handler runs; a shorter one would lapse between \
                         renewals under a live handler); got {:?}",
                        spec.lease_duration()
                    ),
                });
            }
            if !tool.takes_object() {
                let kind = tool.input_schema().get("type").cloned().unwrap_or_default();
                return Err(BuildError::InvalidSpec {
                    tool: spec.name().to_owned(),
                    message: format!(
                        "the arguments' JSON Schema has type {kind}, but OpenAI, Anthropic and \
                         MCP take a JSON object: make the arguments a struct (or a map), e.g. \
                         `struct Args {{ text: String }}`"
                    ),
                });
            }
            check_identity_paths(&tool)?;
            let name = spec.name().to_owned();
            if !names.insert(name.clone()) {
                return Err(BuildError::DuplicateName(name));
            }
            if tool.kind() == ToolKind::Write {
                ToolSpec::validate_name(spec.key_name_text()).map_err(|e| {
                    BuildError::InvalidSpec {
                        tool: spec.name().to_owned(),
                        message: format!("key name: {e}"),
                    }
                })?;
                if let Some(other) = key_names.insert(spec.key_name_text().to_owned(), name.clone())
                {
                    return Err(BuildError::DuplicateKeyName {
                        key_name: spec.key_name_text().to_owned(),
                        tools: (other, name),
                    });
                }
            }
            order.push(name);
            tools.push(tool);
        }
        tools.sort_unstable_by(|a, b| a.name().cmp(b.name()));
        let sink: Arc<dyn EscalationSink> = self.sink.unwrap_or_else(|| Arc::new(LogSink));
        let redact = self.redact;
        let sink = RedactingSink::wrap(sink, redact.as_ref().map(|RedactHook(r)| r));
        let mut memory = self.memory;
        let (store, clock) = match (self.store, self.clock) {
            (Some(store), None) => {
                let clock = store.clock();
                (store, clock)
            }
            (Some(store), Some(clock)) => {
                let (ours, theirs) = (clock.now(), store.clock().now());
                if ours.0.abs_diff(theirs.0) > CLOCK_TOLERANCE_MS {
                    return Err(BuildError::ClockMismatch(format!(
                        "the registry's clock reads {ours} and its store's {theirs}; give the \
                         store the clock (the registry then uses the store's) or the same one \
                         to both"
                    )));
                }
                (store, clock)
            }
            (None, clock) => {
                let clock = clock.unwrap_or_else(|| Arc::new(SystemClock));
                let default = MemoryStore::with_clock(clock.clone());
                memory = Some(default.clone());
                let store: Arc<dyn IdemStore> = Arc::new(default);
                (store, clock)
            }
        };
        Ok(Registry {
            inner: Arc::new(Inner {
                tools: tools.into_boxed_slice(),
                order,
                executor: Executor {
                    store: Arc::new(Instrumented::new(store.clone())),
                    clock,
                    retry: self.retry.unwrap_or_default(),
                    in_flight_wait: self.in_flight_wait.unwrap_or(DEFAULT_IN_FLIGHT_WAIT),
                    default_in_flight_bound: self.default_in_flight_bound,
                    sink,
                    notices: Arc::new(NoticeGate::new(CHANGED_PARAMS_NOTICE_WINDOW)),
                    key_migration: self.key_migration,
                    memory,
                },
                max_args_bytes: self.max_args_bytes.unwrap_or(DEFAULT_MAX_ARGS_BYTES),
                require_tenant: self.require_tenant,
                store,
                redact,
            }),
        })
    }
}

/// Key fields and exclusions name parts of the arguments. A part the arguments' schema
/// cannot have (a typo in a hand-written spec, a Rust field name under `#[serde(rename)]`,
/// a pointer one level too deep) would read as null on every call and merge operations that
/// differ, or exclude nothing: refuse it when the registry is built.
fn check_identity_paths(tool: &DynTool) -> Result<(), BuildError> {
    let spec = tool.spec();
    let invalid = |message: String| BuildError::InvalidSpec {
        tool: spec.name().to_owned(),
        message,
    };
    let parse = |option: &str, text: &str| {
        ArgsPath::parse(text).map_err(|e| invalid(format!("{option} field {e}")))
    };
    let keys = spec
        .key_field_names()
        .map(|p| parse("key", p))
        .collect::<Result<Vec<_>, _>>()?;
    let excluded = spec
        .excluded_field_names()
        .map(|p| parse("excluded", p))
        .collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() && excluded.is_empty() {
        return Ok(());
    }
    let schema = tool.input_schema();
    let props = schema.get("properties").and_then(Value::as_object);
    for (option, paths) in [("key", &keys), ("excluded", &excluded)] {
        for path in paths.iter() {
            if schema_admits(schema, schema, path.tokens(), 0) {
                continue;
            }
            let known: Vec<&str> = props
                .map(|p| p.keys().map(String::as_str).collect())
                .unwrap_or_default();
            let top = if known.is_empty() {
                "the arguments have no properties".to_owned()
            } else {
                format!("the arguments have: {}", known.join(", "))
            };
            let what = if path.is_nested() {
                format!(
                    "{option} field `{path}` is not a path the arguments' schema can have ({top})"
                )
            } else {
                format!("{option} field `{path}` is not a property of the arguments ({top})")
            };
            return Err(invalid(format!(
                "{what}; if serde renames that field, derive the args type with \
                 `#[idem::args]`, which tells `key(..)` and `exclude(..)` the name serde \
                 writes (a hand-written spec and a JSON Pointer name the property)"
            )));
        }
    }
    for key in &keys {
        if let Some(out) = excluded.iter().find(|e| key.is_within(e)) {
            return Err(invalid(format!(
                "key field `{key}` lies in excluded `{out}`: excluded parts are not key \
                 material, so it would read as null on every call"
            )));
        }
    }
    Ok(())
}

/// How deep `$ref`s are followed: a recursive type admits every path down to here.
const SCHEMA_REF_DEPTH: usize = 64;

/// Whether a value of `schema` can have something at `tokens` (JSON Pointer reference
/// tokens): through `properties`, `additionalProperties` and `patternProperties` (a map:
/// any member), `items` and `prefixItems` (array indices), `$ref` into the root's `$defs`
/// (or `definitions`), and any branch of `anyOf`, `oneOf` or `allOf`. A schema that
/// constrains nothing (`true`, `{}`) admits every path.
fn schema_admits(schema: &Value, root: &Value, tokens: &[String], depth: usize) -> bool {
    let Some((token, rest)) = tokens.split_first() else {
        return true;
    };
    let map = match schema {
        Value::Bool(b) => return *b,
        Value::Object(map) => map,
        _ => return false,
    };
    if depth > SCHEMA_REF_DEPTH {
        return true;
    }
    if let Some(target) = map.get("$ref").and_then(Value::as_str) {
        let resolved = target
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer));
        if resolved.is_some_and(|s| schema_admits(s, root, tokens, depth + 1)) {
            return true;
        }
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = map.get(combinator).and_then(Value::as_array) {
            if branches
                .iter()
                .any(|b| schema_admits(b, root, tokens, depth + 1))
            {
                return true;
            }
        }
    }
    let sub = |key: &str| map.get(key);
    if let Some(prop) = sub("properties").and_then(|p| p.get(token.as_str())) {
        if schema_admits(prop, root, rest, depth + 1) {
            return true;
        }
    }
    for any_member in ["additionalProperties", "patternProperties"] {
        let Some(member) = sub(any_member) else {
            continue;
        };
        let admits = match (any_member, member) {
            ("patternProperties", Value::Object(patterns)) => patterns
                .values()
                .any(|s| schema_admits(s, root, rest, depth + 1)),
            (_, member) => schema_admits(member, root, rest, depth + 1),
        };
        if admits {
            return true;
        }
    }
    if let Some(index) = crate::identity::array_index(token) {
        let prefix = sub("prefixItems")
            .and_then(Value::as_array)
            .and_then(|p| p.get(index));
        if let Some(item) = prefix.or_else(|| sub("items")) {
            if schema_admits(item, root, rest, depth + 1) {
                return true;
            }
        }
    }
    const CONSTRAINTS: [&str; 12] = [
        "type",
        "properties",
        "additionalProperties",
        "patternProperties",
        "items",
        "prefixItems",
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
        "enum",
        "const",
    ];
    !CONSTRAINTS.iter().any(|k| map.contains_key(*k))
}

impl Registry {
    /// Starts a builder.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The store this registry claims in, as it was given (without the [`Instrumented`]
    /// wrapper the registry's own operations go through).
    pub fn store(&self) -> &Arc<dyn IdemStore> {
        &self.inner.store
    }

    /// The store as the registry's executor and reconciler use it: traced and timed.
    pub(crate) fn observed_store(&self) -> &Arc<dyn IdemStore> {
        &self.inner.executor.store
    }

    /// Where escalations go.
    pub fn escalation_sink(&self) -> &Arc<dyn EscalationSink> {
        &self.inner.executor.sink
    }

    /// `sink`, redacted by the registry's [`RegistryBuilder::redact`] hook when it has one:
    /// every sink escalations reach, however it was attached, gets them redacted.
    pub(crate) fn redacted(&self, sink: Arc<dyn EscalationSink>) -> Arc<dyn EscalationSink> {
        RedactingSink::wrap(sink, self.inner.redact.as_ref().map(|RedactHook(r)| r))
    }

    pub(crate) fn executor(&self) -> &Executor {
        &self.inner.executor
    }

    /// The limit on a call's arguments as JSON text, in bytes
    /// ([`RegistryBuilder::max_args_bytes`], [`DEFAULT_MAX_ARGS_BYTES`] unless set): larger
    /// arguments are refused before anything runs.
    ///
    /// ```
    /// # use idem_runtime::registry::{Registry, DEFAULT_MAX_ARGS_BYTES};
    /// assert_eq!(Registry::builder().build()?.max_args_bytes(), DEFAULT_MAX_ARGS_BYTES);
    /// assert_eq!(Registry::builder().max_args_bytes(4096).build()?.max_args_bytes(), 4096);
    /// # Ok::<(), idem_runtime::registry::BuildError>(())
    /// ```
    pub fn max_args_bytes(&self) -> usize {
        self.inner.max_args_bytes
    }

    /// A registered tool by name.
    pub fn get(&self, name: &str) -> Option<&DynTool> {
        let tools = &self.inner.tools;
        tools
            .binary_search_by(|t| t.name().cmp(name))
            .ok()
            .map(|i| &tools[i])
    }

    /// The registered tools, in registration order.
    pub fn tools(&self) -> impl Iterator<Item = &DynTool> {
        self.inner.order.iter().filter_map(|n| self.get(n))
    }

    /// Tool definitions in `format`, in registration order.
    pub fn definitions(&self, format: Format) -> Vec<Value> {
        self.definitions_with(format, &DefinitionOptions::default())
    }

    /// Tool definitions in `format` with options (e.g. OpenAI strict mode).
    pub fn definitions_with(&self, format: Format, options: &DefinitionOptions) -> Vec<Value> {
        self.tools()
            .map(|t| definition(t, format, options))
            .collect()
    }

    /// Carries out a call: validate, then (writes) claim, run, settle — or replay.
    ///
    /// Never panics and never runs a handler for a call it refuses; see [`ToolResult`].
    pub async fn call(&self, call: ToolCall) -> ToolResult {
        let timer = crate::observe::Timer::start();
        let span = tracing::info_span!(
            "idem.call",
            // The name as asked for, which the model chose: bounded like the error's echo.
            tool = bounded_name(&call.tool),
            // Ids are bounded before validation refuses long ones; this span is opened first.
            run_id = %crate::observe::field(&call.scope.run_id()),
            call_id = %crate::observe::field(&call.call_id.as_deref().unwrap_or("")),
            key = tracing::field::Empty,
            class = tracing::field::Empty,
        );
        // Unobserved (no subscriber wants the span): no span wrapper to poll through.
        let executed = if span.is_disabled() {
            self.dispatch(&call).await
        } else {
            let executed = self.dispatch(&call).instrument(span.clone()).await;
            let class = match &executed.result {
                Ok(o) => o.class().as_str(),
                Err(_) => "refused",
            };
            // The executor records the key on this span as soon as it derives it.
            span.record("class", class);
            executed
        };
        observe::call_finished(&call.tool, &executed, timer);
        if let CallArgs::Value(args) = call.args {
            if executed.result.is_err() {
                // Refused, possibly before its depth was checked (an unknown tool, an
                // invalid call) or for its depth or size: take it apart without recursing.
                size::dispose(args);
            }
        }
        ToolResult {
            tool: call.tool,
            key: executed.key,
            call_id: call.call_id,
            result: executed.result,
            replayed: executed.replayed,
            attempts: executed.attempts,
        }
    }

    async fn dispatch(&self, call: &ToolCall) -> Executed {
        let refused = |e| Executed {
            key: None,
            result: Err(e),
            replayed: false,
            attempts: 0,
        };
        let Some(tool) = self.get(&call.tool) else {
            return refused(CallError::UnknownTool {
                name: echoed_name(&call.tool),
            });
        };
        if let Err(e) = validate_call(call) {
            return refused(e);
        }
        if self.inner.require_tenant && call.scope.tenant().is_none_or(str::is_empty) {
            return refused(CallError::InvalidCall {
                message: "this registry requires a tenant in every call's scope, and this \
                          call has none; nothing was done"
                    .to_owned(),
            });
        }
        let limit = self.inner.max_args_bytes;
        let args = match &call.args {
            CallArgs::Text(text) => {
                if text.len() > limit {
                    return refused(CallError::ArgsTooLarge {
                        size: text.len(),
                        limit,
                    });
                }
                if crate::identity::canonical::nesting_levels(text.as_bytes()) > MAX_ARGS_DEPTH {
                    // Malformed text is told apart (serde_json's parser stops at its own
                    // depth limit, without recursing past it).
                    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                        return refused(CallError::MalformedJson {
                            message: e.to_string(),
                        });
                    }
                    return refused(too_deep(&call.tool));
                }
                // Decoded straight from the text: no `Value` tree is built for a call that
                // decodes (a malformed one is told apart while being refused).
                RawArgs::Text(text)
            }
            CallArgs::Value(v) => {
                match size::check(v, limit) {
                    Ok(()) => {}
                    Err(size::Refused::TooLarge(size)) => {
                        return refused(CallError::ArgsTooLarge { size, limit })
                    }
                    Err(size::Refused::TooDeep) => return refused(too_deep(&call.tool)),
                }
                RawArgs::Value(v)
            }
        };
        // Every registered tool takes an object (`build` refuses the others).
        if let Err(e) = require_object(args, &call.tool) {
            return refused(e);
        }
        let decoded = match tool.decode(args) {
            Ok(d) => d,
            Err(DecodeError::Malformed(message)) => {
                return refused(CallError::MalformedJson { message })
            }
            Err(DecodeError::Invalid(message)) | Err(DecodeError::Identity(message)) => {
                return refused(CallError::InvalidArgs {
                    tool: call.tool.clone(),
                    message,
                })
            }
        };
        match tool.kind() {
            ToolKind::Write => self.inner.executor.write(tool, call, args, decoded).await,
            // Boxed: a read's attempt state (timers, retries) would otherwise sit in every
            // call future, writes and replays included.
            ToolKind::Read => Box::pin(self.inner.executor.read(tool, call, args, decoded)).await,
        }
    }
}

/// The refusal of arguments nested deeper than [`MAX_ARGS_DEPTH`].
fn too_deep(tool: &str) -> CallError {
    CallError::InvalidArgs {
        tool: tool.to_owned(),
        message: format!("arguments nest deeper than {MAX_ARGS_DEPTH} levels"),
    }
}

/// An unknown tool name as the error repeats it: whole when it could be a tool name (at most
/// 64 bytes), else cut there with `…`, so a model's runaway name is not echoed back in full.
fn echoed_name(name: &str) -> String {
    const MAX: usize = 64;
    if name.len() <= MAX {
        return name.to_owned();
    }
    let mut end = MAX;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

/// A requested tool name cut to the longest a tool name can be (64 bytes), for spans: a
/// model's runaway name is not written into every trace in full.
fn bounded_name(name: &str) -> &str {
    crate::observe::prefix(name, 64)
}

/// Refuses arguments that are not a JSON object when the tool's schema asks for one. Serde
/// alone would read an array as a struct's fields by position: `["acme", 4900]` would run,
/// and a struct of two fields of one type (`from`, `to`) would swap them without a word.
/// `null` is left to the arguments' type: a tool without arguments (`()`) takes it, a
/// struct refuses it.
fn require_object(args: RawArgs<'_>, tool: &str) -> Result<(), CallError> {
    let kind = match args {
        RawArgs::Value(v) => match v {
            Value::Object(_) | Value::Null => return Ok(()),
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
        },
        RawArgs::Text(text) => {
            let first = text
                .bytes()
                .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
            if matches!(first, Some(b'{' | b'n')) {
                // Decoding tells a malformed object (or `null`) apart.
                return Ok(());
            }
            // Not an object: malformed JSON is still reported as such.
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                return Err(CallError::MalformedJson {
                    message: e.to_string(),
                });
            }
            match first {
                Some(b't' | b'f') => "a boolean",
                Some(b'"') => "a string",
                Some(b'[') => "an array",
                _ => "a number",
            }
        }
    };
    Err(CallError::InvalidArgs {
        tool: tool.to_owned(),
        message: format!("arguments must be a JSON object, not {kind}"),
    })
}

/// The shortest lease a tool may declare. The executor renews a lease every third of its
/// length; below this, timer and store latency alone would let it lapse under a live handler.
const MIN_LEASE: Duration = Duration::from_millis(10);

/// The longest run id, tenant, principal or intent id a call may carry.
const MAX_ID_BYTES: usize = 1024;

fn validate_call(call: &ToolCall) -> Result<(), CallError> {
    let invalid = |message: &str| {
        Err(CallError::InvalidCall {
            message: message.to_owned(),
        })
    };
    if call.scope.run_id().is_empty() {
        return invalid("the run id is empty; every call needs the id of the run it belongs to");
    }
    // Ids are hashed into the key, but saved with every record and echoed in logs: bound
    // them like the intent id.
    for (what, id) in [
        ("run id", Some(call.scope.run_id())),
        ("tenant", call.scope.tenant()),
        ("principal", call.scope.principal()),
    ] {
        if id.is_some_and(|id| id.len() > MAX_ID_BYTES) {
            return Err(CallError::InvalidCall {
                message: format!("the {what} is longer than {MAX_ID_BYTES} bytes"),
            });
        }
    }
    if let Some(intent) = &call.intent {
        if intent.is_empty() {
            return invalid("the intent id is empty");
        }
        if intent.len() > MAX_ID_BYTES {
            return invalid("the intent id is longer than 1024 bytes");
        }
    }
    Ok(())
}
