//! What a tool declares about itself: name, description, timeout and, for writes, how its
//! downstream treats idempotency keys.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::Value;

/// Whether a tool reads or changes the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// No effect: runs without a claim, may be retried freely.
    Read,
    /// Has an effect: runs under a claimed idempotency key, at most once per key.
    Write,
}

/// Does the downstream honour idempotency keys?
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Downstream {
    /// The downstream replays the first result for a repeated key (Stripe-style). An
    /// *unknown* attempt may then be retried with the same key inside the safe window.
    Keyed,
    /// The downstream executes every request it receives. An *unknown* attempt is never
    /// retried automatically. The safe assumption, hence the default.
    #[default]
    Unkeyed,
}

/// Default handler timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default safe retry window of a keyed downstream (its key retention, 24 h, minus a margin).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(23 * 3600);

/// Everything a tool declares about itself; built once, when the tool is registered.
///
/// ```
/// # use idem_runtime::tool::{ToolSpec, Downstream};
/// # use std::time::Duration;
/// let spec = ToolSpec::new("charge_card")
///     .description("Charge a customer's card.")
///     .timeout(Duration::from_secs(10))
///     .downstream(Downstream::Keyed)
///     .key_fields(["customer", "invoice"]);
/// assert_eq!(spec.name(), "charge_card");
/// ```
#[derive(Clone, Debug)]
pub struct ToolSpec {
    name: Cow<'static, str>,
    description: Cow<'static, str>,
    timeout: Duration,
    downstream: Downstream,
    window: Duration,
    lease: Option<Duration>,
    destructive: bool,
    key_fields: Vec<Cow<'static, str>>,
    in_flight_bound: Option<Duration>,
    output_schema: Option<Value>,
}

impl ToolSpec {
    /// A spec with the given name and defaults for everything else.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        ToolSpec {
            name: name.into(),
            description: Cow::Borrowed(""),
            timeout: DEFAULT_TIMEOUT,
            downstream: Downstream::Unkeyed,
            window: DEFAULT_WINDOW,
            lease: None,
            destructive: false,
            key_fields: Vec::new(),
            in_flight_bound: None,
            output_schema: None,
        }
    }

    /// How long after its timeout an attempt's effect can still land downstream (the
    /// downstream's own request timeout plus queueing). The executor drops a timed-out
    /// handler this long after its timeout, and a read-back's "not found" only means "did
    /// not happen" once the last attempt's start + timeout + twice this bound has passed.
    /// Without it, "not found" never does, and the reconciler escalates instead.
    pub fn in_flight_bound(mut self, bound: Duration) -> Self {
        self.in_flight_bound = Some(bound);
        self
    }

    /// The declared in-flight bound, if any.
    pub fn in_flight_bound_duration(&self) -> Option<Duration> {
        self.in_flight_bound
    }

    /// The description the model sees.
    pub fn description(mut self, description: impl Into<Cow<'static, str>>) -> Self {
        self.description = description.into();
        self
    }

    /// How long one attempt may run before its outcome is recorded as *unknown*.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether the downstream honours idempotency keys (writes only).
    pub fn downstream(mut self, downstream: Downstream) -> Self {
        self.downstream = downstream;
        self
    }

    /// Safe retry window: how long after the first attempt a retry with the same key is still
    /// deduplicated downstream (writes only).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Lease of a running claim. It is renewed while the handler runs, so only a dead or
    /// stuck worker's claim expires (and becomes *unknown*). Default: the timeout plus 30 s.
    /// At least 10 ms ([`crate::Registry`]'s build refuses less): it is renewed every third
    /// of its length.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Marks the tool destructive (MCP `destructiveHint`).
    pub fn destructive(mut self, destructive: bool) -> Self {
        self.destructive = destructive;
        self
    }

    /// The JSON Schema of the tool's output: what [`crate::tool::output_schema_for`] makes
    /// of the output type. MCP clients get it as the tool's `outputSchema` and the output as
    /// `structuredContent` (see [`crate::definitions::mcp_output_schema`]); the other formats
    /// carry no output schema. `#[tool]` sets it when the output type implements
    /// `JsonSchema`. A value that is not a schema (neither an object nor a boolean) is
    /// ignored by the definitions.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// The output's JSON Schema, if the tool declares one.
    pub fn output_schema_value(&self) -> Option<&Value> {
        self.output_schema.as_ref()
    }

    /// Derive the key from these fields of the arguments instead of the whole arguments.
    pub fn key_fields<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Cow<'static, str>>,
    {
        self.key_fields = fields.into_iter().map(Into::into).collect();
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tool's description.
    pub fn description_text(&self) -> &str {
        &self.description
    }

    /// The per-attempt timeout.
    pub fn timeout_duration(&self) -> Duration {
        self.timeout
    }

    /// The downstream's key contract.
    pub fn downstream_kind(&self) -> Downstream {
        self.downstream
    }

    /// The safe retry window.
    pub fn window_duration(&self) -> Duration {
        self.window
    }

    /// The claim lease (default: timeout + 30 s).
    pub fn lease_duration(&self) -> Duration {
        self.lease
            .unwrap_or_else(|| self.timeout.saturating_add(Duration::from_secs(30)))
    }

    /// Whether the tool is marked destructive.
    pub fn is_destructive(&self) -> bool {
        self.destructive
    }

    /// The `key(…)` fields, empty when the whole arguments are the key material.
    pub fn key_field_names(&self) -> impl Iterator<Item = &str> {
        self.key_fields.iter().map(|s| s.as_ref())
    }

    /// Checks the name: 1–64 characters of `[A-Za-z0-9_-]`.
    pub fn validate_name(name: &str) -> Result<(), String> {
        // The character set first: past it, characters and bytes are the same count.
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(format!(
                "tool name `{name}` contains {c:?}; use only A-Z, a-z, 0-9, `_` and `-`"
            ));
        }
        if name.is_empty() || name.len() > 64 {
            return Err(format!(
                "tool name `{name}` must be 1 to 64 characters long (it is {})",
                name.len()
            ));
        }
        Ok(())
    }
}
