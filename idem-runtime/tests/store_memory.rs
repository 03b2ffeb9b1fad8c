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

    use idem_runtime::identity::IdemKey;
    use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
    use idem_runtime::store::conformance::{self, StoreFactory, StoreOptions};
    use idem_runtime::store::{
        ClaimToken, IdemStore, MemoryStore, Record, RecordState, StoreError,
    };

    #[derive(Debug)]
    struct ListOnly(MemoryStore);

    #[async_trait::async_trait]
    impl IdemStore for ListOnly {
        // A test double that keeps no release traces: a release takes the record over and frees
        // it, a traced release settles and then releases, and no trace is listed.
        async fn release_unsettled(
            &self,
            key: &idem_runtime::identity::IdemKey,
            expected: idem_runtime::store::ClaimToken,
            _note: &idem_runtime::store::ReleaseNote,
        ) -> Result<(), idem_runtime::store::StoreError> {
            let token = self
                .reclaim(key, expected, std::time::Duration::from_secs(60))
                .await?;
            self.release(key, token).await
        }

        async fn release_traced(
            &self,
            key: &idem_runtime::identity::IdemKey,
            token: idem_runtime::store::ClaimToken,
            settlement: idem_runtime::store::backend::Settlement,
            note: &idem_runtime::store::ReleaseNote,
        ) -> Result<(), idem_runtime::store::StoreError> {
            idem_runtime::store::backend::rules::releasable_settlement(key, &settlement)?;
            self.settle(key, token, settlement).await?;
            self.release_unsettled(key, token, note).await
        }

        async fn releases(
            &self,
            _key: &idem_runtime::identity::IdemKey,
        ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError>
        {
            Ok(Vec::new())
        }

        async fn list_releases(
            &self,
            _after: Option<&idem_runtime::store::ListCursor>,
            _limit: usize,
        ) -> Result<Vec<idem_runtime::store::ReleaseRecord>, idem_runtime::store::StoreError>
        {
            Ok(Vec::new())
        }

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

/// The capacity and the sweep: a full store refuses new keys (never evicting a record that
/// still counts), makes room by dropping lapsed tombstones only, and sweeps them as claims
/// go by.
mod bounds {
    use std::sync::Arc;
    use std::time::Duration;

    use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
    use idem_runtime::store::conformance;
    use idem_runtime::store::{
        ClaimToken, IdemStore, ManualClock, MemoryStore, RecordState, Retention, StoreError,
        DEFAULT_CAPACITY,
    };

    const RETENTION: Retention = Retention {
        results: Duration::from_secs(60),
        tombstones: Duration::from_secs(600),
    };

    fn request(name: &str) -> ClaimRequest {
        ClaimRequest {
            key: conformance::key(name),
            fingerprint: conformance::fingerprint("args"),
            tool: "t".into(),
            lease: Duration::from_secs(10),
            operation: None,
        }
    }

    async fn claim(store: &MemoryStore, name: &str) -> Result<ClaimToken, StoreError> {
        match store.claim(&request(name)).await? {
            ClaimOutcome::Claimed(t) => Ok(t),
            other => panic!("{name}: expected a fresh claim, got {other:?}"),
        }
    }

    /// A released key's trace keeps the place its record had: releases cannot grow the
    /// store past its capacity, and the place comes back when the trace lapses.
    #[tokio::test]
    async fn release_traces_count_toward_the_capacity() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()))
            .retention(RETENTION)
            .capacity(2);
        let note = idem_runtime::store::ReleaseNote::new("ops", "not in the ledger");
        for round in 0..3 {
            // The same key, released again and again: still one place.
            let t = claim(&store, "released").await.expect("claim");
            let key = request("released").key;
            store
                .settle(&key, t, Settlement::new(RecordState::Unknown))
                .await
                .expect("settle");
            store
                .release_unsettled(&key, t, &note)
                .await
                .expect("release");
            assert_eq!(store.releases(&key).await.expect("trace").len(), round + 1);
        }
        claim(&store, "other").await.expect("one place left");
        assert!(
            matches!(claim(&store, "third").await, Err(StoreError::Full(_))),
            "the trace holds its place"
        );
        clock.advance(RETENTION.tombstones);
        claim(&store, "third")
            .await
            .expect("a lapsed trace makes room");
        assert!(store
            .releases(&request("released").key)
            .await
            .expect("trace")
            .is_empty());
    }

    #[tokio::test]
    async fn a_full_store_refuses_new_keys_and_evicts_nothing() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone()))
            .retention(RETENTION)
            .capacity(3);
        assert_eq!(MemoryStore::new().max_records(), DEFAULT_CAPACITY);
        assert_eq!(store.max_records(), 3);
        let running = claim(&store, "running").await.expect("claim");
        let unknown = claim(&store, "unknown").await.expect("claim");
        store
            .settle(
                &request("unknown").key,
                unknown,
                Settlement::new(RecordState::Unknown),
            )
            .await
            .expect("settle");
        let done = claim(&store, "done").await.expect("claim");
        store
            .settle(
                &request("done").key,
                done,
                Settlement::new(RecordState::Completed),
            )
            .await
            .expect("settle");

        match claim(&store, "one too many").await {
            Err(e @ StoreError::Full(_)) => {
                assert!(e.to_string().contains("maximum of 3 records"), "{e}");
            }
            other => panic!("a full store must refuse a new key, got {other:?}"),
        }
        assert_eq!(store.len(), 3, "nothing was evicted");
        assert!(store
            .get(&request("one too many").key)
            .await
            .expect("get")
            .is_none());
        // A repeat of a key it holds is still answered.
        assert!(matches!(
            store.claim(&request("done")).await,
            Ok(ClaimOutcome::Existing(_))
        ));

        // Past the result window the tombstone still counts: still full.
        clock.advance(RETENTION.results);
        assert!(matches!(
            claim(&store, "one too many").await,
            Err(StoreError::Full(_))
        ));
        // Past the tombstone window (and long past the running claim's lease, which only
        // makes it unknown), the lapsed tombstone is the one record dropped.
        clock.advance(RETENTION.tombstones);
        claim(&store, "one too many")
            .await
            .expect("a lapsed tombstone makes room");
        assert_eq!(store.len(), 3);
        assert!(store
            .get(&request("done").key)
            .await
            .expect("get")
            .is_none());
        let r = store
            .get(&request("running").key)
            .await
            .expect("get")
            .expect("the lapsed lease's record is kept");
        assert_eq!(r.state, RecordState::Unknown);
        assert_eq!(r.token, running, "the same claim, kept as unknown");
        let r = store
            .get(&request("unknown").key)
            .await
            .expect("get")
            .expect("unknown is kept");
        assert_eq!(r.state, RecordState::Unknown);
    }

    /// Past a couple of thousand free places, shards take places of the capacity in
    /// batches (so that claims on two cores do not write one count). The store must still
    /// hold exactly its capacity however the keys fall on the shards, and a place given back
    /// in one shard must serve a claim in any other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_large_store_fills_to_exactly_its_capacity() {
        let capacity = 5000;
        let store = MemoryStore::new().retention(RETENTION).capacity(capacity);
        let tasks: Vec<_> = (0..4)
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut won = Vec::new();
                    for i in 0..capacity / 4 {
                        let name = format!("{t}-{i}");
                        match store.claim(&request(&name)).await {
                            Ok(ClaimOutcome::Claimed(token)) => won.push((name, token)),
                            other => panic!("{name}: a place was free, got {other:?}"),
                        }
                    }
                    won
                })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            won.extend(t.await.expect("a claiming task"));
        }
        assert_eq!(store.len(), capacity);
        assert!(matches!(
            claim(&store, "one more").await,
            Err(StoreError::Full(_))
        ));
        // Ten places come back, from whatever shards those keys were in; ten new keys (in
        // whatever shards they fall) take them, and not one more.
        for (name, token) in &won[..10] {
            store
                .release(&request(name).key, *token)
                .await
                .expect("release");
        }
        for i in 0..10 {
            claim(&store, &format!("again-{i}"))
                .await
                .expect("a place given back serves any shard");
        }
        assert!(matches!(
            claim(&store, "eleventh").await,
            Err(StoreError::Full(_))
        ));
        assert_eq!(store.len(), capacity);
    }

    #[tokio::test]
    async fn lapsed_tombstones_are_swept_as_keys_are_claimed() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone())).retention(RETENTION);
        for i in 0..200 {
            let name = format!("old-{i}");
            let t = claim(&store, &name).await.expect("claim");
            store
                .settle(
                    &request(&name).key,
                    t,
                    Settlement::new(RecordState::Completed),
                )
                .await
                .expect("settle");
        }
        clock.advance(RETENTION.tombstones);
        // Nobody reads the old keys again; new claims alone sweep them: each shard every 256
        // of its own new claims. Three times 64 shards x 256 claims leaves no shard short of
        // 256 (each gets 768 on average; fewer than 256 is 18 standard deviations away).
        let fresh = 3 * 64 * 256;
        for i in 0..fresh {
            claim(&store, &format!("new-{i}")).await.expect("claim");
        }
        assert_eq!(store.len(), fresh, "every lapsed tombstone was swept");
    }

    #[tokio::test]
    async fn sweep_drops_lapsed_tombstones_only() {
        let clock = ManualClock::starting_now();
        let store = MemoryStore::with_clock(Arc::new(clock.clone())).retention(RETENTION);
        let t = claim(&store, "done").await.expect("claim");
        store
            .settle(
                &request("done").key,
                t,
                Settlement::new(RecordState::Failed),
            )
            .await
            .expect("settle");
        let t = claim(&store, "unknown").await.expect("claim");
        store
            .settle(
                &request("unknown").key,
                t,
                Settlement::new(RecordState::Unknown),
            )
            .await
            .expect("settle");
        assert_eq!(store.sweep(), 0);
        clock.advance(RETENTION.tombstones);
        assert_eq!(store.sweep(), 1);
        assert_eq!(store.len(), 1);
        assert!(store
            .get(&request("unknown").key)
            .await
            .expect("get")
            .is_some());
    }
}

