//! Relays between transport instances on 127.0.0.1: a consumer's copy
//! served onward, every piece checked, failover from holders that corrupt,
//! refuse or stall, and removals that reach every copy.

use std::net::TcpListener;

use super::*;
use crate::relay::wire::{JoinRequest, Serves};

/// Owners hash pieces of 16 KiB here, so a small shard has many.
const OWNER: &str = "relay-piece = \"16KiB\"";
const LEN: usize = (1 << 20) + 13;

fn relay_node(extra: &str) -> Node {
    node(&format!(
        "relay = \"on\"\nrelay-min-size = \"64KiB\"\n{extra}"
    ))
}

/// Places a member at `serves` in the owner's tree of `id`, as a join
/// would (with the owner's token, when it has one).
fn forge_member(owner: &Node, id: u128, serves: SocketAddr, auth: Option<&str>) {
    let body = JoinRequest {
        member: 0xf0f0,
        serves: Some(Serves {
            addr: serves.to_string(),
            tls: false,
        }),
        ..JoinRequest::default()
    }
    .encode();
    let path = crate::relay::wire::join_path(ShardId::from_u128(id));
    let r = post(owner.addr, &path, &body, auth);
    assert_eq!(r.status, 200, "{:?}", r.json());
}

#[test]
fn consumers_after_the_first_get_the_shard_from_relays() {
    let owner = node(OWNER);
    let data = pattern(LEN, 3);
    let desc = export(&owner.t, 1, &data).unwrap();
    let consumers: Vec<Node> = (0..3).map(|_| relay_node("")).collect();
    let mut notes = Vec::new();
    for c in &consumers {
        let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
        assert!(got == data, "the bytes are the owner's");
        notes.push(note);
    }
    // A chain in join order: owner -> c0 -> c1 -> c2.
    assert!(notes[0].starts_with("from owner"), "{}", notes[0]);
    assert!(
        notes[1].contains(&format!("from relay {}", consumers[0].addr)),
        "{}",
        notes[1]
    );
    assert!(notes[2].contains(&format!("from relay {}", consumers[1].addr)));
    assert_eq!(
        stat(&owner.t, "bytes_served"),
        LEN as u64,
        "the owner sent one copy"
    );
    assert_eq!(stat(&owner.t, "relay_joins"), 3);
    assert_eq!(stat(&consumers[0].t, "relay_bytes_served"), LEN as u64);
    assert_eq!(stat(&consumers[0].t, "relay_bytes_from_holders"), 0);
    for c in &consumers[1..] {
        assert_eq!(stat(&c.t, "relay_bytes_from_holders"), LEN as u64);
    }
    for c in &consumers {
        assert_eq!(stat(&c.t, "relay_fetches"), 1);
        assert_eq!(stat(&c.t, "relay_copies"), 1);
        assert_eq!(stat(&c.t, "relay_copy_bytes"), LEN as u64);
    }
    // Removal reaches every copy; a later consumer is told the shard is gone.
    owner
        .t
        .unexport(ShardId::from_u128(1))
        .into_result()
        .unwrap();
    for c in &consumers {
        let start = std::time::Instant::now();
        while stat(&c.t, "relay_copies") > 0 {
            assert!(start.elapsed() < GENEROUS, "{c:?} kept its copy");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(stat(&c.t, "relay_copies_dropped"), 1);
    }
    wait_for_stat(&owner.t, "relay_removals_sent", 3);
    assert_eq!(stat(&owner.t, "relay_trees"), 0);
    let late = relay_node("");
    assert_kind(
        fetch(&late.t, &desc, LEN),
        ErrorKind::NOT_FOUND,
        "not exported",
    );
}

#[test]
fn a_relay_past_its_window_sends_a_late_joiner_to_the_owner_unblamed() {
    let owner = node(OWNER);
    let data = pattern(LEN, 5);
    let desc = export(&owner.t, 1, &data).unwrap();
    // Keeps 4 pieces of 16 KiB of a 65-piece shard.
    let first = relay_node("relay-window = \"64KiB\"");
    let (got, note) = fetch_noted(&first.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(note.starts_with("from owner"), "{note}");
    assert_eq!(
        stat(&first.t, "relay_copy_bytes"),
        64 << 10,
        "the window counts"
    );
    // The owner names `first` as the parent of a late joiner, which no
    // longer holds the start: the joiner takes it from the owner, with the
    // right bytes, and does not report `first` as failed.
    let late = relay_node("");
    let (got, note) = fetch_noted(&late.t, &desc, LEN).unwrap();
    assert!(got == data, "the bytes are the owner's");
    assert!(
        note.contains(&format!(
            "relay {} no longer held byte 0 (relay-window)",
            first.addr
        )),
        "{note}"
    );
    assert!(note.starts_with("from owner"), "{note}");
    assert_eq!(
        stat(&late.t, "relay_failovers"),
        0,
        "not a failure of the relay"
    );
    assert_eq!(stat(&late.t, "relay_bytes_from_holders"), 0);
    assert_eq!(stat(&first.t, "relay_bytes_served"), 0);
    assert_eq!(stat(&owner.t, "bytes_served"), 2 * LEN as u64);
    // A relay stream asked for a dropped piece is 410 `evicted`.
    let path = crate::relay::wire::stream_path(ShardId::from_u128(1), 0);
    let r = get(first.addr, &path, None);
    assert_eq!(r.status, 410, "{:?}", r.json());
    let (code, message) = r.json();
    assert_eq!(code, "evicted", "{message}");
    assert!(message.contains("relay-window"), "{message}");
}

/// Every consumer fetches `desc` at once and gets `data`; the bytes the
/// consumers took from relays, and those the owner served.
fn broadcast(owner: &Node, consumers: &[Node], desc: &[u8], data: &[u8]) -> (u64, u64) {
    std::thread::scope(|s| {
        let joins: Vec<_> = consumers
            .iter()
            .map(|c| s.spawn(|| fetch(&c.t, desc, data.len()).unwrap()))
            .collect();
        for j in joins {
            assert!(j.join().unwrap() == data);
        }
    });
    let relayed: u64 = consumers
        .iter()
        .map(|c| stat(&c.t, "relay_bytes_from_holders"))
        .sum();
    (relayed, stat(&owner.t, "bytes_served"))
}

#[test]
fn a_concurrent_broadcast_gives_everyone_the_right_bytes() {
    let owner = node(OWNER);
    let data = pattern(3 << 20, 9);
    let desc = export(&owner.t, 2, &data).unwrap();
    let consumers: Vec<Node> = (0..4).map(|_| relay_node("")).collect();
    let (relayed, served) = broadcast(&owner, &consumers, &desc, &data);
    // A piece a late source sends after another took it over comes twice
    // (and is dropped): duplicates at most add.
    assert!(
        relayed + served >= 4 * data.len() as u64,
        "every byte came from the owner or a relay"
    );
    assert!(relayed > 0, "relays served part of the broadcast");
}

#[test]
fn a_relay_that_corrupts_pieces_is_left_and_the_bytes_stay_right() {
    let owner = node(OWNER);
    let data = pattern(LEN, 5);
    let desc = export(&owner.t, 3, &data).unwrap();
    let bad = relay_node("test-corrupt-relay = true");
    assert!(fetch(&bad.t, &desc, LEN).unwrap() == data);
    let c = relay_node("");
    let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
    assert!(got == data, "never the corrupted bytes");
    assert!(stat(&c.t, "relay_corrupt_pieces") >= 1);
    assert!(stat(&c.t, "relay_failovers") >= 1);
    assert!(
        note.contains(&format!("after relay {} failed at byte 0", bad.addr)),
        "{note}"
    );
}

#[test]
fn a_holder_without_the_token_is_refused_and_the_fetch_goes_on() {
    let token = "auth-token = \"s3cret\"";
    let owner = node(&format!("{OWNER}\n{token}"));
    let data = pattern(LEN, 7);
    let desc = export(&owner.t, 4, &data).unwrap();
    let first = relay_node(token);
    assert!(fetch(&first.t, &desc, LEN).unwrap() == data);
    // A holder that does not know the token, forged into the tree.
    let stranger = relay_node("auth-token = \"other\"");
    forge_member(&owner, 4, stranger.addr, Some("Bearer s3cret"));
    // Joins without the token are refused by the owner itself.
    let r = post(
        owner.addr,
        &crate::relay::wire::join_path(ShardId::from_u128(4)),
        b"",
        None,
    );
    assert_eq!(r.status, 401);
    let c = relay_node(token);
    let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(
        stat(&stranger.t, "auth_failures") >= 1,
        "the stranger refused it"
    );
    assert!(
        note.contains(&format!("relay {} failed", stranger.addr)),
        "{note}"
    );
    assert!(
        note.contains(&format!("from relay {}", first.addr)),
        "{note}"
    );
}

#[test]
fn a_stalled_holder_is_abandoned_after_the_stall_timeout() {
    let owner = node(OWNER);
    let data = pattern(LEN, 11);
    let desc = export(&owner.t, 5, &data).unwrap();
    // Accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    forge_member(&owner, 5, silent.local_addr().unwrap(), None);
    // One source: the parent alone (with more, an alternate takes over
    // sooner; see below).
    let c = relay_node("relay-stall-timeout = \"200ms\"\nrelay-sources = 1");
    let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(
        note.contains(&format!("relay {} failed", silent.local_addr().unwrap())),
        "{note}"
    );
    drop(silent);
}

#[test]
fn what_the_owner_does_not_relay_is_fetched_plainly() {
    // Under relay-min-size: no join at all.
    let owner = node(OWNER);
    let small = pattern(1000, 1);
    let desc = export(&owner.t, 6, &small).unwrap();
    let c = relay_node("");
    let (got, note) = fetch_noted(&c.t, &desc, 1000).unwrap();
    assert!(got == small);
    assert!(note.starts_with("GET /v1/shards/"), "{note}");
    assert_eq!(stat(&owner.t, "relay_joins"), 0);
    // An empty shard is never joined; a forged join of one is refused.
    export(&owner.t, 7, &[]).unwrap();
    let body = JoinRequest {
        member: 1,
        ..JoinRequest::default()
    }
    .encode();
    let r = post(
        owner.addr,
        &crate::relay::wire::join_path(ShardId::from_u128(7)),
        &body,
        None,
    );
    assert_eq!(r.status, 409);
    assert_eq!(r.json().0, "not_relayable");
    assert_eq!(stat(&c.t, "relay_copies"), 0, "no copy kept");
}

#[test]
fn gpu_shards_are_relayed_to_host_and_device_destinations() {
    // Host memory stands in for the device (the staging protocol runs for
    // real): the owner hashes the shard through its staging pool, streams
    // it staged from any offset, and relays hand it on from host copies.
    let stand_in = "test-device-is-host = true\ndevice-piece = \"64KiB\"";
    let owner = node(&format!("{OWNER}\n{stand_in}"));
    let data = pattern(LEN, 2);
    let desc = export_gpu(&owner.t, 10, &data);
    let first = relay_node(stand_in);
    let (got, note) = fetch_noted(&first.t, &desc, LEN).unwrap();
    assert!(got == data, "a host fetch of the GPU shard");
    assert!(note.starts_with("from owner"), "{note}");
    let second = relay_node(stand_in);
    let dev = fetch_device(&second.t, &desc, LEN).unwrap();
    assert!(dev == data, "into the second consumer's \"device\" memory");
    assert_eq!(stat(&second.t, "relay_bytes_from_holders"), LEN as u64);
    let third = relay_node(stand_in);
    assert!(fetch_device(&third.t, &desc, LEN).unwrap() == data);
    assert_eq!(stat(&second.t, "relay_bytes_served"), LEN as u64);
    assert_eq!(
        stat(&owner.t, "bytes_served"),
        LEN as u64,
        "one staged copy"
    );
    // A stream resumed mid-shard is staged from that offset.
    let id = ShardId::from_u128(10);
    let r = get(owner.addr, &format!("/v1/relay/{id}/{}", 100_000), None);
    assert_eq!(r.status, 200);
    assert!(r.body[..] == data[100_000..]);
}

#[test]
fn relay_endpoints_refuse_malformed_requests() {
    let owner = node(OWNER);
    let data = pattern(LEN, 4);
    export(&owner.t, 8, &data).unwrap();
    let id = ShardId::from_u128(8);
    let join = crate::relay::wire::join_path(id);
    let r = post(owner.addr, &join, b"\x02short", None);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("cut short"), "{:?}", r.json());
    let r = post(owner.addr, &join, &[0u8; 4096], None);
    assert_eq!(r.status, 413);
    // A consumer from before BLAKE3 piece hashes is not relayed to: it
    // would accept pieces any holder can forge (it fetches directly).
    let r = post(owner.addr, &join, b"\x01old join", None);
    assert_eq!(r.status, 409);
    assert!(r.json().1.contains("BLAKE3"), "{:?}", r.json());
    let r = get(owner.addr, &format!("/v1/relay/{id}/{}", LEN + 1), None);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("past the end"));
    let r = get(owner.addr, "/v1/relay/nothex/0", None);
    assert_eq!(r.status, 400);
    let r = get(owner.addr, &join, None);
    assert_eq!(r.status, 405);
    // A holder asked for a copy it does not have.
    let c = relay_node("");
    let r = get(c.addr, &format!("/v1/relay/{id}/0"), None);
    assert_eq!(r.status, 404);
    assert!(r.json().1.contains("holds no relay copy"));
    // The owner streams from any byte; a holder only from piece boundaries.
    let desc = export(&owner.t, 9, &data).unwrap();
    fetch(&c.t, &desc, LEN).unwrap();
    let id9 = ShardId::from_u128(9);
    let r = get(c.addr, &format!("/v1/relay/{id9}/100"), None);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("piece boundary"));
    let r = get(c.addr, &format!("/v1/relay/{id9}/{}", 16 << 10), None);
    assert_eq!(r.status, 200);
    assert!(r.body[..] == data[16 << 10..]);
    let r = get(owner.addr, &format!("/v1/relay/{id9}/100"), None);
    assert_eq!(r.status, 200);
    assert!(r.body[..] == data[100..]);
}

