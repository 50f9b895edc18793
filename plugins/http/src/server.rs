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
use shardport_abi::{
    format_byte_size,
    kit::admission::{Admission, Close, Ticket},
    AbiError, DeviceKind, ErrorKind, ExportRequest, PluginResult, ShardId,
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
        let shared = Arc::new(Shared {
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
            shutdown_rx,
            Arc::clone(&accepting),
        ));
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
            DeviceKind::CPU => shardport_abi::kit::check::lent(req)?,
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
    /// `request-timeout`) until no response reads its bytes any more.
    pub(crate) fn unexport(&self, id: ShardId) -> PluginResult<()> {
        let registry = &self.shared.registry;
        let lent = registry.write().remove(&id).ok_or_else(|| {
            AbiError::not_found(format!("shard {id} is not exported by this http transport"))
        })?;
        registry
            .bytes
            .fetch_sub(lent.len() as u64, Ordering::Relaxed);
        let timeout = self.shared.request_timeout;
        match lent.withdraw(timeout) {
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

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    accepting: Arc<AtomicBool>,
) {
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.changed() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let evict = Evict::default();
                let ticket = shared.admission.enter(peer.ip(), evict.clone());
                let pending = Pending {
                    evict,
                    ticket: Arc::new(Mutex::new(Some(ticket))),
                };
                tokio::spawn(serve_connection(
                    Arc::clone(&shared),
                    stream,
                    peer,
                    permit,
                    pending,
                    shutdown.clone(),
                ));
            }
            Err(e) => {
                warn!(target: "http", error = %e, addr = %shared.bound, "accept failed");
                let hint = if e.raw_os_error() == Some(24) || e.raw_os_error() == Some(23) {
                    " (out of file descriptors: raise `ulimit -n` or lower max-connections)"
                } else {
                    ""
                };
                *shared
                    .accept_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), format!("{e}{hint}")));
                drop(permit);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    *shared
        .stopped
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some("the server was shut down".to_owned());
    accepting.store(false, Ordering::Release);
    debug!(target: "http", addr = %shared.bound, "accept loop stopped");
}

/// The hyper settings of every connection (and of the fuzz target's
/// in-memory one): keep-alive, vectored writes, the head limit; no hyper
/// head timeout (the watchdog enforces header-timeout from the head's first
/// byte, and idle-timeout between requests, separately).
fn http1_builder(shared: &Shared) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.keep_alive(true)
        .writev(true)
        .max_header_size(shared.max_header_bytes)
        .max_buf_size(HYPER_DEFAULT_MAX_BUF.max(shared.max_header_bytes + 8192))
        .header_read_timeout(None);
    b
}

/// The request handler of one connection, as a hyper service.
fn service(
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    pending: Pending,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Frames>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<Frames>, Infallible>>,
> {
    service_fn(move |req| {
        handle(
            Arc::clone(&shared),
            Arc::clone(&activity),
            pending.clone(),
            req,
        )
    })
}

/// How a pending connection is closed when the admission budget evicts it:
/// a notification its task waits on (beside the connection itself).
#[derive(Clone, Default)]
struct Evict(Arc<tokio::sync::Notify>);

impl Close for Evict {
    fn close(&self) {
        // `notify_one` keeps a permit, so a task not yet waiting still sees it.
        self.0.notify_one();
    }
}

/// A connection's place in the pending budget until its first
/// authenticated request ([`Pending::admit`]).
#[derive(Clone)]
struct Pending {
    evict: Evict,
    ticket: Arc<Mutex<Option<Ticket<Evict>>>>,
}

impl Pending {
    /// A connection outside any budget (the fuzz target's in-memory one).
    fn alone() -> Pending {
        Pending {
            evict: Evict::default(),
            ticket: Arc::new(Mutex::new(None)),
        }
    }

    /// The connection authenticated: it stops counting as pending.
    fn admit(&self) {
        if let Some(t) = self
            .ticket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.admit();
        }
    }

    /// Waits until the budget evicts this connection.
    async fn evicted(&self) {
        self.evict.0.notified().await;
    }
}

