//! A decorator that traces and times every operation of any store.
//!
//! The registry wraps its store in [`Instrumented`], so the executor, the late-result
//! watcher and the reconciler are observed at one place, the store boundary, and no call
//! site has to remember to. Nothing is recorded that a store does not need to be told
//! apart: the key (a digest), the tool a claim names, states, counts, the error's kind;
//! never the operation's arguments, a payload, a message or a store's error text.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::{
    async_trait_fns, ClaimOutcome, ClaimRequest, ClaimToken, Clock, IdemStore, ListCursor, Record,
    RecordState, ReleaseNote, ReleaseRecord, Settlement, StoreError, StoreFuture, Swept,
};
use crate::identity::IdemKey;
use crate::observe::Timer;

/// Wraps any [`IdemStore`]: each operation runs inside an `idem.store` span (level `DEBUG`)
/// and, with the `metrics` feature, its latency goes to
/// [`STORE_OP_DURATION`](crate::observe::STORE_OP_DURATION) by backend, operation and
/// result. See [`crate::observe`] for the fields and labels.
///
/// A [`Registry`](crate::registry::Registry) applies it to its store by itself; wrap a store yourself
/// only for code that uses it without a registry (an operator tool). When no subscriber
/// wants the span and the `metrics` feature is off, an operation is handed to the inner
/// store as it is: no span is built, nothing is timed, no future is wrapped.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::store::{IdemStore, Instrumented, MemoryStore};
///
/// let store = Instrumented::new(Arc::new(MemoryStore::new()));
/// assert_eq!(store.backend_name(), "memory");
/// ```
#[derive(Clone)]
pub struct Instrumented {
    inner: Arc<dyn IdemStore>,
    backend: &'static str,
}

