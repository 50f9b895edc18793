//! The node's control endpoint: a small HTTP/1.1 server for operators and
//! the CLI (`shardport stats`, `shardport put`). Data never flows through it
//! to consumers: they fetch from transports.
//!
//! Endpoints (JSON errors are `{"code": "...", "message": "..."}`):
//! - `GET /v1/health` -> `{"ok": true, "node": ...}`
//! - `GET /v1/stats` -> the node's [`NodeStats`](shardport_host::NodeStats)
//! - `POST /v1/put?dtype=bf16&shape=4,8&tag.k=v` with the raw bytes as body
//!   -> `{"id", "handle" (hex of the binary form), "handle_json"}`
//! - `POST /v1/remove` with `{"ids": ["<32 hex>", ...]}` -> `{"missing": [...]}`
//! - `POST /v1/drain` with `{"ids": [...]}` or `{"all": true}` -> `{"drained": n}`:
//!   drops this node's cached copies (and their leases) of those shards
//! - `POST /v1/sweep` -> per transport, what was reclaimed from dead processes
//!
//! Bounded everywhere: header block [`MAX_HEADER_BYTES`], JSON bodies
//! [`MAX_JSON_BODY`], put bodies `node.max-shard-size`, [`MAX_CONNECTIONS`]
//! at once, [`IO_TIMEOUT`] per read/write. One request per connection. With a
//! token configured, every endpoint needs `Authorization: Bearer <token>`
//! (compared in constant time). Binds to loopback unless told otherwise.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use serde_json::json;
use shardport_abi::{DType, Device, ShardId};

use crate::worker::parse_id;
use shardport_host::{node::Node, node::TensorSpec};

/// Largest request head (request line + headers).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest JSON request body.
pub const MAX_JSON_BODY: usize = 1 << 20;
/// Most connections served at once; more get 503.
pub const MAX_CONNECTIONS: usize = 64;
/// Read/write timeout per socket operation: a stalled client loses its
/// connection, never a server thread forever.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Constant-time equality of two byte strings (length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A running control server; stops accepting when dropped. It holds the
/// node only weakly, so dropping the node's last owner shuts the node down.
#[derive(Debug)]
pub struct ControlServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `bind` and serves `node` on a background thread.
    pub fn start(node: &Node, bind: &str, token: Option<String>) -> std::io::Result<ControlServer> {
        let node = node.downgrade();
        let listener = TcpListener::bind(bind).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("cannot bind the control endpoint on {bind}: {e}"),
            )
        })?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicUsize::new(0));
        let token = token.map(Arc::<str>::from);
        let stop2 = Arc::clone(&stop);
        let accept = thread::Builder::new()
            .name("shardport-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(mut stream) = conn else { continue };
                    if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                        let _ = respond(
                            &mut stream,
                            503,
                            JSON,
                            &err_body("busy", "too many control connections"),
                        );
                        continue;
                    }
                    let Some(node) = node.upgrade() else {
                        let _ = respond(
                            &mut stream,
                            503,
                            JSON,
                            &err_body("shutting_down", "the node is shutting down"),
                        );
                        break;
                    };
                    active.fetch_add(1, Ordering::Relaxed);
                    let (token, active) = (token.clone(), Arc::clone(&active));
                    let spawned = thread::Builder::new()
                        .name("shardport-control-conn".into())
                        .spawn(move || {
                            serve_conn(&node, stream, token.as_deref());
                            active.fetch_sub(1, Ordering::Relaxed);
                        });
                    if spawned.is_err() {
                        tracing::warn!(target: "control", "cannot spawn a connection thread");
                    }
                }
            })?;
        tracing::info!(target: "control", %addr, "control endpoint listening");
        Ok(ControlServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
    stream: &mut TcpStream,
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
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
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

/// Reads the request head, bounded in size.
fn read_head(reader: &mut BufReader<TcpStream>) -> Result<Request, (u16, &'static str, String)> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = reader
            .by_ref()
            .take((MAX_HEADER_BYTES + 1 - head.len().min(MAX_HEADER_BYTES)) as u64)
            .read_until(b'\n', &mut head)
            .map_err(|e| (400, "bad_request", format!("reading the request: {e}")))?;
        if head.len() > MAX_HEADER_BYTES {
            return Err((
                431,
                "headers_too_large",
                format!("request head over {MAX_HEADER_BYTES} bytes"),
            ));
        }
        if n == 0 {
            return Err((
                400,
                "bad_request",
                "connection closed before the end of the request head".into(),
            ));
        }
        if head[before..] == *b"\r\n" || head[before..] == *b"\n" {
            break;
        }
    }
    let text = std::str::from_utf8(&head)
        .map_err(|_| (400, "bad_request", "request head is not UTF-8".into()))?;
    let mut lines = text.lines();
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err((
            400,
            "bad_request",
            format!("malformed request line `{line}`"),
        ));
    };
    if !version.starts_with("HTTP/1.") {
        return Err((
            400,
            "bad_request",
            format!("unsupported protocol `{version}`"),
        ));
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
    let mut headers = Vec::new();
    for h in lines.filter(|l| !l.is_empty()) {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| (400, "bad_request", format!("malformed header `{h}`")))?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        headers,
    })
}

