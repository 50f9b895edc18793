//! Counters and gauges shared by the owner's server and the consumer's
//! client (relaxed atomics: they order nothing, they only count).

use shardport_abi::Stat;
use shardport_kit::{GaugeHold, StatList};

pub(crate) use shardport_kit::{Counter, Gauge};

/// Holds one unit of a gauge of shared [`Stats`] until dropped, so every
/// exit path (including a task dropped mid-way) gives it back.
pub(crate) type Held = GaugeHold<Stats>;

/// Relay gauges read from their owners' structures at snapshot time.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RelayGauges {
    /// Owner: shards with a relay tree.
    pub trees: u64,
    /// Relay: copies held, and their bytes.
    pub copies: u64,
    pub copy_bytes: u64,
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
    /// Polls for a connection's next request after a response (`owner-spin`).
    pub owner_polls: Counter,
    /// Those that found the next request within `owner-spin`.
    pub owner_poll_hits: Counter,
    /// Pending inbound connections (no authenticated request yet) closed
    /// to make room for newer ones (`max-pending`, `max-pending-per-peer`).
    pub connections_evicted: Counter,
    /// Inbound connections open now.
    pub connections_open: Gauge,
    /// Of those, served each on a thread of its own (`dedicated-threads`).
    pub connections_dedicated: Gauge,
    /// Times the owner reached `max-connections` (new connections then
    /// wait in the kernel's accept backlog until one closes).
    pub connections_at_limit: Counter,
    /// Served connections closed after their response because others
    /// waited at `max-connections` (their consumers reconnect behind).
    pub connections_rotated: Counter,
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
    /// Requests that found all `max-connections-per-owner` connections to
    /// their owner busy and waited for one / that gave up after
    /// `request-timeout`.
    pub pool_waits: Counter,
    pub pool_wait_timeouts: Counter,
    // Relays.
    /// Owner: joins of a shard's relay tree answered.
    pub relay_joins: Counter,
    /// Owner: joiners made leaves because the address they serve on is not
    /// the one they joined from.
    pub relay_addresses_refused: Counter,
    /// Owner: removal notices sent to relay holders / that failed.
    pub relay_removals_sent: Counter,
    pub relay_removal_failures: Counter,
    /// Owner: relays demoted after a member they fed reported them failed
    /// or late (moved to the tail when they rejoin).
    pub relay_demotions: Counter,
    /// Owner: reports of a failed or late holder the reporter was never
    /// given (they change nothing).
    pub relay_reports_ignored: Counter,
    /// Relay: bytes of relay copies served to other consumers.
    pub relay_bytes_served: Counter,
    /// Relay: copies dropped because their owner removed the shard.
    pub relay_copies_dropped: Counter,
    /// Relay: removals or moves of a copy refused because they did not
    /// carry the key its owner gave (not from the owner).
    pub relay_notices_refused: Counter,
    /// Consumer: fetches that went through a relay tree.
    pub relay_fetches: Counter,
    /// Consumer: bytes received from relays rather than from the owner.
    pub relay_bytes_from_holders: Counter,
    /// Consumer: bytes of verified pieces received by relayed fetches,
    /// from the owner or relays (a piece two sources sent counts twice).
    pub relay_bytes_received: Counter,
    /// Consumer: bytes received from alternates (holders or the owner
    /// named besides the parent) rather than from the parent.
    pub relay_bytes_from_alternates: Counter,
    /// Consumer: runs of pieces an alternate took over from a late source.
    pub relay_takeovers: Counter,
    /// Consumer: rejoins after a relay failed (refused, closed, stalled,
    /// or sent a piece with the wrong hash).
    pub relay_failovers: Counter,
    /// Consumer: pieces whose hash did not match the owner's.
    pub relay_corrupt_pieces: Counter,
    /// Consumer: rejoins because the parent was late and the alternates had
    /// taken over from it (the owner names another parent).
    pub relay_late_parents: Counter,
    /// Relay: rejoins because the owner demoted this relay (it asked with
    /// `POST /v1/relay/{id}`).
    pub relay_moves: Counter,
}

impl Stats {
    /// The stats in the order the README lists them, with owner-side gauges
    /// the caller supplies.
    pub(crate) fn snapshot(
        &self,
        shards_exported: u64,
        bytes_exported: u64,
        relay: RelayGauges,
    ) -> Vec<Stat> {
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
            .gauge("connections_dedicated", &self.connections_dedicated)
            .counter("connections_at_limit", &self.connections_at_limit)
            .counter("connections_rotated", &self.connections_rotated)
            .counter("owner_polls", &self.owner_polls)
            .counter("owner_poll_hits", &self.owner_poll_hits)
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
            .counter("pool_waits", &self.pool_waits)
            .counter("pool_wait_timeouts", &self.pool_wait_timeouts)
            .counter("relay_joins", &self.relay_joins)
            .counter("relay_addresses_refused", &self.relay_addresses_refused)
            .gauge_value("relay_trees", relay.trees)
            .counter("relay_removals_sent", &self.relay_removals_sent)
            .counter("relay_removal_failures", &self.relay_removal_failures)
            .counter("relay_demotions", &self.relay_demotions)
            .counter("relay_reports_ignored", &self.relay_reports_ignored)
            .counter("relay_bytes_served", &self.relay_bytes_served)
            .counter("relay_copies_dropped", &self.relay_copies_dropped)
            .counter("relay_notices_refused", &self.relay_notices_refused)
            .gauge_value("relay_copies", relay.copies)
            .gauge_value("relay_copy_bytes", relay.copy_bytes)
            .counter("relay_fetches", &self.relay_fetches)
            .counter("relay_bytes_from_holders", &self.relay_bytes_from_holders)
            .counter("relay_bytes_received", &self.relay_bytes_received)
            .counter(
                "relay_bytes_from_alternates",
                &self.relay_bytes_from_alternates,
            )
            .counter("relay_takeovers", &self.relay_takeovers)
            .counter("relay_failovers", &self.relay_failovers)
            .counter("relay_late_parents", &self.relay_late_parents)
            .counter("relay_moves", &self.relay_moves)
            .counter("relay_corrupt_pieces", &self.relay_corrupt_pieces)
            .finish()
    }
}
