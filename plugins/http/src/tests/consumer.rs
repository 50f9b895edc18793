//! The consumer side of whole transport instances: pools, timeouts, batches,
//! and what it accepts from owners (fake and scripted ones included).

#[allow(clippy::wildcard_imports)]
use super::*;

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
pub(super) enum Want {
    Bytes(Vec<u8>),
    Kind(ErrorKind),
}

pub(super) fn run_many(consumer: &SharedTransport, items: &[(Vec<u8>, ShardMeta, usize, Want)]) {
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

#[test]
fn a_new_connection_closed_before_its_response_is_retried_once() {
    // An owner's pending budget evicts a new connection before its first
    // request is answered (a burst of connections from one address): the
    // request is sent again on another new connection.
    let data = pattern(1000, 8);
    let consumer = node("request-timeout = \"30s\"");
    let answer = || Answer::Parts(vec![[ok_head(1000), data.clone()].concat()]);
    let (addr, h) = scripted_owner(vec![vec![Answer::Close], vec![answer()]]);
    let desc = desc_for(&addr, 1, 1000);
    assert_eq!(fetch(&consumer.t, &desc, 1000).unwrap(), data);
    h.join().unwrap();
    assert_eq!(stat(&consumer.t, "retries"), 1);
    assert_eq!(stat(&consumer.t, "client_connections_opened"), 2);
}

#[test]
fn connections_to_owners_that_went_away_are_closed_when_another_is_reached() {
    // A long-lived consumer of short-lived owners (restarted elsewhere, on
    // new ports) keeps neither their pools nor their sockets' descriptors.
    let consumer = node("");
    let data = pattern(5000, 1);
    for round in 0..5u128 {
        let owner = node("");
        let desc = export(&owner.t, round, &data).unwrap();
        assert!(fetch(&consumer.t, &desc, data.len()).unwrap() == data);
        owner
            .t
            .unexport(ShardId::from_u128(round))
            .into_result()
            .unwrap();
        drop(owner);
    }
    // The last owner's idle connection may still be open; the others' are
    // closed by the time a new owner is reached.
    assert!(
        stat(&consumer.t, "client_connections_open") <= 1,
        "{} connections left open",
        stat(&consumer.t, "client_connections_open")
    );
}