/// A claim hands back the record the store holds, shared (`ClaimOutcome::Existing(Arc<_>)`).
/// What the reader holds must stay the record as it was found: a settle, a renewal, a
/// takeover or time passing afterwards changes the store's record, never the reader's copy.
mod shared_records {
    use std::sync::Arc;
    use std::time::Duration;

    use idem_runtime::store::backend::{ClaimOutcome, ClaimRequest, Settlement};
    use idem_runtime::store::conformance::{fingerprint, key};
    use idem_runtime::store::{
        IdemStore, ManualClock, MemoryStore, RecordState, Retention, Timestamp,
    };
    use serde_json::json;

    fn request(name: &str) -> ClaimRequest {
        ClaimRequest {
            key: key(name),
            fingerprint: fingerprint("args"),
            tool: "shared".into(),
            lease: Duration::from_secs(30),
            operation: None,
        }
    }

    async fn existing(store: &MemoryStore, req: &ClaimRequest) -> Arc<idem_runtime::store::Record> {
        match store.claim(req).await.unwrap() {
            ClaimOutcome::Existing(r) => r,
            other => panic!("expected the existing record, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_record_found_by_a_claim_is_not_changed_by_what_the_store_does_next() {
        let clock = Arc::new(ManualClock::new(Timestamp(1_000_000)));
        let store = MemoryStore::with_clock(clock.clone()).retention(Retention {
            results: Duration::from_secs(60),
            tombstones: Duration::from_secs(600),
        });
        let req = request("shared-1");
        let ClaimOutcome::Claimed(token) = store.claim(&req).await.unwrap() else {
            panic!("a fresh key is claimed");
        };

        // Found running; then renewed and settled by the holder.
        let running = existing(&store, &req).await;
        store
            .renew(&req.key, token, Duration::from_secs(90))
            .await
            .unwrap();
        let settled = Settlement::new(RecordState::Completed).payload(json!({"id": 7}));
        store.settle(&req.key, token, settled).await.unwrap();
        assert_eq!(running.state, RecordState::Running);
        assert_eq!(running.lease_until, Some(Timestamp(1_030_000)));
        assert_eq!(running.payload, None);

        // Found completed; then its result expires (time alone changes it).
        let completed = existing(&store, &req).await;
        assert_eq!(completed.state, RecordState::Completed);
        assert_eq!(completed.payload, Some(json!({"id": 7})));
        clock.advance(Duration::from_secs(61));
        let tombstone = existing(&store, &req).await;
        assert!(tombstone.result_expired);
        assert_eq!(tombstone.payload, None);
        assert!(
            !completed.result_expired,
            "the earlier reader's record is unchanged"
        );
        assert_eq!(completed.payload, Some(json!({"id": 7})));

        // The store's own record moved on with every step.
        let now = store
            .get(&req.key)
            .await
            .unwrap()
            .expect("the tombstone is kept");
        assert_eq!(now.state, RecordState::Completed);
        assert!(now.result_expired);
    }

    #[tokio::test]
    async fn a_lease_that_lapses_under_a_reader_turns_the_stores_record_unknown_only() {
        let clock = Arc::new(ManualClock::new(Timestamp(5_000_000)));
        let store = MemoryStore::with_clock(clock.clone());
        let req = request("shared-2");
        let ClaimOutcome::Claimed(_) = store.claim(&req).await.unwrap() else {
            panic!("a fresh key is claimed");
        };
        let running = existing(&store, &req).await;
        clock.advance(Duration::from_secs(31));
        let lapsed = existing(&store, &req).await;
        assert_eq!(lapsed.state, RecordState::Unknown);
        assert_eq!(running.state, RecordState::Running);
        assert_eq!(running.lease_until, Some(Timestamp(5_030_000)));
    }
}
