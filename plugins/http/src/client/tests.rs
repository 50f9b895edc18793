use std::net::TcpListener;

use super::*;

fn plain(addr: &str) -> Owner {
    Owner {
        addr: addr.to_owned(),
        tls: false,
    }
}

#[test]
fn a_request_waits_for_a_slot_at_most_request_timeout() {
    let cfg = Config::parse(
        "http",
        "max-connections-per-owner = 1\nrequest-timeout = \"200ms\"",
    )
    .unwrap();
    let client = Client::new(&cfg, None, Arc::default()).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let pool = client.pool(&plain(&l.local_addr().unwrap().to_string()));
    let held = client.checkout(&pool).unwrap();
    let start = Instant::now();
    let e = client.checkout(&pool).err().expect("no slot is free");
    assert_eq!(e.kind, ErrorKind::TIMEOUT);
    assert!(
        e.message.contains("all 1 connections to owner")
            && e.message
                .contains("stayed busy for request-timeout (200ms)"),
        "{e}"
    );
    assert!(start.elapsed() >= Duration::from_millis(200));
    // A slot given back is taken by a waiter.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| client.checkout(&pool).map(|_| ()));
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        waiter.join().unwrap().unwrap();
    });
    assert_eq!(pool.state().busy, 0);
    assert_eq!(client.stats.client_connections_opened.get(), 2);
    // Neither exchange completed: nothing was pooled.
    assert!(pool.state().idle.is_empty());
    assert_eq!(client.stats.client_connections_open.get(), 0);
}

#[test]
fn unused_pools_are_forgotten_with_their_expired_connections() {
    let cfg = Config::parse("http", "idle-timeout = \"50ms\"").unwrap();
    let client = Client::new(&cfg, None, Arc::default()).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let pool = client.pool(&plain(&addr));
    let mut co = client.checkout(&pool).unwrap();
    co.reusable = true;
    drop((co, pool));
    assert_eq!(client.stats.client_connections_open.get(), 1);
    let known = |a: &str| client.pools.lock().unwrap().contains_key(&plain(a));
    let fill = |tag: u32| {
        for i in 0..4u32 {
            client.pool(&plain(&format!("10.{tag}.{}.{}:1", i >> 8, i & 255)));
        }
    };
    // Pools without a request or an idle connection are forgotten; the
    // one holding a fresh idle connection is kept.
    fill(1);
    assert!(known(&addr));
    assert!(!known("10.1.0.0:1"));
    // Once its connection expired, it goes too, closing the connection.
    std::thread::sleep(Duration::from_millis(60));
    fill(2);
    assert!(!known(&addr));
    assert_eq!(client.stats.client_connections_open.get(), 0);
    // Only the last pool made is left: each new one forgets the unused.
    assert_eq!(client.pools.lock().unwrap().len(), 1);
}
