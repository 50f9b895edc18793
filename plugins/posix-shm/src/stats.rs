//! Monotonic counters shared by the owner and consumer sides.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A monotonic counter (relaxed: it orders nothing, it only counts).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Current value.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Every counter `stats()` reports.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Bytes published by `export`.
    pub bytes_exported: Counter,
    /// Shards that did not fit the pool and got their own segment.
    pub spills: Counter,
    /// Leases this consumer obtained (views and copies).
    pub leases_granted: Counter,
    /// Completed `import_into` calls.
    pub imports_copy: Counter,
    /// Completed `import_view` calls.
    pub imports_view: Counter,
    /// Lease slots of dead consumers this owner freed.
    pub leases_reclaimed: Counter,
    /// Segments of dead owners this instance unlinked.
    pub segments_swept: Counter,
    /// `/dev/shm` space those segments occupied (allocated pages).
    pub bytes_swept: Counter,
}
