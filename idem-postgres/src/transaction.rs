//! Transactional handlers: a tool's effect and its completed record in one commit.
//!
//! This crate sits above the runtime, so it sees the tools' [`WriteCtx`] and [`ToolError`]
//! as well as the store's [`HeldClaim`] and [`TxError`].

use crate::codec::ms;
use crate::store::{Busy, Locked, PostgresStore, Write};
use futures_util::future::BoxFuture;
use idem_runtime::store::{HeldClaim, RecordState, TxError};
use idem_runtime::tool::{ToolError, WriteCtx};
use tokio_postgres::Transaction;

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
    ///   completed). The executor records every panic as *unknown*, since it cannot tell
    ///   where the handler panicked, and the key stays blocked until a read-back, the
    ///   reconciler or a person settles it; if that settle cannot reach the row before the
    ///   rollback releases it, the record stays a transactional claim whose transaction is
    ///   gone, and the store frees the key as above. Return an error from `f` rather than
    ///   panic.
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
    /// use idem_postgres::PostgresStore;
    /// use idem_runtime::tool::{ToolError, WriteCtx};
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

    /// Runs an effect and settles the claim's record as *completed* in **one** PostgreSQL
    /// transaction: the store-level form of [`PostgresStore::run_in_transaction`] (for a
    /// `WriteCtx` and `ToolError`), for any claim holder and any error
    /// type that a [`TxError`] converts into. See that method for what it guarantees.
    ///
    /// # Errors
    ///
    /// `f`'s error after rolling back; [`TxError::NotExecuted`] when the claim is no longer
    /// held or the store is unreachable (nothing was executed); [`TxError::Unknown`] when
    /// the commit's outcome could not be determined.
    pub async fn transact<T, E, F>(&self, ctx: &impl HeldClaim, f: F) -> Result<T, E>
    where
        T: serde::Serialize + Send,
        E: From<TxError>,
        F: for<'c> FnOnce(&'c mut Transaction<'_>) -> BoxFuture<'c, Result<T, E>> + Send,
    {
        let sql = &self.inner.sql;
        let key = ctx.key().as_str();
        let token = ctx.claim_token().to_hex();
        // Marking the claim rewrites its row: the fence of its insert is spent.
        self.inner.fences.take(ctx.claim_token());
        let not_run = |why: String| E::from(TxError::NotExecuted(why));
        let mut client = self
            .client()
            .await
            .map_err(|e| not_run(format!("the idem store is unreachable ({e})")))?;

        // 1. Mark the claim transactional, committed on its own: from here on a running
        //    record whose transaction is gone provably has no effect.
        let now = self.inner.clock.now();
        let marked = client
            .execute(&sql.mark_tx, &[&key, &token, &ms(now)])
            .await
            .map_err(|e| not_run(format!("could not mark the claim ({e})")))?;
        if marked != 1 {
            return Err(not_run(
                "the claim is no longer held (its lease passed or it was taken over)".into(),
            ));
        }

        // 2. Open the transaction and lock the record in it: while it is open, nobody can
        //    free or settle the record; if the process dies, PostgreSQL rolls it back.
        let mut tx = client
            .transaction()
            .await
            .map_err(|e| not_run(format!("could not begin ({e})")))?;
        let held = tx
            .query_opt(&sql.lock_tx, &[&key, &token])
            .await
            .map_err(|e| not_run(format!("could not lock the record ({e})")))?;
        if held.is_none() {
            return Err(not_run(
                "the claim was taken over before the transaction began".into(),
            ));
        }

        // 3. The effect.
        let output = match f(&mut tx).await {
            Ok(output) => output,
            Err(e) => {
                // Dropping would roll back too; doing it here returns the connection clean.
                let _ = tx.rollback().await;
                return Err(e);
            }
        };

        // 4. The record, in the same transaction, then one COMMIT for both.
        let payload = match serde_json::to_string(&output) {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(not_run(format!("the output does not serialize ({e})")));
            }
        };
        let settled = tx
            .execute(
                &sql.settle_tx,
                &[&key, &token, &payload, &ms(self.inner.clock.now())],
            )
            .await;
        match settled {
            Ok(1) => {}
            Ok(_) => {
                let _ = tx.rollback().await;
                return Err(not_run("the record was not held at settle time".into()));
            }
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(not_run(format!("could not settle the record ({e})")));
            }
        }
        match tx.commit().await {
            Ok(()) => Ok(output),
            Err(e) if e.code().is_some() => {
                // The server answered: it refused the commit, so it rolled back.
                Err(not_run(format!("the transaction did not commit ({e})")))
            }
            Err(e) => {
                drop(client);
                self.resolve_commit(ctx, output, e).await.map_err(E::from)
            }
        }
    }

    /// The connection broke during COMMIT: read the record back (waiting for the commit to
    /// finish if the server is still at it) to learn which way it went.
    pub(crate) async fn resolve_commit<T>(
        &self,
        ctx: &impl HeldClaim,
        output: T,
        e: tokio_postgres::Error,
    ) -> Result<T, TxError> {
        let outcome = self
            .locked(ctx.key(), Busy::Wait, |current| {
                let state = current.map(|(r, _)| (r.state, r.token));
                (Write::Keep, Ok(state))
            })
            .await;
        match outcome {
            Ok(Locked::Done(Some((RecordState::Completed, t)))) if t == ctx.claim_token() => {
                Ok(output)
            }
            Ok(Locked::Done(Some((RecordState::Running, t)))) if t == ctx.claim_token() => Err(
                TxError::NotExecuted(format!("the transaction did not commit ({e})")),
            ),
            Ok(Locked::Done(Some((state, _)))) => Err(TxError::NotExecuted(format!(
                "the transaction did not commit ({e}); the record has moved on (now {state})"
            ))),
            Ok(Locked::Done(None)) => Err(TxError::NotExecuted(format!(
                "the transaction did not commit ({e}); the claim was freed"
            ))),
            Ok(Locked::Busy(_)) | Err(_) => Err(TxError::Unknown(format!(
                "the connection broke during COMMIT ({e}) and the record could not be read \
                 back: the effect may or may not have committed"
            ))),
        }
    }
}
