//! Counters and gauges shared by the owner's server and the consumer's
//! client (relaxed atomics: they order nothing, they only count).

use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

use shardport_abi::Stat;

/// A monotonic counter.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.add(1);
    }

    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub(crate) struct Gauge(AtomicU64);

impl Gauge {
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Holds one unit of a gauge of shared [`Stats`] until dropped, so every
/// exit path (including a task dropped mid-way) gives it back.
#[derive(Debug)]
pub(crate) struct Held {
    stats: Arc<Stats>,
    gauge: fn(&Stats) -> &Gauge,
}

impl Held {
    pub(crate) fn new(stats: &Arc<Stats>, gauge: fn(&Stats) -> &Gauge) -> Held {
        gauge(stats).add(1);
        Held {
            stats: Arc::clone(stats),
            gauge,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        (self.gauge)(&self.stats).sub(1);
    }
}

/// Every statistic `stats()` reports (see the README's table).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    // Owner side.
    /// Requests answered with 200 (single shards, batches, health).
    pub requests_served: Counter,
    /// Requests answered with an error status, or dropped by a timeout.
    pub requests_failed: Counter,
    /// Shard bytes put into 200 responses (counted when the response starts).
    pub bytes_served: Counter,
    /// `POST /v1/batch` requests answered with 200.
    pub batches_served: Counter,
    /// Requests refused for a missing or wrong token.
    pub auth_failures: Counter,
    /// Inbound connections accepted.
    pub connections_accepted: Counter,
    /// Inbound connections closed by a timeout (idle, slow head, stalled peer).
    pub connections_timed_out: Counter,
    /// Inbound connections open now.
    pub connections_open: Gauge,
    /// Responses whose body is still being written.
    pub responses_in_flight: Gauge,
    /// `unexport` calls that gave up waiting for in-flight responses.
    pub unexport_timeouts: Counter,
    // Consumer side.
    /// Shards imported successfully (single or batched).
    pub fetches: Counter,
    /// Shards whose import failed.
    pub fetch_errors: Counter,
    /// Shard bytes written into destinations.
    pub bytes_fetched: Counter,
    /// `POST /v1/batch` requests sent.
    pub batch_requests: Counter,
    /// Requests sent (single and batch).
    pub requests_sent: Counter,
    /// Requests retried on a fresh connection after a pooled one turned out dead.
    pub retries: Counter,
    /// Outbound connections opened.
    pub client_connections_opened: Counter,
    /// Requests sent over a pooled, already open connection.
    pub client_connections_reused: Counter,
    /// Outbound connections open now (in use or idle in the pool).
    pub client_connections_open: Gauge,
}

impl Stats {
    /// The stats in the order the README lists them, with owner-side gauges
    /// the caller supplies.
    pub(crate) fn snapshot(&self, shards_exported: u64, bytes_exported: u64) -> Vec<Stat> {
        vec![
            Stat::gauge("shards_exported", shards_exported),
            Stat::gauge("bytes_exported", bytes_exported),
            Stat::counter("requests_served", self.requests_served.get()),
            Stat::counter("requests_failed", self.requests_failed.get()),
            Stat::counter("bytes_served", self.bytes_served.get()),
            Stat::counter("batches_served", self.batches_served.get()),
            Stat::counter("auth_failures", self.auth_failures.get()),
            Stat::counter("connections_accepted", self.connections_accepted.get()),
            Stat::counter("connections_timed_out", self.connections_timed_out.get()),
            Stat::gauge("connections_open", self.connections_open.get()),
            Stat::gauge("responses_in_flight", self.responses_in_flight.get()),
            Stat::counter("unexport_timeouts", self.unexport_timeouts.get()),
            Stat::counter("fetches", self.fetches.get()),
            Stat::counter("fetch_errors", self.fetch_errors.get()),
            Stat::counter("bytes_fetched", self.bytes_fetched.get()),
            Stat::counter("batch_requests", self.batch_requests.get()),
            Stat::counter("requests_sent", self.requests_sent.get()),
            Stat::counter("retries", self.retries.get()),
            Stat::counter(
                "client_connections_opened",
                self.client_connections_opened.get(),
            ),
            Stat::counter(
                "client_connections_reused",
                self.client_connections_reused.get(),
            ),
            Stat::gauge(
                "client_connections_open",
                self.client_connections_open.get(),
            ),
        ]
    }
}
