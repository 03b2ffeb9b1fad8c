//! A registry on SQLite: a charge is claimed and its result saved in a file, so after a
//! restart the same call is replayed from the file instead of charging a second time.
//!
//! ```text
//! cargo run --example store_sqlite --features sqlite
//! cargo run --example store_sqlite --features sqlite -- /tmp/idem.sqlite3   # keep the file;
//!                                          # run it twice: the second run only replays
//! ```

#[cfg(feature = "sqlite")]
mod demo {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem::{tool, Reconciler, Registry, ToolCall, ToolError, WriteCtx};
    use idem::{SqliteStore, SqliteSync};
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    /// Charges made by this process: what a real billing API would count.
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
    #[tool(write, key(customer, invoice), downstream = "keyed")]
    async fn charge_card(ctx: WriteCtx, args: ChargeArgs) -> Result<String, ToolError> {
        // A real handler sends `ctx.key()` as the downstream's idempotency key.
        let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
        println!(
            "  handler ran: charging {} {} cents for {} (key {})",
            args.customer,
            args.cents,
            args.invoice,
            ctx.key()
        );
        Ok(format!("ch_{n:04}"))
    }

    /// One process lifetime: open the store, build the registry, make the call.
    async fn run_once(
        path: &std::path::Path,
        label: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        println!("{label}: opening {}", path.display());
        // `Full` (the default) fsyncs every claim and result: they survive a power loss,
        // not only a crash. Spelled out here so the choice is visible.
        let store = SqliteStore::builder(path)
            .sync(SqliteSync::Full)
            .open()
            .await?;
        let registry = Registry::builder().tool(charge_card).store(store).build()?;
        let call = ToolCall::new(
            "order-4711",
            "charge_card",
            json!({"customer": "acme", "invoice": "inv-2026-001", "cents": 4900}),
        );
        let result = registry.call(call).await;
        println!(
            "  outcome: {:?}, replayed: {}, model sees: {:?}",
            result.class(),
            result.replayed(),
            result.text()
        );
        // What a crash left unknown is settled by a reconciler over the same file, not by
        // the model: one pass at every start.
        let decisions = Reconciler::new(&registry).run_once().await?;
        println!("  reconciler: {} record(s) to settle", decisions.len());
        Ok(())
    }

    pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
        let (path, temporary) = match std::env::args_os().nth(1) {
            Some(p) => (PathBuf::from(p), false),
            None => (
                std::env::temp_dir().join(format!("idem-example-{}.sqlite3", std::process::id())),
                true,
            ),
        };

        run_once(&path, "first start").await?;
        // Everything from the first start is gone now except the file: this is what a
        // restarted agent (or one resumed from a checkpoint) sees.
        run_once(&path, "after a restart").await?;

        println!(
            "charges made by this process: {}",
            CHARGES.load(Ordering::SeqCst)
        );
        if temporary {
            for suffix in ["", "-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(suffix);
                let _ = std::fs::remove_file(p);
            }
        }
        Ok(())
    }
}

#[cfg(feature = "sqlite")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    demo::main().await
}

#[cfg(not(feature = "sqlite"))]
fn main() {
    eprintln!(
        "this example needs the `sqlite` feature: \
         cargo run --example store_sqlite --features sqlite"
    );
}