#[test]
fn a_joiner_serving_elsewhere_than_where_it_joined_from_is_a_leaf() {
    let owner = node(OWNER);
    let data = pattern(LEN, 12);
    let desc = export(&owner.t, 11, &data).unwrap();
    // Claims to serve on another host: nobody is ever sent there.
    forge_member(&owner, 11, "10.255.0.9:7071".parse().unwrap(), None);
    assert_eq!(stat(&owner.t, "relay_addresses_refused"), 1);
    let c = relay_node("relay-stall-timeout = \"60s\"");
    let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(!note.contains("10.255.0.9"), "{note}");
    assert_eq!(stat(&c.t, "relay_failovers"), 0);
}

#[test]
fn a_relay_that_trickles_bytes_is_left_after_the_stall_timeout() {
    let owner = node(OWNER);
    let data = pattern(LEN, 13);
    let desc = export(&owner.t, 12, &data).unwrap();
    // Answers any request with a proper head, then one byte every 20 ms:
    // never silent for a whole read timeout, far too slow for a piece.
    let trickler = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = trickler.local_addr().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut s, _) = trickler.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head);
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\nx-shardport-len: {LEN}\r\n\r\n"
            );
            s.write_all(reply.as_bytes()).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if s.write_all(&[0]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    forge_member(&owner, 12, addr, None);
    // The parent alone (with more sources, an alternate takes over).
    let c = relay_node("relay-stall-timeout = \"300ms\"\nrelay-sources = 1");
    let (got, note) = fetch_noted(&c.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(note.contains(&format!("relay {addr} failed")), "{note}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    serving.join().unwrap();
}

#[test]
fn a_relay_waiting_for_its_own_parent_is_not_blamed_by_its_child() {
    let owner = node(OWNER);
    let data = pattern(LEN, 14);
    let desc = export(&owner.t, 13, &data).unwrap();
    // The first relay's parent will be a silent holder: it stalls, leaves
    // it after its stall timeout (600 ms) and gets the shard from the
    // owner. The second, below it, gives up waiting sooner (450 ms): it must
    // ask the first again rather than report it. Its one quiet retry ends
    // 900 ms after it started waiting, which leaves the first 300 ms past
    // its own timeout to get bytes flowing (a shorter margin failed on a
    // loaded machine).
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    forge_member(&owner, 13, silent.local_addr().unwrap(), None);
    // One source each (with more, the first would take the shard from its
    // alternate, the owner, without waiting out its timeout).
    let first = relay_node("relay-stall-timeout = \"600ms\"\nrelay-sources = 1");
    let second = relay_node("relay-stall-timeout = \"450ms\"\nrelay-sources = 1");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| fetch_noted(&first.t, &desc, LEN).unwrap());
        // The second joins once the first has joined and is waiting on the
        // silent holder (it has connected to it; the connection is held and
        // never answered): it is put below the first. Waiting for that
        // connection, not a fixed time, keeps the order on a loaded machine.
        let (held, _) = silent.accept().unwrap();
        let b = s.spawn(|| fetch_noted(&second.t, &desc, LEN).unwrap());
        let out = (a.join().unwrap(), b.join().unwrap());
        drop(held);
        out
    });
    assert!(a.0 == data && b.0 == data);
    assert!(
        a.1.contains("failed"),
        "the first left the silent holder: {}",
        a.1
    );
    assert!(
        b.1.contains(&format!("from relay {}", first.addr)) && !b.1.contains("failed"),
        "the second waited for the first instead of blaming it: {}",
        b.1
    );
    assert_eq!(stat(&second.t, "relay_failovers"), 0);
    drop(silent);
}

