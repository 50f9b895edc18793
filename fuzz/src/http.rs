//! Fuzz targets over the http transport: its descriptor decoder, the
//! owner's request handling (hyper and the handler) and the consumer's
//! response framing (a file of its own: see the crate docs for why each
//! plugin's targets are apart).

use shardport_abi::ErrorKind;
use shardport_http::fuzzing;

/// A fuzz target: its name (binary and corpus directory) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// The targets of this file.
pub const TARGETS: &[Target] = &[
    ("descriptor_http", descriptor_http),
    ("http_server_request", http_server_request),
    ("http_client_response", http_client_response),
];

/// Once as given and once with the checksum recomputed (so the address
/// checks see fuzzed addresses): an accepted descriptor re-encodes to
/// exactly the input; a refusal is `INVALID_DESCRIPTOR`.
pub fn descriptor_http(data: &[u8]) {
    let mut sealed = data.to_vec();
    fuzzing::seal_descriptor(&mut sealed);
    for input in [data, &sealed[..]] {
        match fuzzing::descriptor_roundtrip(input) {
            Ok(bytes) => assert_eq!(bytes, input, "re-encoding differs from the accepted input"),
            Err(e) => assert_eq!(e.kind, ErrorKind::INVALID_DESCRIPTOR, "{}", e.message),
        }
    }
}

/// The owner's server (hyper and the request handler, nothing exported)
/// fed one connection's bytes: it ends without hanging; everything it
/// writes is a sequence of responses the consumer's own parser reads; no
/// 5xx; nothing is served without the bearer token; and a request whose
/// head carries `transfer-encoding` or differing `content-length` fields gets an
/// error and is the last one answered (no request smuggling).
///
/// Two `content-length` fields count as ambiguous only when their values
/// differ: hyper merges equal ones before the server can see them (a known
/// gap, see `finding-duplicate-equal-content-length` in the corpus).
pub fn http_server_request(data: &[u8]) {
    use fuzzing::parse_response_head;
    let (out, ended) = fuzzing::serve(data);
    assert!(ended, "the server still waited after its input ended");
    let mut responses = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        let h = match parse_response_head(rest) {
            Ok(Some(h)) => h,
            other => panic!(
                "the consumer cannot read the server's response {}: {other:?} in {:?}",
                responses.len(),
                String::from_utf8_lossy(&out)
            ),
        };
        assert!(h.status < 500, "server error {} for {data:?}", h.status);
        let body = rest.len() - h.head_len;
        let len = h.content_length.map_or(body, |n| n as usize);
        assert!(len <= body, "response body shorter than its content-length");
        rest = &rest[h.head_len + len..];
        responses.push(h);
    }
    let has_token = data
        .windows(fuzzing::SERVE_TOKEN.len())
        .any(|w| w == fuzzing::SERVE_TOKEN.as_bytes());
    if !has_token {
        assert!(
            responses.iter().all(|h| h.status != 200),
            "served without the token"
        );
    }
    if let Some(head) = first_head(data) {
        if ambiguous_framing(head) {
            let first = responses.first().expect("an ambiguous request is answered");
            assert!(
                first.status >= 400,
                "ambiguous framing answered {}",
                first.status
            );
            assert_eq!(
                responses.len(),
                1,
                "a request after an ambiguous one was answered"
            );
        }
    }
}

/// The first request head of `data` (leading empty lines skipped), when
/// it is complete: up to the first empty line, where lines end in LF or
/// CR LF as hyper reads them.
fn first_head(data: &[u8]) -> Option<&[u8]> {
    let mut d = data;
    while let Some(r) = d.strip_prefix(b"\r\n").or_else(|| d.strip_prefix(b"\n")) {
        d = r;
    }
    let end = (0..d.len()).find(|&i| {
        d[i] == b'\n' && (d[i + 1..].starts_with(b"\n") || d[i + 1..].starts_with(b"\r\n"))
    })?;
    Some(&d[..=end])
}

