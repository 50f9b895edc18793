//! HTTP/1.1 message heads, parsed strictly and within bounds: one parser
//! for every head shardport reads from a peer (the control endpoint's
//! requests, its client's responses, and the http transport's responses).
//!
//! # What is refused
//! Every framing a proxy and this parser could read differently (request
//! smuggling, response splitting): a bare CR, obs-fold (a header line that
//! starts with a space or tab), whitespace between a field name and its
//! colon, a field name that is not a token, more than one `Content-Length`
//! (equal or not, or a list), a `Content-Length` that is not a plain
//! decimal number, and any `Transfer-Encoding` (shardport frames every body
//! with `Content-Length`, so chunk sizes are never parsed). A head is
//! bounded in bytes ([`Rules::max_bytes`]) and in fields
//! ([`Rules::max_fields`]); a socket that trickles its bytes is bounded in
//! time by [`DeadlineStream`](crate::DeadlineStream).
//!
//! # Where readers differ on purpose ([`Rules`])
//! - Line ends ([`LineEnds`]): the control endpoint accepts a lone LF as a
//!   line end (RFC 9112 2.2), so it refuses a CR anywhere else in a line
//!   as a bare CR; the transport's consumer wants CRLF, and a CR inside a
//!   line is a control byte its field and status-line checks refuse.
//! - Field values ([`Values`]): anything but NUL, or visible bytes only.
//! - `Content-Length` digits ([`Rules::max_length_digits`]).
//!
//! A head with several framing faults is refused for one of them:
//! [`framing`] judges a whole head (a `Transfer-Encoding`, then a repeated
//! `Content-Length`, then its value); [`Framing`] refuses at the first
//! faulty field, for a reader that checks as it reads. Either way the
//! head is refused.
//!
//! # Two entry points, one set of checks
//! [`read_lines`] reads a head line by line from a stream (a caller can
//! refuse at the first bad line, e.g. a wrong token); [`head_len`] and
//! [`lines`] cut a head out of a buffer that may still be incomplete. Both
//! hand their lines to the same [`field`] and [`framing`] checks. The
//! string-typed [`parse_field`] and [`body_length`] wrap them with the
//! messages of [`HeadError`]; byte-level callers word their own from
//! [`FieldError`] and [`FramingError`].

use std::io::{BufRead, Read};

pub use crate::syntax::{is_field_byte, is_token_byte, parse_decimal, quote};

/// Where a line of a head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineEnds {
    /// CRLF or a lone LF; a CR anywhere else in a line is refused as a
    /// bare CR.
    CrLfOrLf,
    /// CRLF only; a CR inside a line is left to the field and start-line
    /// checks, which refuse it as a control byte (use [`Values::Visible`]).
    CrLf,
}

/// What a field value may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// Anything but NUL (CR and LF never reach a value).
    NotNul,
    /// Tab, space, visible ASCII and obs-text (RFC 9110 `field-vchar`).
    Visible,
}

/// The bounds and the dialect of one reader of heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Most bytes of a head, start line to blank line included.
    pub max_bytes: usize,
    /// Most header fields (`usize::MAX`: bounded by `max_bytes` alone).
    pub max_fields: usize,
    /// Where a line ends.
    pub line_ends: LineEnds,
    /// What a field value may hold.
    pub values: Values,
    /// Most digits of a `Content-Length` (its value must also fit a `u64`).
    pub max_length_digits: usize,
}

/// What was wrong with a message head, worded for an operator; a server
/// answers 400 with it (431 for [`HeadError::TooLarge`]).
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

/// Why a line could not be cut out of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineError {
    /// A CR not followed by LF ([`LineEnds::CrLfOrLf`]).
    BareCr,
    /// A line ends in a lone LF ([`LineEnds::CrLf`]).
    NoCrLf,
}

/// `raw` (one line with its LF) without its line end.
fn cut(raw: &[u8], ends: LineEnds) -> Result<&[u8], LineError> {
    let line = raw.strip_suffix(b"\n").unwrap_or(raw);
    match ends {
        LineEnds::CrLfOrLf => {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.contains(&b'\r') {
                return Err(LineError::BareCr);
            }
            Ok(line)
        }
        LineEnds::CrLf => line.strip_suffix(b"\r").ok_or(LineError::NoCrLf),
    }
}

fn line_refusal(e: LineError) -> HeadError {
    match e {
        LineError::BareCr => malformed("bare CR in the head"),
        LineError::NoCrLf => malformed("a line of the head ends without CR LF"),
    }
}

