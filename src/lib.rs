//! idem: exactly-once tool calls for Rust AI agents.
#![warn(missing_docs)]

pub use idem_macros::tool;
pub use idem_runtime::*;

#[doc(hidden)]
pub mod __private {
    pub use idem_runtime;
    pub use schemars;
    pub use serde;
    pub use serde_json;
}
