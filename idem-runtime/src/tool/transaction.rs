//! Transactional handlers: a tool's effect and its completed record in one commit.

use futures_util::future::BoxFuture;
use tokio_postgres::Transaction;

use super::{ToolError, WriteCtx};
use crate::store::PostgresStore;

impl PostgresStore {
    /// Runs a write handler's effect and settles its record as *completed* in **one**
    /// PostgreSQL transaction.
    ///
    /// Use it when the tool's effect is a write to this same database (a ledger entry, an
    /// order row, an outbox message). `f` gets the open transaction; do the whole effect
    /// through it and return the output. Then, inside the same transaction, the record
    /// held by `ctx`'s claim is settled as completed with that output (fenced by the claim
    /// token), and the transaction commits. So:
    ///
    /// - commit → the effect **and** the completed record exist; a repeat replays the
    ///   output;
    /// - a crash, a dropped connection, an error returned by `f` → the transaction rolls
    ///   back: **no** effect and the record is not completed. Because the claim was marked
    ///   transactional before the effect started, the store knows nothing can have happened
    ///   and frees the key as soon as the transaction is gone (a repeat runs it again)
    ///   instead of blocking it as *unknown*.
    /// - a panic inside `f` rolls the transaction back as well (no effect, the record not
    ///   completed), but the executor records every panic as *unknown*, since it cannot tell
    ///   where the handler panicked: the key stays blocked until a read-back, the reconciler
    ///   or a person settles it. Return an error from `f` rather than panic.
    ///
    /// Never half. The executor's own settle afterwards finds the record already completed
    /// by the same token and only adds its attempt evidence.
    ///
    /// Everything `f` does outside the transaction (an HTTP call, another database) is not
    /// covered: such effects belong in an ordinary handler.
    ///
    /// # Errors
    ///
    /// - `f`'s error, after rolling back (nothing it wrote is kept). Return
    ///   [`ToolError::rejected`] to free the key for another try;
    /// - [`ToolError::Rejected`] when the claim is no longer held (its lease passed or it
    ///   was taken over) or the store is unreachable — nothing was executed;
    /// - [`ToolError::Unknown`] when the commit's outcome could not be determined (the
    ///   connection broke during `COMMIT` and the record could not be read back).
    ///
    /// A store-level form for other claim holders and error types is
    /// [`PostgresStore::transact`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idem_runtime::store::PostgresStore;
    /// use idem_runtime::{ToolError, WriteCtx};
    ///
    /// async fn credit(store: &PostgresStore, ctx: WriteCtx, account: i64, cents: i64)
    ///     -> Result<serde_json::Value, ToolError>
    /// {
    ///     store
    ///         .run_in_transaction(&ctx, |tx| {
    ///             Box::pin(async move {
    ///                 let row = tx
    ///                     .query_one(
    ///                         "UPDATE accounts SET balance = balance + $2 WHERE id = $1 \
    ///                          RETURNING balance",
    ///                         &[&account, &cents],
    ///                     )
    ///                     .await
    ///                     .map_err(|e| ToolError::rejected(format!("not credited: {e}")))?;
    ///                 let balance: i64 = row.get(0);
    ///                 Ok(serde_json::json!({ "balance": balance }))
    ///             })
    ///         })
    ///         .await
    /// }
    /// ```
    pub async fn run_in_transaction<T, F>(&self, ctx: &WriteCtx, f: F) -> Result<T, ToolError>
    where
        T: serde::Serialize + Send,
        F: for<'c> FnOnce(&'c mut Transaction<'_>) -> BoxFuture<'c, Result<T, ToolError>> + Send,
    {
        self.transact(ctx, f).await
    }
}