impl Instrumented {
    /// Wraps `store`, naming it by its [`IdemStore::backend_name`].
    pub fn new(store: Arc<dyn IdemStore>) -> Instrumented {
        let backend = store.backend_name();
        Instrumented {
            inner: store,
            backend,
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn IdemStore> {
        &self.inner
    }

    /// The inner store as a trait object: calling through the `Arc` would pick the blanket
    /// `impl IdemStore for Arc<S>` and box every future twice.
    fn store(&self) -> &dyn IdemStore {
        &*self.inner
    }

    /// Runs `fut` inside `span`, timed, unless nobody is listening: then `fut` itself is
    /// returned, so an unobserved operation costs one check.
    fn observe<'a, T: Send + 'a>(
        &self,
        op: &'static str,
        span: Span,
        fut: StoreFuture<'a, T>,
        describe: fn(&Span, &T),
    ) -> StoreFuture<'a, T> {
        if unobserved(&span) {
            return fut;
        }
        let backend = self.backend;
        Box::pin(async move {
            let timer = Timer::start();
            let result = fut.instrument(span.clone()).await;
            let outcome = match &result {
                Ok(value) => {
                    describe(&span, value);
                    "ok"
                }
                Err(e) => {
                    let kind = error_kind(e);
                    span.record("error", kind);
                    kind
                }
            };
            record_op(backend, op, outcome, timer);
            result
        })
    }
}

/// The span of a claim of `req` (see [`Instrumented`]).
pub(crate) fn claim_span(backend: &'static str, req: &ClaimRequest) -> Span {
    tracing::debug_span!(
        "idem.store",
        op = "claim",
        backend,
        key = req.key.as_str(),
        tool = &*req.tool,
        state = Empty,
        outcome = Empty,
        error = Empty
    )
}

/// The span of an operation on one key that records nothing of it but its outcome.
fn key_span(backend: &'static str, op: &'static str, key: &IdemKey) -> Span {
    tracing::debug_span!(
        "idem.store",
        op,
        backend,
        key = key.as_str(),
        outcome = Empty,
        error = Empty
    )
}

/// The span of a settle of `key` with `settlement` (see [`Instrumented`]).
pub(crate) fn settle_span(backend: &'static str, key: &IdemKey, settlement: &Settlement) -> Span {
    tracing::debug_span!(
        "idem.store",
        op = "settle",
        backend,
        key = key.as_str(),
        state = settlement.state.as_str(),
        attempt = settlement.attempts.last().map(|a| a.attempt),
        outcome = Empty,
        error = Empty
    )
}

/// True when an operation under `span` goes to the inner store as it is: nobody wants the
/// span and no metrics are compiled in. An operation called on a store directly, past
/// [`Instrumented`], is then observed exactly as much as through it.
pub(crate) fn unobserved(span: &Span) -> bool {
    span.is_disabled() && !cfg!(feature = "metrics")
}

#[cfg(feature = "metrics")]
fn record_op(backend: &'static str, op: &'static str, result: &'static str, timer: Timer) {
    crate::observe::observe(
        crate::observe::STORE_OP_DURATION,
        &[
            ("backend", backend.into()),
            ("op", op.into()),
            ("result", result.into()),
        ],
        timer.seconds(),
    );
}

#[cfg(not(feature = "metrics"))]
fn record_op(_backend: &'static str, _op: &'static str, _result: &'static str, _timer: Timer) {}

impl StoreError {
    /// The error's kind, for a span field or a metric label: its text may quote a server's
    /// reply or a host name, its kind cannot.
    pub(crate) fn kind(&self) -> &'static str {
        error_kind(self)
    }
}

fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::StaleToken { .. } => "stale_token",
        StoreError::NotFound(_) => "not_found",
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Corrupt { .. } => "corrupt",
        StoreError::Full(_) => "full",
        StoreError::Backend(_) => "backend",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

fn describe_nothing<T>(span: &Span, _: &T) {
    span.record("outcome", "ok");
}

fn describe_claim(span: &Span, outcome: &ClaimOutcome) {
    let (what, record) = match outcome {
        ClaimOutcome::Claimed(_) => ("claimed", None),
        ClaimOutcome::Existing(r) => ("existing", Some(r)),
        ClaimOutcome::Mismatch(r) => ("mismatch", Some(r)),
    };
    span.record("outcome", what);
    if let Some(r) = record {
        span.record("state", r.state.as_str());
    }
}

fn describe_record(span: &Span, record: &Option<Record>) {
    match record {
        Some(r) => {
            span.record("outcome", "found");
            span.record("state", r.state.as_str());
        }
        None => {
            span.record("outcome", "absent");
        }
    }
}

// A `&Vec` because it describes what `list` returns, through `fn(&Span, &T)`.
#[allow(clippy::ptr_arg)]
fn describe_list(span: &Span, records: &Vec<Record>) {
    span.record("count", records.len());
}

impl fmt::Debug for Instrumented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Instrumented").field(&self.inner).finish()
    }
}

