//! A limit exhausted under load is what config says (issue 27): with
//! `fetch.exhausted-wait` unset, a fetch that meets a full lease table fails
//! at once naming the limit; with it, the fetch waits (retrying, counted in
//! the metrics) until a lease is released, up to the deadline, and then
//! fails naming the limit. Real owner and consumer nodes on the real
//! posix-shm `.so`, a lease table of two.

use std::time::Duration;

use shardport_host::{FetchMode, Node, TensorSpec};

use crate::util;

fn node(prefix: &str, fetch: &str) -> Node {
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n[fetch]\n{fetch}\n{}",
        util::shm_plugin(&format!(
            "segment-prefix = \"{prefix}\"\npool-size = \"8MiB\"\nmax-leases = 2"
        ))
    )))
    .expect("node starts")
}

#[test]
fn a_full_lease_table_fails_at_once_or_waits_as_configured() {
    let prefix = format!("bp{}", std::process::id());
    let owner = node(&prefix, "");
    let spec = TensorSpec::bytes(4096);
    let h = owner.put(&[5u8; 4096], &spec, Default::default()).unwrap();

    // No wait: the third view fails naming the limit.
    let eager = node(&prefix, "");
    let a = eager.fetch_mode(&h, FetchMode::View).unwrap();
    let b = eager.fetch_mode(&h, FetchMode::View).unwrap();
    let e = eager
        .fetch_mode(&h, FetchMode::View)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max-leases"), "{e}");
    assert_eq!(eager.metrics_snapshot().exhausted_waits, 0);
    drop((a, b));

    // Waiting: the third view is served once another is released.
    let patient = node(&prefix, "exhausted-wait = \"20s\"");
    let a = patient.fetch_mode(&h, FetchMode::View).unwrap();
    let b = patient.fetch_mode(&h, FetchMode::View).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(a);
    });
    let c = patient
        .fetch_mode(&h, FetchMode::View)
        .expect("served once a lease is released");
    assert!(c.data.iter().all(|&x| x == 5));
    release.join().unwrap();
    assert!(patient.metrics_snapshot().exhausted_waits > 0);
    drop((b, c));

    // Waiting, but nothing is released within the deadline: the limit is named.
    let short = node(&prefix, "exhausted-wait = \"50ms\"");
    let a = short.fetch_mode(&h, FetchMode::View).unwrap();
    let b = short.fetch_mode(&h, FetchMode::View).unwrap();
    let e = short
        .fetch_mode(&h, FetchMode::View)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max-leases"), "{e}");
    assert!(short.metrics_snapshot().exhausted_waits > 0);
    drop((a, b));
}

#[test]
fn a_bad_exhausted_wait_is_a_config_error_naming_it() {
    let text = format!(
        "[fetch]\nexhausted-wait = \"soon\"\n{}",
        util::shm_plugin("")
    );
    let e = shardport_host::config::parse_str(&text, shardport_host::config::Origin::embedded())
        .unwrap_err()
        .to_string();
    assert!(e.contains("fetch.exhausted-wait"), "{e}");
}
