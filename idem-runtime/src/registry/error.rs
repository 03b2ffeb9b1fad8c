//! Why a registry could not be built.

/// Why a registry could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two tools share one name.
    #[error("two tools are named `{0}`; tool names must be unique in a registry")]
    DuplicateName(String),
    /// Two write tools derive their keys under one key name (`ToolSpec::key_name`, by
    /// default the tool's name): their operations would share keys.
    #[error(
        "tools `{}` and `{}` both derive keys under the key name `{key_name}`; key names must \
         be unique among a registry's write tools",
        tools.0,
        tools.1
    )]
    DuplicateKeyName {
        /// The shared key name.
        key_name: String,
        /// The two tools, in registration order.
        tools: (String, String),
    },
    /// A tool name is not 1–64 characters of `[A-Za-z0-9_-]`.
    #[error("{0}")]
    InvalidName(String),
    /// The registry was given a clock that disagrees with its store's: attempts would be
    /// stamped by one time and leases and retention aged by another.
    #[error("{0}")]
    ClockMismatch(String),
    /// A tool's options contradict each other.
    #[error("tool `{tool}`: {message}")]
    InvalidSpec {
        /// The tool.
        tool: String,
        /// What is wrong.
        message: String,
    },
}
