//! Behaviour of whole transport instances, driven through the `Transport`
//! trait object as the host drives it, plus raw `TcpStream` clients that
//! misbehave on purpose. Owner and consumer are separate instances with
//! their own servers on ephemeral 127.0.0.1 ports.
//!
//! No assertion depends on timing: deadlines only keep a broken build from
//! hanging, and "has not returned yet" checks can only fail if the code is
//! wrong (the thing waited on cannot happen before the test allows it).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{mpsc, Arc},
    time::Duration,
};

use shardport_abi::{
    testing, AbiError, Device, ErrorKind, ExportRequest, ImportItem, PluginContext, RSlice,
    RSliceMut, ShardId, ShardMeta, SharedBytes, SharedTransport,
};

use crate::{descriptor::Descriptor, wire, HttpTransport};

mod relay;
mod tls;

/// Deadline for anything a test waits on; far above what any step needs.
const GENEROUS: Duration = Duration::from_secs(60);

/// A transport instance and the address its server bound.
struct Node {
    t: SharedTransport,
    addr: SocketAddr,
}

fn node(config: &str) -> Node {
    try_node(config).unwrap_or_else(|e| panic!("http constructor failed: {e}"))
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.addr)
    }
}

/// A node whose server is started (as the first export would start it), so
/// tests can reach its address before exporting.
fn try_node(config: &str) -> Result<Node, AbiError> {
    let ctx = PluginContext::new(testing::context("http", config));
    let h = HttpTransport::new(ctx)?;
    let addr = h.serving()?.server.bound();
    Ok(Node {
        t: Arc::new(shardport_abi::kit::into_transport_box(h)),
        addr,
    })
}

/// Seeded bytes.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Exports `data` as shard `id`. The caller keeps `data` alive until the
/// shard is unexported or the transport is dropped.
fn export(t: &SharedTransport, id: u128, data: &[u8]) -> Result<Vec<u8>, AbiError> {
    t.export(ExportRequest {
        id: ShardId::from_u128(id),
        meta: ShardMeta::bytes(data.len() as u64),
        data: SharedBytes::lend(data),
        allocation: 0,
    })
    .into_result()
    .map(|d| d.into_vec())
}

fn fetch(t: &SharedTransport, desc: &[u8], len: usize) -> Result<Vec<u8>, AbiError> {
    fetch_noted(t, desc, len).map(|(dst, _)| dst)
}

/// Fetches through `t`; the bytes and the transport's note.
fn fetch_noted(
    t: &SharedTransport,
    desc: &[u8],
    len: usize,
) -> Result<(Vec<u8>, String), AbiError> {
    let mut dst = vec![0u8; len];
    t.import_into(
        RSlice::from_slice(desc),
        &ShardMeta::bytes(len as u64),
        RSliceMut::from_mut_slice(&mut dst),
    )
    .into_result()
    .map(|i| (dst, i.note.into()))
}

fn stat(t: &SharedTransport, name: &str) -> u64 {
    t.stats()
        .iter()
        .find(|s| s.name.as_str() == name)
        .unwrap_or_else(|| panic!("no stat {name}"))
        .value
}

#[track_caller]
fn assert_kind<T: std::fmt::Debug>(
    r: Result<T, AbiError>,
    kind: ErrorKind,
    needle: &str,
) -> AbiError {
    let e = r.expect_err("expected an error");
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.message.contains(needle), "expected {needle:?} in: {e}");
    e
}

