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

/// The least in-flight bound [`default_in_flight_bound`] gives: 2 minutes.
pub const MIN_DEFAULT_IN_FLIGHT_BOUND: Duration = Duration::from_secs(120);
/// The most in-flight bound [`default_in_flight_bound`] gives: 30 minutes.
pub const MAX_DEFAULT_IN_FLIGHT_BOUND: Duration = Duration::from_secs(30 * 60);

/// The in-flight bound of a tool that declares none, in a registry that sets no default
/// ([`crate::registry::RegistryBuilder::default_in_flight_bound`]): four times the tool's timeout, at
/// least [`MIN_DEFAULT_IN_FLIGHT_BOUND`] (2 min) and at most [`MAX_DEFAULT_IN_FLIGHT_BOUND`]
/// (30 min). With the default 30 s timeout: 2 minutes.
///
/// Why these numbers: the timeout is what the tool's author expects a slow but healthy call
/// to take, so a request still not committed four timeouts later is stuck, not slow. The
/// floor sits above the request timeouts servers and proxies commonly enforce (60 s for
/// nginx and most load balancers, 80 s for Stripe), after which a server has usually given
/// the request up, so a short client timeout does not make the bound shorter than the
/// downstream's own. The ceiling limits how long a stuck handler holds its task and memory,
/// and how long its record waits before a read-back may release it. A downstream that can
/// commit later than this must declare its bound ([`ToolSpec::in_flight_bound`]).
pub fn default_in_flight_bound(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(4)
        .clamp(MIN_DEFAULT_IN_FLIGHT_BOUND, MAX_DEFAULT_IN_FLIGHT_BOUND)
}

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
    excluded: Vec<Cow<'static, str>>,
    key_name: Option<Cow<'static, str>>,
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
            excluded: Vec::new(),
            key_name: None,
            in_flight_bound: None,
            output_schema: None,
        }
    }

    /// How long after its timeout an attempt's effect can still land downstream (the
    /// downstream's own request timeout plus queueing). The executor drops a timed-out
    /// handler this long after its timeout (recording that it gave up on it), and a
    /// read-back's "not found" only means "did not happen" once the last attempt's start +
    /// timeout + twice this bound has passed.
    ///
    /// Undeclared, the registry's default applies
    /// ([`crate::registry::RegistryBuilder::default_in_flight_bound`]), else
    /// [`default_in_flight_bound`] of the timeout; [`ToolSpec::effective_in_flight_bound`]
    /// is the one rule both the executor and the reconciler use. The built-in default is a
    /// guess: under it a read-back's "not found" is escalated to a person instead of freeing
    /// the key, so declare the bound of a tool whose records the reconciler should release.
    pub fn in_flight_bound(mut self, bound: Duration) -> Self {
        self.in_flight_bound = Some(bound);
        self
    }

    /// The declared in-flight bound, if any (see [`ToolSpec::effective_in_flight_bound`]
    /// for the one that applies).
    pub fn in_flight_bound_duration(&self) -> Option<Duration> {
        self.in_flight_bound
    }

    /// The in-flight bound this tool is held to: the declared one; else `registry_default`
    /// (a registry's [`crate::registry::RegistryBuilder::default_in_flight_bound`]); else
    /// [`default_in_flight_bound`] of the timeout.
    ///
    /// The executor drops a timed-out handler this long after its timeout, and the
    /// reconciler waits the same bound for a late result and twice it before a read-back's
    /// "not found" frees the key: both call this, so they cannot disagree in one registry.
    /// Registries sharing a store (a service and the `idem` CLI) should set the same
    /// default.
    ///
    /// ```
    /// # use idem_runtime::tool::ToolSpec;
    /// # use std::time::Duration;
    /// let spec = ToolSpec::new("charge_card").timeout(Duration::from_secs(60));
    /// assert_eq!(spec.effective_in_flight_bound(None), Duration::from_secs(240));
    /// let minute = Duration::from_secs(60);
    /// assert_eq!(spec.effective_in_flight_bound(Some(minute)), minute);
    /// let declared = spec.in_flight_bound(Duration::from_secs(5));
    /// assert_eq!(declared.effective_in_flight_bound(Some(minute)), Duration::from_secs(5));
    /// ```
    pub fn effective_in_flight_bound(&self, registry_default: Option<Duration>) -> Duration {
        self.in_flight_bound
            .or(registry_default)
            .unwrap_or_else(|| default_in_flight_bound(self.timeout))
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
    /// At least 10 ms ([`crate::registry::Registry`]'s build refuses less): it is renewed every third
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

    /// Derive the key from these parts of the arguments instead of the whole arguments: each
    /// a top-level member name (`"customer"`) or, beginning with `/`, a JSON Pointer into
    /// nested values (`"/customer/id"`). A part the arguments lack reads as `null`.
    /// [`crate::registry::RegistryBuilder::build`] refuses a part the arguments' schema
    /// cannot have, and a pointer that is not one.
    pub fn key_fields<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Cow<'static, str>>,
    {
        self.key_fields = fields.into_iter().map(Into::into).collect();
        self
    }

    /// Leave these parts of the arguments (member names or JSON Pointers, as for
    /// [`ToolSpec::key_fields`]) out of the fingerprint and of the key material: a repeat
    /// that differs only there is the same operation, replayed, not refused as changed
    /// parameters. For what does not change the effect, such as a free-text memo. The
    /// claim still saves the whole arguments.
    pub fn exclude_fields<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Cow<'static, str>>,
    {
        self.excluded = fields.into_iter().map(Into::into).collect();
        self
    }

    /// The name keys are derived under, instead of the tool's name (the default): a tool
    /// renamed with its old name as key name finds every operation it claimed before.
    /// Two write tools of one registry cannot share a key name. The same rules as a tool
    /// name apply (1–64 characters of `A-Z a-z 0-9 _ -`).
    pub fn key_name(mut self, key_name: impl Into<Cow<'static, str>>) -> Self {
        self.key_name = Some(key_name.into());
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

    /// The `exclude(…)` fields, empty when the whole arguments are fingerprinted.
    pub fn excluded_field_names(&self) -> impl Iterator<Item = &str> {
        self.excluded.iter().map(|s| s.as_ref())
    }

    /// The name keys are derived under: the declared key name, else the tool's name.
    pub fn key_name_text(&self) -> &str {
        self.key_name.as_deref().unwrap_or(&self.name)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_is_four_timeouts_between_its_floor_and_ceiling() {
        let secs = Duration::from_secs;
        let cases = [
            (secs(1), MIN_DEFAULT_IN_FLIGHT_BOUND),
            (DEFAULT_TIMEOUT, secs(120)),
            (secs(31), secs(124)),
            (secs(300), secs(1200)),
            (secs(450), MAX_DEFAULT_IN_FLIGHT_BOUND),
            (secs(3600), MAX_DEFAULT_IN_FLIGHT_BOUND),
            (Duration::MAX, MAX_DEFAULT_IN_FLIGHT_BOUND),
        ];
        for (timeout, bound) in cases {
            assert_eq!(
                default_in_flight_bound(timeout),
                bound,
                "timeout {timeout:?}"
            );
        }
    }

    #[test]
    fn declared_then_registry_default_then_the_default() {
        let spec = ToolSpec::new("t").timeout(Duration::from_secs(60));
        let registry = Some(Duration::from_secs(9));
        assert_eq!(
            spec.effective_in_flight_bound(None),
            Duration::from_secs(240)
        );
        assert_eq!(
            spec.effective_in_flight_bound(registry),
            Duration::from_secs(9)
        );
        let spec = spec.in_flight_bound(Duration::ZERO);
        assert_eq!(spec.effective_in_flight_bound(registry), Duration::ZERO);
    }
}
