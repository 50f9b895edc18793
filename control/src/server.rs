//! The server: the accept loop within the pending budget, one thread per
//! connection, TLS or a plain 400 to a client of the other protocol, the
//! head within its deadline, then one authenticated request.

use std::{
    io::BufReader,
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use rustls::ServerConfig;
use shardport_host::node::Node;
use shardport_http_base::{head::HeadError, DeadlineStream};

use crate::{
    admission::{Admission, Ticket},
    conn::{err_body, first_byte_is_tls, handshake, linger, refuse_mismatch, respond, Conn, JSON},
    endpoints::handle,
    request::{body_deadline, head_refusal, read_request, Refusal, Request},
    Limits, IO_TIMEOUT,
};

/// A running control server; stops accepting when dropped. It holds the
/// node only weakly, so dropping the node's last owner shuts the node down.
pub struct ControlServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    admission: Arc<Admission<TcpStream>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// What every connection thread shares.
struct Shared {
    node: shardport_host::node::WeakNode,
    token: Option<Arc<str>>,
    limits: Limits,
    /// Serve HTTPS with this, or plain HTTP.
    tls: Option<Arc<ServerConfig>>,
    active: AtomicUsize,
}

impl ControlServer {
    /// Binds `bind` and serves `node` on a background thread, with the
    /// default [`Limits`].
    pub fn start(node: &Node, bind: &str, token: Option<String>) -> std::io::Result<ControlServer> {
        Self::start_with(node, bind, token, Limits::default())
    }

    /// [`start`](Self::start) with these limits.
    pub fn start_with(
        node: &Node,
        bind: &str,
        token: Option<String>,
        limits: Limits,
    ) -> std::io::Result<ControlServer> {
        Self::start_tls(node, bind, token, limits, None)
    }

    /// [`start_with`](Self::start_with), serving HTTPS only when `tls` is
    /// given (see [`crate::tls::server_config`]).
    pub fn start_tls(
        node: &Node,
        bind: &str,
        token: Option<String>,
        limits: Limits,
        tls: Option<Arc<ServerConfig>>,
    ) -> std::io::Result<ControlServer> {
        let listener = TcpListener::bind(bind).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot bind the control endpoint on {bind}: {e}"),
            )
        })?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let admission = Admission::new(limits.max_pending, limits.max_pending_per_peer);
        let shared = Arc::new(Shared {
            node: node.downgrade(),
            token: token.map(Arc::<str>::from),
            limits,
            tls,
            active: AtomicUsize::new(0),
        });
        let shared_tls = shared.tls.is_some();
        let (stop2, admission2) = (Arc::clone(&stop), Arc::clone(&admission));
        let accept = thread::Builder::new()
            .name("shardport-control".into())
            .spawn(move || accept_loop(&listener, &stop2, &admission2, &shared))?;
        tracing::info!(target: "control", %addr, tls = shared_tls, "control endpoint listening");
        Ok(ControlServer {
            addr,
            stop,
            admission,
            accept: Some(accept),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections whose head has not arrived yet.
    pub fn pending(&self) -> usize {
        self.admission.pending()
    }

    /// Pending connections closed to make room for newer ones.
    pub fn evicted_total(&self) -> u64 {
        self.admission.evicted_total()
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    admission: &Arc<Admission<TcpStream>>,
    shared: &Arc<Shared>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(mut stream) = conn else { continue };
        if shared.node.upgrade().is_none() {
            let _ = respond(
                &mut stream,
                503,
                JSON,
                &err_body("shutting_down", "the node is shutting down"),
            );
            break;
        }
        let (Ok(peer), Ok(closer)) = (stream.peer_addr(), stream.try_clone()) else {
            continue;
        };
        let ticket = admission.enter(peer.ip(), closer);
        let shared = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name("shardport-control-conn".into())
            .spawn(move || serve_conn(&shared, stream, ticket));
        if spawned.is_err() {
            tracing::warn!(target: "control", "cannot spawn a connection thread");
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag, and wait for it.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve_conn(shared: &Shared, stream: TcpStream, ticket: Ticket<TcpStream>) {
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    // The handshake (with TLS) and the head share the head deadline, and
    // the connection stays pending (evictable) until its head is read.
    let deadline = Instant::now() + shared.limits.head_deadline;
    let Some(starts_tls) = first_byte_is_tls(&stream, deadline) else {
        let refusal = head_refusal(HeadError::Io(
            "no request arrived within the head deadline".into(),
        ));
        let _ = respond(&mut out, refusal.0, JSON, &err_body(refusal.1, &refusal.2));
        return;
    };
    if starts_tls != shared.tls.is_some() {
        drop(ticket);
        refuse_mismatch(&mut out, shared.tls.is_some());
        return;
    }
    let plain = DeadlineStream::new(stream, deadline);
    let conn = match &shared.tls {
        None => Conn::Plain(plain),
        Some(config) => match handshake(config, plain) {
            Ok(c) => Conn::Tls(Box::new(c)),
            Err(e) => {
                tracing::debug!(target: "control", error = %e, "tls handshake failed");
                return;
            }
        },
    };
    let mut reader = BufReader::new(conn);
    let result = match read_request(&mut reader, shared.token.as_deref()) {
        Err(r) => {
            drop(ticket);
            Err(r)
        }
        Ok(req) => {
            ticket.admit();
            serve_request(shared, req, &mut reader)
        }
    };
    let (status, content_type, body) = match result {
        Ok((content_type, body)) => (200, content_type, body),
        Err((status, code, message)) => {
            tracing::debug!(target: "control", status, code, %message, "control request refused");
            (status, JSON, err_body(code, &message))
        }
    };
    let conn = reader.get_mut();
    if respond(conn, status, content_type, &body).is_ok() {
        conn.close_notify();
        linger(&mut out);
    }
}

/// An authenticated request, within the budget of [`Limits::max_connections`].
fn serve_request(
    shared: &Shared,
    req: Request,
    reader: &mut BufReader<Conn>,
) -> Result<(&'static str, Vec<u8>), Refusal> {
    let Some(node) = shared.node.upgrade() else {
        return Err((503, "shutting_down", "the node is shutting down".into()));
    };
    if shared.active.fetch_add(1, Ordering::AcqRel) >= shared.limits.max_connections {
        shared.active.fetch_sub(1, Ordering::AcqRel);
        return Err((503, "busy", "too many control requests at once".into()));
    }
    reader
        .get_mut()
        .set_deadline(body_deadline(req.body_len.unwrap_or(0)));
    let result = handle(&node, &req, reader);
    shared.active.fetch_sub(1, Ordering::AcqRel);
    result
}
