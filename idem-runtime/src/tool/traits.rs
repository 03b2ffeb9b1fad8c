//! The typed tool traits users implement (by hand or through `#[tool]`).

use std::future::Future;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::erased::DynTool;
use super::{ReadBack, ReadBackCtx};
use super::{ReadCtx, ToolError, ToolSpec, WriteCtx};

/// A tool without effects: runs without a claim and may be retried freely.
///
/// ```
/// use idem_runtime::tool::{ReadTool, ReadCtx, ToolError, ToolSpec};
///
/// #[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// struct Args { customer: String }
///
/// struct ListCharges;
/// impl ReadTool for ListCharges {
///     type Args = Args;
///     type Output = Vec<u64>;
///     fn spec(&self) -> ToolSpec { ToolSpec::new("list_charges").description("List charges.") }
///     async fn call(&self, _ctx: ReadCtx, _args: Args) -> Result<Vec<u64>, ToolError> {
///         Ok(vec![4900])
///     }
/// }
/// ```
pub trait ReadTool: Send + Sync + 'static {
    /// The arguments, deserialized from the model's JSON.
    type Args: DeserializeOwned + JsonSchema + Serialize + Send + 'static;
    /// The result, serialized to JSON for the model.
    type Output: Serialize + Send + 'static;

    /// Name, description and options; read once, at registration.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool.
    fn call(
        &self,
        ctx: ReadCtx,
        args: Self::Args,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;
}

/// A tool with an effect. It runs only after the executor has claimed its idempotency key,
/// and receives that key in [`WriteCtx`] to pass downstream.
///
/// ```
/// use idem_runtime::tool::{WriteTool, WriteCtx, ToolError, ToolSpec, Downstream};
///
/// #[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
/// struct Args { customer: String, cents: u64 }
///
/// struct Charge;
/// impl WriteTool for Charge {
///     type Args = Args;
///     type Output = String;
///     fn spec(&self) -> ToolSpec {
///         ToolSpec::new("charge").description("Charge a card.").downstream(Downstream::Keyed)
///     }
///     async fn call(&self, ctx: WriteCtx, args: Args) -> Result<String, ToolError> {
///         // billing.create_charge(&args, ctx.key().as_str()).await
///         Ok(format!("ch_{}", &ctx.key().as_str()[5..13]))
///     }
/// }
/// ```
pub trait WriteTool: Send + Sync + 'static {
    /// The arguments, deserialized from the model's JSON.
    type Args: DeserializeOwned + JsonSchema + Serialize + Send + 'static;
    /// The result, serialized to JSON, saved, and replayed to repeats.
    type Output: Serialize + Send + 'static;

    /// Name, description and options; read once, at registration.
    fn spec(&self) -> ToolSpec;

    /// Performs the effect. Pass `ctx.key()` downstream.
    fn call(
        &self,
        ctx: WriteCtx,
        args: Self::Args,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;

    /// Looks the effect of an operation up downstream, by its key or by the metadata the
    /// handler attached. The [`crate::reconcile::Reconciler`] uses it to settle *unknown*
    /// records and to poll *pending* ones. Default: [`ReadBack::Unsupported`].
    fn read_back(
        &self,
        ctx: ReadBackCtx,
        args: Self::Args,
    ) -> impl Future<Output = Result<ReadBack, ToolError>> + Send {
        let _ = (ctx, args);
        async { Ok(ReadBack::Unsupported) }
    }
}

/// A set of tools sharing state (`#[toolbox]` implements it for an impl block).
pub trait Toolbox: Send + Sync + 'static {
    /// The tools, each holding a clone of `self`.
    fn tools(self: Arc<Self>) -> Vec<DynTool>;
}

/// Anything [`crate::registry::RegistryBuilder::tool`] accepts: a [`ReadTool`], a [`WriteTool`] or a
/// [`DynTool`]. The marker parameter keeps the blanket impls apart; callers never name it.
pub trait IntoDynTool<Marker> {
    /// Erases the tool's types.
    fn into_dyn_tool(self) -> DynTool;
}

/// Marker for [`IntoDynTool`] impls of read tools.
#[doc(hidden)]
pub enum ReadMarker {}
/// Marker for [`IntoDynTool`] impls of write tools.
#[doc(hidden)]
pub enum WriteMarker {}
/// Marker for the identity impl of [`DynTool`].
#[doc(hidden)]
pub enum DynMarker {}

impl<T: ReadTool> IntoDynTool<ReadMarker> for T {
    fn into_dyn_tool(self) -> DynTool {
        DynTool::read(self)
    }
}

impl<T: WriteTool> IntoDynTool<WriteMarker> for T {
    fn into_dyn_tool(self) -> DynTool {
        DynTool::write(self)
    }
}

impl IntoDynTool<DynMarker> for DynTool {
    fn into_dyn_tool(self) -> DynTool {
        self
    }
}
