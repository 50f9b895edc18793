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
    AbiError, Device, ErrorKind, ExportRequest, ImportItem, PluginContext, RSlice, RSliceMut,
    ShardId, ShardMeta, SharedBytes, SharedTransport,
};
use shardport_kit::testing;

use crate::{descriptor::Descriptor, wire, HttpTransport};

mod consumer;
mod dedicated;
mod gpu;
mod owner_poll;
mod relay;
mod tls;

pub(crate) use gpu::{export_gpu, fetch_device, gpu_meta, STAND_IN};

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
        t: Arc::new(shardport_kit::into_transport_box(h)),
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

/// A keep-alive GET of shard `id`.
fn get_request(id: u128) -> String {
    format!(
        "GET {} HTTP/1.1\r\nhost: test\r\n\r\n",
        wire::shard_path(ShardId::from_u128(id))
    )
}

/// `rounds` GETs of shard `id` on `s`, each read whole and compared with
/// `data`.
fn round_trips_on(s: &mut TcpStream, id: u128, data: &[u8], rounds: usize) {
    let req = get_request(id);
    for round in 0..rounds {
        s.write_all(req.as_bytes()).unwrap();
        let r = read_response(s);
        assert_eq!(r.status, 200, "round {round}");
        assert!(r.body == data, "round {round}: body differs");
    }
}

/// Waits until counter `name` of `t` reaches `at_least` (the owner counts
/// some events just after the client can see their effect); fails after
/// [`GENEROUS`].
fn wait_for_stat(t: &shardport_abi::SharedTransport, name: &str, at_least: u64) {
    wait_for_stat_to(t, name, |v| v >= at_least, &format!("reach {at_least}"));
}

/// Waits until gauge `name` of `t` is below `below`; fails after
/// [`GENEROUS`].
fn wait_for_stat_below(t: &shardport_abi::SharedTransport, name: &str, below: u64) {
    wait_for_stat_to(t, name, |v| v < below, &format!("fall below {below}"));
}

/// Waits until stat `name` of `t` satisfies `done`; fails after
/// [`GENEROUS`], saying it did not `what`.
fn wait_for_stat_to(
    t: &shardport_abi::SharedTransport,
    name: &str,
    done: impl Fn(u64) -> bool,
    what: &str,
) {
    let start = std::time::Instant::now();
    while !done(stat(t, name)) {
        assert!(
            start.elapsed() < GENEROUS,
            "{name} stayed at {} (did not {what})",
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

/// At `max-connections`, a kept-alive connection does not keep its place
/// while another waits in the accept backlog: the served one closes after
/// its response (rotated), the waiting one is served, and so is the first
/// when it reconnects. Nobody waiting, nobody is rotated.
#[test]
fn a_connection_waiting_at_max_connections_gets_a_turn() {
    let owner = node(
        "max-connections = 1\nheader-timeout = \"100ms\"\nidle-timeout = \"10m\"\ndedicated-threads = 0",
    );
    let data = pattern(4096, 31);
    export(&owner.t, 31, &data).unwrap();
    let mut a = connect(owner.addr);
    // Alone at the limit for several watchdog periods (25 ms): kept.
    for _ in 0..4 {
        round_trips_on(&mut a, 31, &data, 1);
        std::thread::sleep(Duration::from_millis(40));
    }
    assert_eq!(stat(&owner.t, "connections_rotated"), 0);
    // A second consumer waits in the backlog with its request sent.
    let mut b = connect(owner.addr);
    b.write_all(get_request(31).as_bytes()).unwrap();
    assert!(
        closed_by_peer(&mut a),
        "the served connection gives its place"
    );
    let r = read_response(&mut b);
    assert_eq!(r.status, 200);
    assert!(r.body == data);
    // The first reconnects behind it and is served in turn.
    let mut again = connect(owner.addr);
    round_trips_on(&mut again, 31, &data, 1);
    assert!(closed_by_peer(&mut b), "the second gave its place back");
    assert!(stat(&owner.t, "connections_rotated") >= 2);
    owner.t.unexport(ShardId::from_u128(31)).unwrap();
}

/// Two consumers fetching in a loop from an owner with one place: the
/// place rotates between them, each reconnects after its connection was
/// closed for the other, and no fetch fails.
#[test]
fn consumers_sharing_one_place_both_fetch_without_errors() {
    let owner = node(
        "max-connections = 1\nheader-timeout = \"100ms\"\nidle-timeout = \"10m\"\ndedicated-threads = 0",
    );
    let data = pattern(64 << 10, 32);
    let desc = export(&owner.t, 32, &data).unwrap();
    let fetched = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let consumer = node("");
                    let until = std::time::Instant::now() + Duration::from_millis(600);
                    let mut n = 0u32;
                    while std::time::Instant::now() < until {
                        let got = fetch(&consumer.t, &desc, data.len()).expect("a fetch failed");
                        assert!(got == data);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        fetched.iter().all(|&n| n > 0),
        "both consumers fetched: {fetched:?}"
    );
    assert!(stat(&owner.t, "connections_rotated") >= 1);
    owner.t.unexport(ShardId::from_u128(32)).unwrap();
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
    Ok(Arc::new(shardport_kit::into_transport_box(h)))
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