/// A holder at a port of its own that answers every relay request with a
/// proper head and the first `pieces` pieces of `data` it was asked for,
/// then sends nothing more (a relay whose process stopped mid-stream).
struct StallingHolder {
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StallingHolder {
    fn start(data: Arc<Vec<u8>>, piece: usize, pieces: usize) -> StallingHolder {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let Ok((mut s, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    s.set_nonblocking(false).unwrap();
                    let mut head = [0u8; 4096];
                    let n = s.read(&mut head).unwrap_or(0);
                    let line = String::from_utf8_lossy(&head[..n]).into_owned();
                    // GET /v1/relay/{id}/{from}[-{to}] HTTP/1.1
                    let range = line
                        .split_whitespace()
                        .nth(1)
                        .and_then(|p| p.rsplit('/').next())
                        .unwrap_or("0")
                        .to_owned();
                    let (from, to) = match range.split_once('-') {
                        Some((f, t)) => (f.parse().unwrap(), t.parse().unwrap()),
                        None => (range.parse().unwrap_or(0), data.len()),
                    };
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-shardport-len: {}\r\n\r\n",
                        to - from,
                        data.len()
                    );
                    let end = (from + pieces * piece).min(to);
                    let _ = s.write_all(reply.as_bytes());
                    let _ = s.write_all(&data[from..end]);
                    // Open and silent from here on.
                    held.push(s);
                }
            })
        };
        StallingHolder {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StallingHolder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_consumer_whose_parent_stalls_takes_over_then_reports_it_late_and_it_is_demoted() {
    // 512 pieces in runs of 64: the alternate's 8 runs take far longer
    // than the 4 ms of silence (four lags) a report needs.
    const BIG: usize = 8 << 20;
    let owner = node(OWNER);
    let data = Arc::new(pattern(BIG, 21));
    let desc = export(&owner.t, 21, &data).unwrap();
    // owner <- first <- stalling holder <- consumer: the consumer's parent
    // sends 3 pieces and stops; its alternate is `first`, the parent's
    // parent.
    let first = relay_node("");
    assert!(fetch(&first.t, &desc, BIG).unwrap() == *data);
    let stalling = StallingHolder::start(Arc::clone(&data), 16 << 10, 3);
    forge_member(&owner, 21, stalling.addr, None);
    // A stall timeout far longer than the test: the parent is never left
    // for being silent that long; the alternate takes over when it is late
    // (1 ms here), and after two runs, the parent silent for four lags,
    // the consumer reports it late at a rejoin.
    let c = relay_node("relay-stall-timeout = \"10m\"\nrelay-lag = \"1ms\"");
    let (got, note) = fetch_noted(&c.t, &desc, BIG).unwrap();
    assert!(got == *data, "the bytes are the owner's");
    assert!(
        note.contains(&format!("from relay {}", first.addr))
            && note.contains(&format!("relay {} late (", stalling.addr)),
        "the consumer finished from `first`, its parent once the late one was moved: {note}"
    );
    assert!(!note.contains("failed"), "no failover: {note}");
    assert_eq!(stat(&c.t, "relay_failovers"), 0);
    assert_eq!(stat(&c.t, "relay_late_parents"), 1);
    assert!(stat(&c.t, "relay_takeovers") >= 2);
    assert_eq!(stat(&owner.t, "relay_demotions"), 1);
    assert_eq!(stat(&owner.t, "relay_reports_ignored"), 0);
    // Besides the stalling holder's 3 pieces everything came from `first`
    // (as the alternate, then as the parent), not the owner, which served
    // `first` alone.
    assert!(stat(&c.t, "relay_bytes_from_holders") >= BIG as u64);
    assert!(stat(&first.t, "relay_bytes_served") >= BIG as u64 - 3 * (16 << 10));
    assert_eq!(stat(&owner.t, "bytes_served"), BIG as u64);
    // The consumer's copy is whole and in order: a later joiner gets it
    // from the consumer, never from the demoted holder.
    let late = relay_node("relay-sources = 1");
    let (got, note) = fetch_noted(&late.t, &desc, BIG).unwrap();
    assert!(got == *data);
    assert!(note.contains(&format!("from relay {}", c.addr)), "{note}");
    drop(stalling);
}

#[test]
fn a_relay_its_owner_demoted_rejoins_and_finishes_from_another_holder() {
    // The owner names no alternates (`relay-sources = 1`): the relay's only
    // source is its parent, a holder that sends 3 pieces and stops.
    let owner = node(&format!("{OWNER}\nrelay-sources = 1"));
    let data = Arc::new(pattern(LEN, 25));
    let desc = export(&owner.t, 25, &data).unwrap();
    let stalling = StallingHolder::start(Arc::clone(&data), 16 << 10, 3);
    forge_member(&owner, 25, stalling.addr, None);
    // Two sources at the relay: the path that looks for its owner's move
    // while no piece comes. Unmoved, it would wait 20 s for its parent,
    // then fail over (the test fails: no move in the note).
    let relay = relay_node("relay-stall-timeout = \"20s\"");
    let path = crate::relay::wire::join_path(ShardId::from_u128(25));
    let child = |failed: Option<String>| {
        JoinRequest {
            member: 0xc41d,
            late: failed.is_some(),
            failed,
            alternates: true,
            ..JoinRequest::default()
        }
        .encode()
    };
    let (got, note) = std::thread::scope(|s| {
        let f = s.spawn(|| fetch_noted(&relay.t, &desc, LEN));
        // It has its 3 pieces and waits on the silent holder.
        wait_for_stat(&relay.t, "relay_bytes_from_holders", 3 * (16 << 10));
        // A consumer joins below it, then reports it late.
        assert_eq!(post(owner.addr, &path, &child(None), None).status, 200);
        let r = post(
            owner.addr,
            &path,
            &child(Some(relay.addr.to_string())),
            None,
        );
        assert_eq!(r.status, 200, "{:?}", r.json());
        f.join().unwrap()
    })
    .unwrap();
    assert!(got == *data, "the bytes are the owner's");
    assert!(note.contains("moved by the owner"), "{note}");
    assert_eq!(stat(&owner.t, "relay_demotions"), 1);
    assert_eq!(stat(&relay.t, "relay_moves"), 1);
    assert_eq!(stat(&relay.t, "relay_failovers"), 0);
    drop(stalling);
}

/// A report of a holder the reporter was never given changes nothing and
/// is counted; a malformed one is refused with the reason.
#[test]
fn forged_late_reports_change_nothing() {
    // Fanout 2: the stranger's join takes the owner's second slot, not
    // the one under `first`.
    let owner = node(&format!("{OWNER}\nrelay-fanout = 2"));
    let data = pattern(LEN, 24);
    let desc = export(&owner.t, 24, &data).unwrap();
    let first = relay_node("");
    assert!(fetch(&first.t, &desc, LEN).unwrap() == data);
    let path = crate::relay::wire::join_path(ShardId::from_u128(24));
    // A stranger reports `first` late.
    let forged = JoinRequest {
        member: 0xbad,
        failed: Some(first.addr.to_string()),
        late: true,
        alternates: true,
        ..JoinRequest::default()
    };
    let r = post(owner.addr, &path, &forged.encode(), None);
    assert_eq!(r.status, 200, "{:?}", r.json());
    assert_eq!(stat(&owner.t, "relay_reports_ignored"), 1);
    assert_eq!(stat(&owner.t, "relay_demotions"), 0);
    // `first` still serves the next joiner.
    let second = relay_node("");
    let (got, note) = fetch_noted(&second.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(
        note.contains(&format!("from relay {}", first.addr)),
        "{note}"
    );
    // The late flag without an address: 400 with the reason.
    let mut bad = JoinRequest {
        failed: None,
        late: false,
        ..forged
    }
    .encode();
    bad[17] |= 8;
    let r = post(owner.addr, &path, &bad, None);
    assert_eq!(r.status, 400);
    assert!(r.json().1.contains("late flag"), "{:?}", r.json());
    // A move notice for a shard a node does not hold: answered, nothing
    // happens.
    let copy = crate::relay::wire::copy_path(ShardId::from_u128(99));
    let r = post(first.addr, &copy, &[], None);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"{\"rejoining\":false}");
}

#[test]
fn many_sources_give_a_concurrent_broadcast_the_right_bytes() {
    let owner = node(&format!("{OWNER}\nrelay-sources = 4"));
    let data = pattern(3 << 20, 23);
    let desc = export(&owner.t, 22, &data).unwrap();
    let consumers: Vec<Node> = (0..6)
        .map(|i| relay_node(&format!("relay-sources = {}", 2 + i % 3)))
        .collect();
    let (relayed, served) = broadcast(&owner, &consumers, &desc, &data);
    assert!(
        relayed + served >= 6 * data.len() as u64,
        "every byte came from the owner or a relay (duplicates at most add)"
    );
    // Relay streams of a range: piece boundaries only.
    let path = format!(
        "{}/0-1000",
        crate::relay::wire::copy_path(ShardId::from_u128(22))
    );
    let r = get(consumers[0].addr, &path, None);
    assert_eq!(r.status, 400, "{:?}", r.json());
    assert!(r.json().1.contains("piece boundary"));
    let ok = crate::relay::wire::range_path(ShardId::from_u128(22), 16 << 10, 48 << 10);
    let r = get(owner.addr, &ok, None);
    assert_eq!(r.status, 200);
    assert!(r.body == data[16 << 10..48 << 10]);
}

#[test]
fn an_oversized_declared_join_is_refused_at_once() {
    // A request-timeout far longer than the socket's read timeout below:
    // an answer that came only after it would time the read out.
    let owner = node(&format!("{OWNER}\nrequest-timeout = \"120s\""));
    export(&owner.t, 8, &pattern(LEN, 4)).unwrap();
    let join = crate::relay::wire::join_path(ShardId::from_u128(8));
    let mut s = connect(owner.addr);
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(
        format!("POST {join} HTTP/1.1\r\nhost: test\r\ncontent-length: 1000000000000\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    let r = read_response(&mut s);
    assert_eq!(r.status, 413, "{:?}", r.json());
    assert!(r.json().1.contains("at most"), "{:?}", r.json());
}

#[test]
fn a_holder_that_joins_by_name_is_handed_out_by_the_address_verified() {
    let owner = node(OWNER);
    export(&owner.t, 11, &pattern(LEN, 5)).unwrap();
    let path = crate::relay::wire::join_path(ShardId::from_u128(11));
    let join = |member: u64, serves: Option<&str>| {
        JoinRequest {
            member,
            serves: serves.map(|a| Serves {
                addr: a.into(),
                tls: false,
            }),
            ..JoinRequest::default()
        }
        .encode()
    };
    // A name that resolves to where the join came from is accepted...
    let r = post(owner.addr, &path, &join(1, Some("localhost:7333")), None);
    assert_eq!(r.status, 200, "{:?}", r.json());
    // ...and the next member is sent to the IP the owner verified, never
    // to the name (which could resolve elsewhere by then).
    let r = post(owner.addr, &path, &join(2, None), None);
    assert_eq!(r.status, 200, "{:?}", r.json());
    let reply = crate::relay::wire::JoinReply::decode(&r.body, LEN as u64, 1).unwrap();
    assert_eq!(
        reply.parent,
        crate::relay::wire::Parent::Holder(Serves {
            addr: "127.0.0.1:7333".into(),
            tls: false,
        })
    );
}

#[test]
fn only_the_owner_drops_or_moves_a_holders_copy() {
    let owner = node(OWNER);
    let data = pattern(LEN, 6);
    let desc = export(&owner.t, 12, &data).unwrap();
    let holder = relay_node("");
    assert!(fetch(&holder.t, &desc, LEN).unwrap() == data);
    assert_eq!(stat(&holder.t, "relay_copies"), 1);
    // Another token holder (any consumer) asks the holder to drop or move
    // its copy: without the owner's key, or with a made-up one, refused.
    let path = crate::relay::wire::copy_path(ShardId::from_u128(12));
    for (method, body) in [
        ("DELETE", &b""[..]),
        ("DELETE", &[0u8; 16][..]),
        ("POST", &[9u8; 16][..]),
    ] {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let r = raw(holder.addr, &req);
        assert_eq!(r.status, 403, "{method}: {:?}", r.json());
        assert!(r.json().1.contains("only the owner"), "{:?}", r.json());
    }
    assert_eq!(stat(&holder.t, "relay_copies"), 1, "the copy stays");
    assert_eq!(stat(&holder.t, "relay_notices_refused"), 3);
    // It still serves the next consumer.
    let next = relay_node("");
    let (got, note) = fetch_noted(&next.t, &desc, LEN).unwrap();
    assert!(got == data);
    assert!(
        note.contains(&format!("from relay {}", holder.addr)),
        "{note}"
    );
    // The owner's removal carries the key: the copies go.
    owner
        .t
        .unexport(ShardId::from_u128(12))
        .into_result()
        .unwrap();
    wait_for_stat(&holder.t, "relay_copies_dropped", 1);
    assert_eq!(stat(&holder.t, "relay_copies"), 0);
}

#[test]
fn a_shard_removed_mid_fetch_is_not_returned_even_if_a_holder_serves_it_all() {
    let owner = node(OWNER);
    let data = pattern(LEN, 15);
    let desc = export(&owner.t, 14, &data).unwrap();
    // A holder that ignores removals: it serves the owner's own bytes (they
    // pass every piece check), but only after the owner removed the shard.
    let holder = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap();
    let (asked, removed) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let serving = {
        let (asked, removed, data) = (asked.0, removed.1, data.clone());
        std::thread::spawn(move || {
            let (mut s, _) = holder.accept().unwrap();
            let mut head = [0u8; 4096];
            let _ = s.read(&mut head);
            asked.send(()).unwrap();
            removed.recv().unwrap();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\nx-shardport-len: {LEN}\r\n\r\n"
            );
            s.write_all(reply.as_bytes()).unwrap();
            s.write_all(&data).unwrap();
        })
    };
    forge_member(&owner, 14, addr, None);
    let c = relay_node("relay-sources = 1");
    let fetching = std::thread::spawn({
        let t = c.t.clone();
        let desc = desc.clone();
        move || fetch(&t, &desc, LEN)
    });
    asked.1.recv().unwrap();
    owner
        .t
        .unexport(ShardId::from_u128(14))
        .into_result()
        .unwrap();
    removed.0.send(()).unwrap();
    assert_kind(
        fetching.join().unwrap(),
        ErrorKind::NOT_FOUND,
        "was removed",
    );
    serving.join().unwrap();
    assert_eq!(stat(&c.t, "relay_copies"), 0, "no copy of a removed shard");
}