// ---------------------------------------------------------------------------
// A raw HTTP/1.1 client
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> (String, String) {
        assert_eq!(self.header("content-type"), Some("application/json"));
        wire::parse_error_body(&self.body).unwrap_or_else(|| {
            panic!(
                "not a JSON error: {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to the owner");
    s.set_read_timeout(Some(GENEROUS)).unwrap();
    s.set_write_timeout(Some(GENEROUS)).unwrap();
    s
}

/// Reads a response head; returns it and the body bytes read along with it.
fn read_head(s: &mut TcpStream) -> (RawResponse, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut chunk).expect("read response head");
        assert!(n > 0, "connection closed before a response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..end].to_vec()).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = buf[end + 4..].to_vec();
    (
        RawResponse {
            status,
            headers,
            body: Vec::new(),
        },
        rest,
    )
}

/// Reads one whole response (its body sized by `content-length`).
fn read_response(s: &mut TcpStream) -> RawResponse {
    let (mut r, mut body) = read_head(s);
    let len: usize = r
        .header("content-length")
        .expect("content-length")
        .parse()
        .unwrap();
    while body.len() < len {
        let mut chunk = vec![0u8; (len - body.len()).min(1 << 20)];
        let n = s.read(&mut chunk).expect("read body");
        assert!(
            n > 0,
            "connection closed after {} of {len} body bytes",
            body.len()
        );
        body.extend_from_slice(&chunk[..n]);
    }
    r.body = body;
    r
}

/// Sends `req` on a fresh connection and reads one response.
fn raw(addr: SocketAddr, req: &[u8]) -> RawResponse {
    let mut s = connect(addr);
    s.write_all(req).unwrap();
    read_response(&mut s)
}

fn get(addr: SocketAddr, path: &str, auth: Option<&str>) -> RawResponse {
    let auth = auth.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nhost: test\r\n{auth}\r\n").as_bytes(),
    )
}

fn post(addr: SocketAddr, path: &str, body: &[u8], auth: Option<&str>) -> RawResponse {
    let auth = auth.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n{auth}\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    raw(addr, &req)
}

/// Waits until counter `name` of `t` reaches `at_least` (the owner counts
/// some events just after the client can see their effect); fails after
/// [`GENEROUS`].
fn wait_for_stat(t: &shardport_abi::SharedTransport, name: &str, at_least: u64) {
    let start = std::time::Instant::now();
    while stat(t, name) < at_least {
        assert!(
            start.elapsed() < GENEROUS,
            "{name} stayed at {} (< {at_least})",
            stat(t, name)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// True when the peer closed the connection (EOF or reset) before `GENEROUS`.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) => panic!("waiting for the owner to close the connection: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Owner side
// ---------------------------------------------------------------------------

#[test]
fn serves_shards_over_plain_http() {
    let data = pattern(100_003, 1);
    let owner = node("");
    let desc = export(&owner.t, 0xabc, &data).unwrap();
    let d = Descriptor::decode(&desc).unwrap();
    assert_eq!(d.addr, owner.addr.to_string());
    let r = get(
        owner.addr,
        &wire::shard_path(ShardId::from_u128(0xabc)),
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-shardport-len"), Some("100003"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert!(r.body == data, "body differs from the exported bytes");
    // Uppercase hex names the same shard.
    let upper = format!("/v1/shards/{:032X}", 0xabc);
    assert_eq!(get(owner.addr, &upper, None).status, 200);

    let h = get(owner.addr, "/v1/health", None);
    assert_eq!(h.status, 200);
    let text = String::from_utf8(h.body).unwrap();
    assert!(text.contains("\"status\":\"ok\""), "{text}");
    assert!(text.contains("\"shards\":1"), "{text}");
    assert!(text.contains(&owner.addr.to_string()), "{text}");

    assert_eq!(stat(&owner.t, "shards_exported"), 1);
    assert_eq!(stat(&owner.t, "bytes_exported"), 100_003);
    assert!(stat(&owner.t, "bytes_served") >= 2 * 100_003);
    owner.t.unexport(ShardId::from_u128(0xabc)).unwrap();
    assert_eq!(stat(&owner.t, "shards_exported"), 0);
    assert_eq!(stat(&owner.t, "bytes_exported"), 0);
}

#[test]
fn protocol_errors_are_json_with_the_right_status() {
    let owner = node("max-batch = 4");
    let missing = ShardId::from_u128(0x1234_5678_9abc_def0_1122_3344_5566_7788);
    let r = get(owner.addr, &wire::shard_path(missing), None);
    assert_eq!(r.status, 404);
    let (code, message) = r.json();
    assert_eq!(code, "not_found");
    assert!(message.contains(&missing.to_string()), "{message}");

    let r = get(owner.addr, "/v1/shards/xyz", None);
    assert_eq!(r.status, 400);
    assert_eq!(r.json().0, "bad_request");
    let r = get(
        owner.addr,
        "/v1/shards/+0000000000000000000000000000001",
        None,
    );
    assert_eq!(r.status, 400);

    let r = get(owner.addr, "/nope", None);
    assert_eq!(r.status, 404);
    assert_eq!(r.json().0, "no_such_endpoint");

    let r = post(owner.addr, &wire::shard_path(missing), b"", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET"));
    assert_eq!(r.json().0, "method_not_allowed");
    let r = get(owner.addr, "/v1/batch", None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));

    // Malformed batch bodies.
    let r = post(owner.addr, "/v1/batch", b"\x01\x00", None);
    assert_eq!(r.status, 400);
    let r = post(owner.addr, "/v1/batch", b"\x07\x00\x00\x00\x00", None);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("version 7"));
    let mut short = wire::encode_batch_request(&[missing, missing]);
    short.pop();
    assert_eq!(post(owner.addr, "/v1/batch", &short, None).status, 400);

    // Over max-batch: 413 naming the limit.
    let ids: Vec<ShardId> = (0..5).map(ShardId::from_u128).collect();
    let r = post(
        owner.addr,
        "/v1/batch",
        &wire::encode_batch_request(&ids),
        None,
    );
    assert_eq!(r.status, 413);
    let (code, message) = r.json();
    assert_eq!(code, "batch_too_large");
    assert!(message.contains("max-batch (4)"), "{message}");

    assert!(stat(&owner.t, "requests_failed") >= 9);
}

#[test]
fn request_bodies_over_the_limit_are_413() {
    // max-batch 1 allows a 21-byte request body minimum; allow 64 bytes.
    let owner = node("max-batch = 1\nmax-request-bytes = 64");
    // Declared too large: refused before reading.
    let mut s = connect(owner.addr);
    s.write_all(b"POST /v1/batch HTTP/1.1\r\nhost: t\r\ncontent-length: 100000000\r\n\r\n")
        .unwrap();
    let r = read_response(&mut s);
    assert_eq!(r.status, 413);
    assert_eq!(r.json().0, "payload_too_large");
    // Chunked, no length: refused before any chunk is read (bodies are
    // framed by content-length only; see `ambiguous_request_framing_is_refused`).
    let mut req =
        b"POST /v1/batch HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        req.extend_from_slice(b"40\r\n");
        req.extend_from_slice(&[0u8; 64]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let r = raw(owner.addr, &req);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("transfer-encoding"), "{r:?}");
}

#[test]
fn every_endpoint_requires_the_token() {
    let data = pattern(10, 3);
    let owner = node("auth-token = \"right-token\"");
    export(&owner.t, 1, &data).unwrap();
    let path = wire::shard_path(ShardId::from_u128(1));
    for auth in [
        None,
        Some("Bearer wrong-token"),
        Some("Bearer right-toke"),
        Some("Basic right-token"),
    ] {
        for r in [
            get(owner.addr, &path, auth),
            get(owner.addr, "/v1/health", auth),
            get(owner.addr, "/nope", auth),
            post(
                owner.addr,
                "/v1/batch",
                &wire::encode_batch_request(&[ShardId::from_u128(1)]),
                auth,
            ),
        ] {
            assert_eq!(r.status, 401, "{auth:?}");
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"shardport\"")
            );
            let (code, message) = r.json();
            assert_eq!(code, "unauthorized");
            assert!(!message.contains("right-token"), "{message}");
        }
    }
    let r = get(owner.addr, &path, Some("Bearer right-token"));
    assert_eq!(r.status, 200);
    assert_eq!(r.body, data);
    assert_eq!(
        get(owner.addr, &path, Some("bearer right-token")).status,
        200
    );
    assert_eq!(stat(&owner.t, "auth_failures"), 16);
    owner.t.unexport(ShardId::from_u128(1)).unwrap();
}

#[test]
fn batch_responses_frame_found_and_missing_items() {
    let a = pattern(5, 1);
    let b = pattern(0, 2);
    let c = pattern(70_000, 3);
    let owner = node("");
    export(&owner.t, 1, &a).unwrap();
    export(&owner.t, 2, &b).unwrap();
    export(&owner.t, 3, &c).unwrap();
    let ids: Vec<ShardId> = [3u128, 9, 1, 2, 3]
        .into_iter()
        .map(ShardId::from_u128)
        .collect();
    let r = post(
        owner.addr,
        "/v1/batch",
        &wire::encode_batch_request(&ids),
        None,
    );
    assert_eq!(r.status, 200);
    let head_len = wire::batch_head_len(5);
    let entries = wire::decode_batch_head(&r.body[..head_len], 5).unwrap();
    let statuses: Vec<(u16, u64)> = entries.iter().map(|e| (e.status, e.len)).collect();
    assert_eq!(
        statuses,
        [(200, 70_000), (404, 0), (200, 5), (200, 0), (200, 70_000)]
    );
    let mut expected = Vec::new();
    expected.extend_from_slice(&c);
    expected.extend_from_slice(&a);
    expected.extend_from_slice(&c);
    assert!(r.body[head_len..] == expected[..], "data section differs");
    assert_eq!(stat(&owner.t, "batches_served"), 1);
    for id in 1..=3 {
        owner.t.unexport(ShardId::from_u128(id)).unwrap();
    }
}

#[test]
fn hostile_clients_do_not_wedge_the_server() {
    let data = pattern(4096, 9);
    let owner = node("header-timeout = \"300ms\"");
    let consumer = node("");
    let desc = export(&owner.t, 7, &data).unwrap();

    // A client that connects and sends nothing, and one that sends half a
    // head and stops: the server keeps serving others meanwhile.
    let silent = connect(owner.addr);
    let mut half = connect(owner.addr);
    half.write_all(b"GET /v1/shards/0000").unwrap();
    assert_eq!(fetch(&consumer.t, &desc, 4096).unwrap(), data);

    // Garbage: hyper answers 400 (or closes); the server lives on.
    let mut g = connect(owner.addr);
    g.write_all(b"\x00\x01\x02 not http at all\r\n\r\n")
        .unwrap();
    let mut buf = Vec::new();
    let _ = g.read_to_end(&mut buf);
    if !buf.is_empty() {
        assert!(
            buf.starts_with(b"HTTP/1.1 400"),
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    // A truncated request: head promises a body that never comes, then the
    // client goes away.
    let mut t = connect(owner.addr);
    t.write_all(b"POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n\x01\x00")
        .unwrap();
    drop(t);
    // Oversized head: 431 (the whole head fits hyper's reads, so the
    // connection closes cleanly after the answer).
    let big = format!(
        "GET /v1/health HTTP/1.1\r\nhost: x\r\nx-filler: {}\r\n\r\n",
        "a".repeat(18 << 10)
    );
    let mut o = connect(owner.addr);
    o.write_all(big.as_bytes()).unwrap();
    let (r, _) = read_head(&mut o);
    assert!(r.status == 431 || r.status == 400, "{r:?}");

    // The half-sent head is cut off by header-timeout.
    assert!(closed_by_peer(&mut half));
    assert_eq!(fetch(&consumer.t, &desc, 4096).unwrap(), data);
    assert!(owner.t.health().ok);
    drop(consumer);
    owner.t.unexport(ShardId::from_u128(7)).unwrap();
    assert!(stat(&owner.t, "connections_timed_out") >= 1);
    drop(silent);
}

/// Sends `req` on a fresh connection and reads until the owner closes it.
fn raw_to_end(addr: SocketAddr, req: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(req).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return buf,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return buf,
            Err(e) => panic!(
                "reading the answer to {:?}: {e}",
                String::from_utf8_lossy(req)
            ),
        }
    }
}

/// Every request framing that two parsers could read differently is 400
/// and ends the connection; the smuggled second request is never answered.
#[test]
fn ambiguous_request_framing_is_refused() {
    let data = pattern(64, 3);
    // hyper keeps a connection whose request it read completely (equal
    // duplicate lengths: no ambiguity left) open after the 400 despite
    // `connection: close`, until idle-timeout; a short one ends the wait.
    let owner = node("idle-timeout = \"1s\"");
    let consumer = node("");
    let desc = export(&owner.t, 0x51, &data).unwrap();
    let shard = wire::shard_path(ShardId::from_u128(0x51));
    let smuggled = format!("GET {shard} HTTP/1.1\r\nhost: x\r\n\r\n");
    let cases: Vec<(&str, String)> = vec![
        (
            "conflicting content-length",
            format!(
                "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\
                 content-length: {}\r\n\r\n{smuggled}",
                smuggled.len()
            ),
        ),
        (
            "duplicate content-length",
            "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\
             content-length: 0\r\n\r\n"
                .to_owned(),
        ),
        (
            "content-length with transfer-encoding",
            format!(
                "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\
                 transfer-encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"
            ),
        ),
        (
            "transfer-encoding alone",
            "POST /v1/batch HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
             0\r\n\r\n"
                .to_owned(),
        ),
        (
            "invalid chunk size",
            "POST /v1/batch HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
             zz\r\n\r\n"
                .to_owned(),
        ),
        (
            "obs-fold",
            format!("GET {shard} HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n folded\r\n\r\n"),
        ),
        (
            "obs-fold inside content-length",
            "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length:\r\n 0\r\n\r\n".to_owned(),
        ),
        (
            "bare CR",
            format!("GET {shard} HTTP/1.1\r\nhost: x\rx-a: 1\r\n\r\n"),
        ),
        (
            "content-length that is not a number",
            "POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-length: 1,0\r\n\r\n".to_owned(),
        ),
    ];
    for (what, req) in &cases {
        let got = raw_to_end(owner.addr, req.as_bytes());
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 400"), "{what}: {text:?}");
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "{what}: a second request was answered: {text:?}"
        );
        assert!(
            !got.windows(data.len()).any(|w| w == data),
            "{what}: shard bytes leaked"
        );
    }
    // The server keeps serving well-formed requests.
    assert_eq!(fetch(&consumer.t, &desc, data.len()).unwrap(), data);
    owner.t.unexport(ShardId::from_u128(0x51)).unwrap();
}

#[test]
fn idle_connections_are_closed_and_the_consumer_reconnects() {
    let data = pattern(1000, 4);
    let owner = node("idle-timeout = \"200ms\"");
    let consumer = node("");
    let desc = export(&owner.t, 5, &data).unwrap();
    // An idle raw connection is closed by the owner.
    let mut idle = connect(owner.addr);
    assert!(closed_by_peer(&mut idle));
    // The consumer's pooled connection gets closed the same way between two
    // fetches; the second fetch still works (dead pooled connections are
    // dropped or retried).
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    let mut probe = connect(owner.addr);
    assert!(
        closed_by_peer(&mut probe),
        "idle-timeout has passed for the pooled one too"
    );
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    assert!(stat(&consumer.t, "client_connections_opened") >= 1);
    owner.t.unexport(ShardId::from_u128(5)).unwrap();
}

/// 64 MiB: far more than loopback socket buffers hold, so a client that
/// stops reading keeps its response in flight.
const BIG: usize = 64 << 20;

#[test]
fn unexport_waits_for_a_response_still_reading_the_shard() {
    let data = pattern(BIG, 5);
    let owner = node("");
    export(&owner.t, 11, &data).unwrap();
    let path = wire::shard_path(ShardId::from_u128(11));
    let mut slow = connect(owner.addr);
    slow.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, mut body) = read_head(&mut slow);
    assert_eq!(r.status, 200);

    let (tx, rx) = mpsc::channel();
    let t = Arc::clone(&owner.t);
    let waiter = std::thread::spawn(move || {
        tx.send(t.unexport(ShardId::from_u128(11)).into_result())
            .unwrap();
    });
    // The reader holds the bytes: unexport cannot have returned...
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    // ...but the shard is already withdrawn for new requests.
    let again = get(owner.addr, &path, None);
    assert_eq!(again.status, 404);
    assert!(stat(&owner.t, "responses_in_flight") >= 1);

    // Reading the rest lets unexport finish; the bytes arrived intact.
    let mut chunk = vec![0u8; 1 << 20];
    while body.len() < BIG {
        let n = slow.read(&mut chunk).unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    assert!(body == data, "streamed bytes differ");
    rx.recv_timeout(GENEROUS)
        .expect("unexport returns once the response is done")
        .unwrap();
    waiter.join().unwrap();
    assert_eq!(stat(&owner.t, "unexport_timeouts"), 0);
    drop(owner);
}

#[test]
fn unexport_times_out_while_a_reader_stalls() {
    // The host leaks bytes whose unexport failed; so does this test.
    let data: &'static [u8] = Box::leak(pattern(BIG, 6).into_boxed_slice());
    let owner = node("request-timeout = \"500ms\"\nidle-timeout = \"60s\"");
    export(&owner.t, 12, data).unwrap();
    let mut stalled = connect(owner.addr);
    let path = wire::shard_path(ShardId::from_u128(12));
    stalled
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, _) = read_head(&mut stalled);
    assert_eq!(r.status, 200);
    let e = assert_kind(
        owner.t.unexport(ShardId::from_u128(12)).into_result(),
        ErrorKind::TIMEOUT,
        "did not finish within request-timeout (500ms)",
    );
    assert!(e.message.contains("must not be freed"), "{e}");
    assert_eq!(stat(&owner.t, "unexport_timeouts"), 1);
    // The shard is gone for new requests and for a second unexport.
    assert_eq!(get(owner.addr, &path, None).status, 404);
    assert_kind(
        owner.t.unexport(ShardId::from_u128(12)).into_result(),
        ErrorKind::NOT_FOUND,
        "not exported",
    );
    drop(stalled);
}

