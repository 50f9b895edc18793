//! One control connection: plain or TLS over a deadline-bounded socket,
//! the first byte that tells which, the answer, and the linger after it.

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
    time::Instant,
};

use rustls::{ServerConfig, ServerConnection, StreamOwned};
use shardport_http_base::{tls::TLS_HANDSHAKE_RECORD, DeadlineStream};

use crate::{LINGER, LINGER_BYTES};

pub(crate) fn err_body(code: &str, message: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"code": code, "message": message})).unwrap_or_default()
}

pub(crate) const JSON: &str = "application/json";
/// The Prometheus text exposition format.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub(crate) fn respond(
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
    pub(crate) fn close_notify(&mut self) {
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
pub(crate) fn first_byte_is_tls(stream: &TcpStream, deadline: Instant) -> Option<bool> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
        return None;
    }
    let mut first = [0u8; 1];
    match stream.peek(&mut first) {
        Ok(1) => Some(first[0] == TLS_HANDSHAKE_RECORD),
        _ => None,
    }
}

/// Answers a client that speaks the other protocol (plain vs TLS) in plain
/// HTTP, so it gets a reason instead of a hang or a reset.
pub(crate) fn refuse_mismatch(stream: &mut TcpStream, tls_served: bool) {
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

/// The server side of a TLS handshake, bounded by the stream's deadline.
pub(crate) fn handshake(
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
pub(crate) fn linger(stream: &mut TcpStream) {
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
