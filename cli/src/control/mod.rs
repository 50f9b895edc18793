//! The node's control endpoint: a small HTTP/1.1 server for operators and
//! the CLI (`shardport stats`, `shardport put`). Data never flows through it
//! to consumers: they fetch from transports.
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
//! - `POST /v1/reload` with an empty body (read the node's config file
//!   again), `{"path": "/etc/sp.toml"}` (a file on the node's machine) or
//!   `{"config": "<TOML text>", "path": "name for messages and base of
//!   relative plugin paths"}` -> the [`ReloadReport`](shardport_host::node::ReloadReport);
//!   a refused reload is 409 `reload_refused` with the reason (file:line:col
//!   for a bad value), and the running config stays
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
//! One request per connection. Framing is strict ([`head`]): conflicting or
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

use std::{
    io::{BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::json;
use shardport_abi::{DType, Device, ShardId};
use shardport_host::{node::Node, node::TensorSpec};

use crate::worker::parse_id;

/// The pending-connection budget (in the plugin kit: the http data endpoint
/// uses the same one).
pub use shardport_kit::admission;
pub mod client;
pub mod head;
pub mod tls;

use admission::{Admission, Ticket};
use head::{DeadlineStream, HeadError};

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

pub use shardport_kit::check::constant_time_eq;

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
    /// given (see [`tls::server_config`]).
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

struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    /// The declared body length (strictly framed; see [`head::body_length`]).
    body_len: Option<u64>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn err_body(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"code": code, "message": message})).unwrap_or_default()
}

const JSON: &str = "application/json";
/// The Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(
    stream: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        421 => "Misdirected Request",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}

/// A request line: method, path and query pairs.
type RequestLine = (String, String, Vec<(String, String)>);

/// The request line as method, path and query.
fn parse_request_line(line: &str) -> Result<RequestLine, Refusal> {
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(format!("malformed request line `{line}`")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("unsupported protocol `{version}`")));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Ok((method.to_owned(), path.to_owned(), query))
}

fn bad(message: String) -> Refusal {
    (400, "bad_request", message)
}

fn unauthorized() -> Refusal {
    (401, "unauthorized", "missing or wrong bearer token".into())
}

fn head_refusal(e: HeadError) -> Refusal {
    match e {
        HeadError::TooLarge(_) => (431, "headers_too_large", e.to_string()),
        HeadError::Malformed(m) => bad(m),
        HeadError::Io(m) => (408, "request_timeout", m),
    }
}

/// Reads the request head, bounded in size and time, checking the token as
/// soon as the `Authorization` line arrives.
fn read_request(reader: &mut BufReader<Conn>, token: Option<&str>) -> Result<Request, Refusal> {
    let mut line_no = 0usize;
    let mut start = None;
    let mut headers = Vec::new();
    let mut refused = None;
    let read = head::read_lines(reader, MAX_HEADER_BYTES, |line| {
        line_no += 1;
        if line_no == 1 {
            start = Some(parse_request_line(line).map_err(|r| {
                let m = r.2.clone();
                refused = Some(r);
                HeadError::Malformed(m)
            })?);
            return Ok(());
        }
        let field = head::parse_field(line)?;
        if let Some(expected) = token {
            if field.0.eq_ignore_ascii_case("authorization") && !bearer_matches(&field.1, expected)
            {
                refused = Some(unauthorized());
                return Err(HeadError::Malformed("wrong bearer token".into()));
            }
        }
        headers.push(field);
        Ok(())
    });
    if let Some(r) = refused {
        return Err(r);
    }
    read.map_err(head_refusal)?;
    let (method, path, query) = start.ok_or_else(|| bad("empty request".into()))?;
    let body_len = head::body_length(&headers).map_err(head_refusal)?;
    let req = Request {
        method,
        path,
        query,
        headers,
        body_len,
    };
    if let Some(expected) = token {
        let given = req.header("authorization").unwrap_or("");
        if !bearer_matches(given, expected) {
            return Err(unauthorized());
        }
    }
    Ok(req)
}

