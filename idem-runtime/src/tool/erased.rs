//! The type-erased tool the registry stores.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::striped::Striped;
use super::{input_schema_for, ReadBack, ReadBackCtx};
use super::{ReadCtx, ReadTool, ToolError, ToolKind, ToolSpec, WriteCtx, WriteTool};
use crate::identity::canonical::nesting_levels;
use crate::identity::{
    identify_with, ArgsIdentity, CanonicalJson, IdentityRules, ARGS_DEPTH_LIMIT,
};

/// A boxed future, `Send`: what a type-erased tool's handler returns.
pub(crate) type BoxFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A registered tool with its types erased: what [`crate::registry::Registry`] stores and dispatches to.
///
/// Built from any [`ReadTool`] or [`WriteTool`] (see [`DynTool::read`], [`DynTool::write`]);
/// the spec is read and the input schema generated once, here.
#[derive(Clone)]
pub struct DynTool {
    /// The handler, striped: every call clones it into its attempt's future.
    inner: Striped<dyn ErasedTool>,
    spec: Arc<ToolSpec>,
    /// The spec's name, shared: every claim, record and context of a call names the tool,
    /// and a clone of this costs no allocation (and, striped, no cache line two cores
    /// fight over).
    name: Striped<str>,
    /// The key paths and exclusions, parsed once (`Registry::build` refuses a tool whose
    /// spec names a path that does not parse, so none is lost here for a call).
    rules: Arc<IdentityRules>,
    kind: ToolKind,
    schema: Arc<Value>,
    /// The schema's root is `"type": "object"`: callers must send a JSON object.
    takes_object: bool,
}

impl fmt::Debug for DynTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynTool")
            .field("name", &self.spec.name())
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// A call's arguments as they arrived: the caller's JSON value, or JSON text (the model's, or
/// the canonical text saved with a claim). Text is decoded straight into the tool's `Args`,
/// without building a `Value` first.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawArgs<'a> {
    Value(&'a Value),
    Text(&'a str),
}

impl<'a> From<&'a Value> for RawArgs<'a> {
    fn from(v: &'a Value) -> Self {
        RawArgs::Value(v)
    }
}

impl<'a> From<&'a CanonicalJson> for RawArgs<'a> {
    fn from(j: &'a CanonicalJson) -> Self {
        RawArgs::Text(j.as_str())
    }
}

/// Arguments decoded into the tool's `Args` type, with their identity (writes only).
pub(crate) struct Decoded {
    pub(crate) identity: Option<ArgsIdentity>,
    pub(crate) typed: Box<dyn Any + Send>,
}

pub(crate) enum Ctx {
    Read(ReadCtx),
    Write(WriteCtx),
}

/// Why arguments were refused before anything ran.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// The text is not JSON.
    Malformed(String),
    /// Did not deserialize into the tool's `Args`.
    Invalid(String),
    /// Deserialized, but gave no identity (e.g. `key(…)` on a non-object).
    Identity(String),
}

