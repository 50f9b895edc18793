//! Replays the checked-in fuzz corpus of the http targets on stable
//! (see `fuzz_corpus.rs`; this plugin links alone into this binary).
//!
//! The seeds are written by `regenerate_seed_corpus` (ignored; run
//! `cargo test -p shardport --test 'fuzz_corpus*' -- --ignored` after a
//! format changes). Inputs the fuzzer found are kept as `finding-*` files
//! next to the seeds and never regenerated.

#[path = "../fuzz/src/http.rs"]
mod http;
#[path = "../fuzz/src/replay.rs"]
mod replay;

#[test]
fn every_target_replays_its_corpus() {
    for &(name, run) in http::TARGETS {
        replay::replay(name, run);
    }
}

/// The in-memory server answers the seeds as the real one would: health
/// and batch with the token are 200, without it 401, and each smuggling
/// shape gets one 400 and nothing for the request hidden behind it.
#[test]
fn the_server_seeds_get_the_expected_answers() {
    use shardport_http::fuzzing::{parse_response_head, serve};
    let statuses = |input: &[u8]| {
        let (out, ended) = serve(input);
        assert!(ended);
        let mut rest = &out[..];
        let mut got = Vec::new();
        while let Ok(Some(h)) = parse_response_head(rest) {
            let len = h.content_length.expect("a length") as usize;
            rest = &rest[h.head_len + len..];
            got.push(h.status);
        }
        assert!(rest.is_empty(), "unparsed output {rest:?}");
        got
    };
    let seeds: std::collections::BTreeMap<_, _> = server_seeds().into_iter().collect();
    assert_eq!(statuses(&seeds["health"]), [200]);
    assert_eq!(statuses(&seeds["batch"]), [200]);
    assert_eq!(statuses(&seeds["shard-pipelined"]), [404, 200]);
    assert_eq!(statuses(&seeds["no-token"]), [401]);
    assert_eq!(statuses(&seeds["smuggle-te"]), [400]);
    assert_eq!(statuses(&seeds["smuggle-two-cl"]), [400]);
}

/// The descriptor seeds reach both outcomes.
#[test]
fn the_descriptor_seeds_reach_acceptance_and_refusal() {
    use shardport_http::fuzzing::descriptor_roundtrip;
    let accepted: Vec<&str> = http_descriptor_seeds()
        .iter()
        .filter(|(_, d)| descriptor_roundtrip(d).is_ok())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(accepted, ["ipv4", "ipv6", "dns"]);
}

#[test]
#[ignore = "rewrites fuzz/corpus; run by hand after a format changes"]
fn regenerate_seed_corpus() {
    replay::write_seeds("descriptor_http", &http_descriptor_seeds());
    replay::write_seeds("http_server_request", &server_seeds());
    replay::write_seeds("http_client_response", &client_seeds());
}

fn seal(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.extend_from_slice(&[0; 4]);
    shardport_http::fuzzing::seal_descriptor(&mut bytes);
    bytes
}

fn http_descriptor_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use shardport_kit::codec::Writer;
    let desc = |addr: &str, len: u64| {
        seal(
            Writer::new()
                .bytes(b"SPHT")
                .u8(1)
                .short_str(addr)
                .u128(0x42)
                .u64(len)
                .finish(),
        )
    };
    let mut damaged = desc("10.0.0.7:7001", 4096);
    damaged[8] ^= 1;
    vec![
        ("ipv4", desc("127.0.0.1:7070", 4096)),
        ("ipv6", desc("[::1]:7070", 0)),
        ("dns", desc("node-3.cluster.local:443", u64::MAX)),
        ("port-zero", desc("127.0.0.1:0", 1)),
        ("damaged", damaged),
    ]
}

fn server_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut batch = b"POST /v1/batch HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\ncontent-length: 37\r\n\r\n\x01\x00\x00\x00\x02".to_vec();
    batch.extend_from_slice(&[0x11; 32]);
    let req = |s: &str| s.as_bytes().to_vec();
    vec![
        ("health", req("GET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\n")),
        ("shard-pipelined", req("GET /v1/shards/0000000000000000000000000000002a HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\nGET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: bearer fuzz-token\r\n\r\n")),
        ("no-token", req("GET /v1/health HTTP/1.1\r\nhost: o\r\n\r\n")),
        ("batch", batch),
        ("smuggle-te", req("POST /v1/batch HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\nGET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\n")),
        ("smuggle-two-cl", req("POST /v1/batch HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\ncontent-length: 0\r\ncontent-length: 5\r\n\r\nGET /v1/health HTTP/1.1\r\nhost: o\r\nauthorization: Bearer fuzz-token\r\n\r\n")),
    ]
}

fn client_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut batch = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 25\r\n\r\n\x01\x00\x00\x00\x02".to_vec();
    batch.extend_from_slice(&[
        0, 200, 0, 0, 0, 0, 0, 0, 0, 4, 1, 148, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    let resp = |s: &str| s.as_bytes().to_vec();
    vec![
        ("shard", resp("HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: 4\r\nx-shardport-len: 4\r\n\r\nabcd")),
        ("error-json", resp("HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 47\r\nconnection: close\r\n\r\n{\"code\":\"not_found\",\"message\":\"no shard \\u00e9\"}")),
        ("batch-table", batch),
        ("http10-close", resp("HTTP/1.0 401 Unauthorized\r\ncontent-length: 0\r\n\r\n")),
        ("chunked", resp("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n")),
        ("two-lengths", resp("HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\nabcd")),
        ("partial", resp("HTTP/1.1 200 OK\r\ncontent-len")),
    ]
}