fn bearer_matches(value: &str, expected: &str) -> bool {
    let given = value.strip_prefix("Bearer ").unwrap_or("");
    constant_time_eq(given.as_bytes(), expected.as_bytes())
}

fn content_length(req: &Request, max: u64) -> Result<u64, Refusal> {
    let len = req.body_len.ok_or((
        411,
        "length_required",
        "content-length is required".to_owned(),
    ))?;
    if len > max {
        return Err((
            413,
            "too_large",
            format!("body of {len} bytes exceeds the limit of {max}"),
        ));
    }
    Ok(len)
}

/// How long a body of `len` bytes may take.
fn body_deadline(len: u64) -> Instant {
    Instant::now() + BODY_GRACE + Duration::from_secs(len / MIN_BODY_RATE)
}

/// A control connection: plain, or TLS over the same deadline-bounded
/// socket.
pub enum Conn {
    /// Plain HTTP.
    Plain(DeadlineStream),
    /// HTTPS (the handshake is complete).
    Tls(Box<StreamOwned<ServerConnection, DeadlineStream>>),
}

impl Conn {
    fn deadline_stream(&mut self) -> &mut DeadlineStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => &mut s.sock,
        }
    }

    /// Moves the read deadline (see [`DeadlineStream::set_deadline`]).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline_stream().set_deadline(deadline);
    }

    /// Ends a TLS session cleanly (close_notify) before the socket closes.
    fn close_notify(&mut self) {
        if let Conn::Tls(s) = self {
            s.conn.send_close_notify();
            let _ = s.flush();
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Waits (until `deadline`) for the first byte and says whether it starts
/// a TLS handshake; `None` when nothing arrived.
fn first_byte_is_tls(stream: &TcpStream, deadline: Instant) -> Option<bool> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
        return None;
    }
    let mut first = [0u8; 1];
    match stream.peek(&mut first) {
        Ok(1) => Some(first[0] == tls::TLS_HANDSHAKE_RECORD),
        _ => None,
    }
}

/// Answers a client that speaks the other protocol (plain vs TLS) in plain
/// HTTP, so it gets a reason instead of a hang or a reset.
fn refuse_mismatch(stream: &mut TcpStream, tls_served: bool) {
    let (code, message) = if tls_served {
        (
            "tls_required",
            "this control endpoint serves HTTPS only (control.tls-cert is set): connect with \
             TLS, e.g. `--ca <the CA's PEM file>`",
        )
    } else {
        (
            "tls_not_served",
            "this control endpoint serves plain HTTP (control.tls-cert is not set): connect \
             without TLS (drop --ca)",
        )
    };
    if respond(stream, 400, JSON, &err_body(code, message)).is_ok() {
        linger(stream);
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

/// The server side of a TLS handshake, bounded by the stream's deadline.
fn handshake(
    config: &Arc<ServerConfig>,
    mut sock: DeadlineStream,
) -> std::io::Result<StreamOwned<ServerConnection, DeadlineStream>> {
    let mut conn = ServerConnection::new(Arc::clone(config)).map_err(std::io::Error::other)?;
    while conn.is_handshaking() {
        if let (0, 0) = conn.complete_io(&mut sock)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client closed the connection during the handshake",
            ));
        }
    }
    Ok(StreamOwned::new(conn, sock))
}

