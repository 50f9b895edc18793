//! Connections: the accept loop within `max-connections`, the admission of
//! unauthenticated ones (`max-pending`), each connection's watchdog
//! (header, idle and request deadlines), TLS or a plain `400` to a plain
//! client of a TLS owner, and hyper's HTTP/1.1 state machine over it.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    accepting: Arc<AtomicBool>,
) {
    loop {
        if permits.available_permits() == 0 {
            // At max-connections: new connections wait in the kernel's
            // accept backlog until one closes.
            shared.stats.connections_at_limit.inc();
        }
        let permit = tokio::select! {
            _ = shutdown.changed() => break,
            p = Rotation::permit(&shared, &permits, &listener) => match p {
                Some(p) => p,
                None => break,
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
                    peer: Some(peer.ip()),
                };
                let conn = Accepted {
                    shared: Arc::clone(&shared),
                    peer,
                    permit,
                    pending,
                    shutdown: shutdown.clone(),
                };
                match Dedicated::slot(&shared) {
                    Some(slot) => serve_on_own_thread(slot, stream, conn),
                    None => {
                        tokio::spawn(serve_connection(stream, conn, false));
                    }
                }
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
pub(super) fn http1_builder(shared: &Shared) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.keep_alive(true)
        .writev(true)
        .max_header_size(shared.max_header_bytes)
        .max_buf_size(HYPER_DEFAULT_MAX_BUF.max(shared.max_header_bytes + 8192))
        .header_read_timeout(None);
    b
}

/// The request handler of one connection, as a hyper service.
pub(super) fn service(
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
pub(super) struct Evict(Arc<tokio::sync::Notify>);

impl Close for Evict {
    fn close(&self) {
        // `notify_one` keeps a permit, so a task not yet waiting still sees it.
        self.0.notify_one();
    }
}

/// A connection's place in the pending budget until its first
/// authenticated request ([`Pending::admit`]).
#[derive(Clone)]
pub(super) struct Pending {
    pub(super) evict: Evict,
    pub(super) ticket: Arc<Mutex<Option<Ticket<Evict>>>>,
    /// The connection's peer (`None`: the fuzz target's in-memory one):
    /// where a relay that joins must serve from.
    pub(super) peer: Option<std::net::IpAddr>,
}

impl Pending {
    /// A connection outside any budget (the fuzz target's in-memory one).
    pub(super) fn alone() -> Pending {
        Pending {
            evict: Evict::default(),
            ticket: Arc::new(Mutex::new(None)),
            peer: None,
        }
    }

    /// The connection authenticated: it stops counting as pending.
    pub(super) fn admit(&self) {
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
    pub(super) async fn evicted(&self) {
        self.evict.0.notified().await;
    }

    /// Whether the connection has made an authenticated request: it no
    /// longer counts as pending. One evicted in the moment its first
    /// request was being admitted is admitted all the same (it showed the
    /// token), and its response must not be cut short.
    pub(super) fn admitted(&self) -> bool {
        self.ticket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// Per-connection clocks the watchdog reads (milliseconds since
/// [`Shared::epoch`]).
#[derive(Debug)]
pub(super) struct Activity {
    pub(super) epoch: Instant,
    /// Last successful read or write.
    pub(super) last_io: AtomicU64,
    /// First byte of a request head not yet complete, or [`NONE`].
    pub(super) head_since: AtomicU64,
    /// Requests whose handler or response body is alive.
    pub(super) in_flight: AtomicU64,
    /// Requests served to their end.
    pub(super) served: AtomicU64,
}

impl Activity {
    pub(super) fn new(epoch: Instant) -> Activity {
        let now = epoch.elapsed().as_millis() as u64;
        Activity {
            epoch,
            last_io: AtomicU64::new(now),
            head_since: AtomicU64::new(NONE),
            in_flight: AtomicU64::new(0),
            served: AtomicU64::new(0),
        }
    }

    pub(super) fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(super) fn on_read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let _ =
                self.head_since
                    .compare_exchange(NONE, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    pub(super) fn on_write(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    pub(super) fn request_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since.store(NONE, Ordering::Relaxed);
    }

    pub(super) fn request_finished(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    /// Why the connection should be closed now, if it should.
    pub(super) fn expired(
        &self,
        header_timeout: Duration,
        idle_timeout: Duration,
    ) -> Option<&'static str> {
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
pub(super) fn expired_at(
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
/// [`Activity`], and polls for the next request after a response
/// ([`OwnerPoll`]).
pub(super) struct Tracked<S> {
    pub(super) inner: S,
    pub(super) activity: Arc<Activity>,
    pub(super) poll: Option<OwnerPoll>,
}

/// The TCP socket under a connection, for [`OwnerPoll`]'s peeks.
pub(super) trait Socket {
    fn socket(&self) -> std::os::fd::BorrowedFd<'_>;
}

impl Socket for TcpStream {
    fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

impl Socket for tokio_rustls::server::TlsStream<TcpStream> {
    fn socket(&self) -> std::os::fd::BorrowedFd<'_> {
        self.get_ref().0.socket()
    }
}

/// `owner-spin`: once a response has been written and flushed, the
/// connection peeks at its socket for the next request for up to `spin`
/// before the runtime thread goes back to `epoll_wait`. A runtime thread
/// that sleeps there wakes 30-40 us late on a VM that halts idle vCPUs,
/// more than a 64 KiB fetch's whole round trip; when the request comes
/// within `spin`, the thread finds its readiness at once.
///
/// The poll is in the flush, not in a read: hyper reads (to see whether
/// the peer closed) before it writes a response, and a poll there held
/// the response back; after the response hyper does not read until woken.
/// It polls only when nothing of the connection is in flight (no handler
/// or body alive, so the whole response has left), once per response, and
/// peeks only (the runtime reads the request as usual; with TLS the peek
/// sees the ciphertext, which is what it waits for too).
///
/// A poll holds its runtime thread, and tokio sees the readiness of other
/// sockets only in a worker parked on its I/O driver, which none is while
/// the thread that last held it polls here. So a connection polls only
/// while it is the owner's only open connection (no other connection's
/// request can wait behind it), while a core is idle, and not after
/// [`MAX_FRUITLESS_POLLS`] misses in a row (its consumer pauses between
/// requests, a fetch per training step), until a request again comes
/// within `spin` of the response before it.
pub(super) struct OwnerPoll {
    spin: Duration,
    stats: Arc<Stats>,
    /// Bytes were written since the last poll or request bytes.
    armed: bool,
    /// When the last response left.
    flushed_at: Option<Instant>,
    /// Polls in a row that ended without a request.
    fruitless: u32,
    /// The connection has a thread of its own: its poll holds no thread
    /// another connection needs.
    dedicated: bool,
}

impl OwnerPoll {
    /// For one connection, unless `owner-spin` is 0.
    pub(super) fn new(shared: &Shared, dedicated: bool) -> Option<OwnerPoll> {
        (!shared.owner_spin.is_zero()).then(|| OwnerPoll {
            spin: shared.owner_spin,
            stats: Arc::clone(&shared.stats),
            armed: false,
            flushed_at: None,
            fruitless: 0,
            dedicated,
        })
    }

    /// Request bytes arrived; one that came within `spin` of the last
    /// response shows polling pays again.
    fn read(&mut self) {
        self.armed = false;
        if self
            .flushed_at
            .take()
            .is_some_and(|t| t.elapsed() <= self.spin)
        {
            self.fruitless = 0;
        }
    }

    /// After a flush: polls when armed, nothing is in flight, this is the
    /// only open connection or has a thread of its own, a core is idle, and
    /// recent polls paid.
    fn flushed(&mut self, activity: &Activity, socket: std::os::fd::BorrowedFd<'_>) {
        if !self.armed || activity.in_flight.load(Ordering::Relaxed) != 0 {
            return;
        }
        self.armed = false;
        self.flushed_at = Some(Instant::now());
        if self.fruitless >= shardport_kit::poll::MAX_FRUITLESS_POLLS
            || (!self.dedicated && self.stats.connections_open.get() > 1)
            || !core_allowed()
        {
            return;
        }
        self.stats.owner_polls.inc();
        if shardport_kit::poll::await_bytes(socket, self.spin) {
            self.stats.owner_poll_hits.inc();
            self.fruitless = 0;
        } else {
            self.fruitless += 1;
        }
    }
}

/// Whether a poll may take a core now ([`shardport_kit::poll::core_to_spare`]);
/// tests may poll whatever the machine's load ([`POLL_AT_ANY_LOAD`]).
fn core_allowed() -> bool {
    #[cfg(test)]
    if POLL_AT_ANY_LOAD.load(Ordering::Relaxed) {
        return true;
    }
    shardport_kit::poll::core_to_spare()
}

/// Tests: owners poll whatever the machine's load, so what a poll does is
/// tested on a busy machine too.
#[cfg(test)]
pub(crate) static POLL_AT_ANY_LOAD: AtomicBool = AtomicBool::new(false);

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
            if let Some(poll) = self.poll.as_mut() {
                poll.read();
            }
        }
        r
    }
}

impl<S> Tracked<S> {
    fn wrote(&mut self) {
        self.activity.on_write();
        if let Some(poll) = self.poll.as_mut() {
            poll.armed = true;
        }
    }
}

impl<S: AsyncWrite + Socket + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.wrote();
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
            self.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        // hyper queues body chunks (no copy) only for vectored writers.
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) {
            let this = &mut *self;
            if let Some(poll) = this.poll.as_mut() {
                poll.flushed(&this.activity, this.inner.socket());
            }
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

pub(super) fn watchdog_period(shared: &Shared) -> Duration {
    (shared.header_timeout.min(shared.idle_timeout) / 4).clamp(WATCHDOG_MIN, WATCHDOG_MAX)
}

/// Fairness at `max-connections`. Served connections are kept alive, so
/// without a rotation the consumers that got a place keep it while new
/// ones wait in the kernel's accept backlog until `request-timeout`
/// (starved, not refused). So while the owner is at its budget, the accept
/// loop looks at the backlog every [`WATCHDOG_MIN`], and while connections
/// wait there it hands out one rotation at a time: the next connection
/// that has served a request and reaches its watchdog tick takes it and
/// closes after the response in flight (its consumer reconnects, behind
/// those waiting), and the place goes to the first one waiting. One at a
/// time: no other is handed out until the connection that took it has
/// closed (a long response may still be draining), so a budget of
/// hundreds of connections does not close all of them for one that waits.
pub(super) struct Rotation;

/// A connection closing for a rotation ([`Rotation::take`]); counted in
/// `rotating` until it has closed.
pub(super) struct Rotating(Arc<Shared>);

impl Drop for Rotating {
    fn drop(&mut self) {
        self.0.rotating.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Rotation {
    /// A place in `max-connections`; `None` once the semaphore is closed.
    /// While none is free, hands out a rotation whenever connections wait
    /// in the backlog and no connection is still closing for one.
    async fn permit(
        shared: &Shared,
        permits: &Arc<Semaphore>,
        listener: &TcpListener,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let acquire = Arc::clone(permits).acquire_owned();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                p = &mut acquire => {
                    shared.rotations.store(0, Ordering::Relaxed);
                    return p.ok();
                }
                () = tokio::time::sleep(WATCHDOG_MIN) => {
                    let hand_out =
                        shared.rotating.load(Ordering::Acquire) == 0 && backlog(listener);
                    shared.rotations.store(u32::from(hand_out), Ordering::Release);
                }
            }
        }
    }

    /// Whether a connection should close after its response in flight:
    /// it has served a request since it was accepted (one just admitted
    /// keeps its place) and takes the rotation handed out while others
    /// wait at `max-connections`. Hold the returned guard until the
    /// connection has closed.
    fn take(shared: &Arc<Shared>, activity: &Activity) -> Option<Rotating> {
        if activity.served.load(Ordering::Relaxed) == 0 {
            return None;
        }
        shared
            .rotations
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()?;
        shared.rotating.fetch_add(1, Ordering::AcqRel);
        Some(Rotating(Arc::clone(shared)))
    }
}

/// Whether connections wait in `listener`'s accept backlog (one poll,
/// no wait).
fn backlog(listener: &TcpListener) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        listener,
        rustix::event::PollFlags::IN,
    )];
    matches!(
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())),
        Ok(n) if n > 0
    )
}

/// An accepted connection, with what serving it holds.
pub(super) struct Accepted {
    pub(super) shared: Arc<Shared>,
    pub(super) peer: SocketAddr,
    /// Its place in `max-connections`, given back when it ends.
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) pending: Pending,
    pub(super) shutdown: watch::Receiver<bool>,
}

/// `dedicated-threads`: up to that many connections are each served on a
/// thread of their own, by a single-threaded runtime there, the others by
/// the shared runtime. A connection on its own thread runs in step with
/// its consumer (the kernel wakes each where the other ran), and its owner
/// poll holds no thread another connection needs, so it polls whatever
/// the other connections ([`OwnerPoll`]). On the shared runtime every
/// connection's turn goes through its two workers and the I/O driver.
/// A connection gets a thread only while the owner has fewer connections
/// than `dedicated-threads`; once it has more, those with a thread close
/// after their response in flight (at the watchdog's next tick), and
/// their consumers reconnect to the shared runtime, so every connection
/// gets a fair share again ([`Dedicated::outnumbered`]).
/// Work that outlives a connection (telling a demoted relay to rejoin)
/// goes to the shared runtime ([`Dedicated::spawn_blocking`]).
pub(super) struct Dedicated {
    /// `dedicated-threads`.
    max: usize,
    /// Threads that may still start.
    free: std::sync::atomic::AtomicUsize,
    /// The shared runtime (`None` only for the in-memory server of the
    /// fuzz target, which has no threads of its own).
    runtime: Option<tokio::runtime::Handle>,
    /// The host's log dispatcher, set on every connection thread (the
    /// shared runtime's threads get it when they start).
    dispatch: tracing::Dispatch,
}

impl Dedicated {
    pub(super) fn new(max: usize, runtime: &tokio::runtime::Handle) -> Dedicated {
        Dedicated {
            max,
            free: max.into(),
            runtime: Some(runtime.clone()),
            dispatch: tracing::dispatcher::get_default(Clone::clone),
        }
    }

    /// No connection threads.
    pub(super) fn none() -> Dedicated {
        Dedicated {
            max: 0,
            free: 0.into(),
            runtime: None,
            dispatch: tracing::dispatcher::get_default(Clone::clone),
        }
    }

    /// A thread's place for a connection just accepted: while the owner
    /// has fewer connections open than `dedicated-threads` and a place is
    /// free.
    fn slot(shared: &Arc<Shared>) -> Option<DedicatedSlot> {
        if shared.stats.connections_open.get() >= shared.dedicated.max as u64 {
            return None;
        }
        shared
            .dedicated
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| DedicatedSlot {
                shared: Arc::clone(shared),
            })
    }

    /// Whether a connection on a thread of its own should give it back:
    /// the owner has more connections open than `dedicated-threads`, and a
    /// connection with a thread to itself would get a whole thread's share
    /// of the cores while the others share the runtime's (with 2 such
    /// threads and 64 consumers, the two got 12x the mean's fetches).
    fn outnumbered(&self, stats: &Stats) -> bool {
        stats.connections_open.get() > self.max as u64
    }

    /// Runs `f` on the shared runtime's blocking threads, whatever thread
    /// asks: a connection's own runtime ends with the connection.
    pub(super) fn spawn_blocking(&self, f: impl FnOnce() + Send + 'static) {
        match &self.runtime {
            Some(rt) => drop(rt.spawn_blocking(f)),
            None => drop(tokio::task::spawn_blocking(f)),
        }
    }
}

