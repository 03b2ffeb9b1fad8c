//! Which run and intent a `tools/call` belongs to, and the `_meta` keys (and HTTP header) a
//! client may set them with.

use rmcp::model::JsonObject;

/// `_meta` key of a `tools/call` request naming the run the call belongs to (a string of
/// at most [`MAX_RUN_BYTES`]).
///
/// Honoured only on a server that turned client-named runs on
/// ([`McpServer::client_runs`](super::McpServer::client_runs)); elsewhere a call naming one
/// is refused. A named run lives in a namespace of its own, apart from the run the server
/// gives its callers, and within the caller's scope: naming another caller's run reaches
/// nothing of theirs.
pub const RUN_KEY: &str = "idem/run";

/// `_meta` key of a `tools/call` request carrying an explicit intent id (a string of at most
/// [`MAX_INTENT_BYTES`]): the operation's key is derived from it, within the caller's scope,
/// instead of the arguments, so two intended actions with equal arguments stay two, and the
/// same intent sent with other arguments is refused.
pub const INTENT_KEY: &str = "idem/intent";

/// `_meta` key of a `tools/call` request carrying a client's idempotency key: the same as
/// [`INTENT_KEY`] (the spelling MCP's idempotency proposal used).
pub const IDEMPOTENCY_KEY_META: &str = "idempotencyKey";

/// HTTP header of a streamable HTTP `tools/call` request carrying a client's idempotency key
/// (the IETF `Idempotency-Key` header): the same as [`INTENT_KEY`].
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// The longest run a client may name, in bytes.
pub const MAX_RUN_BYTES: usize = 128;

/// The longest intent id or idempotency key a client may send, in bytes.
pub const MAX_INTENT_BYTES: usize = 256;

/// The longest JSON-RPC request id a `tools/call` may carry, in bytes (as JSON text).
pub const MAX_CALL_ID_BYTES: usize = 128;

/// The run of every call whose client names none: calls are repeats of one another when
/// their caller (tenant, principal), tool and arguments (or intent) are equal, whatever
/// connection, session or server process they came through.
pub(crate) const CALLER_RUN: &str = "mcp/caller";

/// Where client-named runs live: `mcp/client/<name>`, never equal to [`CALLER_RUN`].
const CLIENT_RUN_PREFIX: &str = "mcp/client/";

/// `_meta` key of a `tools/call` result: the outcome class (`completed`, `unknown`, …), or
/// `refused` when the call was not carried out.
pub const OUTCOME_KEY: &str = "idem/outcome";

/// `_meta` key of a `tools/call` result: the operation's idempotency key (writes).
pub const KEY_KEY: &str = "idem/key";

/// `_meta` key of a `tools/call` result: `true` when the result is an earlier call's,
/// replayed without running the handler.
pub const REPLAYED_KEY: &str = "idem/replayed";

/// What a request's `_meta` (and, over HTTP, its `Idempotency-Key` header) asks for.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct CallMeta {
    /// The client-named run, as sent (see [`client_run`]).
    pub(crate) run: Option<String>,
    /// The intent id every client-supplied key agreed on.
    pub(crate) intent: Option<String>,
}

impl CallMeta {
    /// Reads [`RUN_KEY`], [`INTENT_KEY`], [`IDEMPOTENCY_KEY_META`] and the header value
    /// `header`; a present one must be a non-empty string within its bound, and the intent
    /// sources that are present must agree. The messages never echo a value sent.
    pub(crate) fn read(meta: &JsonObject, header: Option<&[u8]>) -> Result<CallMeta, String> {
        let run = string_field(meta, RUN_KEY, MAX_RUN_BYTES)?;
        let mut intent: Option<(String, &str)> = None;
        let header = match header {
            None => None,
            Some(bytes) => match std::str::from_utf8(bytes) {
                Ok(s) if !s.is_empty() && s.len() <= MAX_INTENT_BYTES => Some(s.to_owned()),
                _ => {
                    return Err(format!(
                        "the Idempotency-Key header must be 1 to {MAX_INTENT_BYTES} bytes of text"
                    ))
                }
            },
        };
        let sources = [
            (
                string_field(meta, INTENT_KEY, MAX_INTENT_BYTES)?,
                "_meta[\"idem/intent\"]",
            ),
            (
                string_field(meta, IDEMPOTENCY_KEY_META, MAX_INTENT_BYTES)?,
                "_meta[\"idempotencyKey\"]",
            ),
            (header, "the Idempotency-Key header"),
        ];
        for (value, name) in sources {
            let Some(value) = value else { continue };
            match &intent {
                Some((seen, from)) if *seen != value => {
                    return Err(format!(
                        "{from} and {name} name different operations; nothing was run. \
                         Send one idempotency key (or equal ones)."
                    ))
                }
                Some(_) => {}
                None => intent = Some((value, name)),
            }
        }
        Ok(CallMeta {
            run,
            intent: intent.map(|(value, _)| value),
        })
    }
}

