//! `MemoryStore` against the store conformance suite.
#![cfg(feature = "testing")]

use idem_runtime::store::conformance::{StoreFactory, StoreOptions};
use idem_runtime::store::{MemoryStore, StoreError};

/// Every location is a new, empty `MemoryStore`: nothing survives a reopen.
struct Memory;

impl StoreFactory for Memory {
    type Store = MemoryStore;
    type Location = ();

    fn durable(&self) -> bool {
        false
    }

    async fn location(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn open(&self, _: &(), options: &StoreOptions) -> Result<MemoryStore, StoreError> {
        Ok(MemoryStore::with_clock(options.clock()).retention(options.retention))
    }
}

idem_runtime::store_conformance_tests!(Memory);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_passes() {
    idem_runtime::store::conformance::run_all(&Memory).await;
}
