//! Entry points for the fuzz targets in `fuzz/` (hidden from the docs; not
//! part of the plugin's interface). Each wraps a crate-private parser so a
//! target can drive it with arbitrary bytes without loading the plugin or
//! opening a socket.

use shardport_abi::PluginResult;

use crate::{descriptor::Descriptor, head, server, wire};

/// Decodes a descriptor from another process and re-encodes what it
/// accepted.
pub fn descriptor_roundtrip(bytes: &[u8]) -> PluginResult<Vec<u8>> {
    Descriptor::decode(bytes).map(|d| d.encode())
}

/// Overwrites the last 4 bytes with the CRC-32C of the others, so fuzzed
/// descriptors get past the checksum to the address checks.
pub fn seal_descriptor(bytes: &mut [u8]) {
    if let Some(body_len) = bytes.len().checked_sub(4) {
        let crc = crc32c::crc32c(&bytes[..body_len]);
        bytes[body_len..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// What the consumer read from a response head: status, `content-length`,
/// `x-shardport-len`, whether the owner closes, and the head's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Declared body length.
    pub content_length: Option<u64>,
    /// Declared shard length.
    pub shard_len: Option<u64>,
    /// The owner closes the connection after this response.
    pub close: bool,
    /// Bytes of the head, blank line included.
    pub head_len: usize,
}

/// Longest response head the consumer reads.
pub const MAX_RESPONSE_HEAD: usize = head::MAX_RESPONSE_HEAD;

/// The consumer's response-head parser: `Ok(None)` means "read more".
pub fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead>, String> {
    Ok(
        head::parse_response_head(buf)?.map(|(h, head_len)| ResponseHead {
            status: h.status,
            content_length: h.content_length,
            shard_len: h.shard_len,
            close: h.close,
            head_len,
        }),
    )
}

/// The consumer's parser of a batch response's table of `count` entries,
/// as `(status, len)` pairs.
pub fn decode_batch_head(head: &[u8], count: usize) -> Result<Vec<(u16, u64)>, String> {
    wire::decode_batch_head(head, count).map(|v| v.into_iter().map(|e| (e.status, e.len)).collect())
}

/// Bytes of a batch response's table for `count` entries.
pub fn batch_head_len(count: usize) -> usize {
    wire::batch_head_len(count)
}

/// The consumer's reader of JSON error bodies.
pub fn parse_error_body(body: &[u8]) -> Option<(String, String)> {
    wire::parse_error_body(body)
}

/// The owner's writer of JSON error bodies.
pub fn error_body(code: &str, message: &str) -> String {
    wire::error_body(code, message)
}

/// The owner's decoder of batch request bodies, as raw ids.
pub fn decode_batch_request(body: &[u8], max: usize) -> Result<Vec<u128>, String> {
    wire::decode_batch_request(body, max)
        .map(|ids| ids.into_iter().map(|id| id.as_u128()).collect())
        .map_err(|e| format!("{e:?}"))
}

/// Token the in-memory server of [`serve`] requires.
pub const SERVE_TOKEN: &str = server::in_memory::TOKEN;

/// Feeds `input` to the owner's HTTP server (hyper with the server's
/// settings and request handler, no shard exported, `auth-token` =
/// [`SERVE_TOKEN`]) over an in-memory connection that ends after `input`,
/// and returns every byte the server wrote, and whether the connection
/// ended (false: the server still waited after 10 s, a hang).
pub fn serve(input: &[u8]) -> (Vec<u8>, bool) {
    server::in_memory::serve(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statuses of the responses the in-memory server writes for `input`.
    fn statuses(input: &[u8]) -> Vec<u16> {
        let (out, ended) = serve(input);
        assert!(ended, "the server hung");
        let mut rest = &out[..];
        let mut got = Vec::new();
        while let Ok(Some(h)) = parse_response_head(rest) {
            rest = &rest[h.head_len + h.content_length.unwrap_or(0) as usize..];
            got.push(h.status);
        }
        assert!(rest.is_empty(), "unreadable output {rest:?}");
        got
    }

    /// Found by the `http_server_request` fuzz target: a request with two
    /// equal `content-length` fields followed by a second request.
    const EQUAL_DUPLICATE_LENGTHS: &[u8] = b"GET /v1/health HTTP/1.1\r\nhost: o\r\n\
        authorization: Bearer fuzz-token\r\ncontent-length: 0\r\ncontent-length: 0\r\n\r\n\
        GET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\n";

    /// Accepted on purpose: hyper merges equal duplicate lengths into one
    /// field before `check_framing` runs (RFC 9112 section 6.3 allows a
    /// recipient to), so both requests are served. The framing is
    /// unambiguous (both fields say 0): no request hides in a body.
    #[test]
    fn equal_duplicate_lengths_are_merged_by_hyper() {
        assert_eq!(statuses(EQUAL_DUPLICATE_LENGTHS), [200, 200]);
    }

    #[test]
    fn differing_lengths_and_transfer_encoding_end_the_connection() {
        let smuggled =
            "GET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\n";
        for framing in [
            "content-length: 0\r\ncontent-length: 5",
            "transfer-encoding: chunked\r\ncontent-length: 5",
            "transfer-encoding: chunked",
        ] {
            let input = format!(
                "POST /v1/batch HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\
                 {framing}\r\n\r\n0\r\n\r\n{smuggled}"
            );
            assert_eq!(statuses(input.as_bytes()), [400], "{framing}");
        }
    }
}
