//! The wire protocol's binary framings and JSON error bodies, shared by the
//! owner's server and the consumer's client. Pure functions, no I/O.
//!
//! Integers on the wire are big-endian (network order); a shard id is its
//! 128-bit value big-endian, the same digits as its 32-hex form in paths.
//!
//! ```text
//! POST /v1/batch request body          200 response body
//!   0  1  version (1)                    0  1  version (1)
//!   1  4  count n                        1  4  count n (as requested)
//!   5 16n ids                            5 10n per item: status u16, len u64
//!                                     5+10n    the bytes of every item with
//!                                              status 200, in request order
//! ```

use std::fmt::Write as _;

use shardport_abi::ShardId;

/// Version byte of both batch framings.
pub(crate) const BATCH_VERSION: u8 = 1;
/// Bytes of a batch request or response before its per-item part.
pub(crate) const BATCH_PREFIX_LEN: usize = 5;
/// Bytes per id in a batch request.
pub(crate) const BATCH_ID_LEN: usize = 16;
/// Bytes per entry of a batch response's header table.
pub(crate) const BATCH_ENTRY_LEN: usize = 10;
/// Item status: found; its bytes follow in the data section.
pub(crate) const ITEM_OK: u16 = 200;
/// Item status: not exported by this owner; no bytes.
pub(crate) const ITEM_NOT_FOUND: u16 = 404;

/// Path prefix of single-shard fetches.
pub(crate) const SHARD_PATH: &str = "/v1/shards/";
/// Path of batch fetches.
pub(crate) const BATCH_PATH: &str = "/v1/batch";
/// Path of the health endpoint.
pub(crate) const HEALTH_PATH: &str = "/v1/health";
/// Response header carrying the shard's byte length (besides `content-length`).
pub(crate) const LEN_HEADER: &str = "x-shardport-len";

/// Length of a batch request body for `n` ids.
pub(crate) const fn batch_request_len(n: usize) -> usize {
    BATCH_PREFIX_LEN + BATCH_ID_LEN * n
}

/// Length of a batch response's header table for `n` items.
pub(crate) const fn batch_head_len(n: usize) -> usize {
    BATCH_PREFIX_LEN + BATCH_ENTRY_LEN * n
}

/// The path fetching shard `id`.
pub(crate) fn shard_path(id: ShardId) -> String {
    format!("{SHARD_PATH}{id}")
}

/// Parses the 32-hex-digit id of a shard path (either case).
pub(crate) fn parse_shard_id(hex: &str) -> Option<ShardId> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(ShardId::from_u128)
}

/// Encodes a batch request for `ids`.
pub(crate) fn encode_batch_request(ids: &[ShardId]) -> Vec<u8> {
    let mut v = Vec::with_capacity(batch_request_len(ids.len()));
    v.push(BATCH_VERSION);
    v.extend_from_slice(&(ids.len() as u32).to_be_bytes());
    for id in ids {
        v.extend_from_slice(&id.as_u128().to_be_bytes());
    }
    v
}

/// Why a batch request body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BatchRequestError {
    /// Not a batch request (400).
    Malformed(String),
    /// More ids than the owner's `max-batch` (413).
    TooMany { count: u64, max: usize },
}

/// Decodes a batch request body, refusing more than `max` ids.
pub(crate) fn decode_batch_request(
    body: &[u8],
    max: usize,
) -> Result<Vec<ShardId>, BatchRequestError> {
    use BatchRequestError::Malformed;
    if body.len() < BATCH_PREFIX_LEN {
        return Err(Malformed(format!(
            "batch request of {} bytes is shorter than its {BATCH_PREFIX_LEN}-byte prefix",
            body.len()
        )));
    }
    if body[0] != BATCH_VERSION {
        return Err(Malformed(format!(
            "batch request version {} (this owner reads {BATCH_VERSION})",
            body[0]
        )));
    }
    let count = u32::from_be_bytes(body[1..5].try_into().expect("4 bytes"));
    if count as u64 > max as u64 {
        return Err(BatchRequestError::TooMany {
            count: count.into(),
            max,
        });
    }
    let count = count as usize;
    let want = batch_request_len(count);
    if body.len() != want {
        return Err(Malformed(format!(
            "batch request of {count} ids must be {want} bytes, found {}",
            body.len()
        )));
    }
    Ok(body[BATCH_PREFIX_LEN..]
        .chunks_exact(BATCH_ID_LEN)
        .map(|c| ShardId::from_u128(u128::from_be_bytes(c.try_into().expect("16 bytes"))))
        .collect())
}

/// One entry of a batch response's header table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchEntry {
    /// [`ITEM_OK`] or [`ITEM_NOT_FOUND`] (other codes are reserved).
    pub status: u16,
    /// Byte length of the item's data (0 unless found).
    pub len: u64,
}

/// Encodes a batch response's header table.
pub(crate) fn encode_batch_head(entries: &[BatchEntry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(batch_head_len(entries.len()));
    v.push(BATCH_VERSION);
    v.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        v.extend_from_slice(&e.status.to_be_bytes());
        v.extend_from_slice(&e.len.to_be_bytes());
    }
    v
}

