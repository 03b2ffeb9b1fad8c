//! Extreme but legal settings through the public API: the largest durations a caller can
//! write, and handlers that misbehave, never panic across the API; every call ends in a
//! result, and the downstream's ledger says what ran.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    registry::RetryPolicy,
    tool::{Downstream, ToolSpec, WriteTool},
    OutcomeClass, Reconciler, Registry, ToolCall, ToolError, WriteCtx,
};
use serde_json::json;

#[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
struct Args {
    n: u64,
}

struct Send {
    runs: Arc<AtomicU32>,
    spec: ToolSpec,
    fail: bool,
}

impl WriteTool for Send {
    type Args = Args;
    type Output = u64;
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }
    async fn call(&self, _ctx: WriteCtx, args: Args) -> Result<u64, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.fail {
            return Err(ToolError::unknown("502 after sending"));
        }
        Ok(args.n)
    }
}

#[tokio::test(start_paused = true)]
async fn the_longest_durations_are_accepted_or_refused_never_a_panic() {
    longest_durations(|b| b).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(start_paused = true)]
async fn the_longest_durations_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("idem-extremes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = idem::SqliteStore::open(dir.join("idem.sqlite3"))
        .await
        .unwrap();
    longest_durations(|b| b.store(store.clone())).await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn longest_durations(on: impl Fn(idem::RegistryBuilder) -> idem::RegistryBuilder) {
    for keyed in [false, true] {
        for fail in [false, true] {
            let runs = Arc::new(AtomicU32::new(0));
            let spec = ToolSpec::new("send")
                .description("Send.")
                .timeout(Duration::MAX)
                .lease(Duration::MAX)
                .window(Duration::MAX)
                .in_flight_bound(Duration::MAX)
                .downstream(if keyed {
                    Downstream::Keyed
                } else {
                    Downstream::Unkeyed
                });
            let built = on(Registry::builder())
                .in_flight_wait(Duration::MAX)
                .default_in_flight_bound(Duration::MAX)
                .retry_policy(
                    RetryPolicy::default()
                        .max_attempts(u32::MAX)
                        .initial_backoff(Duration::MAX)
                        .max_backoff(Duration::MAX)
                        .budget(Duration::MAX),
                )
                .tool(Send {
                    runs: runs.clone(),
                    spec,
                    fail,
                })
                .build();
            let registry = match built {
                Ok(r) => r,
                // A clear refusal is fine; a panic is not.
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    continue;
                }
            };
            let r = registry
                .call(ToolCall::new(
                    format!("run-{keyed}-{fail}"),
                    "send",
                    json!({"n": 7}),
                ))
                .await;
            if fail {
                assert!(
                    matches!(r.class(), Some(OutcomeClass::Unknown)),
                    "{:?}",
                    r.as_result()
                );
            } else {
                assert_eq!(r.output(), Some(&json!(7)), "{:?}", r.as_result());
            }
            let again = registry
                .call(
                    ToolCall::new(format!("run-{keyed}-{fail}"), "send", json!({"n": 7}))
                        .call_id("toolu_2"),
                )
                .await;
            assert!(again.replayed(), "{:?}", again.as_result());
            let before = runs.load(Ordering::SeqCst);
            let _ = Reconciler::new(&registry).run_once().await;
            assert!(runs.load(Ordering::SeqCst) >= before);
            if !keyed {
                assert_eq!(runs.load(Ordering::SeqCst), 1, "unkeyed: never sent again");
            }
        }
    }
}
