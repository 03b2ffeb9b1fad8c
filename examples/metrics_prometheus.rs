//! Metrics to Prometheus: install `metrics-exporter-prometheus` on loopback, make a few
//! calls (a fresh charge, its replay, a changed-parameters repeat, an unknown tool, a send
//! that times out), run a reconciliation pass (which escalates the timed-out send), and
//! print what a Prometheus server scraping the endpoint would read.
//!
//! ```sh
//! cargo run --example metrics_prometheus --features metrics
//! ```
//!
//! Every metric name, label and unit is listed in `idem::observe` and
//! docs/observability.md.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem::{tool, Reconciler, Registry, ToolCall, ToolError, WriteCtx};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize, Serialize, schemars::JsonSchema)]
struct ChargeArgs {
    customer: String,
    cents: u64,
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Charge a customer's card.
#[tool(write)]
async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!(
        "charged {} {} cents under {}",
        args.customer,
        args.cents,
        ctx.key()
    ))
}

/// Send a parcel (this courier never answers).
#[tool(write, timeout = "50ms")]
async fn send_parcel(_ctx: WriteCtx, _args: ChargeArgs) -> Result<String, ToolError> {
    std::future::pending().await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A free port on loopback (the exporter binds it itself).
    let addr: SocketAddr = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    PrometheusBuilder::new()
        .with_http_listener(addr)
        // Latencies as Prometheus histograms (the default renders summaries).
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[0.000_01, 0.000_1, 0.001, 0.01, 0.1, 1.0, 10.0],
        )?
        .install()?;
    idem::observe::describe_metrics();

    let registry = Registry::builder()
        .tool(charge_card)
        .tool(send_parcel)
        .build()?;
    let charge = |cents: u64| {
        ToolCall::new(
            "run-1",
            "charge_card",
            json!({"customer": "cus_42", "cents": cents}),
        )
        .intent("invoice-7")
    };
    let first = registry.call(charge(4900)).await;
    let again = registry.call(charge(4900)).await; // the model asks again: replayed
    let changed = registry.call(charge(5900)).await; // same intent, other amount: refused
    let unknown = registry
        .call(ToolCall::new("run-1", "refund", json!({})))
        .await;
    let parcel = json!({"customer": "cus_42", "cents": 0});
    let timed_out = registry
        .call(ToolCall::new("run-1", "send_parcel", parcel))
        .await;
    for result in [&first, &again, &changed, &unknown, &timed_out] {
        println!("# {}: {}", result.tool(), result.text());
    }
    println!("# charges made: {}", CHARGES.load(Ordering::SeqCst));
    // Once the timed-out send can no longer land, the reconciler has nothing to settle it
    // with (no key contract, no read-back) and hands it to a person.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for decision in Reconciler::new(&registry).run_once().await? {
        println!("# reconciled {}: {:?}", decision.tool, decision.action);
    }
    println!();

    let scrape = tokio::task::spawn_blocking(move || scrape(addr)).await??;
    print!("{scrape}");
    Ok(())
}

/// `GET /metrics` over plain HTTP/1.0, retried until the exporter is listening.
fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    // The body, after the headers.
    Ok(response
        .split_once("\r\n\r\n")
        .map_or(response.as_str(), |(_, body)| body)
        .to_owned())
}
