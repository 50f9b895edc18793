//! Per-node fetch metrics: counters and latency totals per transport, and
//! downgrades. Lock-free counters; the transport set is fixed at start.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use serde::Serialize;

#[derive(Default)]
struct Counters {
    fetches: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns: AtomicU64,
}

/// Metrics of one node.
pub struct Metrics {
    per_transport: BTreeMap<String, Counters>,
    no_candidate: AtomicU64,
    downgrades: AtomicU64,
    leaked_bytes: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("transports", &self.snapshot())
            .finish()
    }
}

/// One transport's counters at a point in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TransportSnapshot {
    /// Successful fetches.
    pub fetches: u64,
    /// Bytes fetched.
    pub bytes: u64,
    /// Failed attempts.
    pub errors: u64,
    /// Sum of fetch latencies in ns.
    pub latency_ns_total: u64,
}

impl Metrics {
    /// Metrics for these transports.
    pub fn new(transports: impl IntoIterator<Item = String>) -> Self {
        Metrics {
            per_transport: transports
                .into_iter()
                .map(|t| (t, Counters::default()))
                .collect(),
            no_candidate: AtomicU64::new(0),
            downgrades: AtomicU64::new(0),
            leaked_bytes: AtomicU64::new(0),
        }
    }

    /// A successful fetch.
    pub fn fetch_ok(&self, transport: &str, bytes: u64, latency: Duration) {
        if let Some(c) = self.per_transport.get(transport) {
            c.fetches.fetch_add(1, Ordering::Relaxed);
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
            c.latency_ns
                .fetch_add(latency.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// A failed attempt (`None`: no candidate at all).
    pub fn fetch_error(&self, transport: Option<&str>) {
        match transport.and_then(|t| self.per_transport.get(t)) {
            Some(c) => c.errors.fetch_add(1, Ordering::Relaxed),
            None => self.no_candidate.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// A downgrade.
    pub fn downgrade(&self) {
        self.downgrades.fetch_add(1, Ordering::Relaxed);
    }

    /// Owned bytes leaked because a transport failed to unexport them.
    pub fn leaked_storage(&self, bytes: u64) {
        self.leaked_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes leaked so far (see [`leaked_storage`](Self::leaked_storage)).
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked_bytes.load(Ordering::Relaxed)
    }

    /// Fetches that found no candidate transport.
    pub fn no_candidate(&self) -> u64 {
        self.no_candidate.load(Ordering::Relaxed)
    }

    /// Downgrades so far.
    pub fn downgrades(&self) -> u64 {
        self.downgrades.load(Ordering::Relaxed)
    }

    /// Per-transport snapshot.
    pub fn snapshot(&self) -> BTreeMap<String, TransportSnapshot> {
        self.per_transport
            .iter()
            .map(|(t, c)| {
                (
                    t.clone(),
                    TransportSnapshot {
                        fetches: c.fetches.load(Ordering::Relaxed),
                        bytes: c.bytes.load(Ordering::Relaxed),
                        errors: c.errors.load(Ordering::Relaxed),
                        latency_ns_total: c.latency_ns.load(Ordering::Relaxed),
                    },
                )
            })
            .collect()
    }
}
