//! A registry on Redis: two "workers" (two stores, as on two machines) race for the same
//! charge; exactly one runs it, the other is answered from the saved result.
//!
//! ```text
//! IDEM_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example store_redis --features redis
//! ```
//!
//! Without `IDEM_REDIS_URL` it explains what it needs and exits. It writes only under a
//! key prefix of its own and deletes nothing else.

#[cfg(feature = "redis")]
mod demo {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem::RedisStore;
    use idem::{tool, Reconciler, Registry, ToolCall, ToolError, WriteCtx};
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    /// Charges made: what a real billing API would count.
    static CHARGES: AtomicU32 = AtomicU32::new(0);

    #[derive(Deserialize, Serialize, schemars::JsonSchema)]
    struct ChargeArgs {
        /// The customer to charge.
        customer: String,
        /// The invoice being paid; with the customer, it identifies the charge.
        invoice: String,
        /// Amount in cents.
        cents: u64,
    }

    /// Charge a customer's card for one invoice.
    #[tool(write, key(customer, invoice))]
    async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
        println!(
            "  handler ran: charging {} cents (key {})",
            args.cents,
            ctx.key()
        );
        // Stand-in for the network call to the billing API.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        Ok(format!("ch_{n:04}"))
    }

    async fn worker(url: &str, prefix: &str) -> Result<Registry, Box<dyn std::error::Error>> {
        // Production Redis for money: `appendonly yes` + `appendfsync always` (or
        // `everysec`, accepting up to a second of claims lost on power failure), and
        // `maxmemory-policy noeviction`. See `RedisStore`'s documentation.
        let store = RedisStore::builder(url).prefix(prefix).connect().await?;
        Ok(Registry::builder().tool(charge_card).store(store).build()?)
    }

    pub async fn main(url: String) -> Result<(), Box<dyn std::error::Error>> {
        let prefix = format!("idem-example:{}:", std::process::id());
        let (a, b) = (worker(&url, &prefix).await?, worker(&url, &prefix).await?);
        let call = ToolCall::new(
            "order-4711",
            "charge_card",
            json!({"customer": "acme", "invoice": "inv-2026-001", "cents": 4900}),
        );
        println!("two workers issue the same charge at once (prefix {prefix})");
        let (ra, rb) = tokio::join!(a.call(call.clone()), b.call(call.clone()));
        for (name, r) in [("worker a", &ra), ("worker b", &rb)] {
            println!(
                "  {name}: {:?}, replayed: {}, model sees: {:?}",
                r.class(),
                r.replayed(),
                r.text()
            );
        }
        println!("charges made: {}", CHARGES.load(Ordering::SeqCst));
        // Any worker can settle what another left unknown: one reconciler pass over the
        // shared store (a service spawns it: `Reconciler::new(&a).spawn(every)`).
        let decisions = Reconciler::new(&a).run_once().await?;
        println!("reconciler: {} record(s) to settle", decisions.len());
        Ok(())
    }
}

#[cfg(feature = "redis")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("IDEM_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => demo::main(url).await,
        _ => {
            eprintln!(
                "IDEM_REDIS_URL is not set; start a Redis and run\n  \
                 IDEM_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example store_redis --features redis"
            );
            Ok(())
        }
    }
}

#[cfg(not(feature = "redis"))]
fn main() {
    eprintln!(
        "this example needs the `redis` feature: \
         IDEM_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example store_redis --features redis"
    );
}