#[test]
fn dropping_the_transport_with_a_stalled_reader_returns() {
    let data = pattern(BIG, 7);
    let owner = node("");
    export(&owner.t, 13, &data).unwrap();
    let mut stalled = connect(owner.addr);
    let path = wire::shard_path(ShardId::from_u128(13));
    stalled
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, _) = read_head(&mut stalled);
    assert_eq!(r.status, 200);
    let addr = owner.addr;
    let (tx, rx) = mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(owner);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(GENEROUS)
        .expect("drop returns within its bounded grace");
    dropper.join().unwrap();
    // Nothing serves any more: the stalled response was cut off and new
    // connections are refused.
    assert!(closed_by_peer(&mut stalled));
    assert!(TcpStream::connect(addr).is_err());
    drop(data);
}

#[test]
fn export_checks_its_arguments() {
    let data = pattern(16, 1);
    let owner = node("");
    let id = ShardId::from_u128(3);
    let req = |meta: ShardMeta, allocation: u64| ExportRequest {
        id,
        meta,
        data: SharedBytes::lend(&data),
        allocation,
    };
    assert_kind(
        owner.t.export(req(ShardMeta::bytes(15), 0)).into_result(),
        ErrorKind::INVALID_ARGUMENT,
        "meta.byte_len is 15 but 16 bytes were lent",
    );
    assert_kind(
        owner.t.export(req(ShardMeta::bytes(16), 9)).into_result(),
        ErrorKind::INVALID_ARGUMENT,
        "allocation token 9",
    );
    if crate::gpu::Staging::Cuda.ready().is_err() {
        // No CUDA driver here: a GPU shard is refused naming why.
        let mut gpu = ShardMeta::bytes(16);
        gpu.device = Device::cuda(0);
        assert_kind(
            owner.t.export(req(gpu, 0)).into_result(),
            ErrorKind::UNAVAILABLE,
            "needs the CUDA driver",
        );
    }
    owner.t.export(req(ShardMeta::bytes(16), 0)).unwrap();
    assert_kind(
        owner.t.export(req(ShardMeta::bytes(16), 0)).into_result(),
        ErrorKind::INVALID_ARGUMENT,
        "already exported",
    );
    owner.t.unexport(id).unwrap();
    for r in [
        owner.t.allocate(id, 1).map(|_| ()),
        owner.t.free_allocation(1),
        owner.t.release(1),
    ] {
        assert_eq!(r.into_result().unwrap_err().kind, ErrorKind::UNSUPPORTED);
    }
}

