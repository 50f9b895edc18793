//! `dedicated-threads`: connections served each on a thread of its own
//! while the owner has fewer than the budget, given back when outnumbered;
//! all get the same bytes, a connection with a thread polls whatever the
//! others, and the threads end with their connections and at shutdown.

use std::sync::atomic::Ordering;

use super::*;
use crate::server::POLL_AT_ANY_LOAD;

#[test]
fn connections_get_threads_within_the_budget_and_give_them_back_when_outnumbered() {
    let owner = node("dedicated-threads = 2");
    let data = pattern(256 << 10, 21);
    export(&owner.t, 21, &data).unwrap();
    // Two connections: each gets a thread of its own.
    let mut a = connect(owner.addr);
    round_trips_on(&mut a, 21, &data, 2);
    let mut b = connect(owner.addr);
    round_trips_on(&mut b, 21, &data, 2);
    wait_for_stat(&owner.t, "connections_dedicated", 2);
    // A third: it shares the runtime, and the owner, outnumbered, has one
    // of the two with a thread close after its response (its peer reads
    // the end of the stream): then two connections are open, within the
    // budget, and no connection gets a thread's share of the cores to
    // itself while others share the runtime's.
    let mut c = connect(owner.addr);
    round_trips_on(&mut c, 21, &data, 2);
    wait_for_stat_below(&owner.t, "connections_dedicated", 2);
    let ab = [a, b];
    let closed = ab
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let mut byte = [0u8; 1];
            matches!(std::io::Read::read(&mut &**s, &mut byte), Ok(0))
        })
        .count();
    assert_eq!(closed, 1, "one connection with a thread closes");
    assert_eq!(stat(&owner.t, "connections_dedicated"), 1);
    // The shared one goes on, and a consumer through the transport (it
    // reconnects like any consumer of a closed connection) gets the bytes.
    round_trips_on(&mut c, 21, &data, 2);
    let consumer = node("");
    let desc = export(&owner.t, 22, &data).unwrap();
    for _ in 0..3 {
        assert!(fetch(&consumer.t, &desc, data.len()).unwrap() == data);
    }
    // Once the others are gone, a new connection gets a thread again.
    drop(c);
    drop(consumer);
    drop(ab);
    wait_for_stat_below(&owner.t, "connections_open", 1);
    let mut again = connect(owner.addr);
    round_trips_on(&mut again, 21, &data, 2);
    wait_for_stat(&owner.t, "connections_dedicated", 1);
    owner.t.unexport(ShardId::from_u128(21)).unwrap();
    owner.t.unexport(ShardId::from_u128(22)).unwrap();
}

#[test]
fn a_dedicated_connection_polls_while_others_are_open() {
    POLL_AT_ANY_LOAD.store(true, Ordering::Relaxed);
    let owner = node("dedicated-threads = 2\nowner-spin = \"1ms\"");
    let data = pattern(64 << 10, 23);
    export(&owner.t, 23, &data).unwrap();
    // Another connection is open (on a shared runtime it would stop the
    // poll: `owner_poll` tests); both have threads of their own.
    let mut own = connect(owner.addr);
    round_trips_on(&mut own, 23, &data, 1);
    let mut other = connect(owner.addr);
    round_trips_on(&mut other, 23, &data, 1);
    wait_for_stat(&owner.t, "connections_dedicated", 2);
    let before = stat(&owner.t, "owner_polls");
    round_trips_on(&mut own, 23, &data, 10);
    // Its thread ends with it, so all its polls are counted.
    drop(own);
    wait_for_stat_below(&owner.t, "connections_dedicated", 2);
    assert!(
        stat(&owner.t, "owner_polls") > before,
        "no poll on the dedicated connection"
    );
    owner.t.unexport(ShardId::from_u128(23)).unwrap();
}

#[test]
fn dedicated_connections_close_at_shutdown() {
    let owner = node("dedicated-threads = 4");
    let data = pattern(4096, 24);
    export(&owner.t, 24, &data).unwrap();
    let mut conns: Vec<TcpStream> = (0..2).map(|_| connect(owner.addr)).collect();
    for c in &mut conns {
        round_trips_on(c, 24, &data, 1);
    }
    wait_for_stat(&owner.t, "connections_dedicated", 2);
    // Dropping the transport shuts its server down: the idle dedicated
    // connections are closed (their peers read the end of the stream).
    drop(owner);
    for mut c in conns {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(std::io::Read::read(&mut c, &mut b), Ok(0)));
    }
}
