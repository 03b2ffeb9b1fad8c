//! Which run a `tools/call` belongs to, and the `_meta` keys a client may set it with.

use rmcp::model::JsonObject;
use sha2::{Digest, Sha256};

/// `_meta` key of a `tools/call` request naming the run the call belongs to (a string).
///
/// Calls with equal arguments in one run are one operation; set it to the agent run's id
/// (a checkpointed run id survives a restart, a session id does not). Without it the run
/// is the MCP session: the streamable HTTP session, or the connection for stdio.
pub const RUN_KEY: &str = "idem/run";

/// `_meta` key of a `tools/call` request carrying an explicit intent id (a string): the
/// operation's key is derived from it instead of the arguments, so two intended actions
/// with equal arguments stay two, and the same intent sent with other arguments is refused.
pub const INTENT_KEY: &str = "idem/intent";

/// `_meta` key of a `tools/call` result: the outcome class (`completed`, `unknown`, …), or
/// `refused` when the call was not carried out.
pub const OUTCOME_KEY: &str = "idem/outcome";

/// `_meta` key of a `tools/call` result: the operation's idempotency key (writes).
pub const KEY_KEY: &str = "idem/key";

/// `_meta` key of a `tools/call` result: `true` when the result is an earlier call's,
/// replayed without running the handler.
pub const REPLAYED_KEY: &str = "idem/replayed";

/// What a request's `_meta` asks for.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct CallMeta {
    pub(crate) run: Option<String>,
    pub(crate) intent: Option<String>,
}

impl CallMeta {
    /// Reads [`RUN_KEY`] and [`INTENT_KEY`]; a present key must be a non-empty string.
    pub(crate) fn read(meta: &JsonObject) -> Result<CallMeta, String> {
        Ok(CallMeta {
            run: string_field(meta, RUN_KEY)?,
            intent: string_field(meta, INTENT_KEY)?,
        })
    }
}

fn string_field(meta: &JsonObject, key: &str) -> Result<Option<String>, String> {
    match meta.get(key) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(format!("_meta[\"{key}\"] must be a non-empty string")),
    }
}

/// The run id of a streamable HTTP session. The session id is a bearer of the session, so
/// what is saved with records and written to logs is a digest of it, not the id itself.
pub(crate) fn session_run(session_id: &str) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    let mut run = String::with_capacity(12 + 32);
    run.push_str("mcp-session-");
    for byte in &digest[..16] {
        run.push_str(&format!("{byte:02x}"));
    }
    run
}

/// A fresh run id for one connection (stdio, or any transport without sessions).
pub(crate) fn connection_run() -> String {
    format!("mcp-conn-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> JsonObject {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn reads_run_and_intent() {
        let meta = CallMeta::read(&obj(json!({"idem/run": "r1", "idem/intent": "i1", "x": 1})));
        assert_eq!(
            meta,
            Ok(CallMeta {
                run: Some("r1".into()),
                intent: Some("i1".into())
            })
        );
        assert_eq!(CallMeta::read(&obj(json!({}))), Ok(CallMeta::default()));
    }

    #[test]
    fn refuses_a_run_that_is_not_a_string() {
        for bad in [json!(7), json!(""), json!(null), json!({"a": 1})] {
            let err = CallMeta::read(&obj(json!({ "idem/run": bad }))).unwrap_err();
            assert!(err.contains("idem/run"), "{err}");
        }
        assert!(CallMeta::read(&obj(json!({"idem/intent": false}))).is_err());
    }

    #[test]
    fn session_runs_are_digests_and_distinct() {
        let a = session_run("0b6b9e2e-session-a");
        assert_eq!(a, session_run("0b6b9e2e-session-a"));
        assert_ne!(a, session_run("0b6b9e2e-session-b"));
        assert!(!a.contains("session-a"));
        assert_eq!(a.len(), "mcp-session-".len() + 32);
        assert_ne!(connection_run(), connection_run());
    }
}