/// After an answer: stop sending, and read (and drop) what the client still
/// sends for at most [`LINGER`] and [`LINGER_BYTES`], so that closing a
/// socket with unread input does not reset the connection and destroy the
/// answer before the client has read it (a refused request is often
/// answered before its rest has arrived).
fn linger(stream: &mut TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let until = Instant::now() + LINGER;
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
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

type Refusal = (u16, &'static str, String);

fn handle(
    node: &Node,
    req: &Request,
    reader: &mut BufReader<Conn>,
) -> Result<(&'static str, Vec<u8>), Refusal> {
    fn to_json<T: serde::Serialize>(v: &T) -> Result<(&'static str, Vec<u8>), Refusal> {
        serde_json::to_vec(v)
            .map(|b| (JSON, b))
            .map_err(|e| (500, "internal", e.to_string()))
    }
    let json_out = |v: serde_json::Value| to_json(&v);
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/health") => {
            json_out(json!({"ok": true, "node": node.config().node.name, "tag": node.tag()}))
        }
        ("GET", "/v1/stats") => to_json(&node.stats()),
        ("GET", "/metrics") => Ok((
            PROMETHEUS_TEXT,
            shardport_host::metrics::prometheus(&node.metrics_snapshot()).into_bytes(),
        )),
        ("GET", "/v1/metrics.json") => to_json(&node.metrics_snapshot()),
        ("POST", "/v1/experiments/reset") => {
            let body = read_json_body(req, reader)?;
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Reset {
                #[serde(default)]
                experiment: Option<String>,
            }
            let r: Reset = if body.iter().all(u8::is_ascii_whitespace) {
                Reset { experiment: None }
            } else {
                serde_json::from_slice(&body).map_err(|e| {
                    (
                        400,
                        "bad_request",
                        format!("expected {{\"experiment\": \"NAME\"}} or an empty body: {e}"),
                    )
                })?
            };
            let done = node
                .reset_experiments(r.experiment.as_deref())
                .map_err(|m| (404, "not_found", m))?;
            json_out(json!({ "reenabled": done }))
        }
        ("POST", "/v1/put") => {
            let spec = put_spec(req)?;
            let tags = req
                .query
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("tag.").map(|k| (k.to_owned(), v.clone())))
                .collect();
            let len = content_length(req, node.config().node.max_shard_size)?;
            let mut read_err = None;
            let spec = match spec {
                Some(s) => s,
                None => TensorSpec::bytes(len),
            };
            let result = node.put_with(&spec, tags, |dst| {
                if dst.len() as u64 != len {
                    read_err = Some((
                        400,
                        "bad_request",
                        format!("body is {len} bytes, dtype and shape need {}", dst.len()),
                    ));
                } else if let Err(e) = reader.read_exact(dst) {
                    read_err = Some((400, "bad_request", format!("reading the body: {e}")));
                }
            });
            match (result, read_err) {
                (Ok(h), Some(e)) => {
                    node.remove(&[h.id]);
                    Err(e)
                }
                (Err(shardport_host::HostError::InvalidShard(_)), Some(r)) => Err(r),
                (Err(e), _) => Err((400, "put_failed", e.to_string())),
                (Ok(h), None) => json_out(json!({
                    "id": h.id.to_string(),
                    "handle": hex::encode(h.to_bytes()),
                    "handle_json": serde_json::from_str::<serde_json::Value>(&h.to_json()).unwrap_or_default(),
                })),
            }
        }
        ("POST", "/v1/remove") => {
            let ids = read_ids(req, reader)?;
            let Some(ids) = ids else {
                return Err((400, "bad_request", "expected {\"ids\": [...]}".to_owned()));
            };
            let missing: Vec<String> = node.remove(&ids).iter().map(ToString::to_string).collect();
            json_out(json!({ "missing": missing }))
        }
        ("POST", "/v1/drain") => {
            let drained = match read_ids(req, reader)? {
                Some(ids) => node.drain(&ids),
                None => node.drain_all(),
            };
            tracing::info!(target: "control", drained, "drain");
            json_out(json!({ "drained": drained }))
        }
        ("POST", "/v1/sweep") => json_out(node.sweep_json()),
        ("POST", "/v1/reload") => {
            let body = read_json_body(req, reader)?;
            let report = reload(node, &body)?;
            to_json(&report)
        }
        (
            _,
            "/v1/health"
            | "/v1/stats"
            | "/v1/put"
            | "/v1/remove"
            | "/v1/drain"
            | "/v1/sweep"
            | "/metrics"
            | "/v1/metrics.json"
            | "/v1/experiments/reset"
            | "/v1/reload",
        ) => Err((
            405,
            "method_not_allowed",
            format!("{} is not allowed on {}", req.method, req.path),
        )),
        (_, path) => Err((404, "not_found", format!("no endpoint {path}"))),
    }
}

