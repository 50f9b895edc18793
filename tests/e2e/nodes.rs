//! Several nodes in one process: no process globals, no collisions.

use shardport_host::{FetchMode, Node, TensorSpec};

use crate::util;

fn node(extra: &str) -> Node {
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\nchecksum = \"xxh3\"\n{}",
        util::shm_plugin(extra)
    )))
    .expect("node starts")
}

#[test]
fn two_nodes_in_one_process_fetch_each_others_shards() {
    let a = node("pool-size = \"8MiB\"");
    let b = node("pool-size = \"8MiB\"");
    assert_ne!(a.tag(), b.tag());
    let ha = a
        .put(&[7u8; 1000], &TensorSpec::bytes(1000), Default::default())
        .unwrap();
    let hb = b
        .put(&[9u8; 1000], &TensorSpec::bytes(1000), Default::default())
        .unwrap();
    assert_ne!(ha.exports[0].descriptor, hb.exports[0].descriptor);
    let fa = b.fetch_mode(&ha, FetchMode::View).unwrap();
    let fb = a.fetch_mode(&hb, FetchMode::Copy).unwrap();
    assert!(fa.data.iter().all(|&x| x == 7));
    assert!(fb.data.iter().all(|&x| x == 9));
    assert!(fa.data.is_view() && !fb.data.is_view());
    // Each node's segments carry its own tag.
    assert!(!util::shm_segments(a.tag()).is_empty());
    assert!(!util::shm_segments(b.tag()).is_empty());
    let tag_a = a.tag().to_owned();
    drop(fa);
    drop(a);
    assert_eq!(util::shm_segments(&tag_a), Vec::<String>::new());
    // b is unaffected.
    let again = b.fetch_mode(&hb, FetchMode::Copy).unwrap();
    assert!(again.data.iter().all(|&x| x == 9));
}

