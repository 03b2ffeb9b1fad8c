//! A registry on PostgreSQL with a transactional handler: crediting an account writes the
//! ledger row and the idem record in one transaction, so they commit together or not at
//! all. The same call made again replays the saved result; the ledger keeps one row.
//!
//! ```text
//! IDEM_POSTGRES_URL=postgres://user@127.0.0.1:5432/db \
//!     cargo run --example store_postgres --features postgres
//! ```
//!
//! Without `IDEM_POSTGRES_URL` it explains what it needs and exits. It works in a schema of
//! its own (`idem_example_<pid>`) and drops it at the end.

#[cfg(feature = "postgres")]
mod demo {
    use idem::tool::{ToolSpec, WriteTool};
    use idem::PostgresStore;
    use idem::{Registry, ToolCall, ToolError, WriteCtx};
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};

    #[derive(Deserialize, Serialize, schemars::JsonSchema)]
    struct CreditArgs {
        /// The account to credit.
        account: String,
        /// Amount in cents.
        cents: i64,
    }

    /// Credits an account; the ledger lives in the same database as the idem records.
    struct CreditAccount {
        store: PostgresStore,
    }

    impl WriteTool for CreditAccount {
        type Args = CreditArgs;
        type Output = Value;

        fn spec(&self) -> ToolSpec {
            ToolSpec::new("credit_account").description("Credit an account.")
        }

        async fn call(&self, ctx: WriteCtx, args: CreditArgs) -> Result<Value, ToolError> {
            let insert = format!(
                "INSERT INTO \"{}\".ledger (idem_key, account, cents) VALUES ($1, $2, $3) \
                 RETURNING id",
                self.store.schema()
            );
            let key = ctx.key().as_str().to_owned();
            self.store
                .run_in_transaction(&ctx, move |tx| {
                    Box::pin(async move {
                        // The effect. A crash anywhere before COMMIT undoes it *and* frees
                        // the key; after COMMIT the record says completed.
                        let row = tx
                            .query_one(&insert, &[&key, &args.account, &args.cents])
                            .await
                            .map_err(|e| ToolError::rejected(format!("not credited: {e}")))?;
                        let id: i64 = row.get(0);
                        println!("  handler ran: ledger entry {id}");
                        Ok(json!({ "entry": id }))
                    })
                })
                .await
        }
    }

    pub async fn main(url: String) -> Result<(), Box<dyn std::error::Error>> {
        let schema = format!("idem_example_{}", std::process::id());
        // Creates the schema and the idem tables (migrations are applied on connect).
        let store = PostgresStore::builder(url)
            .schema(schema.as_str())
            .connect()
            .await?;
        let client = store.pool().get().await?;
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS \"{schema}\".ledger (id bigserial PRIMARY KEY, \
                 idem_key text NOT NULL, account text NOT NULL, cents bigint NOT NULL)"
            ))
            .await?;
        let registry = Registry::builder()
            .tool(CreditAccount {
                store: store.clone(),
            })
            .store(store.clone())
            .build()?;
        let call = ToolCall::new(
            "refund-run-17",
            "credit_account",
            json!({"account": "acme", "cents": 4900}),
        );
        for label in ["first call", "same call again"] {
            let r = registry.call(call.clone()).await;
            println!(
                "{label}: {:?}, replayed: {}, model sees: {:?}",
                r.class(),
                r.replayed(),
                r.text()
            );
        }
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM \"{schema}\".ledger"), &[])
            .await?
            .get(0);
        println!("ledger rows: {rows}");
        client
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await?;
        Ok(())
    }
}

#[cfg(feature = "postgres")]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var("IDEM_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => demo::main(url).await,
        _ => {
            eprintln!(
                "IDEM_POSTGRES_URL is not set; start a PostgreSQL and run\n  \
                 IDEM_POSTGRES_URL=postgres://user@127.0.0.1:5432/db \
                 cargo run --example store_postgres --features postgres"
            );
            Ok(())
        }
    }
}

#[cfg(not(feature = "postgres"))]
fn main() {
    eprintln!(
        "this example needs the `postgres` feature: \
         IDEM_POSTGRES_URL=postgres://… cargo run --example store_postgres --features postgres"
    );
}
