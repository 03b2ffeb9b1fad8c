//! Why a registry could not be built.

/// Why a registry could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Two tools share one name.
    DuplicateName(String),
    /// Two write tools derive their keys under one key name (`ToolSpec::key_name`, by
    /// default the tool's name): their operations would share keys.
    DuplicateKeyName {
        /// The shared key name.
        key_name: String,
        /// The two tools, in registration order.
        tools: (String, String),
    },
    /// A tool name is not 1–64 characters of `[A-Za-z0-9_-]`.
    InvalidName(String),
    /// The registry was given a clock that disagrees with its store's: attempts would be
    /// stamped by one time and leases and retention aged by another.
    ClockMismatch(String),
    /// A tool's options contradict each other.
    InvalidSpec {
        /// The tool.
        tool: String,
        /// What is wrong.
        message: String,
    },
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::DuplicateName(name) => write!(
                f,
                "two tools are named `{name}`; tool names must be unique in a registry"
            ),
            BuildError::DuplicateKeyName { key_name, tools } => write!(
                f,
                "tools `{}` and `{}` both derive keys under the key name `{key_name}`; key names \
                 must be unique among a registry's write tools",
                tools.0, tools.1
            ),
            BuildError::InvalidName(message) | BuildError::ClockMismatch(message) => {
                f.write_str(message)
            }
            BuildError::InvalidSpec { tool, message } => write!(f, "tool `{tool}`: {message}"),
        }
    }
}

impl std::error::Error for BuildError {}