#[test]
fn put_validates_its_arguments() {
    let n = node("pool-size = \"1MiB\"");
    let err = n
        .put(
            &[0u8; 10],
            &TensorSpec {
                dtype: shardport_abi::DType::BF16,
                shape: vec![4],
                device: shardport_abi::Device::CPU,
            },
            Default::default(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid shard: 10 bytes given, dtype bf16 with shape [4] needs 8"
    );
    // A full pool is an error, not a crash, and names the config key.
    let err = n
        .put(
            &vec![0u8; 2 << 20],
            &TensorSpec::bytes(2 << 20),
            Default::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("shard storage in `posix-shm` failed:"),
        "{err}"
    );
    assert!(err.contains("pool-size"), "{err}");
}

#[test]
fn checksums_are_computed_at_put_and_checked_at_fetch() {
    let n = node("pool-size = \"1MiB\"");
    let h = n
        .put(&[5u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    let c = h.meta.checksum.into_option().expect("checksum set");
    assert_eq!(c.value, xxhash_rust::xxh3::xxh3_64(&[5u8; 4096]));
    assert!(n.fetch(&h).is_ok());
    // A handle whose checksum does not match the bytes is caught.
    let mut bad = h.clone();
    bad.meta.checksum = shardport_abi::ROption::RSome(shardport_abi::Checksum {
        algo: c.algo,
        value: c.value ^ 1,
    });
    let err = n.fetch_mode(&bad, FetchMode::Copy).unwrap_err().to_string();
    assert!(err.contains("checksum mismatch via `posix-shm`"), "{err}");
    // Counted once per failed attempt, by a single fetch and in a batch.
    let errors = || n.stats().transports["posix-shm"].errors;
    assert_eq!(errors(), 1);
    let r = n.fetch_many(&[bad], FetchMode::Copy).unwrap();
    assert!(r[0]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("checksum mismatch"));
    assert_eq!(
        errors(),
        2,
        "a batch's checksum mismatch is one error, not two"
    );
}

fn consumer(fetch_and_cache: &str) -> Node {
    Node::start(util::parse(&format!(
        "{fetch_and_cache}\n{}",
        util::shm_plugin("pool-size = \"1MiB\"")
    )))
    .expect("consumer starts")
}

#[test]
fn fetch_many_keeps_input_order_isolates_failures_and_bounds_the_batch() {
    let a = node("pool-size = \"4MiB\"");
    let b = node("pool-size = \"4MiB\"");
    let put = |n: &Node, v: u8| {
        n.put(&[v; 5000], &TensorSpec::bytes(5000), Default::default())
            .unwrap()
    };
    let (a1, b1, a2, gone) = (put(&a, 1), put(&b, 2), put(&a, 3), put(&b, 4));
    assert!(b.remove(&[gone.id]).is_empty());
    let c = consumer("[fetch]\nmax-batch = 4");
    let results = c
        .fetch_many(
            &[a1.clone(), b1.clone(), a2.clone(), gone.clone()],
            FetchMode::Copy,
        )
        .unwrap();
    for (r, v) in results.iter().take(3).zip([1u8, 2, 3]) {
        let f = r.as_ref().expect("fetched");
        assert!(f.data.iter().all(|&x| x == v));
        assert_eq!(f.selection.transport, "posix-shm");
    }
    let err = results[3].as_ref().unwrap_err().to_string();
    assert!(
        err.contains(&gone.id.to_string()) && err.ends_with("(not_found)"),
        "{err}"
    );
    let err = c
        .fetch_many(&[a1.clone(), b1, a2, a1.clone(), a1], FetchMode::Copy)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch of 5 shards exceeds fetch.max-batch = 4"
    );
}

#[test]
fn the_explicit_cache_serves_repeats_until_drained() {
    let owner = node("pool-size = \"1MiB\"");
    let h = owner
        .put(&[8u8; 256], &TensorSpec::bytes(256), Default::default())
        .unwrap();
    let c = consumer("[cache]\npolicy = \"explicit\"");
    let first = c.fetch_mode(&h, FetchMode::View).unwrap();
    assert_eq!(first.selection.transport, "posix-shm");
    let second = c.fetch_mode(&h, FetchMode::View).unwrap();
    assert_eq!(second.selection.transport, "cache");
    assert!(std::sync::Arc::ptr_eq(&first.data, &second.data));
    assert_eq!(c.stats().cache_entries, 1);
    assert_eq!(c.drain(&[h.id]), 1);
    assert_eq!(c.stats().cache_entries, 0);
    assert_eq!(
        c.fetch_mode(&h, FetchMode::View)
            .unwrap()
            .selection
            .transport,
        "posix-shm"
    );
}

#[test]
fn a_hostile_handle_claiming_a_huge_shard_is_refused_before_any_allocation() {
    let owner = node("pool-size = \"1MiB\"");
    let mut h = owner
        .put(&[1u8; 64], &TensorSpec::bytes(64), Default::default())
        .unwrap();
    // Consistent with its dtype and shape, so it decodes; 2^50 bytes.
    h.meta.shape = shardport_abi::RVec::from(vec![1u64 << 50]);
    h.meta.byte_len = 1 << 50;
    let decoded = shardport_host::Handle::from_bytes(&h.to_bytes()).expect("structurally valid");
    let c = consumer("[node]\nmax-shard-size = \"1GiB\"");
    for mode in [FetchMode::Copy, FetchMode::View] {
        let err = c.fetch_mode(&decoded, mode).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("invalid shard: shard {} claims 1125899906842624 bytes, over node.max-shard-size = 1073741824", h.id)
        );
    }
    let err = c
        .put_with(
            &TensorSpec::bytes(2 << 30),
            Default::default(),
            |_| unreachable!(),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "invalid shard: 2147483648 bytes exceeds node.max-shard-size = 1073741824"
    );
}

/// The owner exports through posix-shm (one segment per shard) and a second
/// transport. Half of the shm segments vanish behind its back, so the shm
/// path fails part-way through the batch; `fallback` must complete exactly
/// the remainder.
fn failover_fetches_only_what_is_missing(fallback_table: &str, fallback: &str) {
    let owner = Node::start(util::parse(&format!(
        "{}{fallback_table}",
        util::shm_plugin("allocation = \"segment-per-shard\"")
    )))
    .unwrap();
    let handles: Vec<_> = (0..8u8)
        .map(|v| {
            owner
                .put(&[v; 3000], &TensorSpec::bytes(3000), Default::default())
                .unwrap()
        })
        .collect();
    let mut segments = util::shm_segments(&format!("{}-s", owner.tag()));
    segments.sort();
    assert_eq!(segments.len(), 8, "{segments:?}");
    for name in segments.iter().step_by(2) {
        std::fs::remove_file(std::path::Path::new("/dev/shm").join(name)).unwrap();
    }
    let c = Node::start(util::parse(&format!(
        "{}{fallback_table}",
        util::shm_plugin("pool-size = \"1MiB\"")
    )))
    .unwrap();
    let results = c.fetch_many(&handles, FetchMode::Copy).unwrap();
    let mut via = std::collections::BTreeMap::<String, usize>::new();
    for (r, v) in results.iter().zip(0u8..) {
        let f = r.as_ref().expect("every shard arrives");
        assert!(f.data.iter().all(|&x| x == v), "shard {v}");
        *via.entry(f.selection.transport.clone()).or_default() += 1;
        if f.selection.transport == fallback {
            assert!(f.selection.downgraded);
            assert!(
                f.selection.reason.ends_with("; after posix-shm failed"),
                "{}",
                f.selection.reason
            );
            assert_eq!(f.selection.failures.len(), 1);
        } else {
            assert!(!f.selection.downgraded);
        }
    }
    assert_eq!(
        via,
        [("posix-shm".to_owned(), 4), (fallback.to_owned(), 4)].into()
    );
    let stats = c.stats();
    assert_eq!(
        stats.transports[fallback].fetches, 4,
        "{fallback} fetched more than the remainder"
    );
    assert_eq!(stats.transports["posix-shm"].fetches, 4);
    assert_eq!(stats.transports["posix-shm"].errors, 4);
    assert_eq!(stats.downgrades, 4);
}

#[test]
fn batch_failover_to_spool_dir_fetches_only_the_missing_shards() {
    let dir = util::temp_dir("failover");
    let spool = format!(
        "[[plugin]]\nname = \"spool-dir\"\npath = \"{}\"\n[plugin.config]\ndir = \"{}\"\n",
        util::plugin_lib("shardport-spool-transport").display(),
        dir.path().display()
    );
    failover_fetches_only_what_is_missing(&spool, "spool-dir");
}

#[test]
fn batch_failover_to_http_fetches_only_the_missing_shards() {
    let http = format!(
        "[[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:0\"\n",
        util::plugin_lib("shardport-http").display()
    );
    failover_fetches_only_what_is_missing(&http, "http");
}

fn leases_on_owner(owner: &Node) -> u64 {
    owner.stats().plugins[0].stats["leases_held_on_owner"]
}

#[test]
fn ttl_expires_views_without_sleeping_but_never_a_held_one() {
    let owner = node("pool-size = \"1MiB\"");
    let h = owner
        .put(&[3u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    let clock = std::sync::Arc::new(util::ManualClock::default());
    let c = Node::start_with_clock(
        util::parse(&format!(
            "[cache]\npolicy = \"ttl\"\nttl = \"30s\"\n{}",
            util::shm_plugin("pool-size = \"1MiB\"")
        )),
        clock.clone(),
    )
    .unwrap();
    let held = c.fetch_mode(&h, FetchMode::View).unwrap();
    assert_eq!(leases_on_owner(&owner), 1);
    clock.advance(std::time::Duration::from_secs(31));
    assert_eq!(
        c.evict_expired(),
        0,
        "a view the caller still holds was evicted"
    );
    assert_eq!(c.cache_stats().held, 1);
    assert_eq!(c.cache_stats().oldest_age_ms, 31_000);
    drop(held);
    assert_eq!(c.evict_expired(), 1);
    assert_eq!(c.cache_stats().entries, 0);
    // The lease went with the entry: the owner sees it released.
    assert_eq!(leases_on_owner(&owner), 0);
}

#[test]
fn lru_keeps_the_cache_within_its_byte_budget() {
    let owner = node("pool-size = \"1MiB\"");
    let hs: Vec<_> = (0..3u8)
        .map(|v| {
            owner
                .put(&[v; 4000], &TensorSpec::bytes(4000), Default::default())
                .unwrap()
        })
        .collect();
    let clock = std::sync::Arc::new(util::ManualClock::default());
    let c = Node::start_with_clock(
        util::parse(&format!(
            "[cache]\npolicy = \"lru\"\nmax-bytes = 10000\n{}",
            util::shm_plugin("pool-size = \"1MiB\"")
        )),
        clock.clone(),
    )
    .unwrap();
    for h in &hs[..2] {
        drop(c.fetch_mode(h, FetchMode::Copy).unwrap());
        clock.advance(std::time::Duration::from_millis(1));
    }
    // Touch the first so the second is least recently used.
    assert_eq!(
        c.fetch_mode(&hs[0], FetchMode::Copy)
            .unwrap()
            .selection
            .transport,
        "cache"
    );
    clock.advance(std::time::Duration::from_millis(1));
    drop(c.fetch_mode(&hs[2], FetchMode::Copy).unwrap());
    let s = c.cache_stats();
    assert_eq!((s.entries, s.bytes, s.evicted), (2, 8000, 1));
    assert_eq!(
        c.fetch_mode(&hs[0], FetchMode::Copy)
            .unwrap()
            .selection
            .transport,
        "cache"
    );
    assert_eq!(
        c.fetch_mode(&hs[1], FetchMode::Copy)
            .unwrap()
            .selection
            .transport,
        "posix-shm"
    );
}

/// A node that only fetches creates no shared-memory segment and binds no
/// port: posix-shm creates its pool on the first put, http binds on the
/// first export. Its owner, which puts, gets both.
#[test]
fn a_consumer_only_node_creates_no_segment_and_binds_no_port() {
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let config = |port: u16| {
        util::parse(&format!(
            "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}\
             [[plugin]]\nname = \"http\"\npath = \"{}\"\n[plugin.config]\nbind = \"127.0.0.1:{port}\"\n",
            util::shm_plugin("pool-size = \"4MiB\""),
            util::plugin_lib("shardport-http").display()
        ))
    };
    let (owner_port, consumer_port) = (free_port(), free_port());
    let owner = Node::start(config(owner_port)).expect("owner starts");
    let consumer = Node::start(config(consumer_port)).expect("consumer starts");
    let port_free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    assert!(
        util::shm_segments(owner.tag()).is_empty(),
        "nothing before a put"
    );
    assert!(port_free(owner_port), "no server before an export");

    let h = owner
        .put(&[3u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    assert!(
        !util::shm_segments(owner.tag()).is_empty(),
        "the put made the pool"
    );
    assert!(
        !port_free(owner_port),
        "the put's export started the server"
    );
    let copy = consumer.fetch_mode(&h, FetchMode::Copy).unwrap();
    let view = consumer.fetch_mode(&h, FetchMode::View).unwrap();
    assert!(copy.data.iter().all(|&x| x == 3) && view.data.iter().all(|&x| x == 3));

    assert_eq!(
        util::shm_segments(consumer.tag()),
        Vec::<String>::new(),
        "a consumer creates no segment"
    );
    assert!(port_free(consumer_port), "a consumer binds no port");
}

#[test]
fn a_handle_naming_another_owners_segment_is_refused_before_any_byte_is_read() {
    // Two owners on this node, one consumer; no checksums, so before
    // handles were bound to their owner's segments a forged handle read the
    // other owner's bytes as good.
    let plain = || {
        Node::start(util::parse(&format!(
            "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\nchecksum = \"none\"\n{}",
            util::shm_plugin("")
        )))
        .unwrap()
    };
    let (a, b, c) = (plain(), plain(), plain());
    let ha = a
        .put(&[1u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    let hb = b
        .put(&[2u8; 4096], &TensorSpec::bytes(4096), Default::default())
        .unwrap();
    assert_eq!(c.fetch_mode(&ha, FetchMode::Copy).unwrap().data[0], 1);
    assert_eq!(c.fetch_mode(&hb, FetchMode::View).unwrap().data[0], 2);
    // A's claim, B's segment.
    let mut forged = ha.clone();
    forged.exports = hb.exports.clone();
    for mode in [FetchMode::Copy, FetchMode::View] {
        let e = c.fetch_mode(&forged, mode).unwrap_err().to_string();
        assert!(
            e.contains("belongs to another owner than the handle names")
                && e.contains("node epoch"),
            "{mode}: {e}"
        );
    }
    // Batches too.
    let r = c
        .fetch_many(&[forged.clone(), ha.clone()], FetchMode::Copy)
        .unwrap();
    assert!(r[0].is_err() && r[1].is_ok());
    // The consumer remembers the last names that passed for a claim: B's
    // real handle passing first must not let the forged one (B's names,
    // A's claim) through right after it.
    let r = c
        .fetch_many(&[hb.clone(), forged.clone(), hb.clone()], FetchMode::Copy)
        .unwrap();
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    let e = r[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("belongs to another owner"), "{e}");
    // The owners still serve their real handles.
    assert_eq!(c.fetch_mode(&hb, FetchMode::Copy).unwrap().data[0], 2);
}

#[test]
fn put_many_keeps_order_and_a_bad_item_does_not_stop_the_others() {
    let n = node("");
    let a = [1u8; 4096];
    let b = [2u8; 100];
    let c = vec![3u8; 64 << 10];
    let items = [
        (&a[..], TensorSpec::bytes(4096), Default::default()),
        // Wrong length for its spec: refused, naming both.
        (&b[..], TensorSpec::bytes(4096), Default::default()),
        (&c[..], TensorSpec::bytes(64 << 10), Default::default()),
    ];
    let r = n.put_many(&items);
    assert_eq!(r.len(), 3);
    let e = r[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("100 bytes given") && e.contains("needs 4096"),
        "{e}"
    );
    for (i, want) in [(0, 1u8), (2, 3u8)] {
        let h = r[i].as_ref().unwrap();
        let f = n.fetch_mode(h, FetchMode::Copy).unwrap();
        assert!(f.data.iter().all(|&x| x == want), "item {i}");
        // The checksum was computed while copying, and matches.
        assert_eq!(
            h.meta.checksum.into_option().unwrap().value,
            xxhash_rust::xxh3::xxh3_64(&f.data)
        );
    }
    assert_eq!(n.stats().shards_owned, 2);
}

/// A private view asked of a transport that lends none (the spool-dir
/// example: zero-copy views, no private ones) is a private copy through the
/// same transport, and the selection says so: mode copy, and why.
#[test]
fn a_private_view_served_as_a_copy_says_so() {
    let dir = util::temp_dir("private-copy");
    let spool = util::spool_plugin(dir.path());
    let owner = Node::start(util::parse(&spool)).expect("owner starts");
    let consumer = Node::start(util::parse(&spool)).expect("consumer starts");
    let h = owner
        .put(&[3u8; 5000], &TensorSpec::bytes(5000), Default::default())
        .unwrap();
    let f = consumer.fetch_private(&h).unwrap();
    assert!(f.data.iter().all(|&x| x == 3));
    assert_eq!(f.selection.transport.as_str(), "spool-dir");
    assert_eq!(f.selection.mode, FetchMode::Copy);
    assert!(
        f.selection.reason.contains("private copy"),
        "{}",
        f.selection.reason
    );
    // A plain view through the same transport stays a view.
    let v = consumer.fetch_mode(&h, FetchMode::View).unwrap();
    assert_eq!(v.selection.mode, FetchMode::View);
}

/// A consumer node with a copy-destination budget of `copy_buffers`.
fn copying_consumer(copy_buffers: &str) -> Node {
    Node::start(util::parse(&format!(
        "[fetch]\ncopy-buffers = \"{copy_buffers}\"\n{}",
        util::shm_plugin("pool-size = \"8MiB\"")
    )))
    .expect("node starts")
}

#[test]
fn copy_destinations_are_reused_and_every_byte_is_the_new_shards() {
    let owner = node("pool-size = \"64MiB\"");
    let b = copying_consumer("64MiB");
    let len = 1 << 20;
    let put = |fill: u8| {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 ^ fill).collect();
        let h = owner
            .put(&bytes, &TensorSpec::bytes(len as u64), Default::default())
            .unwrap();
        (h, bytes)
    };
    let (h1, bytes1) = put(1);
    let (h2, bytes2) = put(2);
    let first = b.fetch_mode(&h1, FetchMode::Copy).unwrap();
    assert!(!first.data.is_view() && first.data[..] == bytes1[..]);
    let at = first.data.as_ptr();
    drop(first);
    assert_eq!(b.stats().copy_buffers.kept, 1, "the destination came back");
    // Another shard of the same length: the same memory, all of its bytes
    // the new shard's (none left of the first).
    let second = b.fetch_mode(&h2, FetchMode::Copy).unwrap();
    assert_eq!(second.data.as_ptr(), at, "the kept destination is reused");
    assert!(
        second.data[..] == bytes2[..],
        "bytes of the earlier shard left"
    );
    // Held: the next copy gets fresh memory.
    let third = b.fetch_mode(&h1, FetchMode::Copy).unwrap();
    assert_ne!(third.data.as_ptr(), at);
    assert!(third.data[..] == bytes1[..]);
    // A view takes nothing from the shelf.
    let view = b.fetch_mode(&h1, FetchMode::View).unwrap();
    assert!(view.data.is_view() && view.data[..] == bytes1[..]);
    let s = b.stats().copy_buffers;
    assert_eq!((s.reused, s.fresh, s.kept), (1, 2, 0));
    drop((second, third, view));
    assert_eq!(b.stats().copy_buffers.kept, 2);
    // A batch reuses them too, and its bytes are right.
    let many = b
        .fetch_many(&[h2.clone(), h1.clone()], FetchMode::Copy)
        .unwrap();
    assert!(many[0].as_ref().unwrap().data[..] == bytes2[..]);
    assert!(many[1].as_ref().unwrap().data[..] == bytes1[..]);
    assert_eq!(b.stats().copy_buffers.reused, 3);
    drop(many);
    // `clear` frees what is kept.
    b.clear();
    assert_eq!(b.stats().copy_buffers.kept, 0);
}

#[test]
fn the_shelf_of_copy_destinations_is_bounded_by_its_budget() {
    let owner = node("pool-size = \"64MiB\"");
    let len = 256 << 10;
    let handles: Vec<_> = (0..12u8)
        .map(|k| {
            owner
                .put(
                    &vec![k; len],
                    &TensorSpec::bytes(len as u64),
                    Default::default(),
                )
                .unwrap()
        })
        .collect();
    // 12 copies of 256 KiB held at once, then dropped: a 1 MiB budget keeps 4.
    let b = copying_consumer("1MiB");
    let held: Vec<_> = handles
        .iter()
        .map(|h| b.fetch_mode(h, FetchMode::Copy).unwrap())
        .collect();
    for (k, f) in held.iter().enumerate() {
        assert!(f.data.iter().all(|&x| x == k as u8));
    }
    drop(held);
    let s = b.stats().copy_buffers;
    assert_eq!((s.kept, s.kept_bytes), (4, 1 << 20));
    // A budget of 0 keeps nothing: every copy is fresh.
    let none = copying_consumer("0");
    for _ in 0..3 {
        let f = none.fetch_mode(&handles[0], FetchMode::Copy).unwrap();
        assert!(f.data.iter().all(|&x| x == 0));
    }
    let s = none.stats().copy_buffers;
    assert_eq!((s.kept, s.reused), (0, 0));
}
