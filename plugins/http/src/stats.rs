//! Counters and gauges shared by the owner's server and the consumer's
//! client (relaxed atomics: they order nothing, they only count).

use shardport_abi::{
    kit::{GaugeHold, StatList},
    Stat,
};

pub(crate) use shardport_abi::kit::{Counter, Gauge};

/// Holds one unit of a gauge of shared [`Stats`] until dropped, so every
/// exit path (including a task dropped mid-way) gives it back.
pub(crate) type Held = GaugeHold<Stats>;

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
    /// Pending inbound connections (no authenticated request yet) closed
    /// to make room for newer ones (`max-pending`, `max-pending-per-peer`).
    pub connections_evicted: Counter,
    /// Inbound connections open now.
    pub connections_open: Gauge,
    /// Inbound TLS handshakes that failed or timed out (plain HTTP sent to a
    /// TLS owner, untrusted or missing client certificates, stalled peers).
    pub tls_handshake_failures: Counter,
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
        StatList::new()
            .gauge_value("shards_exported", shards_exported)
            .gauge_value("bytes_exported", bytes_exported)
            .counter("requests_served", &self.requests_served)
            .counter("requests_failed", &self.requests_failed)
            .counter("bytes_served", &self.bytes_served)
            .counter("batches_served", &self.batches_served)
            .counter("auth_failures", &self.auth_failures)
            .counter("connections_accepted", &self.connections_accepted)
            .counter("connections_timed_out", &self.connections_timed_out)
            .counter("connections_evicted", &self.connections_evicted)
            .gauge("connections_open", &self.connections_open)
            .counter("tls_handshake_failures", &self.tls_handshake_failures)
            .gauge("responses_in_flight", &self.responses_in_flight)
            .counter("unexport_timeouts", &self.unexport_timeouts)
            .counter("fetches", &self.fetches)
            .counter("fetch_errors", &self.fetch_errors)
            .counter("bytes_fetched", &self.bytes_fetched)
            .counter("batch_requests", &self.batch_requests)
            .counter("requests_sent", &self.requests_sent)
            .counter("retries", &self.retries)
            .counter("client_connections_opened", &self.client_connections_opened)
            .counter("client_connections_reused", &self.client_connections_reused)
            .gauge("client_connections_open", &self.client_connections_open)
            .finish()
    }
}