/// Decodes a batch response's header table of exactly `count` entries
/// (`head.len() == batch_head_len(count)`), checking that the data section
/// the entries announce adds up without overflow.
pub(crate) fn decode_batch_head(head: &[u8], count: usize) -> Result<Vec<BatchEntry>, String> {
    if head.len() != batch_head_len(count) {
        return Err(format!(
            "a batch response head for {count} items is {} bytes, found {}",
            batch_head_len(count),
            head.len()
        ));
    }
    if head[0] != BATCH_VERSION {
        return Err(format!(
            "batch response version {} (this consumer reads {BATCH_VERSION})",
            head[0]
        ));
    }
    let n = u32::from_be_bytes(head[1..5].try_into().expect("4 bytes"));
    if n as u64 != count as u64 {
        return Err(format!(
            "batch response has {n} items, {count} were requested"
        ));
    }
    let mut total: u64 = 0;
    let mut out = Vec::with_capacity(count);
    for c in head[BATCH_PREFIX_LEN..].chunks_exact(BATCH_ENTRY_LEN) {
        let status = u16::from_be_bytes([c[0], c[1]]);
        let len = u64::from_be_bytes(c[2..10].try_into().expect("8 bytes"));
        if status != ITEM_OK && len != 0 {
            return Err(format!(
                "item {} has status {status} and {len} bytes of data",
                out.len()
            ));
        }
        total = total
            .checked_add(len)
            .ok_or_else(|| "batch response lengths overflow".to_owned())?;
        out.push(BatchEntry { status, len });
    }
    Ok(out)
}

/// A JSON error body: `{"code": "...", "message": "..."}`.
pub(crate) fn error_body(code: &str, message: &str) -> String {
    let mut s = String::with_capacity(32 + code.len() + message.len());
    s.push_str("{\"code\":");
    push_json_string(&mut s, code);
    s.push_str(",\"message\":");
    push_json_string(&mut s, message);
    s.push('}');
    s
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Reads `code` and `message` from a JSON error body written by
/// [`error_body`] (or any flat JSON object with those string members).
/// `None` when the body is not such an object.
pub(crate) fn parse_error_body(body: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(body).ok()?;
    let mut p = JsonCursor {
        s: text.as_bytes(),
        i: 0,
    };
    p.ws();
    p.eat(b'{')?;
    let (mut code, mut message) = (None, None);
    loop {
        p.ws();
        if p.eat(b'}').is_some() {
            break;
        }
        let key = p.string()?;
        p.ws();
        p.eat(b':')?;
        p.ws();
        let value = p.string()?;
        match key.as_str() {
            "code" => code = Some(value),
            "message" => message = Some(value),
            _ => {}
        }
        p.ws();
        if p.eat(b',').is_none() {
            p.ws();
            p.eat(b'}')?;
            break;
        }
    }
    Some((code?, message?))
}

/// Just enough JSON to read a flat object of string members.
struct JsonCursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl JsonCursor<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.s.get(self.i) == Some(&b)).then(|| self.i += 1)
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.i..self.i + 4)?;
        self.i += 4;
        u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i)?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let e = *self.s.get(self.i)?;
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => char::from_u32(self.hex4()?).unwrap_or('\u{fffd}'),
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b if b < 0x20 => return None,
                b => out.push(b),
            }
        }
    }
}

pub(crate) use shardport_kit::check::constant_time_eq;

