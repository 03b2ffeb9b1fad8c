//! A Postgres schema of its own per check, dropped with everything in it afterwards, so
//! test runs and checks never collide. Shared by the Postgres test files (`#[path]` module).

use std::sync::atomic::{AtomicU64, Ordering};

/// A schema of its own, dropped with everything in it when this is dropped.
pub struct Schema {
    pub url: String,
    pub name: String,
}

impl Schema {
    /// A schema name no other run or check uses (process id, time, counter).
    pub fn fresh(url: &str) -> Schema {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
        Schema {
            url: url.to_owned(),
            name: format!(
                "idem_t_{}_{nanos}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Drop runs inside the test's runtime; a runtime of its own on a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}