/// Per-connection clocks the watchdog reads (milliseconds since
/// [`Shared::epoch`]).
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    /// Last successful read or write.
    last_io: AtomicU64,
    /// First byte of a request head not yet complete, or [`NONE`].
    head_since: AtomicU64,
    /// Requests whose handler or response body is alive.
    in_flight: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        let now = epoch.elapsed().as_millis() as u64;
        Activity {
            epoch,
            last_io: AtomicU64::new(now),
            head_since: AtomicU64::new(NONE),
            in_flight: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn on_read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let _ =
                self.head_since
                    .compare_exchange(NONE, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn on_write(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(NONE, Ordering::Relaxed);
    }

    fn request_finished(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Why the connection should be closed now, if it should.
    fn expired(&self, header_timeout: Duration, idle_timeout: Duration) -> Option<&'static str> {
        expired_at(
            self.now(),
            self.last_io.load(Ordering::Relaxed),
            self.head_since.load(Ordering::Relaxed),
            self.in_flight.load(Ordering::Relaxed),
            header_timeout,
            idle_timeout,
        )
    }
}

/// The watchdog's decision, a pure function of the connection's clocks (all
/// in milliseconds since the same origin; `head_since` is [`NONE`] when no
/// request head is in progress): why to close it now, or `None`.
fn expired_at(
    now: u64,
    last_io: u64,
    head_since: u64,
    in_flight: u64,
    header_timeout: Duration,
    idle_timeout: Duration,
) -> Option<&'static str> {
    let idle = now.saturating_sub(last_io) >= idle_timeout.as_millis() as u64;
    if in_flight > 0 {
        return idle
            .then_some("no progress on a request in flight for idle-timeout (stalled peer)");
    }
    if head_since != NONE && now.saturating_sub(head_since) >= header_timeout.as_millis() as u64 {
        return Some("request head not complete within header-timeout");
    }
    idle.then_some("idle for idle-timeout")
}

/// A connection (TCP, or TLS over TCP) that records progress in its
/// [`Activity`].
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        // hyper queues body chunks (no copy) only for vectored writers.
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn watchdog_period(shared: &Shared) -> Duration {
    (shared.header_timeout.min(shared.idle_timeout) / 4).clamp(WATCHDOG_MIN, WATCHDOG_MAX)
}

async fn serve_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    _permit: tokio::sync::OwnedSemaphorePermit,
    pending: Pending,
    shutdown: watch::Receiver<bool>,
) {
    let _open = Held::new(&shared.stats, |s| &s.connections_open);
    shared.stats.connections_accepted.inc();
    let Some(acceptor) = shared.tls.clone() else {
        return serve_http(shared, stream, peer, pending, shutdown).await;
    };
    // The handshake holds this connection's `max-connections` slot, so it
    // has its own deadline, counted from accept.
    let handshake = async {
        if !starts_like_tls(&stream).await? {
            refuse_plaintext(&stream).await;
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "plain HTTP sent to a TLS endpoint",
            ));
        }
        acceptor.accept(stream).await
    };
    // A connection still handshaking is pending: the budget may evict it.
    let handshake = async {
        tokio::select! {
            r = handshake => Some(r),
            () = pending.evicted() => None,
        }
    };
    let outcome = match tokio::time::timeout(shared.tls_handshake_timeout, handshake).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => {
            shared.stats.connections_evicted.inc();
            debug!(target: "http", peer = %peer, "pending connection evicted during its tls handshake");
            return;
        }
        Err(e) => Err(e),
    };
    match outcome {
        Ok(Ok(tls)) => serve_http(shared, tls, peer, pending, shutdown).await,
        Ok(Err(e)) => {
            shared.stats.tls_handshake_failures.inc();
            debug!(target: "http", peer = %peer, error = %e, "tls handshake failed");
        }
        Err(_) => {
            shared.stats.tls_handshake_failures.inc();
            shared.stats.connections_timed_out.inc();
            debug!(target: "http", peer = %peer, "tls handshake not complete within tls-handshake-timeout");
        }
    }
}

/// TLS starts with a handshake record (content type 22); an HTTP request
/// starts with a method's letters. Waits for the first byte (the caller
/// bounds the wait); `Ok(false)` for anything but a handshake record.
async fn starts_like_tls(stream: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    Ok(n == 1 && first[0] == 0x16)
}

