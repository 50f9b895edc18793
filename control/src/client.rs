//! A minimal client for the control endpoint (used by the CLI). It reads
//! answers with the server's head parser and rules (the workspace's one
//! parser, `shardport_http_base::head`, with [`crate::HEAD_RULES`] except
//! for the size, [`MAX_RESPONSE_HEAD`])
//! and a bounded body, so a hostile or broken endpoint gets a clear error,
//! never an unbounded allocation or a body read two ways.
//!
//! With a [`Trust`] (the CLI's `--ca`) it speaks HTTPS: the handshake is
//! bounded by the call's timeout, and a failure says whether the
//! certificate was not trusted or the endpoint serves plain HTTP.

use std::{
    io::{BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::{Duration, Instant},
};

use rustls::{ClientConnection, StreamOwned};

use shardport_http_base::{
    head::{self, HeadError, Rules},
    DeadlineStream,
};

pub use crate::tls::Trust;
use crate::HEAD_RULES;

/// Largest response head accepted.
pub const MAX_RESPONSE_HEAD: usize = 16 * 1024;
/// Largest response body accepted (metrics of a node with many experiments
/// stay far below this).
pub const MAX_RESPONSE_BODY: u64 = 64 << 20;
/// Response heads are read like request heads, up to [`MAX_RESPONSE_HEAD`].
const RESPONSE_RULES: Rules = Rules {
    max_bytes: MAX_RESPONSE_HEAD,
    ..HEAD_RULES
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
    /// The TLS handshake or session failed (untrusted certificate, a
    /// plain-HTTP endpoint, a name the certificate does not carry).
    #[error("control endpoint {addr}: TLS failed: {message}")]
    Tls {
        /// Address.
        addr: String,
        /// What went wrong, with a hint.
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
    request_with(addr, None, method, path, token, body, timeout)
}

/// A connection to the endpoint: plain, or TLS with the handshake done.
enum Stream {
    Plain(DeadlineStream),
    Tls(Box<StreamOwned<ClientConnection, DeadlineStream>>),
}

impl Stream {
    fn set_deadline(&mut self, deadline: Instant) {
        match self {
            Stream::Plain(s) => s.set_deadline(deadline),
            Stream::Tls(s) => s.sock.set_deadline(deadline),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// [`request`] over TLS when `trust` is given (the endpoint's certificate
/// checked against it and the host of `addr`).
pub fn request_with(
    addr: &str,
    trust: Option<&Trust>,
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
    let tls_failed = |message: String| ClientError::Tls {
        addr: addr.to_owned(),
        message,
    };
    let sock = addr.to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "address resolves to nothing",
        ))
    })?;
    let s = TcpStream::connect_timeout(&sock, timeout).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let plain = DeadlineStream::new(s, Instant::now() + timeout);
    let mut s = match trust {
        None => Stream::Plain(plain),
        Some(trust) => {
            let name = crate::tls::server_name(addr).map_err(tls_failed)?;
            let conn = ClientConnection::new(trust.config(), name)
                .map_err(|e| tls_failed(e.to_string()))?;
            let mut tls = StreamOwned::new(conn, plain);
            while tls.conn.is_handshaking() {
                match tls.conn.complete_io(&mut tls.sock) {
                    Ok((0, 0)) => {
                        return Err(tls_failed(
                            "the endpoint closed the connection during the handshake".into(),
                        ))
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(match crate::tls::explain(&e) {
                            Some(m) => tls_failed(m),
                            None if e.kind() == std::io::ErrorKind::TimedOut => tls_failed(
                                format!("the handshake did not finish within {timeout:?}"),
                            ),
                            None => io(e),
                        })
                    }
                }
            }
            Stream::Tls(Box::new(tls))
        }
    };
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let sent = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body))
        .and_then(|()| s.flush());
    s.set_deadline(Instant::now() + timeout);
    match sent {
        // A server may answer before it has read the whole request (401,
        // 413) and close: its answer says more than the broken pipe.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            read_response(addr, s).map_err(|_| io(e))
        }
        Err(e) => Err(match crate::tls::explain(&e) {
            Some(m) => tls_failed(m),
            None => io(e),
        }),
        Ok(()) => read_response(addr, s),
    }
}