fn string_field(meta: &JsonObject, key: &str, max: usize) -> Result<Option<String>, String> {
    match meta.get(key) {
        None => Ok(None),
        Some(serde_json::Value::String(s)) if !s.is_empty() && s.len() <= max => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(format!(
            "_meta[\"{key}\"] must be a string of 1 to {max} bytes"
        )),
    }
}

/// The run of a call whose client named `name`, in the namespace of client-named runs.
pub(crate) fn client_run(name: &str) -> String {
    format!("{CLIENT_RUN_PREFIX}{name}")
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
        let meta = CallMeta::read(
            &obj(json!({"idem/run": "r1", "idem/intent": "i1", "x": 1})),
            None,
        );
        assert_eq!(
            meta,
            Ok(CallMeta {
                run: Some("r1".into()),
                intent: Some("i1".into())
            })
        );
        assert_eq!(
            CallMeta::read(&obj(json!({})), None),
            Ok(CallMeta::default())
        );
    }

    #[test]
    fn every_idempotency_key_spelling_is_an_intent() {
        let from_meta = CallMeta::read(&obj(json!({"idempotencyKey": "k"})), None).unwrap();
        let from_header = CallMeta::read(&obj(json!({})), Some(b"k")).unwrap();
        let all = CallMeta::read(
            &obj(json!({"idempotencyKey": "k", "idem/intent": "k"})),
            Some(b"k"),
        )
        .unwrap();
        for meta in [from_meta, from_header, all] {
            assert_eq!(meta.intent.as_deref(), Some("k"));
        }
    }

    #[test]
    fn disagreeing_keys_are_refused() {
        let err = CallMeta::read(&obj(json!({"idem/intent": "a"})), Some(b"b")).unwrap_err();
        assert!(
            err.contains("Idempotency-Key") && err.contains("idem/intent"),
            "{err}"
        );
        assert!(CallMeta::read(
            &obj(json!({"idem/intent": "a", "idempotencyKey": "b"})),
            None
        )
        .is_err());
    }

    #[test]
    fn refuses_values_that_are_not_bounded_strings() {
        for bad in [json!(7), json!(""), json!(null), json!({"a": 1})] {
            let err = CallMeta::read(&obj(json!({ "idem/run": bad })), None).unwrap_err();
            assert!(err.contains("idem/run"), "{err}");
        }
        assert!(CallMeta::read(&obj(json!({"idem/intent": false})), None).is_err());
        let long = "x".repeat(MAX_RUN_BYTES + 1);
        let err = CallMeta::read(&obj(json!({ "idem/run": long })), None).unwrap_err();
        assert!(!err.contains("xxxx"), "the message echoes the value: {err}");
        let long = "x".repeat(MAX_INTENT_BYTES + 1);
        assert!(CallMeta::read(&obj(json!({ "idempotencyKey": long })), None).is_err());
        assert!(CallMeta::read(&obj(json!({})), Some(long.as_bytes())).is_err());
        assert!(CallMeta::read(&obj(json!({})), Some(b"\xff")).is_err());
    }

    #[test]
    fn client_runs_never_meet_the_caller_run() {
        assert_ne!(client_run(""), CALLER_RUN);
        assert!(client_run(CALLER_RUN).starts_with(CLIENT_RUN_PREFIX));
        assert!(!CALLER_RUN.starts_with(CLIENT_RUN_PREFIX));
    }
}
