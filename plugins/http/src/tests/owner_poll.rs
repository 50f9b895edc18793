//! `owner-spin`: an owner's connection polls for the next request after a
//! response. The tests poll whatever the machine's load
//! ([`POLL_AT_ANY_LOAD`]), so what a poll does is tested on a busy machine
//! too; whether a poll finds the next request in time is timing, left to
//! the bench.

use std::sync::atomic::Ordering;

use super::*;
use crate::server::POLL_AT_ANY_LOAD;

/// `rounds` GETs of shard `id` on a new keep-alive connection
/// ([`round_trips_on`]); the connection, still open.
fn round_trips(addr: SocketAddr, id: u128, data: &[u8], rounds: usize) -> TcpStream {
    let mut s = connect(addr);
    round_trips_on(&mut s, id, data, rounds);
    s
}

#[test]
fn an_owner_polls_once_per_response_and_serves_what_follows() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    let owner = node("owner-spin = \"1ms\"");
    // Small and large responses: a large one is written in many pieces,
    // and only the end of the whole response may poll.
    let small = pattern(64 << 10, 3);
    let large = pattern(8 << 20, 4);
    export(&owner.t, 1, &small).unwrap();
    export(&owner.t, 2, &large).unwrap();
    drop(round_trips(owner.addr, 1, &small, 20));
    wait_for_stat_below(&owner.t, "connections_open", 1);
    let polls_small = stat(&owner.t, "owner_polls");
    drop(round_trips(owner.addr, 2, &large, 4));
    // One connection at a time: a poll after every response, but after a
    // miss streak (the next request came too late) polls stop for a while.
    let polls = stat(&owner.t, "owner_polls");
    assert!(polls_small >= 1, "no poll after 20 responses");
    assert!(polls > polls_small, "no poll after 4 large responses");
    assert!(polls <= 24, "{polls} polls for 24 responses");
    assert!(stat(&owner.t, "owner_poll_hits") <= polls);
    owner.t.unexport(ShardId::from_u128(1)).unwrap();
    owner.t.unexport(ShardId::from_u128(2)).unwrap();
}

#[test]
fn an_owner_with_another_open_connection_does_not_poll() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    // Connections on the shared runtime (with threads of their own they
    // poll whatever the others: `dedicated` tests).
    let owner = node("owner-spin = \"1ms\"\ndedicated-threads = 0");
    let data = pattern(64 << 10, 9);
    export(&owner.t, 5, &data).unwrap();
    // An idle connection is open: a poll would hold the runtime thread
    // its requests need. (It sends nothing, so it never polls itself: a
    // response of its own would poll once, maybe after `before` is read.)
    let _idle = connect(owner.addr);
    wait_for_stat(&owner.t, "connections_open", 1);
    let before = stat(&owner.t, "owner_polls");
    let _busy = round_trips(owner.addr, 5, &data, 10);
    assert_eq!(stat(&owner.t, "owner_polls"), before);
    // A consumer through the transport gets the same bytes.
    let consumer = node("owner-spin = \"1ms\"");
    let desc = export(&owner.t, 6, &data).unwrap();
    for _ in 0..5 {
        assert!(fetch(&consumer.t, &desc, data.len()).unwrap() == data);
    }
    owner.t.unexport(ShardId::from_u128(5)).unwrap();
    owner.t.unexport(ShardId::from_u128(6)).unwrap();
}

#[test]
fn a_peer_that_closes_while_the_owner_polls_is_let_go() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    let owner = node("owner-spin = \"1ms\"");
    let data = pattern(4096, 5);
    export(&owner.t, 7, &data).unwrap();
    let s = round_trips(owner.addr, 7, &data, 1);
    wait_for_stat(&owner.t, "connections_accepted", 1);
    drop(s);
    // The poll sees the end of the stream; the connection closes.
    wait_for_stat_below(&owner.t, "connections_open", 1);
    owner.t.unexport(ShardId::from_u128(7)).unwrap();
}

#[test]
fn owner_spin_zero_never_polls() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    let owner = node("owner-spin = \"0s\"");
    let data = pattern(4096, 6);
    export(&owner.t, 9, &data).unwrap();
    let _s = round_trips(owner.addr, 9, &data, 5);
    assert_eq!(stat(&owner.t, "owner_polls"), 0);
    owner.t.unexport(ShardId::from_u128(9)).unwrap();
}

#[test]
fn pipelined_requests_are_served() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    let owner = node("owner-spin = \"1ms\"");
    let data = pattern(64 << 10, 8);
    export(&owner.t, 11, &data).unwrap();
    let req = get_request(11);
    // Two requests in one write: the second is in hyper's buffer when
    // the first response leaves.
    let mut a = connect(owner.addr);
    a.write_all(format!("{req}{req}").as_bytes()).unwrap();
    for i in 0..2 {
        let r = read_response(&mut a);
        assert_eq!(r.status, 200, "pipelined response {i}");
        assert!(r.body == data, "pipelined response {i} differs");
    }
    // Then a connection of its own, polled after its responses (the
    // waits make it the only open one, and count its polls once it ends).
    drop(a);
    wait_for_stat_below(&owner.t, "connections_open", 1);
    drop(round_trips(owner.addr, 11, &data, 10));
    wait_for_stat_below(&owner.t, "connections_open", 1);
    assert!(stat(&owner.t, "owner_polls") >= 1);
    owner.t.unexport(ShardId::from_u128(11)).unwrap();
}