/// A node as the host builds it: nothing started until the first export.
fn lazy_node(config: &str) -> Result<SharedTransport, AbiError> {
    let ctx = PluginContext::new(testing::context("http", config));
    let h = HttpTransport::new(ctx)?;
    Ok(Arc::new(shardport_abi::kit::into_transport_box(h)))
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True when `port` on loopback is free (nobody bound it).
fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[test]
fn a_consumer_only_node_binds_no_port() {
    let owner = node("");
    let data = pattern(4096, 9);
    let desc = export(&owner.t, 1, &data).unwrap();
    let port = free_port();
    let consumer = lazy_node(&format!("bind = \"127.0.0.1:{port}\"")).unwrap();
    let h = consumer.health();
    assert!(h.ok, "{}", h.message);
    assert!(
        h.message.contains(&format!(
            "not serving yet: binds 127.0.0.1:{port} on the first export"
        )),
        "{}",
        h.message
    );
    assert_eq!(fetch(&consumer, &desc, 4096).unwrap(), data);
    assert_eq!(stat(&consumer, "shards_exported"), 0);
    assert!(port_is_free(port), "fetching bound no port");
    // Its first export starts the server on the configured address.
    let mine = pattern(10, 1);
    let d = Descriptor::decode(&export(&consumer, 2, &mine).unwrap()).unwrap();
    assert_eq!(d.addr, format!("127.0.0.1:{port}"));
    assert!(!port_is_free(port), "the first export bound the port");
    assert_eq!(fetch(&owner.t, &d.encode(), 10).unwrap(), mine);
    consumer.unexport(ShardId::from_u128(2)).unwrap();
    owner.t.unexport(ShardId::from_u128(1)).unwrap();
}

#[test]
fn a_lazy_bind_failure_goes_to_the_export_that_needed_it() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let t = lazy_node(&format!("bind = \"127.0.0.1:{port}\"")).unwrap();
    let data = pattern(8, 2);
    let e = assert_kind(
        export(&t, 1, &data),
        ErrorKind::UNAVAILABLE,
        &format!("cannot bind `plugin.http.config.bind` = \"127.0.0.1:{port}\""),
    );
    assert!(e.message.contains("use port 0"), "{e}");
    let h = t.health();
    assert!(
        !h.ok && h.message.starts_with("cannot serve: cannot bind"),
        "{}",
        h.message
    );
    assert_kind(
        t.unexport(ShardId::from_u128(1)).into_result(),
        ErrorKind::NOT_FOUND,
        "not exported",
    );
    // Once the port is free, the next export starts the server.
    drop(taken);
    export(&t, 1, &data).unwrap();
    assert!(t.health().ok);
    t.unexport(ShardId::from_u128(1)).unwrap();
}

#[test]
fn constructor_errors_name_the_key_or_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    // `listen = "eager"` binds in the constructor, which then names the address.
    let e = lazy_node(&format!("bind = \"127.0.0.1:{port}\"\nlisten = \"eager\""))
        .err()
        .expect("the eager constructor binds");
    assert!(
        e.message.contains(&format!(
            "cannot bind `plugin.http.config.bind` = \"127.0.0.1:{port}\""
        )),
        "{e}"
    );
    assert!(e.message.contains("use port 0"), "{e}");
    let e = try_node("threads = \"two\"").unwrap_err();
    assert_eq!(e.kind, ErrorKind::CONFIG);
    let e = try_node("bogus = 1").unwrap_err();
    assert!(
        e.message.contains("unknown key `plugin.http.config.bogus`"),
        "{e}"
    );
}

#[test]
fn health_names_the_bound_and_advertised_address() {
    let n = node("advertise = \"node7.example\"");
    let h = n.t.health();
    assert!(h.ok);
    assert!(h.message.contains(&n.addr.to_string()), "{}", h.message);
    assert!(
        h.message
            .contains(&format!("node7.example:{}", n.addr.port())),
        "{}",
        h.message
    );
    let data = pattern(1, 0);
    let d = Descriptor::decode(&export(&n.t, 1, &data).unwrap()).unwrap();
    assert_eq!(d.addr, format!("node7.example:{}", n.addr.port()));
    n.t.unexport(ShardId::from_u128(1)).unwrap();
}

// ---------------------------------------------------------------------------
// Consumer side
// ---------------------------------------------------------------------------

#[test]
fn pooled_connections_are_reused_and_bounded() {
    let shards: Vec<Vec<u8>> = (0..6).map(|i| pattern(50_000 + i, i as u8)).collect();
    let owner = node("");
    let consumer = node("max-connections-per-owner = 2");
    let descs: Vec<Vec<u8>> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| export(&owner.t, i as u128, s).unwrap())
        .collect();
    // Sequential fetches share one connection.
    for (d, s) in descs.iter().zip(&shards) {
        assert!(fetch(&consumer.t, d, s.len()).unwrap() == *s);
    }
    assert_eq!(stat(&consumer.t, "client_connections_opened"), 1);
    assert_eq!(stat(&consumer.t, "client_connections_reused"), 5);
    // Eight threads at once never open more than two.
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (consumer, descs, shards) = (&consumer, &descs, &shards);
            scope.spawn(move || {
                for round in 0..5 {
                    let i = (t + round) % shards.len();
                    assert!(fetch(&consumer.t, &descs[i], shards[i].len()).unwrap() == shards[i]);
                }
            });
        }
    });
    assert!(stat(&consumer.t, "client_connections_opened") <= 2);
    assert!(stat(&consumer.t, "client_connections_open") <= 2);
    assert!(stat(&owner.t, "connections_accepted") <= 2);
    assert_eq!(stat(&consumer.t, "fetches"), 46);
    for i in 0..6 {
        owner.t.unexport(ShardId::from_u128(i)).unwrap();
    }
}

