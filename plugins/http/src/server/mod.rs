//! Owner side: the exported shards and the HTTP/1.1 server that serves them.
//!
//! # Overview
//! [`Registry`] maps shard ids to the bytes the host lent to `export`
//! ([`LentBytes`]); nothing is copied. The server runs on the plugin's own
//! runtime: an accept loop bounded by `max-connections`, and one task per
//! connection running hyper's HTTP/1.1 state machine plus a watchdog. A
//! response body reads the lent memory in place (`Bytes` owning a
//! [`Reader`](crate::sys::Reader)), so `unexport` can wait for exactly the
//! responses still reading a shard.
//!
//! # Timeouts (a slow or hostile peer never wedges the server)
//! - a request head must be complete within `header-timeout` of its first
//!   byte, and fit in `max-header-bytes` (hyper answers 431 otherwise);
//! - a request body must fit in `max-request-bytes` (413) and arrive within
//!   `request-timeout` (408);
//! - a connection with no I/O progress for `idle-timeout` is closed, whether
//!   it is idle between requests or a peer stopped reading its response;
//! - at most `max-connections` are served at once; more wait in the kernel's
//!   accept backlog;
//! - with TLS (`tls-cert`), the handshake runs inside the connection's
//!   `max-connections` slot and must finish within `tls-handshake-timeout`
//!   of accept; a peer that speaks plain HTTP to it gets a plain `400`
//!   saying so (`tls_required`) and the connection is closed.
//!
//! # Locking
//! The registry is one `RwLock` (readers: request handlers, which only clone
//! `Arc`s under it; writers: `export` / `unexport`, which never wait under
//! it). Each export has its own reader book (see `sys`).

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError, RwLock,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::{
    body::Incoming,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::TokioIo;
use shardport_abi::{AbiError, DeviceKind, ErrorKind, ExportRequest, PluginResult, ShardId};
use shardport_kit::{
    admission::{Admission, Close, Ticket},
    format_byte_size,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{watch, Semaphore},
};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use crate::{
    config::{format_duration, Config, Token},
    descriptor::{parse_host_port, Descriptor, MAX_ADDR_LEN},
    gpu::PinnedPool,
    stats::{Held, Stats},
    sys::{LentBytes, Reader},
    wire,
};

/// How long the accept loop pauses after `accept` fails (out of file
/// descriptors, usually): long enough not to spin, short enough that
/// service resumes as soon as descriptors free up.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long in-flight responses may finish after the transport is dropped
/// before their connections are closed (capped by `request-timeout`).
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long an `accept` failure keeps `health()` not ok.
const ACCEPT_ERROR_WINDOW: Duration = Duration::from_secs(10);
/// Finest and coarsest watchdog period: checks run four times per shortest
/// timeout, within these bounds, so a timeout fires at most 25% late.
const WATCHDOG_MIN: Duration = Duration::from_millis(10);
const WATCHDOG_MAX: Duration = Duration::from_secs(1);
/// hyper's default read/write buffer limit (8 KiB + 100 x 4 KiB); raised only
/// when `max-header-bytes` needs more room.
const HYPER_DEFAULT_MAX_BUF: usize = 8192 + 4096 * 100;
/// Longest request path quoted back in an error message.
const MAX_QUOTED_PATH: usize = 96;
/// Response bodies: ready chunks, and GPU shards staged piece by piece.
mod body;
mod connection;
mod relay;
mod routes;

#[cfg(test)]
pub(crate) use self::connection::POLL_AT_ANY_LOAD;
#[allow(clippy::wildcard_imports)]
use self::{connection::*, routes::*};
/// The request handler over an in-memory connection, for the fuzz targets.
pub(crate) mod in_memory;

use body::{Frames, InFlight, Part};
/// How long the answer to a plain-HTTP client of a TLS owner lingers,
/// reading what the client still sends, and the most it reads.
const PLAINTEXT_LINGER: Duration = Duration::from_millis(500);
const PLAINTEXT_LINGER_BYTES: usize = 64 << 10;
/// Marker for "no request head in progress".
const NONE: u64 = u64::MAX;

/// The shards this owner exports, by id.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    shards: RwLock<HashMap<ShardId, Arc<LentBytes>>>,
    bytes: AtomicU64,
}

