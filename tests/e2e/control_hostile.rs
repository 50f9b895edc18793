//! The control endpoint against hostile clients and servers: slow heads
//! cannot lock operators out, a trickled head is cut off at its deadline,
//! ambiguous framing is refused in both directions (issue 13, items 1-2).

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

use shardport_control::{client, ControlServer, Limits, MAX_PENDING};
use shardport_host::Node;

use crate::util;

/// A safety bound on loops that wait for the server; never reached when
/// the server behaves.
const SAFETY: Duration = Duration::from_secs(30);

fn node() -> Node {
    Node::start(util::parse(&util::shm_plugin("pool-size = \"1MiB\""))).unwrap()
}

/// Sends `req` whole and returns everything the server answers.
fn raw(addr: &str, req: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(SAFETY)).unwrap();
    let _ = c.write_all(req);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut r = String::new();
    let _ = c.read_to_string(&mut r);
    r
}

#[test]
fn clients_trickling_their_heads_do_not_lock_out_an_operator() {
    let n = node();
    let server = ControlServer::start(&n, "127.0.0.1:0", Some("tok".into())).unwrap();
    let addr = server.addr().to_string();
    // More slow clients than the pending budget, each holding a started
    // head open (one byte at a time would do the same, only slower).
    let attackers: Vec<TcpStream> = (0..MAX_PENDING + 16)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /v1/stats HTTP/1.1\r\nx-slow: ").unwrap();
            s
        })
        .collect();
    // An operator with the token still gets through, repeatedly.
    for _ in 0..3 {
        let stats = client::call(&addr, "GET", "/v1/stats", Some("tok"), &[], SAFETY)
            .expect("an authenticated operator was locked out");
        assert!(stats.get("shards_owned").is_some(), "{stats}");
    }
    assert!(
        server.evicted_total() >= 16,
        "the oldest pending connections were not evicted: {}",
        server.evicted_total()
    );
    assert!(server.pending() <= MAX_PENDING);
    drop(attackers);
}

#[test]
fn a_head_trickled_past_its_deadline_is_cut_off() {
    let n = node();
    let limits = Limits {
        head_deadline: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = ControlServer::start_with(&n, "127.0.0.1:0", None, limits).unwrap();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    // One byte every 20 ms: each read is quick, the head never ends.
    for b in b"GET /v1/stats HTTP/1.1\r\nx: "
        .iter()
        .chain([b'a'; 4096].iter())
        .cycle()
    {
        assert!(
            start.elapsed() < SAFETY,
            "the server never cut the head off"
        );
        if s.write_all(&[*b]).is_err() {
            // Closed: whatever answer arrived is still readable.
            let _ = s.read_to_end(&mut answer);
            break;
        }
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => answer.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        if answer.ends_with(b"}") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("deadline"), "{answer}");
}

#[test]
fn ambiguous_request_framing_is_refused() {
    let n = node();
    let server = ControlServer::start(&n, "127.0.0.1:0", None).unwrap();
    let addr = server.addr().to_string();
    let body = r#"{"all": true}"#;
    let cases: [(&str, String); 7] = [
        (
            "more than one content-length",
            format!("content-length: {}\r\ncontent-length: 99", body.len()),
        ),
        (
            "more than one content-length",
            format!("content-length: {0}\r\ncontent-length: {0}", body.len()),
        ),
        (
            "ambiguous framing",
            format!(
                "transfer-encoding: chunked\r\ncontent-length: {}",
                body.len()
            ),
        ),
        (
            "transfer-encoding is not supported",
            "transfer-encoding: chunked".to_owned(),
        ),
        (
            "obsolete line folding",
            format!("content-length: {}\r\n x-folded: 1", body.len()),
        ),
        (
            "bare CR",
            format!("content-length: {}\rx-smuggled: 1", body.len()),
        ),
        ("is not a token", format!("content-length : {}", body.len())),
    ];
    for (expected, fields) in cases {
        let r = raw(
            &addr,
            format!("POST /v1/drain HTTP/1.1\r\n{fields}\r\n\r\n{body}").as_bytes(),
        );
        assert!(
            r.starts_with("HTTP/1.1 400") && r.contains(expected),
            "{fields:?}: expected 400 `{expected}`, got {r}"
        );
    }
    // The same request framed once is served.
    let r = raw(
        &addr,
        format!(
            "POST /v1/drain HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
}

#[test]
fn a_wrong_token_is_refused_before_the_rest_of_the_head() {
    let n = node();
    let server = ControlServer::start(&n, "127.0.0.1:0", Some("tok".into())).unwrap();
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(SAFETY)).unwrap();
    // The head never ends; the refusal comes anyway.
    s.write_all(b"GET /v1/stats HTTP/1.1\r\nauthorization: Bearer nope\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// A one-shot server answering `response` to the first request.
fn fake_server(response: Vec<u8>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            // Read the whole request head (the client sends no body here).
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(&response);
        }
    });
    addr
}

#[test]
fn the_client_refuses_ambiguous_or_oversized_responses() {
    let cases: [(&[u8], &str); 5] = [
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
            "more than one content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "transfer-encoding",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}trailing",
            "content-length said 2",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n{}",
            "over the client's limit",
        ),
        (b"HTTP/1.1 2x0 OK\r\n\r\n{}", "malformed status line"),
    ];
    for (response, expected) in cases {
        let addr = fake_server(response.to_vec());
        let e = client::call(&addr, "GET", "/v1/stats", None, &[], SAFETY).unwrap_err();
        assert!(
            e.to_string().contains(expected),
            "{:?}: expected `{expected}`, got `{e}`",
            String::from_utf8_lossy(response)
        );
    }
}
