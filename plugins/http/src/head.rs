//! HTTP/1.1 message heads on the consumer side: the request heads this
//! client writes, and a strict, bounded reader of the response heads owners
//! send, over the workspace's one head parser (`shardport_http_base::head`)
//! with this consumer's [`RULES`]. Pure functions, no I/O.
//!
//! The parser accepts what a shardport owner sends (hyper's HTTP/1.1
//! server) and refuses anything it cannot frame safely, with a message that
//! says what was wrong:
//! - a status line `HTTP/1.1 <3 digits> <reason>` (or `HTTP/1.0`);
//!   informational `1xx` answers are refused (this client never asks for
//!   them);
//! - at most [`MAX_RESPONSE_HEAD`] bytes and [`MAX_HEADERS`] header fields,
//!   each `name: value` with a token name and visible-ASCII value, lines
//!   ending in CRLF, no obsolete line folding;
//! - bodies framed by `content-length` only: `transfer-encoding` (chunked
//!   or any other coding) is refused, a `200` without `content-length` is
//!   refused, and a second `content-length` (equal or not) is refused.
//!
//! ```text
//! HTTP/1.1 200 OK\r\n
//! content-type: application/octet-stream\r\n
//! content-length: 4096\r\n
//! x-shardport-len: 4096\r\n
//! \r\n
//! <4096 body bytes>
//! ```

use shardport_http_base::head::{
    self, quote, FieldError, Framing, FramingError, LineEnds, Rules, Values,
};

use crate::wire;

/// Largest response head accepted, request line to the blank line
/// included. hyper's heads are about 150 bytes; 16 KiB is the owner's own
/// default limit for request heads.
pub(crate) const MAX_RESPONSE_HEAD: usize = 16 << 10;
/// Most header fields accepted in one response head (hyper sends 3 to 5).
pub(crate) const MAX_HEADERS: usize = 64;
/// Sent with every request, so an owner's logs say who asked.
pub(crate) const USER_AGENT: &str = concat!("shardport-http/", env!("CARGO_PKG_VERSION"));

/// What the consumer needs from a response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponseHead {
    /// The status code (200 ..= 599).
    pub status: u16,
    /// `content-length`, always present when `status` is 200.
    pub content_length: Option<u64>,
    /// `x-shardport-len`, the shard's length, when the owner sent it.
    pub shard_len: Option<u64>,
    /// The owner closes the connection after this response
    /// (`connection: close`, or HTTP/1.0 without `keep-alive`).
    pub close: bool,
}

/// How this consumer reads response heads: CRLF line ends, visible field
/// values, at most [`MAX_RESPONSE_HEAD`] bytes and [`MAX_HEADERS`] fields,
/// and a `content-length` of up to 20 digits (any `u64`).
pub(crate) const RULES: Rules = Rules {
    max_bytes: MAX_RESPONSE_HEAD,
    max_fields: MAX_HEADERS,
    line_ends: LineEnds::CrLf,
    values: Values::Visible,
    max_length_digits: 20,
};

