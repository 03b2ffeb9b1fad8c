//! Support for the code `#[tool]` and `#[toolbox]` generate. Not a public API: the names here
//! may change in any release.
//!
//! The macro recognises the context and return type of a handler by position and shape; the
//! traits below give the type checker the last word. Generated code converts each parameter
//! through them, spanned on the user's own tokens, so a wrong type is an error *at that type*
//! that says what to write instead — an alias of `WriteCtx` passes, a look-alike struct named
//! `WriteCtx` does not.

use std::borrow::Cow;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};

use crate::tool::{
    output_schema_for, DynTool, IntoDynTool, ReadCtx, ToolError, ToolSpec, WriteCtx,
};

/// Implemented only by [`WriteCtx`]: the first parameter of a `#[tool(write)]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `idem::WriteCtx`, the context a `#[tool(write)]` handler takes first",
    label = "expected `WriteCtx` here",
    note = "a write tool needs the `WriteCtx` that carries its idempotency key; write the handler as `async fn name(ctx: WriteCtx, args: Args) -> Result<T, ToolError>`"
)]
pub trait WriteContext: Sized {
    /// Hands the executor's context to the handler.
    fn from_write_ctx(ctx: WriteCtx) -> Self;
}

impl WriteContext for WriteCtx {
    #[inline]
    fn from_write_ctx(ctx: WriteCtx) -> Self {
        ctx
    }
}

/// Implemented only by [`ReadCtx`]: the first parameter of a `#[tool(read)]` handler.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `idem::ReadCtx`, the context a `#[tool(read)]` handler takes first",
    label = "expected `ReadCtx` here",
    note = "a read tool takes `ReadCtx` and sees no idempotency key; write the handler as `async fn name(ctx: ReadCtx, args: Args) -> Result<T, ToolError>`, or make it `#[tool(write)]` if it has an effect"
)]
pub trait ReadContext: Sized {
    /// Hands the executor's context to the handler.
    fn from_read_ctx(ctx: ReadCtx) -> Self;
}

impl ReadContext for ReadCtx {
    #[inline]
    fn from_read_ctx(ctx: ReadCtx) -> Self {
        ctx
    }
}

/// What a handler may return: `Result<T, E>`. `T` is checked by the tool traits (`Serialize`),
/// `E` by [`HandlerError`].
#[diagnostic::on_unimplemented(
    message = "a `#[tool]` handler must return `Result<T, E>`, not `{Self}`",
    label = "expected `Result<T, E>` with `T: Serialize` and `E: Into<ToolError>`",
    note = "write `-> Result<Output, ToolError>`; an error type `E` with `impl From<E> for ToolError` works too"
)]
pub trait HandlerReturn {
    /// The success type: the tool's output.
    type Ok;
    /// The handler's error type.
    type Err;
    /// Converts the handler's result into what the tool traits return.
    fn into_tool_result(self) -> Result<Self::Ok, ToolError>
    where
        Self::Err: HandlerError;
}

impl<T, E> HandlerReturn for Result<T, E> {
    type Ok = T;
    type Err = E;
    #[inline]
    fn into_tool_result(self) -> Result<T, ToolError>
    where
        E: HandlerError,
    {
        self.map_err(HandlerError::into_tool_error)
    }
}

/// An error type a handler may return: anything that converts into [`ToolError`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not convert into `ToolError`, so it cannot be a `#[tool]` handler's error",
    label = "this error type has no `Into<ToolError>`",
    note = "return `ToolError` (e.g. `ToolError::failed(e)`), or add `impl From<{Self}> for ToolError` saying which outcome the error is: rejected, failed, pending or unknown"
)]
pub trait HandlerError {
    /// Converts the error.
    fn into_tool_error(self) -> ToolError;
}

impl<E: Into<ToolError>> HandlerError for E {
    #[inline]
    fn into_tool_error(self) -> ToolError {
        self.into()
    }
}

/// Marker of the [`IntoDynTool`] impl for tool constructors.
pub enum FnMarker {}

/// `#[tool]` turns `fn charge_card(ctx, args)` into `fn charge_card() -> charge_card` (a
/// braced struct, so the name stays free in the value namespace); this impl lets
/// `Registry::builder().tool(charge_card)` take that fn. A unit struct named like the fn
/// would be simpler, but a unit struct is also a pattern: `let charge_card = …;` anywhere in
/// the module would stop compiling.
impl<F, T, M> IntoDynTool<(FnMarker, M)> for F
where
    F: FnOnce() -> T,
    T: IntoDynTool<M>,
{
    fn into_dyn_tool(self) -> DynTool {
        self().into_dyn_tool()
    }
}

/// Marks the stub registration `#[tool]` emits next to a compile error, so that the
/// registration of a broken tool adds no second error.
pub enum Fallback {}

/// Serde's names of an args type's fields, implemented by `#[idem::args]`: `key(customer_id)`
/// names the Rust field, the key reads the serialized property (`customerId` under
/// `#[serde(rename_all = "camelCase")]`).
pub trait ArgsFields {
    /// `(Rust field name, serialized name)` of each named field, flattened ones excepted.
    const FIELDS: &'static [(&'static str, &'static str)];
}