/// Tells a plain-HTTP client, in plain HTTP, that this owner speaks TLS
/// only (best effort, bounded by the caller's deadline), so it gets an
/// answer instead of a reset.
async fn refuse_plaintext(stream: &TcpStream) {
    let body = wire::error_body(
        "tls_required",
        "this shardport owner serves HTTPS only (tls-cert is set): connect with TLS",
    );
    let msg = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut rest = msg.as_bytes();
    while !rest.is_empty() {
        if stream.writable().await.is_err() {
            return;
        }
        match stream.try_write(rest) {
            Ok(0) => return,
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
    // Read (and drop) what the client still sends for a moment, so closing
    // with unread input does not reset the connection before the client
    // read the answer.
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut drained = 0usize;
        while drained < PLAINTEXT_LINGER_BYTES {
            if stream.readable().await.is_err() {
                return;
            }
            match stream.try_read(&mut sink) {
                Ok(0) => return,
                Ok(n) => drained += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(PLAINTEXT_LINGER, drain).await;
}

/// Runs hyper's HTTP/1.1 state machine on one connection (plain or TLS)
/// with the watchdog.
async fn serve_http<S>(
    shared: Arc<Shared>,
    stream: S,
    peer: SocketAddr,
    pending: Pending,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(shared.epoch));
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
    });
    let conn = http1_builder(&shared).serve_connection(
        io,
        service(Arc::clone(&shared), Arc::clone(&activity), pending.clone()),
    );
    tokio::pin!(conn);
    let period = watchdog_period(&shared);
    let mut drain_until: Option<Instant> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(target: "http", peer = %peer, error = %e, "connection ended with an error");
                }
                break;
            }
            () = pending.evicted() => {
                shared.stats.connections_evicted.inc();
                debug!(target: "http", peer = %peer, "pending connection evicted to make room");
                break;
            }
            _ = tokio::time::sleep(period) => {
                if let Some(why) = activity.expired(shared.header_timeout, shared.idle_timeout) {
                    shared.stats.connections_timed_out.inc();
                    debug!(target: "http", peer = %peer, why, "closing connection");
                    break;
                }
                if drain_until.is_some_and(|t| Instant::now() >= t) {
                    debug!(target: "http", peer = %peer, "closing connection still busy at shutdown");
                    break;
                }
            }
            _ = shutdown.changed(), if drain_until.is_none() => {
                conn.as_mut().graceful_shutdown();
                drain_until = Some(Instant::now() + SHUTDOWN_GRACE.min(shared.request_timeout));
            }
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    pending: Pending,
    req: Request<Incoming>,
) -> Result<Response<Frames>, Infallible> {
    let in_flight = InFlight::new(activity, &shared.stats);
    let mut resp = route(&shared, &pending, req).await;
    if resp.status() == StatusCode::OK {
        shared.stats.requests_served.inc();
    } else {
        shared.stats.requests_failed.inc();
    }
    resp.body_mut().track(in_flight);
    Ok(resp)
}

/// Answers one request. A request that gets past framing and the token
/// check admits its connection (it stops counting as pending); a refused
/// one leaves it pending, and evictable.
async fn route(shared: &Shared, pending: &Pending, req: Request<Incoming>) -> Response<Frames> {
    if let Err(why) = check_framing(req.headers()) {
        let mut r = error(StatusCode::BAD_REQUEST, "bad_request", &why);
        // The body's extent is ambiguous: never read another request from
        // this connection.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    if let Some(token) = &shared.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes);
        if !wire::bearer_matches(given, token.as_str()) {
            shared.stats.auth_failures.inc();
            let why = if given.is_none() {
                "missing bearer token: this owner requires `authorization: Bearer <auth-token>`"
            } else {
                "wrong bearer token: owner and consumer must share the same auth-token"
            };
            let mut r = error(StatusCode::UNAUTHORIZED, "unauthorized", why);
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"shardport\""),
            );
            return r;
        }
    }
    pending.admit();
    let path = req.uri().path();
    if path == wire::HEALTH_PATH {
        if req.method() != Method::GET {
            return method_not_allowed(req.method(), path, "GET");
        }
        return health(shared);
    }
    if path == wire::BATCH_PATH {
        if req.method() != Method::POST {
            return method_not_allowed(req.method(), path, "POST");
        }
        return batch(shared, req).await;
    }
    if let Some(hex) = path.strip_prefix(wire::SHARD_PATH) {
        if req.method() != Method::GET {
            return method_not_allowed(req.method(), path, "GET");
        }
        let Some(id) = wire::parse_shard_id(hex) else {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!(
                    "malformed shard id {:?} in the path: expected 32 hex digits",
                    quote(hex)
                ),
            );
        };
        return shard(shared, id);
    }
    error(
        StatusCode::NOT_FOUND,
        "no_such_endpoint",
        &format!(
            "no endpoint {:?}; this owner serves GET /v1/shards/{{id}}, POST /v1/batch, \
             GET /v1/health",
            quote(path)
        ),
    )
}