fn content_length(req: &Request, max: u64) -> Result<u64, (u16, &'static str, String)> {
    let len: u64 = req
        .header("content-length")
        .ok_or((
            411,
            "length_required",
            "content-length is required".to_owned(),
        ))?
        .parse()
        .map_err(|_| {
            (
                400,
                "bad_request",
                "content-length is not a number".to_owned(),
            )
        })?;
    if len > max {
        return Err((
            413,
            "too_large",
            format!("body of {len} bytes exceeds the limit of {max}"),
        ));
    }
    Ok(len)
}

fn serve_conn(node: &Node, stream: TcpStream, token: Option<&str>) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut out = write_half;
    let mut reader = BufReader::new(stream);
    let (status, content_type, body) = match handle(node, &mut reader, token) {
        Ok((content_type, body)) => (200, content_type, body),
        Err((status, code, message)) => {
            tracing::debug!(target: "control", status, code, %message, "control request refused");
            (status, JSON, err_body(code, &message))
        }
    };
    let _ = respond(&mut out, status, content_type, &body);
}

type Refusal = (u16, &'static str, String);

fn handle(
    node: &Node,
    reader: &mut BufReader<TcpStream>,
    token: Option<&str>,
) -> Result<(&'static str, Vec<u8>), Refusal> {
    let req = read_head(reader)?;
    if let Some(expected) = token {
        let given = req
            .header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), expected.as_bytes()) {
            return Err((401, "unauthorized", "missing or wrong bearer token".into()));
        }
    }
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
            let body = read_json_body(&req, reader)?;
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
            let spec = put_spec(&req)?;
            let tags = req
                .query
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("tag.").map(|k| (k.to_owned(), v.clone())))
                .collect();
            let len = content_length(&req, node.config().node.max_shard_size)?;
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
            let ids = read_ids(&req, reader)?;
            let Some(ids) = ids else {
                return Err((400, "bad_request", "expected {\"ids\": [...]}".to_owned()));
            };
            let missing: Vec<String> = node.remove(&ids).iter().map(ToString::to_string).collect();
            json_out(json!({ "missing": missing }))
        }
        ("POST", "/v1/drain") => {
            let drained = match read_ids(&req, reader)? {
                Some(ids) => node.drain(&ids),
                None => node.drain_all(),
            };
            tracing::info!(target: "control", drained, "drain");
            json_out(json!({ "drained": drained }))
        }
        ("POST", "/v1/sweep") => json_out(node.sweep_json()),
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
            | "/v1/experiments/reset",
        ) => Err((
            405,
            "method_not_allowed",
            format!("{} is not allowed on {}", req.method, req.path),
        )),
        (_, path) => Err((404, "not_found", format!("no endpoint {path}"))),
    }
}