/// Reads a head line by line, at most `rules.max_bytes` bytes in all, and
/// hands each line (without its line end; the empty line that ends the
/// head is not passed) to `on_line` as soon as it arrives, so a caller can
/// refuse early.
pub fn read_lines<R: BufRead>(
    reader: &mut R,
    rules: &Rules,
    mut on_line: impl FnMut(&str) -> Result<(), HeadError>,
) -> Result<(), HeadError> {
    let max = rules.max_bytes;
    let mut used = 0usize;
    let mut raw = Vec::new();
    loop {
        raw.clear();
        let n = reader
            .by_ref()
            .take((max + 1 - used.min(max)) as u64)
            .read_until(b'\n', &mut raw)
            .map_err(|e| HeadError::Io(format!("reading the head: {e}")))?;
        used += n;
        if used > max {
            return Err(HeadError::TooLarge(max));
        }
        if n == 0 || raw.last() != Some(&b'\n') {
            return Err(HeadError::Io(
                "connection closed before the end of the head".into(),
            ));
        }
        let line = cut(&raw, rules.line_ends).map_err(line_refusal)?;
        if line.is_empty() {
            return Ok(());
        }
        let text = std::str::from_utf8(line).map_err(|_| malformed("the head is not UTF-8"))?;
        on_line(text)?;
    }
}

/// The length of the head at the start of `buf`, blank line included:
/// `Ok(None)` while no head ends within `rules.max_bytes` and `buf` is
/// shorter than that (read more), [`HeadError::TooLarge`] once it is not.
pub fn head_len(buf: &[u8], rules: &Rules) -> Result<Option<usize>, HeadError> {
    let window = &buf[..buf.len().min(rules.max_bytes)];
    let end = match rules.line_ends {
        LineEnds::CrLf => window
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|i| i + 4),
        LineEnds::CrLfOrLf => window.iter().enumerate().find_map(|(i, &b)| {
            if b != b'\n' {
                return None;
            }
            match &window[i + 1..] {
                [b'\n', ..] => Some(i + 2),
                [b'\r', b'\n', ..] => Some(i + 3),
                _ => None,
            }
        }),
    };
    match end {
        Some(n) => Ok(Some(n)),
        None if buf.len() >= rules.max_bytes => Err(HeadError::TooLarge(rules.max_bytes)),
        None => Ok(None),
    }
}

/// The lines of a complete head (from [`head_len`]) without their line
/// ends, start line first, up to the blank line.
pub fn lines(head: &[u8], ends: LineEnds) -> impl Iterator<Item = Result<&[u8], LineError>> {
    head.split_inclusive(|&b| b == b'\n')
        .map(move |raw| cut(raw, ends))
        .take_while(|l| l.is_ok_and(|l| !l.is_empty()) || l.is_err())
}

/// Why a header line is not a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldError<'a> {
    /// Obsolete line folding: the line starts with a space or tab.
    ObsFold,
    /// No colon.
    NoColon,
    /// The name (before the colon) is empty or not a token: whitespace
    /// before the colon lands here.
    BadName(&'a [u8]),
    /// The value holds a byte [`Values`] refuses.
    BadValue(&'a [u8]),
}

/// A header line as `(name, value)`, the value without surrounding spaces
/// and tabs; refuses obs-fold, whitespace before the colon, names that are
/// not tokens and values with bytes `values` refuses.
pub fn field(line: &[u8], values: Values) -> Result<(&[u8], &[u8]), FieldError<'_>> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(FieldError::ObsFold);
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(FieldError::NoColon)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    if name.is_empty() || !name.iter().all(|&b| is_token_byte(b)) {
        return Err(FieldError::BadName(name));
    }
    let ok = match values {
        Values::NotNul => !value.contains(&0),
        Values::Visible => value.iter().all(|&b| is_field_byte(b)),
    };
    if !ok {
        return Err(FieldError::BadValue(name));
    }
    Ok((name, trim_ows(value)))
}

/// `v` without leading and trailing spaces and tabs (RFC 9110 `OWS`).
fn trim_ows(v: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = v.iter().position(|b| !ows(b)).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &v[start..end]
}

/// [`field`] over a line of [`read_lines`], with [`HeadError`]'s messages.
pub fn parse_field(line: &str, rules: &Rules) -> Result<Field, HeadError> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match field(line.as_bytes(), rules.values) {
        Ok((name, value)) => Ok((text(name), text(value))),
        Err(FieldError::ObsFold) => Err(malformed(format!(
            "obsolete line folding (a header line starting with whitespace): `{line}`"
        ))),
        Err(FieldError::NoColon) => Err(malformed(format!("malformed header `{line}`"))),
        Err(FieldError::BadName(name)) => Err(malformed(format!(
            "header name `{}` is not a token (no whitespace before the colon)",
            text(name)
        ))),
        Err(FieldError::BadValue(name)) => Err(malformed(match rules.values {
            Values::NotNul => format!("NUL in the value of header `{}`", text(name)),
            Values::Visible => format!("control bytes in the value of header `{}`", text(name)),
        })),
    }
}