/// Reads a whole response: status line, fields (strict framing), and a body
/// of exactly `Content-Length` bytes (or up to the end of the stream when
/// there is none), bounded by [`MAX_RESPONSE_BODY`].
fn read_response(addr: &str, stream: Stream) -> Result<(u16, Vec<u8>), ClientError> {
    let invalid = |what: String| ClientError::Invalid {
        addr: addr.to_owned(),
        what,
    };
    let mut reader = BufReader::new(stream);
    let mut status = None;
    let mut fields = Vec::new();
    head::read_lines(&mut reader, &RESPONSE_RULES, |line| {
        if status.is_none() {
            status = Some(parse_status_line(line)?);
        } else {
            fields.push(head::parse_field(line, &RESPONSE_RULES)?);
        }
        Ok(())
    })
    .map_err(|e| invalid(e.to_string()))?;
    let status = status.ok_or_else(|| invalid("no status line".into()))?;
    let declared =
        head::body_length(&fields, &RESPONSE_RULES).map_err(|e| invalid(e.to_string()))?;
    if declared.is_some_and(|n| n > MAX_RESPONSE_BODY) {
        return Err(invalid(format!(
            "body of {} bytes is over the client's limit of {MAX_RESPONSE_BODY}",
            declared.unwrap_or_default()
        )));
    }
    let mut body = Vec::new();
    reader
        .take(declared.unwrap_or(MAX_RESPONSE_BODY) + 1)
        .read_to_end(&mut body)
        .map_err(|source| match crate::tls::explain(&source) {
            Some(message) => ClientError::Tls {
                addr: addr.to_owned(),
                message,
            },
            None => ClientError::Io {
                addr: addr.to_owned(),
                source,
            },
        })?;
    match declared {
        Some(n) if body.len() as u64 != n => Err(invalid(format!(
            "body is {} bytes, content-length said {n}",
            body.len()
        ))),
        None if body.len() as u64 > MAX_RESPONSE_BODY => Err(invalid(format!(
            "body is over the client's limit of {MAX_RESPONSE_BODY} bytes"
        ))),
        _ => Ok((status, body)),
    }
}

/// The status code of `HTTP/1.x DDD reason`.
fn parse_status_line(line: &str) -> Result<u16, HeadError> {
    let mut parts = line.splitn(3, ' ');
    match (parts.next(), parts.next()) {
        (Some(v), Some(code))
            if v.starts_with("HTTP/1.")
                && code.len() == 3
                && code.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Ok(code.parse().unwrap_or_default())
        }
        _ => Err(HeadError::Malformed(format!(
            "malformed status line `{line}`"
        ))),
    }
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
    call_with(addr, None, method, path, token, body, timeout)
}

/// [`call`] over TLS when `trust` is given.
pub fn call_with(
    addr: &str,
    trust: Option<&Trust>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
    timeout: Duration,
) -> Result<serde_json::Value, ClientError> {
    let (status, resp) = request_with(addr, trust, method, path, token, body, timeout)?;
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
    get_text_with(addr, None, path, token, timeout)
}

/// [`get_text`] over TLS when `trust` is given.
pub fn get_text_with(
    addr: &str,
    trust: Option<&Trust>,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<String, ClientError> {
    let (status, resp) = request_with(addr, trust, "GET", path, token, &[], timeout)?;
    if status != 200 {
        return Err(refusal(addr, status, &resp));
    }
    String::from_utf8(resp).map_err(|_| ClientError::Invalid {
        addr: addr.to_owned(),
        what: "body is not UTF-8".to_owned(),
    })
}
