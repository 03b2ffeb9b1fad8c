//! `MemoryStore` against the store conformance suite.

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

/// `IdemStore::list_after`'s default implementation, for stores that only implement `list`:
/// a `MemoryStore` behind a wrapper that forwards everything but `list_after`.
mod default_list_after {
    use std::time::Duration;

    use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
    use idem_runtime::store::{
        ClaimOutcome, ClaimRequest, ClaimToken, IdemStore, MemoryStore, Record, RecordState,
        Settlement, StoreError,
    };
    use idem_runtime::IdemKey;

    #[derive(Debug)]
    struct ListOnly(MemoryStore);

    #[async_trait::async_trait]
    impl IdemStore for ListOnly {
        async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
            self.0.claim(req).await
        }
        async fn renew(
            &self,
            key: &IdemKey,
            token: ClaimToken,
            lease: Duration,
        ) -> Result<(), StoreError> {
            self.0.renew(key, token, lease).await
        }
        async fn settle(
            &self,
            key: &IdemKey,
            token: ClaimToken,
            settlement: Settlement,
        ) -> Result<(), StoreError> {
            self.0.settle(key, token, settlement).await
        }
        async fn release(&self, key: &IdemKey, token: ClaimToken) -> Result<(), StoreError> {
            self.0.release(key, token).await
        }
        async fn reclaim(
            &self,
            key: &IdemKey,
            expected: ClaimToken,
            lease: Duration,
        ) -> Result<ClaimToken, StoreError> {
            self.0.reclaim(key, expected, lease).await
        }
        async fn get(&self, key: &IdemKey) -> Result<Option<Record>, StoreError> {
            self.0.get(key).await
        }
        async fn list(&self, state: RecordState, limit: usize) -> Result<Vec<Record>, StoreError> {
            self.0.list(state, limit).await
        }
    }

    struct Factory;

    impl StoreFactory for Factory {
        type Store = ListOnly;
        type Location = ();

        fn durable(&self) -> bool {
            false
        }

        async fn location(&self) -> Result<(), StoreError> {
            Ok(())
        }

        async fn open(&self, _: &(), options: &StoreOptions) -> Result<ListOnly, StoreError> {
            Ok(ListOnly(
                MemoryStore::with_clock(options.clock()).retention(options.retention),
            ))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn pages_exactly_once() {
        conformance::list_after_pages_exactly_once(&Factory).await;
    }
}
