//! HTTP/1.1 message heads for the control endpoint, parsed strictly: the
//! server and the client refuse every framing a proxy and this server could
//! read differently (request smuggling, response splitting).
//!
//! Refused, each with its own message: a bare CR, obs-fold (a header line
//! that starts with a space or tab), whitespace between a field name and
//! its colon, a field name that is not a token, more than one
//! `Content-Length` (equal or not, or a list), a `Content-Length` that is
//! not a plain decimal number, and any `Transfer-Encoding` (this endpoint
//! speaks only `Content-Length` framing, so chunk sizes are never parsed).
//! Lines end in CRLF; a lone LF is accepted as a line end (RFC 9112 2.2).

use std::{
    io::{self, BufRead, Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

/// What was wrong with a message head; the server answers 400 with it (431
/// for [`HeadError::TooLarge`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The head is longer than the limit.
    #[error("request head over {0} bytes")]
    TooLarge(usize),
    /// The head is malformed or its framing is ambiguous.
    #[error("{0}")]
    Malformed(String),
    /// The peer closed or stalled before the end of the head.
    #[error("{0}")]
    Io(String),
}

fn malformed(what: impl Into<String>) -> HeadError {
    HeadError::Malformed(what.into())
}

/// One header field, name as sent, value without surrounding whitespace.
pub type Field = (String, String);

/// Reads a head line by line, at most `max` bytes in all, and hands each
/// line (without its line end; the empty line that ends the head is not
/// passed) to `on_line` as soon as it arrives, so a caller can refuse early.
pub fn read_lines<R: BufRead>(
    reader: &mut R,
    max: usize,
    mut on_line: impl FnMut(&str) -> Result<(), HeadError>,
) -> Result<(), HeadError> {
    let mut used = 0usize;
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .by_ref()
            .take((max + 1 - used.min(max)) as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| HeadError::Io(format!("reading the head: {e}")))?;
        used += n;
        if used > max {
            return Err(HeadError::TooLarge(max));
        }
        if n == 0 || line.last() != Some(&b'\n') {
            return Err(HeadError::Io(
                "connection closed before the end of the head".into(),
            ));
        }
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.contains(&b'\r') {
            return Err(malformed("bare CR in the head"));
        }
        if line.is_empty() {
            return Ok(());
        }
        let text = std::str::from_utf8(&line).map_err(|_| malformed("the head is not UTF-8"))?;
        on_line(text)?;
    }
}

/// A header line as `(name, value)`, refusing obs-fold, whitespace before
/// the colon, and names that are not tokens.
pub fn parse_field(line: &str) -> Result<Field, HeadError> {
    if line.starts_with([' ', '\t']) {
        return Err(malformed(format!(
            "obsolete line folding (a header line starting with whitespace): `{line}`"
        )));
    }
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| malformed(format!("malformed header `{line}`")))?;
    if name.is_empty() || !name.bytes().all(is_token_byte) {
        return Err(malformed(format!(
            "header name `{name}` is not a token (no whitespace before the colon)"
        )));
    }
    if value.bytes().any(|b| b == 0) {
        return Err(malformed(format!("NUL in the value of header `{name}`")));
    }
    Ok((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()))
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The body length the fields declare: `None` without `Content-Length`.
/// Refuses `Transfer-Encoding`, repeated or list-valued `Content-Length`,
/// and anything but 1 to 19 decimal digits.
pub fn body_length(fields: &[Field]) -> Result<Option<u64>, HeadError> {
    let has = |n: &str| fields.iter().any(|(k, _)| k.eq_ignore_ascii_case(n));
    if has("transfer-encoding") {
        return Err(malformed(if has("content-length") {
            "both transfer-encoding and content-length: ambiguous framing"
        } else {
            "transfer-encoding is not supported here; send content-length"
        }));
    }
    let mut lengths = fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"));
    let Some((_, value)) = lengths.next() else {
        return Ok(None);
    };
    if lengths.next().is_some() {
        return Err(malformed("more than one content-length header"));
    }
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(format!(
            "content-length `{value}` is not a decimal number"
        )));
    }
    value
        .parse()
        .map(Some)
        .map_err(|_| malformed(format!("content-length `{value}` is out of range")))
}