pub(crate) trait ErasedTool: Send + Sync + 'static {
    fn read_back(
        self: Arc<Self>,
        ctx: ReadBackCtx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<ReadBack, ToolError>>;
    fn decode(
        &self,
        args: RawArgs<'_>,
        rules: &IdentityRules,
        write: bool,
    ) -> Result<Decoded, DecodeError>;
    fn invoke(
        self: Arc<Self>,
        ctx: Ctx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<Value, ToolError>>;
}

fn decode_typed<A>(
    args: RawArgs<'_>,
    rules: &IdentityRules,
    write: bool,
) -> Result<Decoded, DecodeError>
where
    A: serde::de::DeserializeOwned + serde::Serialize + Send + 'static,
{
    let typed: A = match args {
        RawArgs::Value(v) => decode_value(v)?,
        RawArgs::Text(text) => match serde_json::from_str::<A>(text) {
            Ok(t) => t,
            // Anything else that went wrong, the value path decides, so text and value calls
            // are refused (or accepted) alike: malformed JSON, `{}` for `()`.
            Err(typed_err) => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| DecodeError::Malformed(e.to_string()))?;
                // One of the args' fields given twice: which one the model meant is anyone's
                // guess (parsers disagree: first or last), so serde's refusal stands. A value
                // cannot carry it: whoever parsed it into one has already picked.
                if duplicate_field(&typed_err) {
                    return Err(DecodeError::Invalid(typed_err.to_string()));
                }
                decode_value(&v)?
            }
        },
    };
    let identity = if write {
        let identity =
            identify_with(&typed, rules).map_err(|e| DecodeError::Identity(e.to_string()))?;
        // The saved operation holds these bytes: deeper than the limit, they might not read
        // back (text decodes to 128 levels, and an `Args` type may serialize deeper than it
        // reads), so the call is refused before it claims.
        if nesting_levels(&identity.canonical) > ARGS_DEPTH_LIMIT {
            return Err(DecodeError::Invalid(format!(
                "arguments nest deeper than {ARGS_DEPTH_LIMIT} levels"
            )));
        }
        Some(identity)
    } else {
        None
    };
    Ok(Decoded {
        identity,
        typed: Box::new(typed),
    })
}

/// Serde's "duplicate field" error (`serde::de::Error::duplicate_field`), which derived
/// `Deserialize` impls raise for a field named twice, at any depth of the args' own types.
fn duplicate_field(e: &serde_json::Error) -> bool {
    e.classify() == serde_json::error::Category::Data
        && e.to_string().starts_with("duplicate field `")
}

fn decode_value<A: serde::de::DeserializeOwned + 'static>(args: &Value) -> Result<A, DecodeError> {
    match A::deserialize(args) {
        Ok(t) => Ok(t),
        // A tool without arguments (`Args = ()`) advertises an empty object schema, which
        // allows any members; models send `{}` (or stray members), which serde's unit does not
        // accept. Only on that failure path, try null: the members are ignored, as an args
        // struct ignores unknown fields and as the macro's no-argument tools do. (Any other
        // type that reads null, an `Option`, gets that only for `{}`: a non-empty object that
        // does not decode is its caller's mistake, not "no arguments".)
        Err(_)
            if args.as_object().is_some_and(|m| {
                m.is_empty() || std::any::TypeId::of::<A>() == std::any::TypeId::of::<()>()
            }) && A::deserialize(&Value::Null).is_ok() =>
        {
            A::deserialize(&Value::Null).map_err(|e| DecodeError::Invalid(e.to_string()))
        }
        // An integer field given as a float with no fraction (`2.0`): JSON Schema's
        // `"integer"`, which the input schema advertises, allows it, and models send it;
        // serde refuses it. Only on that failure path, try the value with such floats written
        // as integers. The identity comes from the decoded args, so `2.0` and `2` are one
        // operation. If that fails too, its error is the one to report: the conversion only
        // makes values more acceptable, so it is at least as close to the cause, and for a
        // whole float the type cannot hold (`3e9` for an `i32`) it names the range
        // ("integer `3000000000`, expected i32") where the first said "floating point",
        // which would send the model to retry with `3000000000`.
        Err(e) => match integral_floats_as_integers(args) {
            Some(v) => A::deserialize(&v).map_err(|e| DecodeError::Invalid(e.to_string())),
            None => Err(DecodeError::Invalid(e.to_string())),
        },
    }
}