/// A connection thread's place in `dedicated-threads`, given back on drop.
struct DedicatedSlot {
    shared: Arc<Shared>,
}

impl Drop for DedicatedSlot {
    fn drop(&mut self) {
        self.shared.dedicated.free.fetch_add(1, Ordering::AcqRel);
    }
}

/// Serves `stream` on a thread of its own ([`Dedicated`]). A connection
/// that cannot get one (no thread or runtime could start) is closed, with
/// a warning: the consumer retries it like any broken connection.
fn serve_on_own_thread(slot: DedicatedSlot, stream: TcpStream, conn: Accepted) {
    let peer = conn.peer;
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            warn!(target: "http", peer = %peer, error = %e, "a connection could not move to a thread of its own; closed");
            return;
        }
    };
    let dispatch = conn.shared.dedicated.dispatch.clone();
    let started = std::thread::Builder::new()
        .name("shardport-http-conn".into())
        .spawn(move || {
            let _log = tracing::dispatcher::set_default(&dispatch);
            let _open = Held::new(&slot.shared.stats, |s| &s.connections_dedicated);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build();
            let rt = match rt {
                Ok(rt) => rt,
                Err(e) => {
                    warn!(target: "http", peer = %peer, error = %e, "no runtime for a connection's own thread; closed");
                    return;
                }
            };
            rt.block_on(async move {
                match TcpStream::from_std(stream) {
                    Ok(stream) => serve_connection(stream, conn, true).await,
                    Err(e) => {
                        warn!(target: "http", peer = %peer, error = %e, "a connection could not join its thread's runtime; closed");
                    }
                }
            });
        });
    if let Err(e) = started {
        warn!(target: "http", peer = %peer, error = %e, "no thread for a connection (dedicated-threads); closed");
    }
}