/// The request body, bounded by [`MAX_JSON_BODY`].
fn read_json_body(req: &Request, reader: &mut BufReader<TcpStream>) -> Result<Vec<u8>, Refusal> {
    let len = content_length(req, MAX_JSON_BODY as u64)?;
    let mut body = vec![0u8; len as usize];
    reader
        .read_exact(&mut body)
        .map_err(|e| (400, "bad_request", format!("reading the body: {e}")))?;
    Ok(body)
}

/// A `{"ids": [...]}` body (`Some`) or `{"all": true}` (`None`).
fn read_ids(
    req: &Request,
    reader: &mut BufReader<TcpStream>,
) -> Result<Option<Vec<ShardId>>, Refusal> {
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

/// A minimal client for the control endpoint (used by the CLI).
pub mod client {
    use std::{
        io::{Read, Write},
        net::{TcpStream, ToSocketAddrs},
        time::Duration,
    };

    /// A control call failed.
    #[derive(Debug, thiserror::Error)]
    pub enum ClientError {
        /// Connecting or talking failed.
        #[error("control endpoint {addr}: {source}")]
        Io {
            /// Address.
            addr: String,
            /// OS error.
            source: std::io::Error,
        },
        /// Non-200 answer.
        #[error("control endpoint {addr} answered {status}: {message}")]
        Status {
            /// Address.
            addr: String,
            /// HTTP status.
            status: u16,
            /// The error message from the body.
            message: String,
        },
        /// Unparseable answer.
        #[error("control endpoint {addr} sent an invalid response: {what}")]
        Invalid {
            /// Address.
            addr: String,
            /// What was wrong.
            what: String,
        },
    }

    /// Sends one request; returns the status and the body.
    pub fn request(
        addr: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let io = |source| ClientError::Io {
            addr: addr.to_owned(),
            source,
        };
        let sock = addr.to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
            io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "address resolves to nothing",
            ))
        })?;
        let mut s = TcpStream::connect_timeout(&sock, timeout).map_err(io)?;
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        s.set_write_timeout(Some(timeout)).map_err(io)?;
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .map_err(io)?;
        s.write_all(body).map_err(io)?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(io)?;
        let invalid = |what: &str| ClientError::Invalid {
            addr: addr.to_owned(),
            what: what.to_owned(),
        };
        let split = resp
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| invalid("no end of headers"))?;
        let head = std::str::from_utf8(&resp[..split]).map_err(|_| invalid("non-UTF-8 head"))?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid("no status code"))?;
        resp.drain(..split + 4);
        Ok((status, resp))
    }

    fn refusal(addr: &str, status: u16, body: &[u8]) -> ClientError {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(200).collect());
        ClientError::Status {
            addr: addr.to_owned(),
            status,
            message,
        }
    }

    /// Sends one request and returns the JSON body of a 200 answer.
    pub fn call(
        addr: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
        timeout: Duration,
    ) -> Result<serde_json::Value, ClientError> {
        let (status, resp) = request(addr, method, path, token, body, timeout)?;
        if status != 200 {
            return Err(refusal(addr, status, &resp));
        }
        serde_json::from_slice(&resp).map_err(|e| ClientError::Invalid {
            addr: addr.to_owned(),
            what: format!("body is not JSON: {e}"),
        })
    }

    /// `GET path` and returns the text body of a 200 answer (`/metrics`).
    pub fn get_text(
        addr: &str,
        path: &str,
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<String, ClientError> {
        let (status, resp) = request(addr, "GET", path, token, &[], timeout)?;
        if status != 200 {
            return Err(refusal(addr, status, &resp));
        }
        String::from_utf8(resp).map_err(|_| ClientError::Invalid {
            addr: addr.to_owned(),
            what: "body is not UTF-8".to_owned(),
        })
    }
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