/// Exhausted connection budgets on both sides are counted: the owner's
/// `max-connections` (new connections wait in the backlog) and the
/// consumer's `max-connections-per-owner` (requests wait for a slot, up to
/// `request-timeout`, then fail naming the limit); nothing hangs.
#[test]
fn exhausted_connection_budgets_are_counted_and_bounded() {
    let owner = node("max-connections = 1");
    // One connection that never sends a request takes the only slot.
    let _idle = connect(owner.addr);
    wait_for_stat(&owner.t, "connections_at_limit", 1);
    // A consumer whose only connection to a silent owner is busy.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let desc = desc_for(&silent.local_addr().unwrap().to_string(), 1, 10);
    let consumer = node("max-connections-per-owner = 1\nrequest-timeout = \"300ms\"");
    let (accepted_tx, accepted_rx) = mpsc::channel();
    let holder = std::thread::spawn(move || {
        let (s, _) = silent.accept().unwrap();
        accepted_tx.send(()).unwrap();
        // Keep it open (and silent) until both fetches are over.
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    std::thread::scope(|scope| {
        let first = scope.spawn(|| fetch(&consumer.t, &desc, 10));
        accepted_rx.recv_timeout(GENEROUS).unwrap();
        let second = fetch(&consumer.t, &desc, 10);
        for r in [first.join().unwrap(), second] {
            assert_eq!(r.unwrap_err().kind, ErrorKind::TIMEOUT);
        }
    });
    assert!(stat(&consumer.t, "pool_waits") >= 1);
    holder.join().unwrap();
}

#[test]
fn errors_map_to_kinds_the_host_acts_on() {
    let data = pattern(100, 1);
    let owner = node("auth-token = \"tok-a\"");
    let desc = export(&owner.t, 1, &data).unwrap();
    let addr = owner.addr.to_string();

    let anonymous = node("");
    let e = assert_kind(
        fetch(&anonymous.t, &desc, 100),
        ErrorKind::PERMISSION_DENIED,
        &addr,
    );
    assert!(e.message.contains("HTTP 401"), "{e}");
    assert!(e.message.contains("missing bearer token"), "{e}");
    let wrong = node("auth-token = \"tok-b\"");
    assert_kind(
        fetch(&wrong.t, &desc, 100),
        ErrorKind::PERMISSION_DENIED,
        "same auth-token",
    );
    let right = node("auth-token = \"tok-a\"");
    assert_eq!(fetch(&right.t, &desc, 100).unwrap(), data);

    owner.t.unexport(ShardId::from_u128(1)).unwrap();
    let e = assert_kind(fetch(&right.t, &desc, 100), ErrorKind::NOT_FOUND, &addr);
    assert!(
        e.message.contains(&ShardId::from_u128(1).to_string()),
        "{e}"
    );

    // The owner goes away: UNAVAILABLE naming it, on the pooled connection
    // (retried on a fresh one, refused) as on a new one.
    drop(owner);
    assert_kind(fetch(&right.t, &desc, 100), ErrorKind::UNAVAILABLE, &addr);
    assert_kind(
        fetch(&right.t, &desc, 100),
        ErrorKind::UNAVAILABLE,
        "nothing listens there",
    );
    assert!(stat(&right.t, "fetch_errors") >= 3);
}

#[test]
fn a_closed_port_fails_unavailable_quickly() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let desc = Descriptor {
        addr: addr.clone(),
        id: ShardId::from_u128(1),
        len: 10,
        tls: false,
    }
    .encode();
    let consumer = node("connect-timeout = \"30s\"\nrequest-timeout = \"30s\"");
    let start = std::time::Instant::now();
    let e = assert_kind(fetch(&consumer.t, &desc, 10), ErrorKind::UNAVAILABLE, &addr);
    assert!(e.message.contains("nothing listens there"), "{e}");
    // Refused, not timed out: far below the configured timeouts.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_silent_owner_times_out_instead_of_hanging() {
    // Connections complete in the kernel's backlog; nobody ever answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let consumer = node("request-timeout = \"300ms\"");
    let desc = Descriptor {
        addr: addr.clone(),
        id: ShardId::from_u128(1),
        len: 10,
        tls: false,
    }
    .encode();
    let e = assert_kind(fetch(&consumer.t, &desc, 10), ErrorKind::TIMEOUT, &addr);
    assert!(e.message.contains("request-timeout (300ms)"), "{e}");
    // A batch to the same owner times out the same way, item by item.
    let mut bufs = vec![vec![0u8; 10]; 2];
    let meta = ShardMeta::bytes(10);
    let mut items: Vec<ImportItem<'_>> = bufs
        .iter_mut()
        .map(|b| ImportItem {
            desc: RSlice::from_slice(&desc),
            meta: &meta,
            dst: RSliceMut::from_mut_slice(b),
        })
        .collect();
    let results = consumer
        .t
        .import_many(RSliceMut::from_mut_slice(&mut items));
    for r in results.into_iter() {
        assert_eq!(r.into_result().unwrap_err().kind, ErrorKind::TIMEOUT);
    }
    drop(silent);
}

/// One import_many item, its expected outcome.
enum Want {
    Bytes(Vec<u8>),
    Kind(ErrorKind),
}

fn run_many(consumer: &SharedTransport, items: &[(Vec<u8>, ShardMeta, usize, Want)]) {
    let mut bufs: Vec<Vec<u8>> = items.iter().map(|(_, _, n, _)| vec![0xEEu8; *n]).collect();
    let mut abi_items: Vec<ImportItem<'_>> = items
        .iter()
        .zip(bufs.iter_mut())
        .map(|((desc, meta, _, _), b)| ImportItem {
            desc: RSlice::from_slice(desc),
            meta,
            dst: RSliceMut::from_mut_slice(b),
        })
        .collect();
    let results = consumer.import_many(RSliceMut::from_mut_slice(&mut abi_items));
    drop(abi_items);
    assert_eq!(results.len(), items.len());
    for (i, ((r, (_, _, _, want)), got)) in results.into_iter().zip(items).zip(&bufs).enumerate() {
        match (r.into_result(), want) {
            (Ok(_), Want::Bytes(b)) => assert!(got == b, "item {i}: wrong bytes"),
            (Err(e), Want::Kind(k)) => assert_eq!(e.kind, *k, "item {i}: {e}"),
            (Ok(_), Want::Kind(k)) => panic!("item {i} succeeded, expected {k}"),
            (Err(e), Want::Bytes(_)) => panic!("item {i} failed: {e}"),
        }
    }
}

#[test]
fn import_many_batches_per_owner_and_fails_only_bad_items() {
    let a_data: Vec<Vec<u8>> = (0..9)
        .map(|i| pattern([0, 1, 4097, 100_003][i % 4], i as u8))
        .collect();
    let b_data: Vec<Vec<u8>> = (0..5).map(|i| pattern(3000 + i, 100 + i as u8)).collect();
    let owner_a = node("");
    let owner_b = node("");
    let consumer = node("max-batch = 4");
    let mut items = Vec::new();
    for (i, d) in a_data.iter().enumerate() {
        let desc = export(&owner_a.t, i as u128, d).unwrap();
        items.push((
            desc,
            ShardMeta::bytes(d.len() as u64),
            d.len(),
            Want::Bytes(d.clone()),
        ));
    }
    for (i, d) in b_data.iter().enumerate() {
        let desc = export(&owner_b.t, 100 + i as u128, d).unwrap();
        // Interleave the owners.
        items.insert(
            2 * i + 1,
            (
                desc,
                ShardMeta::bytes(d.len() as u64),
                d.len(),
                Want::Bytes(d.clone()),
            ),
        );
    }
    // One shard withdrawn before the batch: only its item fails.
    owner_a.t.unexport(ShardId::from_u128(2)).unwrap();
    let gone = items
        .iter()
        .position(|(d, ..)| Descriptor::decode(d).unwrap().id == ShardId::from_u128(2))
        .unwrap();
    items[gone].3 = Want::Kind(ErrorKind::NOT_FOUND);
    // Items broken on the consumer side.
    let good = items[0].0.clone();
    let good_len = items[0].2;
    items.push((
        b"garbage".to_vec(),
        ShardMeta::bytes(5),
        5,
        Want::Kind(ErrorKind::INVALID_DESCRIPTOR),
    ));
    items.push((
        good,
        ShardMeta::bytes(good_len as u64),
        good_len + 1,
        Want::Kind(ErrorKind::INVALID_ARGUMENT),
    ));
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let dead = Descriptor {
        addr: closed,
        id: ShardId::from_u128(1),
        len: 8,
        tls: false,
    }
    .encode();
    items.push((
        dead,
        ShardMeta::bytes(8),
        8,
        Want::Kind(ErrorKind::UNAVAILABLE),
    ));

    run_many(&consumer.t, &items);
    // 9 items of owner A in batches of 4 (3 requests), 5 of B (2), 1 to the
    // closed port (1).
    assert_eq!(stat(&consumer.t, "batch_requests"), 6);
    assert_eq!(stat(&owner_a.t, "batches_served"), 3);
    assert_eq!(stat(&owner_b.t, "batches_served"), 2);
    assert_eq!(stat(&consumer.t, "fetches"), 13);
    assert_eq!(stat(&consumer.t, "fetch_errors"), 4);
    // The pooled connections are reused by the next batch.
    run_many(&consumer.t, &items);
    assert!(stat(&consumer.t, "client_connections_reused") >= 1);
    for i in (0..9).filter(|&i| i != 2) {
        owner_a.t.unexport(ShardId::from_u128(i)).unwrap();
    }
    for i in 0..5 {
        owner_b.t.unexport(ShardId::from_u128(100 + i)).unwrap();
    }
}

#[test]
fn import_many_splits_batches_an_owner_refuses_as_too_large() {
    let data: Vec<Vec<u8>> = (0..5).map(|i| pattern(1000 + i, i as u8)).collect();
    let owner = node("max-batch = 2");
    let consumer = node("max-batch = 8");
    let items: Vec<_> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let desc = export(&owner.t, i as u128, d).unwrap();
            (
                desc,
                ShardMeta::bytes(d.len() as u64),
                d.len(),
                Want::Bytes(d.clone()),
            )
        })
        .collect();
    run_many(&consumer.t, &items);
    // 5 refused -> 2 ok + 3 refused -> 1 ok + 2 ok.
    assert_eq!(stat(&consumer.t, "batch_requests"), 5);
    assert_eq!(stat(&owner.t, "batches_served"), 3);
    for i in 0..5 {
        owner.t.unexport(ShardId::from_u128(i)).unwrap();
    }
}