fn shard(shared: &Shared, id: ShardId) -> Response<Frames> {
    let Some(reader) = shared.registry.reader(id) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!(
                "shard {id} is not exported by owner {} (it was removed, or never existed here)",
                shared.advertised
            ),
        );
    };
    let body = Frames::of([part(shared, reader)]);
    let len = body.len();
    shared.stats.bytes_served.add(len);
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(wire::LEN_HEADER, HeaderValue::from(len));
    r
}

async fn batch(shared: &Shared, req: Request<Incoming>) -> Response<Frames> {
    let limit = shared.max_request_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &format!(
                "batch request body exceeds max-request-bytes ({})",
                format_byte_size(limit as u64)
            ),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large();
    }
    let collected = tokio::time::timeout(
        shared.request_timeout,
        Limited::new(req.into_body(), limit).collect(),
    )
    .await;
    let body = match collected {
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                &format!(
                    "the request body did not arrive within request-timeout ({})",
                    format_duration(shared.request_timeout)
                ),
            )
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("cannot read the request body: {e}"),
            )
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    let ids = match wire::decode_batch_request(&body, shared.max_batch) {
        Ok(ids) => ids,
        Err(wire::BatchRequestError::Malformed(why)) => {
            return error(StatusCode::BAD_REQUEST, "bad_request", &why)
        }
        Err(wire::BatchRequestError::TooMany { count, max }) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "batch_too_large",
                &format!("batch of {count} shards exceeds this owner's max-batch ({max})"),
            )
        }
    };
    let readers = shared.registry.readers(&ids);
    let mut entries = Vec::with_capacity(ids.len());
    let mut data = Vec::with_capacity(ids.len() + 1);
    for reader in readers {
        match reader {
            Some(r) => {
                entries.push(wire::BatchEntry {
                    status: wire::ITEM_OK,
                    len: r.len() as u64,
                });
                data.push(part(shared, r));
            }
            None => entries.push(wire::BatchEntry {
                status: wire::ITEM_NOT_FOUND,
                len: 0,
            }),
        }
    }
    let head = Bytes::from(wire::encode_batch_head(&entries));
    let served: u64 = entries.iter().map(|e| e.len).sum();
    shared.stats.bytes_served.add(served);
    shared.stats.batches_served.inc();
    let body = Frames::of(std::iter::once(Part::Ready(head)).chain(data));
    let len = body.len();
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// The body part of one exported shard: its host bytes in place, or a GPU
/// shard to stage.
fn part(shared: &Shared, reader: Reader) -> Part {
    if reader.device().is_some() {
        Part::Device {
            reader,
            pool: Arc::clone(&shared.staging),
            wait: shared.request_timeout,
        }
    } else {
        Part::Ready(reader.into_bytes())
    }
}

fn health(shared: &Shared) -> Response<Frames> {
    let (shards, bytes) = shared.registry.totals();
    let mut body = String::from("{\"status\":\"ok\",\"bound\":\"");
    body.push_str(&shared.bound.to_string());
    body.push_str("\",\"advertised\":\"");
    // Validated at construction: no characters JSON would need escaped.
    body.push_str(&shared.advertised);
    body.push_str(&format!(
        "\",\"shards\":{shards},\"bytes\":{bytes},\"version\":\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    ));
    json(StatusCode::OK, body)
}

fn method_not_allowed(method: &Method, path: &str, allow: &'static str) -> Response<Frames> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        &format!("{method} is not allowed on {}; use {allow}", quote(path)),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// Refuses every request whose body framing two HTTP parsers could read
/// differently (the request-smuggling shapes): more than one
/// `content-length` field, even with equal values, and any
/// `transfer-encoding` (our client frames every body with `content-length`,
/// so chunk sizes are never parsed). hyper itself refuses obs-fold, bare CR
/// and unparsable `content-length` values with 400.
fn check_framing(headers: &header::HeaderMap) -> Result<(), String> {
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter().count();
    if lengths > 1 {
        return Err(format!(
            "{lengths} content-length fields: a request must carry at most one"
        ));
    }
    if let Some(te) = headers.get(header::TRANSFER_ENCODING) {
        return Err(format!(
            "transfer-encoding {:?} is not accepted: frame the body with content-length",
            String::from_utf8_lossy(te.as_bytes())
        ));
    }
    Ok(())
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Frames> {
    json(status, wire::error_body(code, message))
}

fn json(status: StatusCode, body: String) -> Response<Frames> {
    let body = Frames::new([Bytes::from(body)]);
    let len = body.len();
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

/// A peer-supplied string shortened for an error message.
fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTED_PATH {
        return s.to_owned();
    }
    let mut end = MAX_QUOTED_PATH;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
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
