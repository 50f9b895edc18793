//! # shardport-control: the node's control endpoint, server and client
//!
//! A small HTTP/1.1 (optionally HTTPS) server for operators and tools
//! (`shardport stats`, `shardport put`, `shardport reload`, ...), and the
//! client those tools use. Data never flows through it to consumers: they
//! fetch from transports. It lives on the library side (over
//! [`shardport_host`], not in the CLI) so that any process that runs a
//! [`Node`](shardport_host::Node) — `shardport serve`, or a library node
//! such as the Python binding — can serve the same authenticated endpoint.
//!
//! # Public API
//! - [`ControlServer::start`] (default [`Limits`]), [`ControlServer::start_with`]
//!   (shorter limits, for tests) and [`ControlServer::start_tls`] (HTTPS
//!   with a config from [`tls::server_config`]): binds, serves on
//!   background threads, stops when dropped. It holds the node weakly.
//! - [`client`]: [`client::call`] / [`client::call_with`] (JSON answers),
//!   [`client::get_text`] (`/metrics`), [`client::request`] (any answer),
//!   over TLS with a [`client::Trust`] built from a CA file.
//! - The bounds as named constants ([`MAX_HEADER_BYTES`], [`HEAD_DEADLINE`],
//!   ...), [`HEAD_RULES`] (how heads are read), [`parse_id`].
//!
//! ```no_run
//! use shardport_control::{client, ControlServer};
//! # fn demo(node: &shardport_host::Node) -> Result<(), Box<dyn std::error::Error>> {
//! let server = ControlServer::start(node, "127.0.0.1:0", Some("secret".into()))?;
//! let addr = server.addr().to_string();
//! let t = std::time::Duration::from_secs(5);
//! let stats = client::call(&addr, "GET", "/v1/stats", Some("secret"), &[], t)?;
//! let gone = client::call(&addr, "POST", "/v1/remove", Some("secret"), br#"{"ids": []}"#, t)?;
//! # let _ = (stats, gone);
//! # Ok(()) }
//! ```
//!
//! Heads, deadlines and TLS come from the workspace's one HTTP/1.1 and TLS
//! base (`shardport_http_base`), which the http transport uses too. Where
//! to start reading: `server.rs` (a connection's life), then
//! `endpoints.rs` (what each path does).
//!
//! Endpoints (JSON errors are `{"code": "...", "message": "..."}`):
//! - `GET /v1/health` -> `{"ok": true, "node": ...}`
//! - `GET /v1/stats` -> the node's [`NodeStats`](shardport_host::NodeStats)
//! - `GET /metrics` (Prometheus text), `GET /v1/metrics.json`
//! - `POST /v1/put?dtype=bf16&shape=4,8&tag.k=v` with the raw bytes as body
//!   -> `{"id", "handle" (hex of the binary form), "handle_json"}`
//! - `POST /v1/remove` with `{"ids": ["<32 hex>", ...]}` -> `{"missing": [...]}`
//! - `POST /v1/drain` with `{"ids": [...]}` or `{"all": true}` -> `{"drained": n}`:
//!   drops this node's cached copies (and their leases) of those shards
//! - `POST /v1/sweep` -> per transport, what was reclaimed from dead processes
//! - `POST /v1/experiments/reset` -> arms a guardrail disabled, re-enabled
//! - `POST /v1/reload` with an empty body (read the node's own config file
//!   again: the one it was started with, or adopted since),
//!   `{"path": "/etc/sp.toml"}` (a file on the node's machine) or
//!   `{"config": "<TOML text>", "path": "name for messages and base of
//!   relative plugin paths"}`, each with `"adopt": true` to make that
//!   path the node's own file -> the [`ReloadReport`](shardport_host::node::ReloadReport);
//!   a refused reload is 409 `reload_refused` with the reason (file:line:col
//!   for a bad value), counted and logged by the node, and the running
//!   config stays
//!
//! # Limits
//! Bounded everywhere ([`Limits`]): the request head in size
//! ([`MAX_HEADER_BYTES`]) and in time as a whole ([`HEAD_DEADLINE`], however
//! the bytes are paced); bodies in size (JSON [`MAX_JSON_BODY`], puts
//! `node.max-shard-size`) and in time (a grace period plus a minimum rate).
//! Connections whose head has not arrived are *pending* and have their own
//! budget ([`admission`]): a new connection evicts the oldest pending one,
//! so clients that trickle their heads cannot lock operators out.
//! Authenticated requests have a separate budget ([`MAX_CONNECTIONS`]).
//! One request per connection. Framing is strict
//! (`shardport_http_base::head` with [`HEAD_RULES`]): conflicting or
//! repeated `Content-Length`, `Transfer-Encoding`, obs-fold and bare CR are
//! refused with 400.
//!
//! # TLS
//! With `[control] tls-cert` and `tls-key` the endpoint speaks HTTPS only
//! ([`tls`]); the handshake runs while the connection is still pending, so
//! it counts against the pending budget and the head deadline
//! ([`HEAD_DEADLINE`] covers handshake and head together). A plain-HTTP
//! client of a TLS endpoint, or a TLS client of a plain one, is answered
//! at once with a plain 400 (`tls_required` / `tls_not_served`).
//!
//! # Authentication
//! With a token configured, every endpoint needs `Authorization: Bearer
//! <token>`, compared in constant time as soon as that header line arrives
//! (a wrong token is refused before the rest of the head). Binds to
//! loopback unless told otherwise.

