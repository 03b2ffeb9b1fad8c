//! Tools: what a tool declares ([`ToolSpec`]), what its handler receives ([`ReadCtx`],
//! [`WriteCtx`]) and returns ([`ToolError`]), and the traits that tie them together.

mod context;
pub(crate) mod erased;
mod error;
mod read_back;
pub(crate) mod schema;
mod spec;
mod striped;
mod traits;

pub use context::{ReadCtx, WriteCtx};
pub use erased::DynTool;
pub use error::ToolError;
pub use read_back::{ReadBack, ReadBackCtx};
pub use schema::{input_schema_for, output_schema_for};
pub use spec::{
    default_in_flight_bound, Downstream, ToolKind, ToolSpec, DEFAULT_TIMEOUT, DEFAULT_WINDOW,
    MAX_DEFAULT_IN_FLIGHT_BOUND, MIN_DEFAULT_IN_FLIGHT_BOUND,
};
pub use traits::{DynMarker, IntoDynTool, ReadMarker, ReadTool, Toolbox, WriteMarker, WriteTool};