/// A socket reader that fails with `TimedOut` once its deadline has passed,
/// whatever the pace of the bytes: per-read timeouts alone let a peer that
/// sends one byte a second hold a connection forever.
pub struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl DeadlineStream {
    /// Reads from `stream` until `deadline`.
    pub fn new(stream: TcpStream, deadline: Instant) -> DeadlineStream {
        DeadlineStream { stream, deadline }
    }

    /// Moves the deadline (e.g. from the head's to the body's).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// The socket.
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }
}

/// Writes go straight to the socket, bounded by its write timeout (the
/// deadline bounds reads; TLS writes its handshake through this too).
impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let deadline_passed = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "deadline passed before the message was complete",
            )
        };
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(deadline_passed());
        }
        self.stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        // The socket timeout is the time left, so its expiry is the deadline.
        self.stream.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => deadline_passed(),
            _ => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(head: &[u8]) -> Result<Vec<String>, HeadError> {
        let mut out = Vec::new();
        read_lines(&mut io::Cursor::new(head), 1024, |l| {
            out.push(l.to_owned());
            Ok(())
        })?;
        Ok(out)
    }

    fn fields(head: &[u8]) -> Result<Vec<Field>, HeadError> {
        lines(head)?
            .iter()
            .skip(1)
            .map(|l| parse_field(l))
            .collect()
    }

    #[test]
    fn a_plain_head_parses_with_crlf_or_lf() {
        let f = fields(b"GET / HTTP/1.1\r\nA: 1\r\nb:2 \r\n\r\n").unwrap();
        assert_eq!(f, vec![("A".into(), "1".into()), ("b".into(), "2".into())]);
        assert_eq!(fields(b"GET / HTTP/1.1\nA: 1\n\n").unwrap().len(), 1);
    }

    #[test]
    fn bare_cr_is_refused() {
        let e = lines(b"GET / HTTP/1.1\r\nA: 1\rB: 2\r\n\r\n").unwrap_err();
        assert_eq!(e, malformed("bare CR in the head"));
    }

    #[test]
    fn obs_fold_is_refused() {
        let e = fields(b"GET / HTTP/1.1\r\nA: 1\r\n 2\r\n\r\n").unwrap_err();
        assert!(e.to_string().contains("obsolete line folding"), "{e}");
        let e = fields(b"GET / HTTP/1.1\r\nA: 1\r\n\t2\r\n\r\n").unwrap_err();
        assert!(e.to_string().contains("obsolete line folding"), "{e}");
    }

    #[test]
    fn whitespace_before_the_colon_is_refused() {
        let e = fields(b"GET / HTTP/1.1\r\nContent-Length : 5\r\n\r\n").unwrap_err();
        assert!(e.to_string().contains("is not a token"), "{e}");
    }

    #[test]
    fn the_head_is_bounded_and_must_end() {
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(2000));
        assert_eq!(lines(long.as_bytes()), Err(HeadError::TooLarge(1024)));
        assert!(matches!(
            lines(b"GET / HTTP/1.1\r\nA: 1\r\n"),
            Err(HeadError::Io(_))
        ));
    }

    fn length(fields: &[(&str, &str)]) -> Result<Option<u64>, HeadError> {
        let f: Vec<Field> = fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        body_length(&f)
    }

    #[test]
    fn content_length_must_be_single_and_plain() {
        assert_eq!(length(&[("Content-Length", "42")]), Ok(Some(42)));
        assert_eq!(length(&[("x", "1")]), Ok(None));
        for bad in [
            vec![("content-length", "5"), ("Content-Length", "6")],
            vec![("content-length", "5"), ("content-length", "5")],
            vec![("content-length", "5, 5")],
            vec![("content-length", "+5")],
            vec![("content-length", "-1")],
            vec![("content-length", "0x10")],
            vec![("content-length", "")],
            vec![("content-length", "99999999999999999999")],
        ] {
            assert!(length(&bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn transfer_encoding_is_refused_with_or_without_content_length() {
        let e = length(&[("transfer-encoding", "chunked"), ("content-length", "5")]).unwrap_err();
        assert!(e.to_string().contains("ambiguous framing"), "{e}");
        let e = length(&[("Transfer-Encoding", "chunked")]).unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