// Not through `#[async_trait]`: it would box a second future around the inner store's on
// every operation, observed or not. `async_trait_fns!` gives its signatures to methods that
// return the inner store's future as it is.
impl IdemStore for Instrumented {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }

    fn backend_name(&self) -> &'static str {
        self.backend
    }

    fn durability(&self) -> super::Durability {
        self.inner.durability()
    }

    async_trait_fns! {
        fn claim<'life1>(
            &self,
            req: &'life1 ClaimRequest,
        ) -> StoreFuture<'async_trait, ClaimOutcome> {
            let span = claim_span(self.backend, req);
            self.observe("claim", span, self.store().claim(req), describe_claim)
        }

        fn renew<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ()> {
            let span = key_span(self.backend, "renew", key);
            let fut = self.store().renew(key, token, lease);
            self.observe("renew", span, fut, describe_nothing)
        }

        fn settle<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
        ) -> StoreFuture<'async_trait, ()> {
            let span = settle_span(self.backend, key, &settlement);
            let fut = self.store().settle(key, token, settlement);
            self.observe("settle", span, fut, describe_nothing)
        }

        fn release<'life1>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
        ) -> StoreFuture<'async_trait, ()> {
            let span = key_span(self.backend, "release", key);
            let fut = self.store().release(key, token);
            self.observe("release", span, fut, describe_nothing)
        }

        fn release_unsettled<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()> {
            let span = key_span(self.backend, "release_unsettled", key);
            let fut = self.store().release_unsettled(key, expected, note);
            self.observe("release_unsettled", span, fut, describe_nothing)
        }

        fn release_traced<'life1, 'life2>(
            &self,
            key: &'life1 IdemKey,
            token: ClaimToken,
            settlement: Settlement,
            note: &'life2 ReleaseNote,
        ) -> StoreFuture<'async_trait, ()> {
            let span = key_span(self.backend, "release_traced", key);
            let fut = self.store().release_traced(key, token, settlement, note);
            self.observe("release_traced", span, fut, describe_nothing)
        }

        fn releases<'life1>(
            &self,
            key: &'life1 IdemKey,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>> {
            let span = key_span(self.backend, "releases", key);
            let fut = self.store().releases(key);
            self.observe("releases", span, fut, describe_nothing)
        }

        fn list_releases<'life1>(
            &self,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<ReleaseRecord>> {
            let span = tracing::debug_span!(
                "idem.store",
                op = "list_releases",
                backend = self.backend,
                outcome = Empty,
                error = Empty
            );
            let fut = self.store().list_releases(after, limit);
            self.observe("list_releases", span, fut, describe_nothing)
        }

        fn reclaim<'life1>(
            &self,
            key: &'life1 IdemKey,
            expected: ClaimToken,
            lease: Duration,
        ) -> StoreFuture<'async_trait, ClaimToken> {
            let span = key_span(self.backend, "reclaim", key);
            let fut = self.store().reclaim(key, expected, lease);
            self.observe("reclaim", span, fut, describe_nothing)
        }

        fn get<'life1>(&self, key: &'life1 IdemKey) -> StoreFuture<'async_trait, Option<Record>> {
            let span = tracing::debug_span!(
                "idem.store",
                op = "get",
                backend = self.backend,
                key = key.as_str(),
                state = Empty,
                outcome = Empty,
                error = Empty
            );
            self.observe("get", span, self.store().get(key), describe_record)
        }

        fn list(&self, state: RecordState, limit: usize) -> StoreFuture<'async_trait, Vec<Record>> {
            let span = tracing::debug_span!(
                "idem.store",
                op = "list",
                backend = self.backend,
                state = state.as_str(),
                count = Empty,
                error = Empty
            );
            self.observe("list", span, self.store().list(state, limit), describe_list)
        }

        fn list_after<'life1>(
            &self,
            state: RecordState,
            after: Option<&'life1 ListCursor>,
            limit: usize,
        ) -> StoreFuture<'async_trait, Vec<Record>> {
            let span = tracing::debug_span!(
                "idem.store",
                op = "list_after",
                backend = self.backend,
                state = state.as_str(),
                count = Empty,
                error = Empty
            );
            let fut = self.store().list_after(state, after, limit);
            self.observe("list_after", span, fut, describe_list)
        }

        fn sweep_expired(&self) -> StoreFuture<'async_trait, Swept> {
            self.store().sweep_expired()
        }

        fn wait_settled<'life1>(
            &self,
            key: &'life1 IdemKey,
            timeout: Duration,
        ) -> StoreFuture<'async_trait, Option<Record>> {
            let span = tracing::debug_span!(
                "idem.store",
                op = "wait_settled",
                backend = self.backend,
                key = key.as_str(),
                state = Empty,
                outcome = Empty,
                error = Empty
            );
            let fut = self.store().wait_settled(key, timeout);
            self.observe("wait_settled", span, fut, describe_record)
        }
    }
}
