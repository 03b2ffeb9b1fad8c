//! Shared handles whose reference counts threads on different cores do not share.
//!
//! Every write clones its tool's name into the claim, the record and the handler's context,
//! and its handler into the attempt's future. Cloning an [`Arc`] writes its count, so when
//! every worker thread clones the *same* `Arc`, the cache line holding that count moves
//! between cores on every clone and every drop: two threads calling one tool spend their
//! time waiting for each other's writes although they share no data. A [`Striped`] value
//! holds several equal `Arc`s, each its own allocation with its counts in a 128-byte block
//! of its own (a cache line and the neighbour the prefetcher pulls in with it), and each
//! thread clones the one of its stripe.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How many copies a [`Striped`] value keeps: as many threads as this clone without
/// touching each other's counts (a runtime's workers are one a core).
const STRIPES: usize = 8;

/// The block size that keeps two counts from sharing a cache line, or a pair of lines.
const BLOCK: usize = 128;

/// Several equal `Arc<T>`s, one per stripe of threads; see the module's doc.
pub(crate) struct Striped<T: ?Sized> {
    stripes: Box<[Arc<T>]>,
}

impl<T: ?Sized> Clone for Striped<T> {
    fn clone(&self) -> Self {
        Striped {
            stripes: self.stripes.clone(),
        }
    }
}

impl<T: ?Sized> Striped<T> {
    /// Calls `make` until it has [`STRIPES`] values whose counts lie in distinct blocks.
    ///
    /// Allocators hand out small allocations side by side, so consecutive values would share
    /// a line; candidates that land in a taken block are held until the end (the allocator
    /// cannot hand their place out again meanwhile) and then dropped. If the allocator keeps
    /// putting them together anyway, the values are kept as they come: sharing a line costs
    /// speed, never correctness.
    pub(crate) fn new(mut make: impl FnMut() -> Arc<T>) -> Self {
        let mut stripes: Vec<Arc<T>> = Vec::with_capacity(STRIPES);
        let mut crowded = Vec::new();
        while stripes.len() < STRIPES {
            let candidate = make();
            let block = counts_block(&candidate);
            if crowded.len() < 4 * STRIPES && stripes.iter().any(|s| counts_block(s) == block) {
                crowded.push(candidate);
            } else {
                stripes.push(candidate);
            }
        }
        drop(crowded);
        Striped {
            stripes: stripes.into_boxed_slice(),
        }
    }

    /// A copy to borrow, not clone: reading it writes nothing, so any copy serves every
    /// thread (and no thread-local lookup is needed).
    pub(crate) fn any(&self) -> &T {
        &self.stripes[0]
    }

    /// The copy this thread clones.
    pub(crate) fn local(&self) -> &Arc<T> {
        &self.stripes[this_threads_stripe() % self.stripes.len()]
    }
}

/// The block holding `value`'s counts: they sit just before the value (for values aligned
/// to at most 16 bytes, as everything striped here is).
fn counts_block<T: ?Sized>(value: &Arc<T>) -> usize {
    let counts = 2 * std::mem::size_of::<usize>();
    (Arc::as_ptr(value).cast::<u8>() as usize).wrapping_sub(counts) / BLOCK
}

/// This thread's stripe: threads are numbered in the order they first ask, so a runtime's
/// workers get neighbouring numbers and distinct stripes.
fn this_threads_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|stripe| {
        if stripe.get() == usize::MAX {
            stripe.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
        }
        stripe.get()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stripe_is_its_own_allocation_with_its_own_counts_block() {
        let striped: Striped<str> = Striped::new(|| Arc::from("charge_card"));
        let mut blocks: Vec<usize> = striped.stripes.iter().map(counts_block).collect();
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), STRIPES);
        for s in striped.stripes.iter() {
            assert_eq!(&**s, "charge_card");
            assert_eq!(Arc::strong_count(s), 1);
        }
    }

    #[test]
    fn a_thread_keeps_its_copy_and_threads_spread_over_the_copies() {
        let striped = Arc::new(Striped::new(|| Arc::new(7_u64)));
        assert!(Arc::ptr_eq(striped.local(), striped.local()));
        // Eight threads in turn draw eight consecutive numbers (other tests' threads may draw
        // in between, but cannot make all eight land on one stripe).
        let mut seen: Vec<usize> = (0..STRIPES)
            .map(|_| {
                let striped = Arc::clone(&striped);
                std::thread::spawn(move || Arc::as_ptr(striped.local()) as usize)
                    .join()
                    .unwrap()
            })
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() > 1, "every thread cloned one copy");
        assert_eq!(*striped.local().clone(), 7);
    }
}
