//! Read-backs: how a write tool looks its own effect up downstream, for the reconciler.

use serde_json::Value;

use crate::identity::{IdemKey, Scope};

/// What a read-back found downstream for one operation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "found", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReadBack {
    /// The tool has no read-back (the default of [`crate::tool::WriteTool::read_back`]).
    Unsupported,
    /// Nothing downstream carries this operation's key or metadata. This only means "did
    /// not happen" once the original attempt can no longer commit (see
    /// [`crate::tool::ToolSpec::in_flight_bound`]).
    NotFound,
    /// The effect exists and succeeded.
    Completed {
        /// The downstream's id for it.
        downstream_ref: Option<String>,
        /// What the handler would have returned (saved and replayed).
        output: Value,
    },
    /// The effect exists and is not terminal yet.
    Pending {
        /// The downstream's id to poll.
        downstream_ref: String,
    },
    /// The effect exists and failed terminally.
    Failed {
        /// The downstream's id for it.
        downstream_ref: Option<String>,
        /// What the downstream said.
        message: String,
    },
    /// More than one effect carries this operation's key or metadata: a person must look.
    Ambiguous {
        /// The downstream ids found.
        downstream_refs: Vec<String>,
    },
    /// Part of a batch is done downstream and part is not (some items charged, the rest
    /// not): a person decides what to do with the rest, and the escalation lists what landed
    /// ([`crate::escalation::Escalation::landed`]).
    Partial {
        /// The parts done downstream: their downstream ids, or what names them.
        landed: Vec<String>,
        /// The parts not done, named the same way.
        left: Vec<String>,
    },
}

impl ReadBack {
    /// A one-line summary for the record's evidence.
    pub fn summary(&self) -> String {
        match self {
            ReadBack::Unsupported => "no read-back".to_owned(),
            ReadBack::NotFound => "not found".to_owned(),
            ReadBack::Completed { downstream_ref, .. } => {
                format!(
                    "found completed {}",
                    downstream_ref.as_deref().unwrap_or("(no ref)")
                )
            }
            ReadBack::Pending { downstream_ref } => format!("found pending {downstream_ref}"),
            ReadBack::Failed {
                downstream_ref,
                message,
            } => format!(
                "found failed {}: {message}",
                downstream_ref.as_deref().unwrap_or("(no ref)")
            ),
            ReadBack::Ambiguous { downstream_refs } => {
                format!(
                    "found {} effects: {}",
                    downstream_refs.len(),
                    downstream_refs.join(", ")
                )
            }
            ReadBack::Partial { landed, left } => format!(
                "found partial: {} landed ({}), {} left ({})",
                landed.len(),
                landed.join(", "),
                left.len(),
                left.join(", ")
            ),
        }
    }
}

/// What a read-back gets to find the effect with.
#[derive(Clone, Debug)]
pub struct ReadBackCtx {
    pub(crate) key: IdemKey,
    pub(crate) scope: Scope,
    pub(crate) downstream_ref: Option<String>,
}

impl ReadBackCtx {
    /// The operation's key (what the handler sent downstream).
    pub fn key(&self) -> &IdemKey {
        &self.key
    }

    /// The scope the operation ran in.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The downstream's id, when an earlier attempt or read-back learned it.
    pub fn downstream_ref(&self) -> Option<&str> {
        self.downstream_ref.as_deref()
    }

    /// A context for unit-testing a read-back directly.
    #[cfg(feature = "testing")]
    pub fn for_test(key: IdemKey, downstream_ref: Option<String>) -> Self {
        ReadBackCtx {
            key,
            scope: Scope::run("test"),
            downstream_ref,
        }
    }
}