/// Resolves a `key(..)` field of the args type `T` to the property the key reads:
/// `(&KeyName::<T>::new()).key_name("customer_id")`. Method resolution picks
/// [`ByArgsFields`] when `T: ArgsFields` (the type's own serde names) and [`ByFieldName`]
/// otherwise (the Rust name as it is; `Registry::build` then checks it against the schema's
/// properties).
pub struct KeyName<T: ?Sized>(PhantomData<fn() -> PhantomData<T>>);

impl<T: ?Sized> KeyName<T> {
    /// The probe for `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        KeyName(PhantomData)
    }
}

/// The serialized name, for an args type that says its serde names.
pub trait ByArgsFields {
    /// The property `rust` is serialized as.
    fn key_name(&self, rust: &'static str) -> &'static str;
}

impl<T: ArgsFields + ?Sized> ByArgsFields for KeyName<T> {
    fn key_name(&self, rust: &'static str) -> &'static str {
        T::FIELDS
            .iter()
            .find(|(field, _)| *field == rust)
            .map_or(rust, |(_, serialized)| serialized)
    }
}

/// The Rust name, for any other args type.
pub trait ByFieldName {
    /// `rust` itself.
    fn key_name(&self, rust: &'static str) -> &'static str;
}

impl<T: ?Sized> ByFieldName for &KeyName<T> {
    fn key_name(&self, rust: &'static str) -> &'static str {
        rust
    }
}

/// Probes whether a tool's output type `T` has a JSON Schema:
/// `(&OutputSchemaOf::<T>::new()).output_schema()`, with both traits below in scope. Method
/// resolution tries the receiver `&OutputSchemaOf<T>` before auto-referencing it, so it picks
/// [`HasOutputSchema`] (implemented for `OutputSchemaOf<T>` when `T: JsonSchema`) when it
/// applies and [`NoOutputSchema`] (for `&OutputSchemaOf<T>`, any `T`) otherwise. Generated
/// code names a concrete type, so the choice is made at compile time, without specialization,
/// and an output type without `JsonSchema` compiles as before.
pub struct OutputSchemaOf<T: ?Sized>(PhantomData<fn() -> PhantomData<T>>);

impl<T: ?Sized> OutputSchemaOf<T> {
    /// The probe for `T`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        OutputSchemaOf(PhantomData)
    }
}

/// The output schema, for an output type that implements `JsonSchema`.
pub trait HasOutputSchema {
    /// `Some` schema of the output type.
    fn output_schema(&self) -> Option<serde_json::Value>;
}

impl<T: JsonSchema> HasOutputSchema for OutputSchemaOf<T> {
    fn output_schema(&self) -> Option<serde_json::Value> {
        Some(output_schema_for::<T>())
    }
}

/// No output schema, for any other output type.
pub trait NoOutputSchema {
    /// `None`.
    fn output_schema(&self) -> Option<serde_json::Value>;
}

impl<T: ?Sized> NoOutputSchema for &OutputSchemaOf<T> {
    fn output_schema(&self) -> Option<serde_json::Value> {
        None
    }
}

/// `spec` with the output schema the probe found, if any.
pub fn with_output_schema(spec: ToolSpec, schema: Option<serde_json::Value>) -> ToolSpec {
    match schema {
        Some(schema) => spec.output_schema(schema),
        None => spec,
    }
}

/// The arguments of a tool whose handler takes none: accepts `{}` (and `null`, which some
/// clients send for "no arguments"), serializes as `{}`, and has the schema
/// `{"type": "object", "properties": {}}`.
///
/// Unknown fields are ignored, as for any args struct. For a write tool every call in a scope
/// therefore has the same key; give each intended action an intent id to tell them apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NoArgs;

impl serde::Serialize for NoArgs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_map(Some(0))?.end()
    }
}

impl<'de> serde::Deserialize<'de> for NoArgs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NoArgsVisitor;

        impl<'de> Visitor<'de> for NoArgsVisitor {
            type Value = NoArgs;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object (this tool takes no arguments)")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoArgs, A::Error> {
                while map
                    .next_entry::<de::IgnoredAny, de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(NoArgs)
            }

            fn visit_unit<E: de::Error>(self) -> Result<NoArgs, E> {
                Ok(NoArgs)
            }

            fn visit_none<E: de::Error>(self) -> Result<NoArgs, E> {
                Ok(NoArgs)
            }
        }

        deserializer.deserialize_any(NoArgsVisitor)
    }
}

impl JsonSchema for NoArgs {
    fn schema_name() -> Cow<'static, str> {
        Cow::Borrowed("NoArgs")
    }

    fn inline_schema() -> bool {
        true
    }

    /// The schema of `()`, which is how the input schema generator recognises a tool without
    /// arguments: it renders it as `{"type": "object", "properties": {}}` (and drops the
    /// `title` it would otherwise add at the root).
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <()>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::input_schema_for;
    use serde_json::json;

    #[test]
    fn no_args_accepts_empty_object_and_null() {
        assert_eq!(serde_json::from_value::<NoArgs>(json!({})).unwrap(), NoArgs);
        assert_eq!(
            serde_json::from_value::<NoArgs>(json!(null)).unwrap(),
            NoArgs
        );
        assert!(serde_json::from_value::<NoArgs>(json!([1])).is_err());
        assert_eq!(serde_json::to_value(NoArgs).unwrap(), json!({}));
    }

    #[test]
    fn no_args_schema_is_an_empty_object() {
        assert_eq!(
            input_schema_for::<NoArgs>(),
            json!({ "type": "object", "properties": {} })
        );
    }
}
