//! `Instrumented` changes nothing a store does: the conformance suite passes through it,
//! both when nobody traces (each operation goes to the inner store untouched) and when a
//! subscriber takes every span (each operation runs inside its span, timed).

use std::sync::Arc;

use idem_runtime::store::conformance::{StoreFactory, StoreOptions};
use idem_runtime::store::{IdemStore, Instrumented, MemoryStore, StoreError};

/// A new, empty `MemoryStore` behind `Instrumented` at every location.
struct InstrumentedMemory;

impl StoreFactory for InstrumentedMemory {
    type Store = Instrumented;
    type Location = ();

    fn durable(&self) -> bool {
        false
    }

    async fn location(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn open(&self, _: &(), options: &StoreOptions) -> Result<Instrumented, StoreError> {
        let store = MemoryStore::with_clock(options.clock()).retention(options.retention);
        Ok(Instrumented::new(Arc::new(store)))
    }
}

idem_runtime::store_conformance_tests!(InstrumentedMemory);

#[test]
fn the_suite_passes_while_every_span_is_taken() {
    // The registry alone enables every span and records nothing: the observed path runs
    // for every operation, on every thread of a multi-thread runtime (the suite races
    // claims for real).
    let subscriber = || tracing::subscriber::set_default(tracing_subscriber::registry());
    let _guard = subscriber();
    assert!(tracing::enabled!(tracing::Level::DEBUG));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        // A worker keeps its subscriber for as long as it lives.
        .on_thread_start(move || std::mem::forget(subscriber()))
        .enable_all()
        .build()
        .unwrap()
        .block_on(idem_runtime::store::conformance::run_all(
            &InstrumentedMemory,
        ));
}

#[test]
fn it_names_the_inner_backend() {
    let store = Instrumented::new(Arc::new(MemoryStore::new()));
    assert_eq!(store.backend_name(), "memory");
    assert_eq!(store.inner().backend_name(), "memory");
}