/// Parses the response head at the start of `buf`.
///
/// `Ok(None)`: no complete head yet (read more and call again with the
/// longer buffer). `Ok(Some((head, n)))`: the head is `buf[..n]`; what
/// follows is body. `Err(why)`: not a response this client can read; `why`
/// names the problem.
pub(crate) fn parse_response_head(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, String> {
    const PREFIX: &[u8] = b"HTTP/";
    let prefix = &buf[..buf.len().min(PREFIX.len())];
    if !PREFIX.starts_with(prefix) {
        return Err(format!(
            "the response does not start with `HTTP/` but with {}",
            quote(&buf[..buf.len().min(32)])
        ));
    }
    let head_len = match head::head_len(buf, &RULES) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(_) => {
            return Err(format!(
                "the response head exceeds {} KiB",
                MAX_RESPONSE_HEAD >> 10
            ))
        }
    };
    let mut lines = head::lines(&buf[..head_len], RULES.line_ends)
        .map(|l| l.map_err(|_| "a line of the response head ends without CR LF".to_owned()));
    let status_line = lines.next().expect("a head has a start line")?;
    let (http10, status) = parse_status_line(status_line)?;
    // Field by field, refusing at the first fault (the owner's head is read
    // as it comes; the first thing wrong is what the message names).
    let mut framing = Framing::new(RULES.max_length_digits);
    let mut shard_len: Option<u64> = None;
    let (mut close, mut keep_alive) = (false, false);
    let mut count = 0usize;
    for line in lines {
        let line = line?;
        count += 1;
        if count > RULES.max_fields {
            return Err(format!(
                "the response has more than {MAX_HEADERS} header fields"
            ));
        }
        let (name, value) = head::field(line, RULES.values).map_err(|e| match e {
            FieldError::ObsFold => "obsolete line folding in the response head".to_owned(),
            FieldError::NoColon => format!("header line {} has no `:`", quote(line)),
            FieldError::BadName(name) => format!("malformed header name {}", quote(name)),
            FieldError::BadValue(name) => {
                format!("header {} has control bytes in its value", quote(name))
            }
        })?;
        framing.field(name, value).map_err(|e| match e {
            FramingError::TransferEncoding { value, .. } => format!(
                "transfer-encoding {} is not supported: a shardport owner frames every body \
                 with content-length",
                quote(&value)
            ),
            FramingError::BadLength(v) => {
                format!("content-length {} is not a byte count", quote(&v))
            }
            FramingError::RepeatedLength { values: [a, b], .. } => {
                let n = |v: &[u8]| head::parse_decimal(v, RULES.max_length_digits);
                match (n(&a), n(&b)) {
                    (Some(c), Some(n)) if c != n => {
                        format!("conflicting content-length values {c} and {n}")
                    }
                    (_, n) => format!("duplicate content-length {}", n.unwrap_or_default()),
                }
            }
        })?;
        if name.eq_ignore_ascii_case(wire::LEN_HEADER.as_bytes()) {
            shard_len = Some(
                head::parse_decimal(value, RULES.max_length_digits).ok_or_else(|| {
                    format!("{} {} is not a byte count", wire::LEN_HEADER, quote(value))
                })?,
            );
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in value.split(|&b| b == b',') {
                let option = option.trim_ascii();
                close |= option.eq_ignore_ascii_case(b"close");
                keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
            }
        }
    }
    let content_length = framing.length();
    if status == 200 && content_length.is_none() {
        return Err(
            "a 200 response without content-length (this client reads only bodies of \
                    announced length)"
                .to_owned(),
        );
    }
    Ok(Some((
        ResponseHead {
            status,
            content_length,
            shard_len,
            close: close || (http10 && !keep_alive),
        },
        head_len,
    )))
}

/// `HTTP/1.x SP 3DIGIT [SP reason]`: (is HTTP/1.0, status).
fn parse_status_line(line: &[u8]) -> Result<(bool, u16), String> {
    let bad = || format!("malformed status line {}", quote(line));
    let http10 = if line.starts_with(b"HTTP/1.1 ") {
        false
    } else if line.starts_with(b"HTTP/1.0 ") {
        true
    } else {
        return Err(format!(
            "status line {} is not HTTP/1.1 or HTTP/1.0",
            quote(line)
        ));
    };
    let rest = &line[9..];
    let code = rest.get(..3).ok_or_else(bad)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    match &rest[3..] {
        [] => {}
        [b' ', reason @ ..] if reason.iter().all(|&b| head::is_field_byte(b)) => {}
        _ => return Err(bad()),
    }
    if !(100..=599).contains(&status) {
        return Err(format!("status {status} is not an HTTP status code"));
    }
    if status < 200 {
        return Err(format!(
            "an informational {status} response (this client never asks for one)"
        ));
    }
    Ok((http10, status))
}