/// `POST /v1/reload`: which config to apply, from the body.
fn reload(node: &Node, body: &[u8]) -> Result<shardport_host::node::ReloadReport, Refusal> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Reload {
        #[serde(default)]
        path: Option<std::path::PathBuf>,
        #[serde(default)]
        config: Option<String>,
    }
    let r: Reload = if body.iter().all(u8::is_ascii_whitespace) {
        Reload {
            path: None,
            config: None,
        }
    } else {
        serde_json::from_slice(body).map_err(|e| {
            (
                400,
                "bad_request",
                format!(
                    "expected an empty body, {{\"path\": FILE}} or {{\"config\": TOML, \"path\": FILE}}: {e}"
                ),
            )
        })?
    };
    let result = match (r.config, r.path) {
        (Some(text), path) => {
            let origin = match path {
                Some(p) => shardport_host::config::Origin::File(p),
                None => shardport_host::config::Origin::Text {
                    name: "<config sent to POST /v1/reload>".to_owned(),
                    base_dir: std::env::current_dir().unwrap_or_default(),
                    search_deps: false,
                },
            };
            node.reload_text(&text, origin)
        }
        (None, path) => node.reload_file(path.as_deref()),
    };
    result.map_err(|e| (409, "reload_refused", e.to_string()))
}

/// The request body, bounded by [`MAX_JSON_BODY`].
fn read_json_body(req: &Request, reader: &mut BufReader<Conn>) -> Result<Vec<u8>, Refusal> {
    let len = content_length(req, MAX_JSON_BODY as u64)?;
    let mut body = vec![0u8; len as usize];
    reader
        .read_exact(&mut body)
        .map_err(|e| (400, "bad_request", format!("reading the body: {e}")))?;
    Ok(body)
}

/// A `{"ids": [...]}` body (`Some`) or `{"all": true}` (`None`).
fn read_ids(req: &Request, reader: &mut BufReader<Conn>) -> Result<Option<Vec<ShardId>>, Refusal> {
    let body = read_json_body(req, reader)?;
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ids {
        #[serde(default)]
        ids: Option<Vec<String>>,
        #[serde(default)]
        all: bool,
    }
    let ids: Ids = serde_json::from_slice(&body).map_err(|e| {
        (
            400,
            "bad_request",
            format!("expected {{\"ids\": [...]}} or {{\"all\": true}}: {e}"),
        )
    })?;
    match (ids.ids, ids.all) {
        (Some(list), false) => list
            .iter()
            .map(|s| parse_id(s))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|e| (400, "bad_request", e)),
        (None, true) => Ok(None),
        _ => Err((
            400,
            "bad_request",
            "give exactly one of \"ids\" and \"all\": true".to_owned(),
        )),
    }
}

/// `dtype` and `shape` query parameters; `None` when both are absent (raw bytes).
fn put_spec(req: &Request) -> Result<Option<TensorSpec>, Refusal> {
    let get = |k: &str| {
        req.query
            .iter()
            .find(|(q, _)| q == k)
            .map(|(_, v)| v.as_str())
    };
    let (dtype, shape) = (get("dtype"), get("shape"));
    if dtype.is_none() && shape.is_none() {
        return Ok(None);
    }
    let dtype = match dtype {
        Some(d) => DType::from_name(d)
            .ok_or_else(|| (400, "bad_request", format!("unknown dtype `{d}`")))?,
        None => DType::U8,
    };
    let shape = shape
        .ok_or_else(|| {
            (
                400,
                "bad_request",
                "`dtype` needs `shape` (e.g. shape=4,8)".to_owned(),
            )
        })?
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<u64>().map_err(|_| {
                (
                    400,
                    "bad_request",
                    format!("shape dimension `{d}` is not a number"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(TensorSpec {
        dtype,
        shape,
        device: Device::CPU,
    }))
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(constant_time_eq(b"", b""));
    }
}