/// `value` with every float that is a whole number of magnitude below 2^53 (so exactly an
/// integer) written as that integer; `None` when it holds no such float.
fn integral_floats_as_integers(value: &Value) -> Option<Value> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let f = n.as_f64()?;
            if f.fract() == 0.0 && f.abs() < EXACT {
                Some(Value::from(f as i64))
            } else {
                None
            }
        }
        Value::Array(items) => {
            let converted: Vec<Option<Value>> =
                items.iter().map(integral_floats_as_integers).collect();
            if converted.iter().all(Option::is_none) {
                return None;
            }
            Some(Value::Array(
                converted
                    .into_iter()
                    .zip(items)
                    .map(|(c, v)| c.unwrap_or_else(|| v.clone()))
                    .collect(),
            ))
        }
        Value::Object(members) => {
            let mut changed = false;
            let out = members
                .iter()
                .map(|(k, v)| {
                    let v = match integral_floats_as_integers(v) {
                        Some(c) => {
                            changed = true;
                            c
                        }
                        None => v.clone(),
                    };
                    (k.clone(), v)
                })
                .collect();
            changed.then_some(Value::Object(out))
        }
        _ => None,
    }
}

fn output_to_value<O: serde::Serialize + 'static>(tool: &str, output: O) -> Value {
    // An output that already is a `Value` (a handler returning `serde_json::Value`) is taken
    // as it is: serializing it into a new one would copy every node of it.
    let mut output = Some(output);
    if let Some(value) = (&mut output as &mut dyn Any)
        .downcast_mut::<Option<Value>>()
        .and_then(Option::take)
    {
        return crate::identity::output_to_keep(value, tool);
    }
    let Some(output) = output else {
        return Value::Null;
    };
    // The effect has happened; the record must still say "completed". Where the output
    // cannot be kept we keep a null result rather than pretend the call failed, and make the
    // bug loud.
    match serde_json::to_value(output) {
        Ok(v) => crate::identity::output_to_keep(v, tool),
        Err(e) => {
            tracing::error!(tool, error = %crate::observe::field(&e), "tool output does not serialize to JSON; saving null");
            Value::Null
        }
    }
}

fn wrong_args_type(tool: &str) -> ToolError {
    // Unreachable while `decode` and `invoke` come from one `DynTool`; if it ever happens,
    // the handler has not run, so "rejected before execution" is the truth.
    ToolError::rejected(format!(
        "internal error: arguments of another type reached `{tool}`"
    ))
}

// The tool is shared by the stripes of one `DynTool`, each stripe an adapter of its own.
struct ReadAdapter<T>(Arc<T>, Arc<ToolSpec>);
struct WriteAdapter<T>(Arc<T>, Arc<ToolSpec>);

impl<T: ReadTool> ErasedTool for ReadAdapter<T> {
    fn read_back(
        self: Arc<Self>,
        _ctx: ReadBackCtx,
        _args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<ReadBack, ToolError>> {
        Box::pin(async { Ok(ReadBack::Unsupported) })
    }

    fn decode(
        &self,
        args: RawArgs<'_>,
        rules: &IdentityRules,
        write: bool,
    ) -> Result<Decoded, DecodeError> {
        decode_typed::<T::Args>(args, rules, write)
    }

    fn invoke(
        self: Arc<Self>,
        ctx: Ctx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(async move {
            let (Ctx::Read(ctx), Ok(args)) = (ctx, args.downcast::<T::Args>()) else {
                return Err(wrong_args_type(self.1.name()));
            };
            let out = self.0.call(ctx, *args).await?;
            Ok(output_to_value(self.1.name(), out))
        })
    }
}

impl<T: WriteTool> ErasedTool for WriteAdapter<T> {
    fn read_back(
        self: Arc<Self>,
        ctx: ReadBackCtx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<ReadBack, ToolError>> {
        Box::pin(async move {
            let Ok(args) = args.downcast::<T::Args>() else {
                return Err(wrong_args_type(self.1.name()));
            };
            self.0.read_back(ctx, *args).await
        })
    }

    fn decode(
        &self,
        args: RawArgs<'_>,
        rules: &IdentityRules,
        write: bool,
    ) -> Result<Decoded, DecodeError> {
        decode_typed::<T::Args>(args, rules, write)
    }

    fn invoke(
        self: Arc<Self>,
        ctx: Ctx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(async move {
            let (Ctx::Write(ctx), Ok(args)) = (ctx, args.downcast::<T::Args>()) else {
                return Err(wrong_args_type(self.1.name()));
            };
            let out = self.0.call(ctx, *args).await?;
            Ok(output_to_value(self.1.name(), out))
        })
    }
}

impl DynTool {
    /// Erases a read tool.
    pub fn read<T: ReadTool>(tool: T) -> DynTool {
        let spec = Arc::new(tool.spec());
        let schema = Arc::new(input_schema_for::<T::Args>());
        let tool = Arc::new(tool);
        DynTool::assemble(
            Striped::new(|| -> Arc<dyn ErasedTool> {
                Arc::new(ReadAdapter(Arc::clone(&tool), spec.clone()))
            }),
            spec,
            ToolKind::Read,
            schema,
        )
    }