#[test]
fn import_many_with_auth_and_empty_input() {
    let data = pattern(10, 1);
    let owner = node("auth-token = \"t0k\"");
    let consumer = node("auth-token = \"t0k\"");
    let stranger = node("");
    let desc = export(&owner.t, 1, &data).unwrap();
    let items = vec![(
        desc.clone(),
        ShardMeta::bytes(10),
        10,
        Want::Bytes(data.clone()),
    )];
    run_many(&consumer.t, &items);
    let items = vec![(
        desc,
        ShardMeta::bytes(10),
        10,
        Want::Kind(ErrorKind::PERMISSION_DENIED),
    )];
    run_many(&stranger.t, &items);
    run_many(&consumer.t, &[]);
    owner.t.unexport(ShardId::from_u128(1)).unwrap();
}

#[test]
fn a_stalled_reader_is_cut_off_and_unexport_then_succeeds() {
    let data = pattern(BIG, 8);
    // The default relation: idle-timeout well below request-timeout.
    let owner = node("idle-timeout = \"300ms\"\nrequest-timeout = \"60s\"");
    export(&owner.t, 14, &data).unwrap();
    let mut stalled = connect(owner.addr);
    let path = wire::shard_path(ShardId::from_u128(14));
    stalled
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, _) = read_head(&mut stalled);
    assert_eq!(r.status, 200);
    // The owner closes the connection that makes no progress, which
    // releases the shard: unexport returns Ok well within request-timeout.
    owner.t.unexport(ShardId::from_u128(14)).unwrap();
    assert_eq!(stat(&owner.t, "unexport_timeouts"), 0);
    assert!(stat(&owner.t, "connections_timed_out") >= 1);
    assert!(closed_by_peer(&mut stalled));
}

/// A fake owner: answers the first request on one connection with
/// `response`, then closes. Returns its address.
fn fake_owner(response: Vec<u8>) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(GENEROUS)).unwrap();
        // Read the head and the body it announces.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        while buf.len() < end + len {
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        let _ = s.write_all(&response);
    });
    (addr, h)
}

fn desc_for(addr: &str, id: u128, len: u64) -> Vec<u8> {
    Descriptor {
        addr: addr.to_owned(),
        id: ShardId::from_u128(id),
        len,
        tls: false,
    }
    .encode()
}

#[test]
fn the_consumer_checks_what_an_owner_sends() {
    let consumer = node("request-timeout = \"30s\"");
    // Ends the body early.
    let (addr, h) =
        fake_owner(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n0123456789".to_vec());
    let e = assert_kind(
        fetch(&consumer.t, &desc_for(&addr, 1, 1000), 1000),
        ErrorKind::UNAVAILABLE,
        &addr,
    );
    assert!(
        e.message.contains("10 bytes of the response received"),
        "{e}"
    );
    h.join().unwrap();
    // Serves another length than the descriptor says.
    let (addr, h) = fake_owner(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nabcd".to_vec());
    assert_kind(
        fetch(&consumer.t, &desc_for(&addr, 1, 5), 5),
        ErrorKind::INVALID_DESCRIPTOR,
        "serves 4 bytes for shard",
    );
    h.join().unwrap();
    // A server error.
    let (addr, h) = fake_owner(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 43\r\ncontent-type: application/json\r\n\r\n{\"code\":\"overloaded\",\"message\":\"try later\"}"
            .to_vec(),
    );
    let e = assert_kind(
        fetch(&consumer.t, &desc_for(&addr, 1, 5), 5),
        ErrorKind::UNAVAILABLE,
        "HTTP 503",
    );
    assert!(e.message.contains("try later (overloaded)"), "{e}");
    h.join().unwrap();
    // A batch response whose header table disagrees with the request.
    let entry = wire::BatchEntry {
        status: wire::ITEM_OK,
        len: 3,
    };
    let mut body = wire::encode_batch_head(&[entry, entry]);
    body[1..5].copy_from_slice(&3u32.to_be_bytes());
    body.extend_from_slice(b"abcdef");
    let mut resp =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    resp.extend_from_slice(&body);
    let (addr, h) = fake_owner(resp);
    let items: Vec<_> = (0..2)
        .map(|i| {
            (
                desc_for(&addr, i, 3),
                ShardMeta::bytes(3),
                3,
                Want::Kind(ErrorKind::INTERNAL),
            )
        })
        .collect();
    run_many(&consumer.t, &items);
    h.join().unwrap();
    // A batch item whose length differs from its descriptor fails alone;
    // the next item is still read from the right place.
    let mut body = wire::encode_batch_head(&[
        wire::BatchEntry {
            status: wire::ITEM_OK,
            len: 4,
        },
        wire::BatchEntry {
            status: wire::ITEM_OK,
            len: 3,
        },
    ]);
    body.extend_from_slice(b"wxyzabc");
    let mut resp =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    resp.extend_from_slice(&body);
    let (addr, h) = fake_owner(resp);
    let items = vec![
        (
            desc_for(&addr, 1, 3),
            ShardMeta::bytes(3),
            3,
            Want::Kind(ErrorKind::INVALID_DESCRIPTOR),
        ),
        (
            desc_for(&addr, 2, 3),
            ShardMeta::bytes(3),
            3,
            Want::Bytes(b"abc".to_vec()),
        ),
    ];
    run_many(&consumer.t, &items);
    h.join().unwrap();
}

/// Reads one request (its head and the body it announces) from a raw
/// connection; false when the peer closed the connection first.
fn read_request(s: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) | Err(_) => return false,
            Ok(_) => buf.push(byte[0]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).is_ok()
}

/// What a scripted owner does with one request.
enum Answer {
    /// Sends these parts, pausing briefly between two (so they arrive in
    /// separate reads of the consumer, in practice).
    Parts(Vec<Vec<u8>>),
    /// Closes the connection without answering.
    Close,
}

/// A fake owner serving `script`: one entry per connection it accepts (in
/// order), each the answers to that connection's requests.
fn scripted_owner(script: Vec<Vec<Answer>>) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        for answers in script {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(GENEROUS)).unwrap();
            s.set_nodelay(true).unwrap();
            for a in answers {
                assert!(read_request(&mut s), "the consumer closed the connection");
                match a {
                    Answer::Close => break,
                    Answer::Parts(parts) => {
                        for (i, p) in parts.iter().enumerate() {
                            if i > 0 {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            s.write_all(p).unwrap();
                        }
                    }
                }
            }
        }
    });
    (addr, h)
}

