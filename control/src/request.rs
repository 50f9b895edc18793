//! A request head: the request line, the fields within [`HEAD_RULES`],
//! the bearer token checked as soon as its line arrives, and the body's
//! declared length and deadline.

use std::{
    io::BufReader,
    time::{Duration, Instant},
};

use shardport_http_base::head::{self, HeadError};

use crate::{conn::Conn, constant_time_eq, BODY_GRACE, HEAD_RULES, MIN_BODY_RATE};

/// A request refused: HTTP status, error code, message.
pub(crate) type Refusal = (u16, &'static str, String);
/// A request head, read and checked.
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) headers: Vec<(String, String)>,
    /// The declared body length (strictly framed; see [`head::body_length`]).
    pub(crate) body_len: Option<u64>,
}

impl Request {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
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

pub(crate) fn head_refusal(e: HeadError) -> Refusal {
    match e {
        HeadError::TooLarge(_) => (431, "headers_too_large", e.to_string()),
        HeadError::Malformed(m) => bad(m),
        HeadError::Io(m) => (408, "request_timeout", m),
    }
}

/// Reads the request head, bounded in size and time, checking the token as
/// soon as the `Authorization` line arrives.
pub(crate) fn read_request(
    reader: &mut BufReader<Conn>,
    token: Option<&str>,
) -> Result<Request, Refusal> {
    let mut line_no = 0usize;
    let mut start = None;
    let mut headers = Vec::new();
    let mut refused = None;
    let read = head::read_lines(reader, &HEAD_RULES, |line| {
        line_no += 1;
        if line_no == 1 {
            start = Some(parse_request_line(line).map_err(|r| {
                let m = r.2.clone();
                refused = Some(r);
                HeadError::Malformed(m)
            })?);
            return Ok(());
        }
        let field = head::parse_field(line, &HEAD_RULES)?;
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
    let body_len = head::body_length(&headers, &HEAD_RULES).map_err(head_refusal)?;
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

pub(crate) fn content_length(req: &Request, max: u64) -> Result<u64, Refusal> {
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
pub(crate) fn body_deadline(len: u64) -> Instant {
    Instant::now() + BODY_GRACE + Duration::from_secs(len / MIN_BODY_RATE)
}