    /// Erases a write tool.
    pub fn write<T: WriteTool>(tool: T) -> DynTool {
        let spec = Arc::new(tool.spec());
        let schema = Arc::new(input_schema_for::<T::Args>());
        let tool = Arc::new(tool);
        DynTool::assemble(
            Striped::new(|| -> Arc<dyn ErasedTool> {
                Arc::new(WriteAdapter(Arc::clone(&tool), spec.clone()))
            }),
            spec,
            ToolKind::Write,
            schema,
        )
    }

    fn assemble(
        inner: Striped<dyn ErasedTool>,
        spec: Arc<ToolSpec>,
        kind: ToolKind,
        schema: Arc<Value>,
    ) -> DynTool {
        let valid = |p: &&str| crate::identity::ArgsPath::parse(p).is_ok();
        let rules = IdentityRules::new(
            spec.key_field_names().filter(valid),
            spec.excluded_field_names().filter(valid),
        )
        .unwrap_or_default();
        let takes_object = schema.get("type").and_then(Value::as_str) == Some("object");
        DynTool {
            inner,
            name: Striped::new(|| Arc::from(spec.name())),
            spec,
            rules: Arc::new(rules),
            kind,
            schema,
            takes_object,
        }
    }

    /// The tool's spec.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        self.spec.name()
    }

    /// The name its keys are derived under ([`ToolSpec::key_name_text`]).
    pub fn key_name(&self) -> &str {
        self.spec.key_name_text()
    }

    /// The tool's name, shared (a clone is a reference count, of this thread's stripe).
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        self.name.local()
    }

    /// Read or write.
    pub fn kind(&self) -> ToolKind {
        self.kind
    }

    /// The JSON Schema of the arguments (root `"type": "object"`, no `$schema`, no `$ref`
    /// where it could be inlined), generated once.
    pub fn input_schema(&self) -> &Value {
        &self.schema
    }

    /// True when the advertised schema asks for a JSON object (every struct, map and enum
    /// of arguments, and `()`), so a caller's array or scalar is refused before decoding.
    pub(crate) fn takes_object(&self) -> bool {
        self.takes_object
    }

    pub(crate) fn decode<'a>(&self, args: impl Into<RawArgs<'a>>) -> Result<Decoded, DecodeError> {
        self.inner
            .any()
            .decode(args.into(), &self.rules, self.kind == ToolKind::Write)
    }

    pub(crate) fn read_back(
        &self,
        ctx: ReadBackCtx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<ReadBack, ToolError>> {
        Arc::clone(self.inner.local()).read_back(ctx, args)
    }

    pub(crate) fn invoke(
        &self,
        ctx: Ctx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        Arc::clone(self.inner.local()).invoke(ctx, args)
    }
}

/// A hook around a write tool's handler: what the fault kit
/// ([`crate::fault_kit`]) puts between the executor and the user's tool. It sees each
/// attempt the executor runs and decides whether the handler runs, and how often.
#[cfg(feature = "testing")]
pub(crate) trait Intercept: Send + Sync + 'static {
    /// Runs one attempt of the executor (see [`Attempt`]).
    fn attempt(self: Arc<Self>, attempt: Attempt) -> BoxFuture<'static, Result<Value, ToolError>>;
}