/// A head whose body extent two readers could disagree on: a
/// `transfer-encoding` field, or `content-length` fields that are not all
/// the same number (by a plain line-by-line reading). Equal duplicates are
/// not ambiguous, and hyper merges them before the server's own check
/// sees the fields (see docs/reliability.md, "Fuzzing").
fn ambiguous_framing(head: &[u8]) -> bool {
    let value = |line: &[u8], name: &[u8]| {
        (line.len() > name.len()
            && line[..name.len()].eq_ignore_ascii_case(name)
            && line[name.len()] == b':')
            .then(|| line[name.len() + 1..].trim_ascii().to_vec())
    };
    let lines: Vec<&[u8]> = head.split(|&b| b == b'\n').skip(1).collect();
    let te = lines
        .iter()
        .any(|l| value(l, b"transfer-encoding").is_some());
    let lengths: Vec<Option<u64>> = lines
        .iter()
        .filter_map(|l| value(l, b"content-length"))
        .map(|v| {
            std::str::from_utf8(&v)
                .ok()?
                .trim_end_matches('\r')
                .parse()
                .ok()
        })
        .collect();
    te || (lengths.len() > 1 && lengths.iter().any(|l| l.is_none() || *l != lengths[0]))
}

/// The consumer's response-head parser, batch table and error bodies:
/// an accepted head ends at the first blank line within the limit, parses
/// the same alone, has a valid status and frames a 200 by
/// `content-length`; "read more" only when no head is complete; a batch
/// table adds up; the error-body reader agrees with serde_json on flat
/// objects of strings and reads back what the owner writes.
pub fn http_client_response(data: &[u8]) {
    use fuzzing::{parse_response_head, MAX_RESPONSE_HEAD};
    let blank = data.windows(4).position(|w| w == b"\r\n\r\n");
    match parse_response_head(data) {
        Ok(Some(h)) => {
            assert!(h.head_len <= data.len().min(MAX_RESPONSE_HEAD));
            assert_eq!(
                blank,
                Some(h.head_len - 4),
                "the head ends at the first blank line"
            );
            assert!((200..=599).contains(&h.status));
            assert!(h.status != 200 || h.content_length.is_some());
            assert_eq!(
                parse_response_head(&data[..h.head_len]),
                Ok(Some(h.clone())),
                "the head parses the same without its body"
            );
            let body = &data[h.head_len..];
            if body.len() >= 5 && (body.len() - 5) % 10 == 0 {
                let count = (body.len() - 5) / 10;
                if let Ok(entries) = fuzzing::decode_batch_head(body, count) {
                    assert_eq!(entries.len(), count);
                    assert_eq!(fuzzing::batch_head_len(count), body.len());
                    let mut total = 0u64;
                    for (status, len) in entries {
                        assert!(status == 200 || len == 0);
                        total = total.checked_add(len).expect("lengths add up");
                    }
                }
            }
            error_body(body);
        }
        Ok(None) => {
            assert!(
                data.len() < MAX_RESPONSE_HEAD,
                "read more past the head limit"
            );
            assert_eq!(blank, None, "read more with a complete head");
        }
        Err(_) => {}
    }
    error_body(data);
}

fn error_body(body: &[u8]) {
    let ours = fuzzing::parse_error_body(body);
    if let Some((code, message)) = &ours {
        let written = fuzzing::error_body(code, message);
        assert_eq!(
            fuzzing::parse_error_body(written.as_bytes()).as_ref(),
            Some(&(code.clone(), message.clone())),
            "an error body the owner writes reads back"
        );
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice(body) {
        let strings: Option<Vec<(&String, &str)>> = map
            .iter()
            .map(|(k, v)| v.as_str().map(|s| (k, s)))
            .collect();
        let (Some(strings), Some(code), Some(message)) = (
            strings,
            map.get("code").and_then(|v| v.as_str()),
            map.get("message").and_then(|v| v.as_str()),
        ) else {
            return;
        };
        if !strings.is_empty() {
            assert_eq!(
                ours,
                Some((code.to_owned(), message.to_owned())),
                "serde_json reads this error body differently"
            );
        }
    }
}