fn ok_head(len: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {len}\r\n\
         x-shardport-len: {len}\r\n\r\n"
    )
    .into_bytes()
}

#[test]
fn body_bytes_that_arrive_with_the_head_land_in_place() {
    let consumer = node("request-timeout = \"30s\"");
    let small = pattern(3, 1);
    let medium = pattern(100_000, 2);
    let large = pattern(3 << 20, 3);
    let with_head = |data: &[u8], first: usize| {
        let mut p = ok_head(data.len());
        p.extend_from_slice(&data[..first]);
        vec![p, data[first..].to_vec()]
    };
    // One connection, kept alive across the four responses.
    let (addr, h) = scripted_owner(vec![vec![
        // Head and whole body in one write.
        Answer::Parts(vec![[ok_head(3), small.clone()].concat()]),
        // Head plus part of the body, then the rest.
        Answer::Parts(with_head(&medium, 5000)),
        Answer::Parts(with_head(&large, 10)),
        // Head alone, then the body.
        Answer::Parts(with_head(&medium, 0)),
    ]]);
    assert!(fetch(&consumer.t, &desc_for(&addr, 1, 3), 3).unwrap() == small);
    assert!(fetch(&consumer.t, &desc_for(&addr, 2, 100_000), 100_000).unwrap() == medium);
    assert!(fetch(&consumer.t, &desc_for(&addr, 3, 3 << 20), 3 << 20).unwrap() == large);
    assert!(fetch(&consumer.t, &desc_for(&addr, 2, 100_000), 100_000).unwrap() == medium);
    h.join().unwrap();
    assert_eq!(stat(&consumer.t, "client_connections_opened"), 1);
    assert_eq!(stat(&consumer.t, "client_connections_reused"), 3);

    // A batch whose whole response arrives in one write, and one split
    // inside its header table and inside an item.
    let a = pattern(7, 4);
    let b = pattern(40_000, 5);
    let mut body = wire::encode_batch_head(&[
        wire::BatchEntry {
            status: wire::ITEM_OK,
            len: 7,
        },
        wire::BatchEntry {
            status: wire::ITEM_NOT_FOUND,
            len: 0,
        },
        wire::BatchEntry {
            status: wire::ITEM_OK,
            len: 40_000,
        },
    ]);
    body.extend_from_slice(&a);
    body.extend_from_slice(&b);
    let mut whole =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    whole.extend_from_slice(&body);
    let head_len = whole.len() - body.len();
    let (addr, h) = scripted_owner(vec![vec![
        Answer::Parts(vec![whole.clone()]),
        Answer::Parts(vec![
            whole[..head_len + 12].to_vec(),
            whole[head_len + 12..head_len + 40].to_vec(),
            whole[head_len + 40..].to_vec(),
        ]),
    ]]);
    let items = || {
        vec![
            (
                desc_for(&addr, 1, 7),
                ShardMeta::bytes(7),
                7,
                Want::Bytes(a.clone()),
            ),
            (
                desc_for(&addr, 2, 9),
                ShardMeta::bytes(9),
                9,
                Want::Kind(ErrorKind::NOT_FOUND),
            ),
            (
                desc_for(&addr, 3, 40_000),
                ShardMeta::bytes(40_000),
                40_000,
                Want::Bytes(b.clone()),
            ),
        ]
    };
    run_many(&consumer.t, &items());
    run_many(&consumer.t, &items());
    h.join().unwrap();
}

#[test]
fn responses_the_consumer_cannot_frame_are_refused() {
    let consumer = node("request-timeout = \"30s\"");
    let cases: [(&[u8], &str); 4] = [
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "transfer-encoding `chunked` is not supported",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\r\nabc",
            "without content-length",
        ),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "does not start with `HTTP/`"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabc",
            "conflicting content-length",
        ),
    ];
    for (response, needle) in cases {
        let (addr, h) = scripted_owner(vec![vec![Answer::Parts(vec![response.to_vec()])]]);
        let e = assert_kind(
            fetch(&consumer.t, &desc_for(&addr, 1, 3), 3),
            ErrorKind::INTERNAL,
            needle,
        );
        assert!(e.message.contains(&addr), "{e}");
        h.join().unwrap();
    }
    // An error without a length is read up to the end of the connection.
    let (addr, h) = scripted_owner(vec![vec![Answer::Parts(vec![
        b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n".to_vec(),
        b"{\"code\":\"busy\",\"message\":\"later\"}".to_vec(),
    ])]]);
    let e = assert_kind(
        fetch(&consumer.t, &desc_for(&addr, 1, 3), 3),
        ErrorKind::UNAVAILABLE,
        "HTTP 503 Service Unavailable: later (busy)",
    );
    assert!(e.message.contains(&addr), "{e}");
    h.join().unwrap();
    // Nothing was pooled from these connections.
    assert_eq!(stat(&consumer.t, "client_connections_open"), 0);
}

#[test]
fn a_pooled_connection_that_fails_before_answering_is_retried_once() {
    let data = pattern(1000, 6);
    let consumer = node("request-timeout = \"30s\"");
    let answer = || Answer::Parts(vec![[ok_head(1000), data.clone()].concat()]);
    // The first connection answers once, then closes on the next request
    // (an owner restarting, or closing an idle connection as it is reused).
    let (addr, h) = scripted_owner(vec![vec![answer(), Answer::Close], vec![answer()]]);
    let desc = desc_for(&addr, 1, 1000);
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    h.join().unwrap();
    assert_eq!(stat(&consumer.t, "retries"), 1);
    assert_eq!(stat(&consumer.t, "client_connections_opened"), 2);
    assert_eq!(stat(&consumer.t, "requests_sent"), 3);
    // Once only: a fresh connection that fails is an error, not a retry.
    let (addr, h) = scripted_owner(vec![vec![answer(), Answer::Close], vec![Answer::Close]]);
    let desc = desc_for(&addr, 1, 1000);
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    let e = assert_kind(
        fetch(&consumer.t, &desc, 1000),
        ErrorKind::UNAVAILABLE,
        &addr,
    );
    assert!(
        e.message.contains("closed before a response arrived"),
        "{e}"
    );
    h.join().unwrap();
    assert_eq!(stat(&consumer.t, "retries"), 2);
}

#[test]
fn slow_heads_cannot_hold_the_owner_and_a_real_consumer_gets_through() {
    // Eight connection slots, four of them at most for connections that
    // have not authenticated; heads may take a minute. Sixteen clients
    // trickle half a head each: without the pending budget they would hold
    // all eight slots for a minute and the consumer would wait in the
    // backlog past its request timeout.
    let owner = node(
        "auth-token = \"tok-tok-tok-tok\"\nmax-connections = 8\nmax-pending = 4\nmax-pending-per-peer = 4\nheader-timeout = \"60s\"",
    );
    let data = pattern(4096, 3);
    let desc = export(&owner.t, 1, &data).unwrap();
    let mut slow: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut s = connect(owner.addr);
            s.write_all(b"GET /v1/health HTTP/1.1\r\nhost: o\r\nx-slow: ")
                .unwrap();
            s
        })
        .collect();
    let consumer = node(
        "auth-token = \"tok-tok-tok-tok\"\nrequest-timeout = \"10s\"\nconnect-timeout = \"10s\"",
    );
    assert_eq!(fetch(&consumer.t, &desc, 4096).unwrap(), data);
    // The oldest slow clients were cut off to make room (the accept loop
    // may still be taking the last of them in when the fetch is done: a
    // polling consumer finishes within microseconds); the consumer's
    // connection authenticated and is no longer evictable.
    wait_for_stat(&owner.t, "connections_evicted", 12);
    // The twelve oldest were evicted by the four newest (the others may
    // still wait, so only those are read).
    for (i, s) in slow.iter_mut().take(12).enumerate() {
        assert!(closed_by_peer(s), "slow client {i} was not closed");
    }
    for _ in 0..8 {
        let _ = connect(owner.addr).write_all(b"GET /v1/health HTTP/1.1\r\nx: ");
    }
    assert_eq!(
        fetch(&consumer.t, &desc, 4096).unwrap(),
        data,
        "kept-alive consumer"
    );
    owner.t.unexport(ShardId::from_u128(1)).unwrap();
}