/// Writes a request into `out` (cleared first): request line, `host`,
/// `user-agent`, `authorization` when `auth` (the whole value, `Bearer
/// <token>`) is given, and for a non-empty body `content-type` and
/// `content-length` followed by the body. Keep-alive is HTTP/1.1's default.
pub(crate) fn write_request(
    out: &mut Vec<u8>,
    method: &str,
    path: &str,
    host: &str,
    auth: Option<&str>,
    body: &[u8],
) {
    out.clear();
    out.reserve(160 + path.len() + host.len() + auth.map_or(0, str::len) + body.len());
    for part in [
        method,
        " ",
        path,
        " HTTP/1.1\r\nhost: ",
        host,
        "\r\nuser-agent: ",
    ] {
        out.extend_from_slice(part.as_bytes());
    }
    out.extend_from_slice(USER_AGENT.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(a) = auth {
        out.extend_from_slice(b"authorization: ");
        out.extend_from_slice(a.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() {
        out.extend_from_slice(b"content-type: application/octet-stream\r\ncontent-length: ");
        out.extend_from_slice(body.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &[u8]) -> Result<Option<(ResponseHead, usize)>, String> {
        parse_response_head(s)
    }

    #[track_caller]
    fn refused(s: &[u8], needle: &str) {
        let e = parse(s).expect_err("expected a refusal");
        assert!(e.contains(needle), "expected {needle:?} in {e:?}");
    }

    #[test]
    fn reads_what_hyper_sends() {
        let r = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
                  content-length: 4096\r\nx-shardport-len: 4096\r\n\
                  date: Sun, 22 Nov 2026 02:00:00 GMT\r\n\r\nBODY";
        let (h, n) = parse(r).unwrap().unwrap();
        assert_eq!(
            h,
            ResponseHead {
                status: 200,
                content_length: Some(4096),
                shard_len: Some(4096),
                close: false
            }
        );
        assert_eq!(&r[n..], b"BODY");
        let (h, _) = parse(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\
              Content-Length: 10\r\nConnection: close\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.status, h.content_length, h.close), (404, Some(10), true));
        // An error without a length (read to the end of the connection).
        let (h, _) = parse(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.status, h.content_length), (400, None));
        // No reason phrase; OWS around values; HTTP/1.0 closes unless kept alive.
        let (h, _) = parse(b"HTTP/1.0 200\r\ncontent-length:\t7 \r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((h.content_length, h.close), (Some(7), true));
        let (h, _) =
            parse(b"HTTP/1.0 200 OK\r\nconnection: Keep-Alive\r\ncontent-length: 0\r\n\r\n")
                .unwrap()
                .unwrap();
        assert!(!h.close);
    }

    #[test]
    fn incomplete_heads_ask_for_more() {
        let full = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n";
        for n in 0..full.len() {
            assert_eq!(parse(&full[..n]), Ok(None), "{n}");
        }
        assert!(parse(full).unwrap().is_some());
    }

    #[test]
    fn chunked_and_unframed_bodies_are_refused() {
        refused(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            "transfer-encoding `chunked` is not supported",
        );
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "not supported",
        );
        refused(
            b"HTTP/1.1 404 Not Found\r\ntransfer-encoding: chunked\r\n\r\n",
            "transfer-encoding",
        );
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-type: x\r\n\r\n",
            "without content-length",
        );
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "conflicting content-length",
        );
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nContent-Length: 3\r\n\r\n",
            "duplicate content-length 3",
        );
        for bad in ["-1", "", "1 2", "0x10", "3,3", "+3", "18446744073709551616"] {
            refused(
                format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n").as_bytes(),
                "is not a byte count",
            );
        }
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n")
                .unwrap()
                .unwrap()
                .0
                .content_length,
            Some(u64::MAX)
        );
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-shardport-len: x\r\n\r\n",
            "x-shardport-len `x`",
        );
    }

    #[test]
    fn malformed_heads_are_refused_with_what_was_wrong() {
        refused(b"garbage", "does not start with `HTTP/`");
        refused(b"\x00\x01", "`\\x00\\x01`");
        refused(b"HTTP/2 200\r\n\r\n", "not HTTP/1.1");
        refused(b"HTTP/1.1 20 OK\r\n\r\n", "malformed status line");
        refused(b"HTTP/1.1 2000 OK\r\n\r\n", "malformed status line");
        refused(b"HTTP/1.1 abc OK\r\n\r\n", "malformed status line");
        refused(b"HTTP/1.1 700 Odd\r\n\r\n", "not an HTTP status code");
        refused(b"HTTP/1.1 100 Continue\r\n\r\n", "informational 100");
        refused(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "has no `:`");
        refused(
            b"HTTP/1.1 200 OK\r\nbad name: x\r\n\r\n",
            "malformed header name",
        );
        refused(b"HTTP/1.1 200 OK\r\n: x\r\n\r\n", "malformed header name");
        refused(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n folded\r\n\r\n",
            "line folding",
        );
        refused(b"HTTP/1.1 200 OK\nx: y\r\n\r\n", "without CR LF");
        refused(b"HTTP/1.1 200 OK\r\nx: a\x00b\r\n\r\n", "control bytes");
        refused(b"HTTP/1.1 200 OK\r\nx: a\rb\r\n\r\n", "control bytes");
        let mut many = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n".to_vec();
        for i in 0..MAX_HEADERS {
            many.extend_from_slice(format!("x-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        refused(&many, "more than 64 header fields");
        // An endless head is refused once it passes the bound, not waited on.
        let mut long = b"HTTP/1.1 200 OK\r\nx-filler: ".to_vec();
        long.resize(MAX_RESPONSE_HEAD - 1, b'a');
        assert_eq!(parse(&long), Ok(None));
        long.push(b'a');
        refused(&long, "exceeds 16 KiB");
    }

    #[test]
    fn requests_are_well_formed() {
        let mut out = b"stale".to_vec();
        write_request(&mut out, "GET", "/v1/shards/00", "h:1", None, b"");
        let text = String::from_utf8(out.clone()).unwrap();
        assert_eq!(
            text,
            format!("GET /v1/shards/00 HTTP/1.1\r\nhost: h:1\r\nuser-agent: {USER_AGENT}\r\n\r\n")
        );
        write_request(
            &mut out,
            "POST",
            "/v1/batch",
            "h:1",
            Some("Bearer t"),
            b"\x01\x02",
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("POST /v1/batch HTTP/1.1\r\nhost: h:1\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nauthorization: Bearer t\r\n"), "{text}");
        assert!(
            text.ends_with("\r\ncontent-length: 2\r\n\r\n\x01\x02"),
            "{text}"
        );
    }

    proptest::proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
        ) {
            if let Ok(Some((h, n))) = parse_response_head(&bytes) {
                proptest::prop_assert!(n <= bytes.len() && n <= MAX_RESPONSE_HEAD);
                proptest::prop_assert!((200..=599).contains(&h.status));
                proptest::prop_assert!(h.status != 200 || h.content_length.is_some());
            }
        }

        #[test]
        fn near_valid_heads_never_panic(
            lines in proptest::collection::vec("[ -~\t\r\n:]{0,40}", 0..8),
            status in 0u16..1000,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
        ) {
            let mut bytes = format!("HTTP/1.1 {status} X\r\n").into_bytes();
            for l in &lines {
                bytes.extend_from_slice(l.as_bytes());
                bytes.extend_from_slice(b"\r\n");
            }
            bytes.extend_from_slice(b"\r\n");
            bytes.extend_from_slice(&body);
            let r = parse_response_head(&bytes);
            if let Ok(Some((h, n))) = r {
                proptest::prop_assert_eq!(h.status, status);
                proptest::prop_assert!(n <= bytes.len());
            }
            // Every prefix is incomplete, refused, or the same answer.
            for cut in [1, bytes.len() / 2, bytes.len().saturating_sub(1)] {
                let _ = parse_response_head(&bytes[..cut.min(bytes.len())]);
            }
        }

        #[test]
        fn body_bytes_after_the_head_are_left_alone(
            len in 0u64..100_000,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\n\r\n");
            let mut bytes = head.clone().into_bytes();
            bytes.extend_from_slice(&body);
            let (h, n) = parse_response_head(&bytes).unwrap().unwrap();
            proptest::prop_assert_eq!(h.content_length, Some(len));
            proptest::prop_assert_eq!(n, head.len());
            proptest::prop_assert_eq!(&bytes[n..], &body[..]);
        }
    }
}