/// One attempt as an [`Intercept`] gets it: the tool's own handler with its context and
/// two copies of the arguments (decoded twice from the same JSON, so `Args` need not be
/// `Clone`), to run once, twice, or not at all.
#[cfg(feature = "testing")]
pub(crate) struct Attempt {
    tool: Arc<dyn ErasedTool>,
    ctx: WriteCtx,
    args: Box<dyn Any + Send>,
    copy: Box<dyn Any + Send>,
}

#[cfg(feature = "testing")]
impl Attempt {
    /// Runs the handler once.
    pub(crate) fn run(self) -> BoxFuture<'static, Result<Value, ToolError>> {
        self.tool.invoke(Ctx::Write(self.ctx), self.args)
    }

    /// The handler twice, with the same context and equal arguments: a redelivered request.
    pub(crate) fn run_twice(self) -> (HandlerFuture, HandlerFuture) {
        let first = Arc::clone(&self.tool).invoke(Ctx::Write(self.ctx.clone()), self.args);
        let second = self.tool.invoke(Ctx::Write(self.ctx), self.copy);
        (first, second)
    }
}

/// A run of the handler, as [`Attempt::run_twice`] hands it out.
#[cfg(feature = "testing")]
pub(crate) type HandlerFuture = BoxFuture<'static, Result<Value, ToolError>>;

/// Arguments decoded twice: the handler's, and the copy a redelivery runs with.
#[cfg(feature = "testing")]
struct Twice(Box<dyn Any + Send>, Box<dyn Any + Send>);

/// A write tool whose handler runs behind an [`Intercept`]; decoding and read-back are the
/// tool's own.
#[cfg(feature = "testing")]
struct Intercepted {
    tool: Arc<dyn ErasedTool>,
    name: Arc<str>,
    hook: Arc<dyn Intercept>,
}

#[cfg(feature = "testing")]
impl ErasedTool for Intercepted {
    fn read_back(
        self: Arc<Self>,
        ctx: ReadBackCtx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<ReadBack, ToolError>> {
        match args.downcast::<Twice>() {
            Ok(twice) => Arc::clone(&self.tool).read_back(ctx, twice.0),
            Err(_) => Box::pin(async move { Err(wrong_args_type(&self.name)) }),
        }
    }

    fn decode(
        &self,
        args: RawArgs<'_>,
        rules: &IdentityRules,
        write: bool,
    ) -> Result<Decoded, DecodeError> {
        let first = self.tool.decode(args, rules, write)?;
        let copy = self.tool.decode(args, rules, false)?;
        Ok(Decoded {
            identity: first.identity,
            typed: Box::new(Twice(first.typed, copy.typed)),
        })
    }

    fn invoke(
        self: Arc<Self>,
        ctx: Ctx,
        args: Box<dyn Any + Send>,
    ) -> BoxFuture<'static, Result<Value, ToolError>> {
        let (Ctx::Write(ctx), Ok(twice)) = (ctx, args.downcast::<Twice>()) else {
            return Box::pin(async move { Err(wrong_args_type(&self.name)) });
        };
        let Twice(args, copy) = *twice;
        Arc::clone(&self.hook).attempt(Attempt {
            tool: Arc::clone(&self.tool),
            ctx,
            args,
            copy,
        })
    }
}

#[cfg(feature = "testing")]
impl DynTool {
    /// This write tool with every attempt of its handler passed through `hook`; same spec,
    /// schema, key fields and read-back, so it claims the same keys. `None` for a read tool.
    pub(crate) fn intercepted(&self, hook: Arc<dyn Intercept>) -> Option<DynTool> {
        if self.kind != ToolKind::Write {
            return None;
        }
        let erased: Arc<dyn ErasedTool> = Arc::new(Intercepted {
            tool: Arc::clone(self.inner.local()),
            name: Arc::from(self.spec.name()),
            hook,
        });
        Some(DynTool {
            inner: Striped::new(|| Arc::clone(&erased)),
            ..self.clone()
        })
    }
}