/// Why the fields of a head do not frame a body unambiguously.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramingError {
    /// A `Transfer-Encoding` field (its first value), with or without
    /// `Content-Length` fields beside it.
    TransferEncoding {
        /// The first `Transfer-Encoding` value.
        value: Vec<u8>,
        /// How many `Content-Length` fields are there too (in the whole
        /// head for [`framing`], before it for [`Framing`]); any is
        /// ambiguous framing.
        lengths: usize,
    },
    /// More than one `Content-Length` field, equal or not.
    RepeatedLength {
        /// How many.
        count: usize,
        /// The first two values.
        values: [Vec<u8>; 2],
    },
    /// A `Content-Length` that is not a plain decimal number within the
    /// digit limit and `u64`.
    BadLength(Vec<u8>),
}

/// The body length the fields of a whole head declare: `None` without
/// `Content-Length`. Refuses (in this order) `Transfer-Encoding`, a
/// repeated `Content-Length`, and a value that is not 1 to `max_digits`
/// decimal digits fitting a `u64`.
pub fn framing<'a>(
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    max_digits: usize,
) -> Result<Option<u64>, FramingError> {
    let mut te = None;
    let mut lengths: Vec<&[u8]> = Vec::new();
    let mut count = 0usize;
    for (name, value) in fields {
        if te.is_none() && name.eq_ignore_ascii_case(b"transfer-encoding") {
            te = Some(value);
        } else if name.eq_ignore_ascii_case(b"content-length") {
            count += 1;
            if lengths.len() < 2 {
                lengths.push(value);
            }
        }
    }
    if let Some(value) = te {
        return Err(FramingError::TransferEncoding {
            value: value.to_vec(),
            lengths: count,
        });
    }
    match lengths[..] {
        [] => Ok(None),
        [v] => parse_decimal(v, max_digits)
            .map(Some)
            .ok_or_else(|| FramingError::BadLength(v.to_vec())),
        [a, b, ..] => Err(FramingError::RepeatedLength {
            count,
            values: [a.to_vec(), b.to_vec()],
        }),
    }
}

/// The same framing rule checked field by field, for a reader that refuses
/// at the first field that makes the framing ambiguous (the fault it
/// reports is the first in the head, where [`framing`] ranks them).
#[derive(Debug, Clone)]
pub struct Framing {
    max_digits: usize,
    lengths: usize,
    length: Option<(u64, Vec<u8>)>,
}

impl Framing {
    /// No field yet; `Content-Length` values of at most `max_digits`.
    pub fn new(max_digits: usize) -> Framing {
        Framing {
            max_digits,
            lengths: 0,
            length: None,
        }
    }

    /// The next field: refuses a `Transfer-Encoding`, a `Content-Length`
    /// that is not a plain number, and a second `Content-Length`.
    pub fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), FramingError> {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err(FramingError::TransferEncoding {
                value: value.to_vec(),
                lengths: self.lengths,
            });
        }
        if !name.eq_ignore_ascii_case(b"content-length") {
            return Ok(());
        }
        self.lengths += 1;
        let n = parse_decimal(value, self.max_digits)
            .ok_or_else(|| FramingError::BadLength(value.to_vec()))?;
        if let Some((_, first)) = &self.length {
            return Err(FramingError::RepeatedLength {
                count: self.lengths,
                values: [first.clone(), value.to_vec()],
            });
        }
        self.length = Some((n, value.to_vec()));
        Ok(())
    }

    /// The body length declared so far: `None` without `Content-Length`.
    pub fn length(&self) -> Option<u64> {
        self.length.as_ref().map(|(n, _)| *n)
    }
}

/// [`framing`] over the fields of [`parse_field`], with [`HeadError`]'s
/// messages.
pub fn body_length(fields: &[Field], rules: &Rules) -> Result<Option<u64>, HeadError> {
    let pairs = fields.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes()));
    framing(pairs, rules.max_length_digits).map_err(|e| match e {
        FramingError::TransferEncoding { lengths: 1.., .. } => {
            malformed("both transfer-encoding and content-length: ambiguous framing")
        }
        FramingError::TransferEncoding { .. } => {
            malformed("transfer-encoding is not supported here; send content-length")
        }
        FramingError::RepeatedLength { .. } => malformed("more than one content-length header"),
        FramingError::BadLength(v) => malformed(format!(
            "content-length `{}` is not a decimal number",
            String::from_utf8_lossy(&v)
        )),
    })
}

#[cfg(test)]
mod tests;