// ---------------------------------------------------------------------------
// GPU shards, staged through host memory. No GPU exists here: the plugin's
// `test-device-is-host` mode makes a GPU shard's address host memory, so
// the protocol (pieces, pool, ring, batches, unexport) runs for real on
// real sockets while the device copies are plain memory copies.

pub(crate) const STAND_IN: &str =
    "test-device-is-host = true\ndevice-piece = \"64KiB\"\ndevice-buffers = 2";

pub(crate) fn gpu_meta(len: usize) -> ShardMeta {
    let mut m = ShardMeta::bytes(len as u64);
    m.device = Device::cuda(0);
    m
}

pub(crate) fn export_gpu(t: &SharedTransport, id: u128, data: &[u8]) -> Vec<u8> {
    t.export(ExportRequest {
        id: ShardId::from_u128(id),
        meta: gpu_meta(data.len()),
        data: SharedBytes::device(data.as_ptr() as u64, data.len()),
        allocation: 0,
    })
    .into_result()
    .expect("a GPU export with host memory standing in")
    .into_vec()
}

/// Imports a GPU shard into "device" memory (host memory standing in).
pub(crate) fn fetch_device(
    t: &SharedTransport,
    desc: &[u8],
    len: usize,
) -> Result<Vec<u8>, AbiError> {
    let mut dev = vec![0u8; len];
    t.import_into_device(
        RSlice::from_slice(desc),
        &gpu_meta(len),
        dev.as_mut_ptr() as u64,
        len as u64,
    )
    .into_result()
    .map(|info| {
        assert!(
            info.note.as_str().contains("staged into cuda:0"),
            "{}",
            info.note
        );
        dev
    })
}

#[test]
fn gpu_shards_are_staged_piece_by_piece_to_host_and_device_destinations() {
    let owner = node(STAND_IN);
    let consumer = node(STAND_IN);
    // Not a multiple of the piece size; 17 pieces through a pool of 2.
    let data = pattern((16 << 16) + 123, 7);
    let small = pattern(100, 9);
    let desc = export_gpu(&owner.t, 1, &data);
    let desc_small = export_gpu(&owner.t, 2, &small);
    // Into host memory (the ordinary fetch of a remote GPU shard).
    let mut host = vec![0u8; data.len()];
    consumer
        .t
        .import_into(
            RSlice::from_slice(&desc),
            &gpu_meta(data.len()),
            RSliceMut::from_mut_slice(&mut host),
        )
        .into_result()
        .unwrap();
    assert!(host == data, "host copy");
    // Into "device" memory through the consumer's ring.
    let mut dev = fetch_device(&consumer.t, &desc, data.len()).unwrap();
    assert!(dev == data, "device copy");
    // A wrong destination length is refused before any request.
    assert_kind(
        consumer
            .t
            .import_into_device(
                RSlice::from_slice(&desc),
                &gpu_meta(data.len()),
                dev.as_mut_ptr() as u64,
                10,
            )
            .into_result(),
        ErrorKind::INVALID_ARGUMENT,
        "destination is 10 bytes",
    );
    // A batch mixing GPU and CPU shards.
    let cpu = pattern(5000, 3);
    let desc_cpu = export(&owner.t, 3, &cpu).unwrap();
    run_many(
        &consumer.t,
        &[
            (
                desc.clone(),
                gpu_meta(data.len()),
                data.len(),
                Want::Bytes(data.clone()),
            ),
            (
                desc_cpu,
                ShardMeta::bytes(5000),
                5000,
                Want::Bytes(cpu.clone()),
            ),
            (desc_small, gpu_meta(100), 100, Want::Bytes(small.clone())),
        ],
    );
    // The owner made at most its pool's buffers, however many pieces went out.
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
    assert!(stat(&owner.t, "device_staging_bytes") > 0);
    for id in 1..=3 {
        owner
            .t
            .unexport(ShardId::from_u128(id))
            .into_result()
            .unwrap();
    }
    assert_kind(
        fetch(&consumer.t, &desc, data.len()),
        ErrorKind::NOT_FOUND,
        "not exported",
    );
}

#[test]
fn many_consumers_of_one_gpu_shard_share_the_owner_s_bounded_pool() {
    let owner = node(STAND_IN);
    let data = pattern(40 * 65536 + 1, 5);
    let desc = export_gpu(&owner.t, 9, &data);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let consumer = node(STAND_IN);
                for _ in 0..3 {
                    assert!(fetch_device(&consumer.t, &desc, data.len()).unwrap() == data);
                }
            });
        }
    });
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
    owner
        .t
        .unexport(ShardId::from_u128(9))
        .into_result()
        .unwrap();
}

/// A GPU shard is staged piece by piece while a slow client reads: until
/// every piece is out of "device" memory, unexport waits (the memory must
/// not be freed); new requests get 404 at once; the bytes that arrive are
/// the shard's. Host memory stands in for the device.
#[test]
fn unexport_of_a_gpu_shard_waits_for_its_staging() {
    let data = pattern(BIG, 15);
    let owner = node(STAND_IN);
    export_gpu(&owner.t, 21, &data);
    let path = wire::shard_path(ShardId::from_u128(21));
    let mut slow = connect(owner.addr);
    slow.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, mut body) = read_head(&mut slow);
    assert_eq!(r.status, 200);
    let (tx, rx) = mpsc::channel();
    let t = Arc::clone(&owner.t);
    let waiter = std::thread::spawn(move || {
        tx.send(t.unexport(ShardId::from_u128(21)).into_result())
            .unwrap();
    });
    // 64 MiB through a pool of two 64 KiB buffers: the stager cannot be
    // done while the client reads nothing.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    assert_eq!(get(owner.addr, &path, None).status, 404);
    let mut chunk = vec![0u8; 1 << 20];
    while body.len() < BIG {
        let n = slow.read(&mut chunk).unwrap();
        assert!(n > 0);
        body.extend_from_slice(&chunk[..n]);
    }
    assert!(body == data, "staged bytes differ");
    rx.recv_timeout(GENEROUS)
        .expect("unexport returns once staging is done")
        .unwrap();
    waiter.join().unwrap();
    // Every buffer went back to the pool.
    assert!(stat(&owner.t, "device_staging_bytes") <= 2 * 65536);
}

/// A client that goes away in the middle of a GPU shard: the stager stops
/// at the next piece, unexport then returns promptly, and the next client
/// gets the whole shard from the same pool.
#[test]
fn a_consumer_that_goes_away_stops_the_staging() {
    let data = pattern(BIG, 16);
    // A stager that kept going would hold unexport past this and fail it.
    let owner = node(&format!("{STAND_IN}\nrequest-timeout = \"10s\""));
    let desc = export_gpu(&owner.t, 22, &data);
    let path = wire::shard_path(ShardId::from_u128(22));
    let mut gone = connect(owner.addr);
    gone.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .unwrap();
    let (r, _) = read_head(&mut gone);
    assert_eq!(r.status, 200);
    drop(gone);
    let consumer = node(STAND_IN);
    assert!(fetch_device(&consumer.t, &desc, data.len()).unwrap() == data);
    owner
        .t
        .unexport(ShardId::from_u128(22))
        .into_result()
        .expect("the stager of the client that left has stopped");
    assert_eq!(stat(&owner.t, "unexport_timeouts"), 0);
}