/// Checks an `authorization` header value against `token`: scheme `Bearer`
/// (any case), one space, then the token compared in constant time.
pub(crate) fn bearer_matches(header: Option<&[u8]>, token: &str) -> bool {
    let Some(value) = header else {
        return false;
    };
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return false;
    }
    constant_time_eq(&value[SCHEME.len()..], token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_ids_in_paths() {
        let id = ShardId::from_u128(0x00ff_0000_0000_0000_0000_0000_0000_abcd);
        let p = shard_path(id);
        assert_eq!(p, "/v1/shards/00ff000000000000000000000000abcd");
        assert_eq!(parse_shard_id(&p[SHARD_PATH.len()..]), Some(id));
        assert_eq!(parse_shard_id("00FF000000000000000000000000ABCD"), Some(id));
        for bad in [
            "",
            "abcd",
            "+0ff000000000000000000000000abcd",
            "00ff000000000000000000000000abcdx",
            "00ff000000000000000000000000abcg",
            "00ff00000000000000000000000ab\u{e9}",
        ] {
            assert_eq!(parse_shard_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn batch_request_roundtrip_and_limits() {
        let ids: Vec<ShardId> = (0..5u128)
            .map(|i| ShardId::from_u128(i << 100 | i))
            .collect();
        let body = encode_batch_request(&ids);
        assert_eq!(body.len(), batch_request_len(5));
        assert_eq!(&body[..5], &[1, 0, 0, 0, 5]);
        assert_eq!(decode_batch_request(&body, 5).unwrap(), ids);
        assert_eq!(
            decode_batch_request(&body, 4),
            Err(BatchRequestError::TooMany { count: 5, max: 4 })
        );
        assert_eq!(
            decode_batch_request(&encode_batch_request(&[]), 4),
            Ok(vec![])
        );
        for n in 0..body.len() {
            assert!(matches!(
                decode_batch_request(&body[..n], 5),
                Err(BatchRequestError::Malformed(_))
            ));
        }
        let mut long = body.clone();
        long.push(0);
        assert!(matches!(
            decode_batch_request(&long, 5),
            Err(BatchRequestError::Malformed(_))
        ));
        let mut v2 = body;
        v2[0] = 2;
        assert!(matches!(
            decode_batch_request(&v2, 5),
            Err(BatchRequestError::Malformed(m)) if m.contains("version 2")
        ));
        // A huge count is refused by the limit before the length is computed.
        assert_eq!(
            decode_batch_request(&[1, 0xff, 0xff, 0xff, 0xff], 1024),
            Err(BatchRequestError::TooMany {
                count: u32::MAX.into(),
                max: 1024
            })
        );
    }

    #[test]
    fn batch_head_roundtrip_and_checks() {
        let entries = [
            BatchEntry {
                status: ITEM_OK,
                len: 3,
            },
            BatchEntry {
                status: ITEM_NOT_FOUND,
                len: 0,
            },
            BatchEntry {
                status: ITEM_OK,
                len: 0,
            },
        ];
        let head = encode_batch_head(&entries);
        assert_eq!(head.len(), batch_head_len(3));
        assert_eq!(decode_batch_head(&head, 3).unwrap(), entries);
        assert!(decode_batch_head(&head, 2)
            .unwrap_err()
            .contains("for 2 items"));
        let mut v2 = head.clone();
        v2[0] = 2;
        assert!(decode_batch_head(&v2, 3).unwrap_err().contains("version 2"));
        let mut wrong_count = head.clone();
        wrong_count[1..5].copy_from_slice(&7u32.to_be_bytes());
        assert!(decode_batch_head(&wrong_count, 3)
            .unwrap_err()
            .contains("7 items"));
        let lying = encode_batch_head(&[BatchEntry {
            status: ITEM_NOT_FOUND,
            len: 9,
        }]);
        assert!(decode_batch_head(&lying, 1)
            .unwrap_err()
            .contains("status 404"));
        let overflow = encode_batch_head(&[
            BatchEntry {
                status: ITEM_OK,
                len: u64::MAX,
            },
            BatchEntry {
                status: ITEM_OK,
                len: 1,
            },
        ]);
        assert!(decode_batch_head(&overflow, 2)
            .unwrap_err()
            .contains("overflow"));
    }

    #[test]
    fn error_bodies_roundtrip() {
        let msg = "shard \"x\"\\ not\nfound \u{1} \u{e9}";
        let body = error_body("not_found", msg);
        assert!(body.starts_with("{\"code\":\"not_found\",\"message\":\"shard \\\"x\\\"\\\\"));
        assert_eq!(
            parse_error_body(body.as_bytes()),
            Some(("not_found".into(), msg.into()))
        );
        assert_eq!(
            parse_error_body(
                b" { \"message\" : \"m\\u0041\\/\", \"extra\": \"x\", \"code\":\"c\" } "
            ),
            Some(("c".into(), "mA/".into()))
        );
        for bad in [
            &b""[..],
            b"{",
            b"{\"code\":1}",
            b"[]",
            b"{\"code\":\"x\"}",
            b"\xff",
        ] {
            assert_eq!(parse_error_body(bad), None);
        }
    }

    #[test]
    fn bearer_tokens() {
        assert!(bearer_matches(Some(b"Bearer abc"), "abc"));
        assert!(bearer_matches(Some(b"bearer abc"), "abc"));
        for bad in [
            &b"Bearer abd"[..],
            b"Bearer ab",
            b"Bearer abcd",
            b"Bearer  abc",
            b"Basic abc",
            b"abc",
            b"",
        ] {
            assert!(!bearer_matches(Some(bad), "abc"), "{bad:?}");
        }
        assert!(!bearer_matches(None, "abc"));
        assert!(constant_time_eq(b"", b""));
        assert!(!constant_time_eq(b"\xff", b""));
        assert!(!constant_time_eq(b"", b"\x00"));
    }

    proptest::proptest! {
        #[test]
        fn batch_request_decode_never_panics(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
            max in 0usize..20,
        ) {
            if let Ok(ids) = decode_batch_request(&bytes, max) {
                proptest::prop_assert!(ids.len() <= max);
                proptest::prop_assert_eq!(encode_batch_request(&ids), bytes);
            }
        }

        #[test]
        fn batch_head_decode_never_panics(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..120),
            count in 0usize..12,
        ) {
            if let Ok(entries) = decode_batch_head(&bytes, count) {
                proptest::prop_assert_eq!(encode_batch_head(&entries), bytes);
            }
        }

        #[test]
        fn error_body_parse_never_panics(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..120),
        ) {
            let _ = parse_error_body(&bytes);
        }

        #[test]
        fn error_body_roundtrips_any_text(code in ".{0,20}", message in ".{0,80}") {
            let body = error_body(&code, &message);
            proptest::prop_assert_eq!(parse_error_body(body.as_bytes()), Some((code, message)));
        }
    }
}