/// Serves one connection to its end; `dedicated`: on a thread of its own.
pub(super) async fn serve_connection(stream: TcpStream, conn: Accepted, dedicated: bool) {
    let Accepted {
        shared,
        peer,
        permit: _permit,
        pending,
        shutdown,
    } = conn;
    let _open = Held::new(&shared.stats, |s| &s.connections_open);
    shared.stats.connections_accepted.inc();
    let Some(acceptor) = shared.tls.clone() else {
        return serve_http(shared, stream, peer, pending, shutdown, dedicated).await;
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
        Ok(Ok(tls)) => serve_http(shared, tls, peer, pending, shutdown, dedicated).await,
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
pub(super) async fn starts_like_tls(stream: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    Ok(n == 1 && first[0] == shardport_http_base::tls::TLS_HANDSHAKE_RECORD)
}

/// Tells a plain-HTTP client, in plain HTTP, that this owner speaks TLS
/// only (best effort, bounded by the caller's deadline), so it gets an
/// answer instead of a reset.
pub(super) async fn refuse_plaintext(stream: &TcpStream) {
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
/// with the watchdog, polling after responses ([`OwnerPoll`]).
pub(super) async fn serve_http<S>(
    shared: Arc<Shared>,
    stream: S,
    peer: SocketAddr,
    pending: Pending,
    mut shutdown: watch::Receiver<bool>,
    dedicated: bool,
) where
    S: AsyncRead + AsyncWrite + Socket + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(shared.epoch));
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: Arc::clone(&activity),
        poll: OwnerPoll::new(&shared, dedicated),
    });
    let conn = http1_builder(&shared).serve_connection(
        io,
        service(Arc::clone(&shared), Arc::clone(&activity), pending.clone()),
    );
    tokio::pin!(conn);
    let period = watchdog_period(&shared);
    let mut drain_until: Option<Instant> = None;
    let mut stopping = false;
    // Held from a rotation taken until the connection has closed.
    let mut _rotating: Option<Rotating>;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(target: "http", peer = %peer, error = %e, "connection ended with an error");
                }
                break;
            }
            () = pending.evicted() => {
                if pending.admitted() {
                    // Evicted while its first request was being admitted
                    // (the eviction's notice outlived the race): it is not
                    // pending any more; keep serving it.
                    continue;
                }
                shared.stats.connections_evicted.inc();
                debug!(target: "http", peer = %peer, "pending connection evicted to make room");
                break;
            }
            _ = tokio::time::sleep(period) => {
                if drain_until.is_none() {
                    // Finish the response in flight, then close: the
                    // consumer reconnects, to the shared runtime or behind
                    // the connections waiting at max-connections.
                    let why = if dedicated && shared.dedicated.outnumbered(&shared.stats) {
                        Some("a thread of its own while the owner has more connections than dedicated-threads")
                    } else if let Some(guard) = Rotation::take(&shared, &activity) {
                        _rotating = Some(guard);
                        shared.stats.connections_rotated.inc();
                        Some("others wait at max-connections")
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        debug!(target: "http", peer = %peer, why, "closing a connection after its response");
                        conn.as_mut().graceful_shutdown();
                        drain_until = Some(Instant::now() + shared.request_timeout);
                    }
                }
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
            _ = shutdown.changed(), if !stopping => {
                // Also for a connection already closing (outnumbered,
                // rotated): the shutdown's shorter grace applies.
                stopping = true;
                if drain_until.is_none() {
                    conn.as_mut().graceful_shutdown();
                }
                let grace = Instant::now() + SHUTDOWN_GRACE.min(shared.request_timeout);
                drain_until = Some(drain_until.map_or(grace, |t| t.min(grace)));
            }
        }
    }
}

#[cfg(test)]
mod pending_tests {
    use super::*;

    /// The race behind responses cut short under a burst of connections
    /// from one address: the budget evicts a connection (its notice is kept
    /// until the connection's task waits for it) just as its first request
    /// is admitted. The task then finds the notice, and must see that the
    /// connection is admitted, and keep serving it.
    #[tokio::test]
    async fn an_eviction_that_lost_the_race_to_admission_is_ignored() {
        let admission = Admission::new(8, 1);
        let peer: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let pending = |a: &Arc<Admission<Evict>>| {
            let evict = Evict::default();
            let ticket = a.enter(peer, evict.clone());
            Pending {
                evict,
                ticket: Arc::new(Mutex::new(Some(ticket))),
                peer: Some(peer),
            }
        };
        let first = pending(&admission);
        assert!(!first.admitted());
        // A second connection from the same address evicts the first...
        let _second = pending(&admission);
        // ...whose request is admitted in the same moment.
        first.admit();
        // The notice is there at once; the connection is admitted.
        tokio::time::timeout(Duration::from_secs(60), first.evicted())
            .await
            .expect("the eviction's notice is kept");
        assert!(first.admitted(), "its task keeps serving it");
    }
}
