//! Monotonic counters shared by the owner and consumer sides.

pub(crate) use shardport_kit::Counter;

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
    /// Completed `import_view_private` calls (copy-on-write views).
    pub imports_view_private: Counter,
    /// Lease slots of dead consumers this owner freed.
    pub leases_reclaimed: Counter,
    /// Segments of dead owners this instance unlinked.
    pub segments_swept: Counter,
    /// `/dev/shm` space those segments occupied (allocated pages).
    pub bytes_swept: Counter,
}