#![forbid(unsafe_code)]

use std::time::Duration;

pub use shardport_http_base::head::{LineEnds, Rules, Values};
/// The pending-connection budget (in the plugin kit: the http data endpoint
/// uses the same one).
pub use shardport_kit::admission;
pub use shardport_kit::check::constant_time_eq;

pub mod client;
mod conn;
mod endpoints;
mod request;
mod server;
pub mod tls;

pub use conn::Conn;
pub use server::ControlServer;

/// Largest request head (request line + headers).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest JSON request body.
pub const MAX_JSON_BODY: usize = 1 << 20;
/// Most authenticated requests served at once; more get 503.
pub const MAX_CONNECTIONS: usize = 64;
/// Most connections whose head has not arrived yet; one more evicts the
/// oldest of them.
pub const MAX_PENDING: usize = 64;
/// Most pending connections from one address; one more evicts that
/// address's oldest.
pub const MAX_PENDING_PER_PEER: usize = 16;
/// The whole request head must arrive within this, however it is paced:
/// generous for any real client (heads are a few hundred bytes).
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// A body gets this long plus its length at [`MIN_BODY_RATE`].
pub const BODY_GRACE: Duration = Duration::from_secs(10);
/// The slowest body rate served (bytes per second): far below any real
/// network, far above a trickle meant to hold a connection.
pub const MIN_BODY_RATE: u64 = 1 << 20;
/// How long a connection may linger after its answer (see `linger`).
pub const LINGER: Duration = Duration::from_millis(500);
/// The most a lingering connection reads and drops.
pub const LINGER_BYTES: usize = 64 << 10;
/// Write timeout per socket operation, and what `shutdown` waits for
/// requests in flight: a stalled client loses its connection, never a
/// server thread forever.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The control server's limits (the defaults are the constants above;
/// tests shorten them).
#[derive(Debug, Clone)]
pub struct Limits {
    /// See [`HEAD_DEADLINE`].
    pub head_deadline: Duration,
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`MAX_PENDING`].
    pub max_pending: usize,
    /// See [`MAX_PENDING_PER_PEER`].
    pub max_pending_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head_deadline: HEAD_DEADLINE,
            max_connections: MAX_CONNECTIONS,
            max_pending: MAX_PENDING,
            max_pending_per_peer: MAX_PENDING_PER_PEER,
        }
    }
}

/// How the control endpoint and its client read heads: at most
/// [`MAX_HEADER_BYTES`], a lone LF accepted as a line end (so a CR anywhere
/// else is a bare CR), any value byte but NUL, and a `Content-Length` of
/// at most 19 digits.
pub const HEAD_RULES: Rules = Rules {
    max_bytes: MAX_HEADER_BYTES,
    max_fields: usize::MAX,
    line_ends: LineEnds::CrLfOrLf,
    values: Values::NotNul,
    max_length_digits: 19,
};

/// A shard id from its 32 hex digits (how the endpoints and the CLI's
/// worker protocol write one).
pub fn parse_id(s: &str) -> Result<shardport_abi::ShardId, String> {
    if s.len() != 32 {
        return Err(format!("shard id `{s}` is not 32 hex digits"));
    }
    u128::from_str_radix(s, 16)
        .map(shardport_abi::ShardId::from_u128)
        .map_err(|_| format!("shard id `{s}` is not 32 hex digits"))
}

#[cfg(test)]
mod tests {
    use super::{constant_time_eq, parse_id};
    use shardport_abi::ShardId;

    #[test]
    fn ids_parse() {
        let id = ShardId::from_u128(0xabc);
        assert_eq!(parse_id(&id.to_string()), Ok(id));
        assert!(parse_id("xyz").is_err());
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }
}
