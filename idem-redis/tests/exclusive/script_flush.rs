//! The server's loaded functions and script cache flushed under a running store.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::backend::Settlement;
use idem_runtime::store::conformance::{self, claim, get, request_leased};
use idem_runtime::store::{IdemStore, ManualClock, RecordState, Retention};
use idem_test::stores::RedisPrefix;
use serde_json::json;

fn redis_url(test: &str) -> Option<String> {
    conformance::backend_url("IDEM_REDIS_URL", test)
}

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

const LEASE: Duration = Duration::from_secs(10);

const RETENTION: Retention = Retention {
    results: Duration::from_secs(60),
    tombstones: Duration::from_secs(24 * 3600),
};

/// The server's functions and script cache are flushed (a restart without persistence, a
/// failover to a node that never had them, an operator's FUNCTION FLUSH or SCRIPT FLUSH):
/// the next call loads the library again and works; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_script_flush_is_survived() {
    let Some(url) = redis_url("redis_script_flush_is_survived") else {
        return;
    };
    let at = RedisPrefix::on(url.clone(), "redis");
    let clock = ManualClock::starting_now();
    let s = at.open_on(Arc::new(clock.clone()), RETENTION).await;
    let library = s
        .function_library()
        .expect("Redis 7 has FUNCTION")
        .to_owned();
    let req = request_leased("flush", LEASE);
    let t = claim(&s, &req).await;
    let mut conn = conn(&at.url).await;
    let flush = || {
        let mut pipe = redis::pipe();
        pipe.cmd("FUNCTION").arg("FLUSH").cmd("SCRIPT").arg("FLUSH");
        pipe
    };
    let loaded = |conn: &mut redis::aio::MultiplexedConnection| {
        let library = library.clone();
        let mut conn = conn.clone();
        async move {
            let listed: redis::Value = redis::cmd("FUNCTION")
                .arg("LIST")
                .arg("LIBRARYNAME")
                .arg(&library)
                .query_async(&mut conn)
                .await
                .expect("FUNCTION LIST");
            matches!(listed, redis::Value::Array(ref libs) if libs.len() == 1)
        }
    };
    // (Other checks share this server and may load the library again at any moment, so
    // only what follows the store's own calls is asserted; tests/crash_redis.rs counts the
    // reload on a server of its own.)
    let () = flush().query_async(&mut conn).await.expect("FLUSH");
    s.renew(&req.key, t, LEASE)
        .await
        .expect("renew after flush");
    assert!(loaded(&mut conn).await, "the renew loaded it again");
    let () = flush().query_async(&mut conn).await.expect("FLUSH");
    s.settle(
        &req.key,
        t,
        Settlement::new(RecordState::Completed).payload(json!("ok")),
    )
    .await
    .expect("settle after flush");
    let r = get(&s, &req.key).await;
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.payload, Some(json!("ok")));
}