impl Registry {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ShardId, Arc<LentBytes>>> {
        // Critical sections only insert, remove or clone: a panic cannot
        // leave the map half-updated.
        self.shards.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ShardId, Arc<LentBytes>>> {
        self.shards.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader of shard `id`, or `None` when it is not exported.
    fn reader(&self, id: ShardId) -> Option<Reader> {
        self.read().get(&id).and_then(LentBytes::reader)
    }

    /// Readers of every id, taken under one lock so a batch sees one state.
    fn readers(&self, ids: &[ShardId]) -> Vec<Option<Reader>> {
        let map = self.read();
        ids.iter()
            .map(|id| map.get(id).and_then(LentBytes::reader))
            .collect()
    }

    /// Number of exported shards and their total bytes.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.read().len() as u64, self.bytes.load(Ordering::Relaxed))
    }
}

/// Limits and identity every connection task needs.
struct Shared {
    registry: Arc<Registry>,
    stats: Arc<Stats>,
    token: Option<Token>,
    bound: SocketAddr,
    advertised: String,
    max_batch: usize,
    max_request_bytes: usize,
    max_header_bytes: usize,
    request_timeout: Duration,
    idle_timeout: Duration,
    header_timeout: Duration,
    /// `owner-spin`: polling for a connection's next request after a
    /// response (0: never).
    owner_spin: Duration,
    /// `dedicated-threads`: connections each served on a thread of its own.
    dedicated: connection::Dedicated,
    /// At `max-connections` with connections waiting in the accept
    /// backlog: 1 while a served connection may close after its response
    /// so that one waiting gets its place ([`connection::Rotation`]).
    rotations: std::sync::atomic::AtomicU32,
    /// Connections that took a rotation and have not closed yet (their
    /// response in flight still draining): no other is handed out meanwhile.
    rotating: std::sync::atomic::AtomicU32,
    /// Serve HTTPS with this (`tls-cert`), or plain HTTP.
    tls: Option<TlsAcceptor>,
    tls_handshake_timeout: Duration,
    /// Connections accepted whose first authenticated request has not
    /// arrived: their own budget, oldest evicted first.
    admission: Arc<Admission<Evict>>,
    /// Origin of the millisecond clocks in [`Activity`].
    epoch: Instant,
    /// Why the accept loop stopped, when it did.
    stopped: Mutex<Option<String>>,
    /// The last `accept` failure and when it happened.
    accept_error: Mutex<Option<(Instant, String)>>,
    /// Pinned buffers GPU shards are staged through.
    staging: Arc<PinnedPool>,
    /// Owner: the relay tree of every shard consumers joined.
    trackers: crate::relay::Trackers,
    /// Relay: this node's copies of shards it fetched.
    holdings: Arc<crate::relay::Holdings>,
    /// `relay-stall-timeout`: how long a stream waits for the next piece.
    relay_stall: Duration,
    /// Tests only: corrupt every relayed piece.
    relay_corrupt: bool,
    /// Owner: tells demoted relays to rejoin.
    client: Arc<crate::client::Client>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("bound", &self.bound)
            .field("advertised", &self.advertised)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// The owner side of one transport instance.
#[derive(Debug)]
pub(crate) struct Server {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    accepting: Arc<AtomicBool>,
}

impl Server {
    /// Binds `cfg.bind` (a failure names the address) and starts serving on
    /// `rt`, over TLS with `tls`.
    pub(crate) fn start(
        cfg: &Config,
        tls: Option<Arc<rustls::ServerConfig>>,
        rt: &tokio::runtime::Handle,
        stats: Arc<Stats>,
        holdings: Arc<crate::relay::Holdings>,
        client: Arc<crate::client::Client>,
    ) -> PluginResult<Server> {
        let listener = std::net::TcpListener::bind(cfg.bind).map_err(|e| {
            let mut err = AbiError::io(
                format_args!(
                    "cannot bind `plugin.{}.config.bind` = \"{}\" ({})",
                    cfg.instance, cfg.bind_text, cfg.bind
                ),
                &e,
            );
            if e.kind() == io::ErrorKind::AddrInUse {
                err.kind = ErrorKind::UNAVAILABLE;
                err.message.push_str(
                    "; another process serves that port (use port 0 for an ephemeral one)",
                );
            }
            err
        })?;
        let bound = listener.local_addr().map_err(|e| {
            AbiError::io(
                format_args!("cannot read the bound address of {}", cfg.bind),
                &e,
            )
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| AbiError::io(format_args!("cannot make {bound} non-blocking"), &e))?;
        let listener = {
            let _enter = rt.enter();
            TcpListener::from_std(listener).map_err(|e| {
                AbiError::io(format_args!("cannot register {bound} with the runtime"), &e)
            })?
        };
        let advertised = cfg.advertised(bound);
        // The bound address can be one consumers cannot parse (an IPv6
        // scope id): refuse it now rather than hand out bad descriptors.
        if advertised.len() > MAX_ADDR_LEN {
            return Err(AbiError::config(format!(
                "`plugin.{}.config.advertise`: the advertised address {advertised:?} is longer \
                 than {MAX_ADDR_LEN} bytes",
                cfg.instance
            )));
        }
        if let Err(why) = parse_host_port(&advertised) {
            return Err(AbiError::config(format!(
                "`plugin.{}.config.advertise`: the bound address {advertised} cannot go into \
                 descriptors ({why}); set `advertise` to an address consumers can reach",
                cfg.instance
            )));
        }
        let serves_tls = tls.is_some();
        let shared = Arc::new(Shared {
            trackers: crate::relay::Trackers::new(
                cfg.relay.fanout,
                cfg.relay.sources,
                cfg.relay.piece,
                crate::relay::TlsPolicy {
                    tls: serves_tls,
                    client_auth: serves_tls
                        && cfg.tls.client_auth == crate::config::ClientAuth::Required,
                },
                cfg.relay.keep,
            ),
            holdings,
            relay_stall: cfg.relay.stall_timeout,
            relay_corrupt: cfg.relay.test_corrupt,
            client,
            registry: Arc::default(),
            stats,
            token: cfg.auth_token.clone(),
            bound,
            advertised,
            max_batch: cfg.max_batch,
            max_request_bytes: cfg.max_request_bytes,
            max_header_bytes: cfg.max_header_bytes,
            request_timeout: cfg.request_timeout,
            idle_timeout: cfg.idle_timeout,
            header_timeout: cfg.header_timeout,
            owner_spin: cfg.owner_spin,
            dedicated: connection::Dedicated::new(cfg.dedicated_threads, rt),
            rotations: 0.into(),
            rotating: 0.into(),
            tls: tls.map(TlsAcceptor::from),
            tls_handshake_timeout: cfg.tls.handshake_timeout,
            admission: Admission::new(cfg.max_pending, cfg.max_pending_per_peer),
            epoch: Instant::now(),
            stopped: Mutex::new(None),
            accept_error: Mutex::new(None),
            staging: Arc::new(PinnedPool::new(
                cfg.staging,
                cfg.device_piece,
                cfg.device_buffers,
            )),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let accepting = Arc::new(AtomicBool::new(true));
        rt.spawn(accept_loop(
            Arc::clone(&shared),
            listener,
            Arc::new(Semaphore::new(cfg.max_connections)),
            shutdown_rx.clone(),
            Arc::clone(&accepting),
        ));
        if cfg.relay.on {
            let period =
                (cfg.relay.keep / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
            rt.spawn(relay::prune_copies(
                Arc::clone(&shared.holdings),
                period,
                shutdown_rx,
            ));
        }
        debug!(target: "http", bound = %bound, advertised = %shared.advertised, "serving");
        Ok(Server {
            shared,
            shutdown,
            accepting,
        })
    }

    /// The address the server is bound to.
    pub(crate) fn bound(&self) -> SocketAddr {
        self.shared.bound
    }

    /// The address put into descriptors.
    pub(crate) fn advertised(&self) -> &str {
        &self.shared.advertised
    }

    /// Whether the server speaks TLS.
    pub(crate) fn tls(&self) -> bool {
        self.shared.tls.is_some()
    }

    /// Shards with a relay tree at this owner.
    pub(crate) fn relay_trees(&self) -> usize {
        self.shared.trackers.len()
    }

    /// Pinned staging buffers made so far for GPU shards.
    pub(crate) fn staging_buffers(&self) -> usize {
        self.shared.staging.made()
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// `None` while serving, or why the server stopped or cannot accept
    /// connections right now.
    pub(crate) fn unhealthy(&self) -> Option<String> {
        if self.accepting.load(Ordering::Acquire) {
            let recent = self
                .shared
                .accept_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .filter(|(at, _)| at.elapsed() < ACCEPT_ERROR_WINDOW)
                .map(|(_, e)| e.clone());
            return recent.map(|e| format!("accepting connections failed recently: {e}"));
        }
        Some(
            self.shared
                .stopped
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .unwrap_or_else(|| "the server was shut down".to_owned()),
        )
    }

    /// Publishes a shard: records the lent bytes (no copy) and returns the
    /// descriptor.
    pub(crate) fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        let id = req.id;
        if req.allocation != 0 {
            return Err(AbiError::invalid_argument(format!(
                "export of shard {id}: allocation token {} is not one of ours (the http \
                 transport has no allocator)",
                req.allocation
            )));
        }
        match req.meta.device.kind {
            DeviceKind::CPU => shardport_kit::check::lent(req)?,
            DeviceKind::CUDA => {
                self.shared.staging.staging().ready().map_err(|why| {
                    AbiError::unavailable(format!(
                        "export of shard {id}: the http transport serves a GPU shard by \
                         staging it through host memory, which needs the CUDA driver: {why}"
                    ))
                })?;
                if req.data.len() as u64 != req.meta.byte_len {
                    return Err(AbiError::invalid_argument(format!(
                        "export of shard {id}: {} bytes lent for a shard of {}",
                        req.data.len(),
                        req.meta.byte_len
                    )));
                }
            }
            other => {
                return Err(AbiError::unsupported(format!(
                    "export of shard {id}: the http transport serves host and CUDA memory, \
                     the shard lives on {}",
                    shardport_abi::Device {
                        kind: other,
                        index: req.meta.device.index
                    }
                )))
            }
        }
        let desc = Descriptor {
            addr: self.shared.advertised.clone(),
            id,
            len: req.meta.byte_len,
            tls: self.shared.tls.is_some(),
        }
        .encode();
        let registry = &self.shared.registry;
        {
            let mut map = registry.write();
            if map.contains_key(&id) {
                return Err(AbiError::invalid_argument(format!(
                    "shard {id} is already exported by this http transport"
                )));
            }
            map.insert(id, LentBytes::from_request(req));
        }
        registry
            .bytes
            .fetch_add(req.meta.byte_len, Ordering::Relaxed);
        debug!(target: "http", shard = %id, bytes = req.meta.byte_len, "exported");
        Ok(desc)
    }

    /// Withdraws a shard: new requests get 404 at once; then waits (up to
    /// `request-timeout`) until no response reads its bytes any more, and
    /// forgets its relay tree. Returns where its relay holders serve (they
    /// are to be told), with the outcome.
    pub(crate) fn unexport(
        &self,
        id: ShardId,
    ) -> (PluginResult<()>, Vec<crate::relay::wire::Serves>) {
        let registry = &self.shared.registry;
        let Some(lent) = registry.write().remove(&id) else {
            let e =
                AbiError::not_found(format!("shard {id} is not exported by this http transport"));
            return (Err(e), Vec::new());
        };
        registry
            .bytes
            .fetch_sub(lent.len() as u64, Ordering::Relaxed);
        let timeout = self.shared.request_timeout;
        let withdrawn = lent.withdraw(timeout);
        // After the readers: a join holds one until its member is placed.
        let holders = self.shared.trackers.forget(id);
        (self.withdrawn(id, withdrawn, timeout), holders)
    }

    fn withdrawn(&self, id: ShardId, r: Result<(), usize>, timeout: Duration) -> PluginResult<()> {
        match r {
            Ok(()) => {
                debug!(target: "http", shard = %id, "unexported");
                Ok(())
            }
            Err(left) => {
                self.shared.stats.unexport_timeouts.inc();
                warn!(
                    target: "http",
                    shard = %id,
                    responses = left,
                    "unexport timed out waiting for responses still reading the shard"
                );
                Err(AbiError::new(
                    ErrorKind::TIMEOUT,
                    format!(
                        "shard {id} is withdrawn (new requests get 404), but {left} response(s) \
                         still reading its bytes did not finish within request-timeout ({}); \
                         the bytes must not be freed",
                        format_duration(timeout)
                    ),
                ))
            }
        }
    }

    /// Stops accepting, asks every connection to finish its response and
    /// close, and waits up to `grace` (plus one watchdog period) for them.
    /// Connections still open then are closed by the runtime's shutdown.
    pub(crate) fn shutdown(&self, grace: Duration) {
        let _ = self.shutdown.send(true);
        let deadline = Instant::now() + grace + WATCHDOG_MAX;
        while (self.shared.stats.connections_open.get() > 0
            || self.accepting.load(Ordering::Acquire))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_rules() {
        let (head, idle) = (Duration::from_millis(100), Duration::from_millis(1000));
        let at = |now, last_io, head_since, in_flight| {
            expired_at(now, last_io, head_since, in_flight, head, idle)
        };
        // Idle between requests: closed after idle-timeout, not before.
        assert_eq!(at(999, 0, NONE, 0), None);
        assert_eq!(at(1000, 0, NONE, 0), Some("idle for idle-timeout"));
        // A head in progress: header-timeout from its first byte, even while
        // bytes keep trickling in.
        assert_eq!(at(150, 140, 60, 0), None);
        assert_eq!(
            at(160, 159, 60, 0),
            Some("request head not complete within header-timeout")
        );
        // A response in flight: only a lack of progress counts, however long
        // the transfer takes, and header-timeout does not apply.
        assert_eq!(at(1_000_000, 999_500, 60, 1), None);
        assert_eq!(
            at(1_000_000, 999_000, NONE, 2),
            Some("no progress on a request in flight for idle-timeout (stalled peer)")
        );
        // Clocks read out of order never underflow.
        assert_eq!(at(5, 10, 20, 0), None);
    }
}
