//! Fault injection through real plugins (`[plugin.faults]`): resets
//! mid-body, short reads, corrupted bytes, garbage descriptors and ENOSPC,
//! driven through put, fetch (copy, view, batch), drain and failover. For
//! each: the caller gets a correct fallback or a clear error, wrong bytes
//! are never returned as good (handles carry checksums), nothing leaks (no
//! segment, no lease), and the node keeps serving. Plus a real full
//! `/dev/shm`: a worker in its own mount namespace over a 3 MiB tmpfs.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use shardport_host::{FetchMode, Handle, Node, TensorSpec};

use crate::util;

fn faults(table: &str) -> String {
    format!("[plugin.faults]\n{table}\n")
}

/// posix-shm with a segment prefix of its own (so leftovers are countable)
/// and an optional faults table.
fn shm(prefix: &str, faults_table: Option<&str>) -> String {
    format!(
        "{}{}",
        util::shm_plugin(&format!(
            "segment-prefix = \"{prefix}\"\npool-size = \"16MiB\""
        )),
        faults_table.map(faults).unwrap_or_default()
    )
}

/// Shards of 4 KiB .. 64 KiB, each filled with bytes derived from its index.
fn content(i: usize) -> Vec<u8> {
    let len = 4096 << (i % 5);
    (0..len).map(|k| (i * 31 + k) as u8).collect()
}

fn owner(extra: &str) -> Node {
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\nchecksum = \"xxh3\"\n{extra}{}",
        util::http_plugin()
    )))
    .expect("owner starts")
}

fn put_all(o: &Node, n: usize) -> Vec<Handle> {
    (0..n)
        .map(|i| {
            let b = content(i);
            o.put(&b, &TensorSpec::bytes(b.len() as u64), BTreeMap::new())
                .unwrap()
        })
        .collect()
}

/// The named counter of `transport` in the node's stats.
fn stat(n: &Node, transport: &str, name: &str) -> u64 {
    n.stats()
        .plugins
        .iter()
        .find(|p| p.name == transport)
        .and_then(|p| p.stats.get(name).copied())
        .unwrap_or(0)
}

#[test]
fn import_faults_fall_back_to_a_good_copy_and_never_return_wrong_bytes() {
    let o = owner(&shm("spf1", None));
    let handles = put_all(&o, 120);
    let c = Node::start(util::parse(&format!(
        "[fetch]\non-downgrade = \"allow\"\n{}{}",
        shm(
            "spf1",
            Some("seed = 3\nreset = 0.2\nshort-read = 0.2\ncorrupt = 0.2\ndelay = \"1ms\"\ndelay-rate = 0.05")
        ),
        util::http_plugin()
    )))
    .unwrap();
    for round in 0..2 {
        for (i, h) in handles.iter().enumerate() {
            for mode in [FetchMode::Copy, FetchMode::View] {
                let f = c
                    .fetch_mode(h, mode)
                    .unwrap_or_else(|e| panic!("round {round} shard {i} {mode}: {e}"));
                assert_eq!(
                    f.data[..],
                    content(i)[..],
                    "shard {i} via {}",
                    f.selection.transport
                );
                if f.selection.transport == "http" {
                    assert!(f.selection.downgraded, "{:?}", f.selection);
                    assert!(
                        f.selection.failures[0].0 == "posix-shm",
                        "{:?}",
                        f.selection
                    );
                }
            }
        }
        // Batches: one call, each shard still right or failed over.
        for r in c
            .fetch_many(&handles, FetchMode::Copy)
            .unwrap()
            .iter()
            .enumerate()
        {
            let (i, r) = r;
            assert_eq!(
                r.as_ref().unwrap().data[..],
                content(i)[..],
                "batch shard {i}"
            );
        }
    }
    for kind in ["reset", "short_read", "corrupt", "delay"] {
        assert!(
            stat(&c, "posix-shm", &format!("faults_{kind}_total")) > 0,
            "no {kind} was injected"
        );
    }
    let s = c.stats();
    assert!(
        s.downgrades > 0 && s.transports["http"].fetches > 0,
        "{s:?}"
    );
    assert!(
        s.plugins
            .iter()
            .any(|p| p.name == "posix-shm" && p.health.starts_with("FAULT INJECTION ON")),
        "the health line says so"
    );
    // Nothing held: every view was dropped, the cache keeps nothing.
    c.drain_all();
    assert_eq!(stat(&c, "posix-shm", "leases_active"), 0);
    // The node keeps serving.
    assert_eq!(
        c.fetch_mode(&handles[0], FetchMode::Copy).unwrap().data[..],
        content(0)[..]
    );
}

#[test]
fn without_a_fallback_each_fault_is_a_clear_error_never_wrong_bytes() {
    let o = owner(&shm("spf2", None));
    let handles = put_all(&o, 60);
    let c = Node::start(util::parse(&shm(
        "spf2",
        Some("seed = 11\nreset = 0.25\nshort-read = 0.25\ncorrupt = 0.25"),
    )))
    .unwrap();
    let (mut ok, mut errors) = (0, Vec::new());
    for (i, h) in handles.iter().enumerate() {
        match c.fetch_mode(h, FetchMode::Copy) {
            Ok(f) => {
                assert_eq!(
                    f.data[..],
                    content(i)[..],
                    "shard {i} returned wrong bytes as good"
                );
                ok += 1;
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    assert!(
        ok > 0 && !errors.is_empty(),
        "{ok} ok, {} errors",
        errors.len()
    );
    for e in &errors {
        assert!(
            e.contains("injected fault: connection reset") || e.contains("checksum"),
            "unclear error: {e}"
        );
    }
    assert!(
        errors.iter().any(|e| e.contains("checksum")),
        "short reads and corruption caught by the checksum"
    );
}

#[test]
fn enospc_on_put_is_a_clear_error_and_leaves_nothing_behind() {
    let o = owner(&shm("spf3", Some("seed = 5\nenospc = 0.3")));
    let (mut kept, mut refused) = (Vec::new(), 0);
    for i in 0..80 {
        let b = content(i);
        match o.put(&b, &TensorSpec::bytes(b.len() as u64), BTreeMap::new()) {
            Ok(h) => kept.push((i, h)),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("no space left on device"), "{msg}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && !kept.is_empty(), "{refused} refused");
    assert_eq!(
        o.stats().shards_owned,
        kept.len(),
        "a refused put registers nothing"
    );
    let c = Node::start(util::parse(&shm("spf3", None))).unwrap();
    for (i, h) in &kept {
        assert_eq!(
            c.fetch_mode(h, FetchMode::Copy).unwrap().data[..],
            content(*i)[..]
        );
    }
    // Removing everything returns the pool; dropping the nodes removes
    // every segment they made.
    o.clear();
    assert_eq!(stat(&o, "posix-shm", "pool_bytes_used"), 0);
    drop((o, c));
    assert!(util::shm_segments("spf3").is_empty(), "segments left");
}

#[test]
fn garbage_descriptors_are_refused_and_the_fetch_fails_over() {
    let o = owner(&shm("spf4", Some("seed = 9\ngarbage-descriptor = 0.5")));
    let handles = put_all(&o, 40);
    let c = Node::start(util::parse(&format!(
        "[fetch]\non-downgrade = \"allow\"\n{}{}",
        shm("spf4", None),
        util::http_plugin()
    )))
    .unwrap();
    let mut failed_over = 0;
    for (i, h) in handles.iter().enumerate() {
        let f = c.fetch_mode(h, FetchMode::View).unwrap();
        assert_eq!(f.data[..], content(i)[..]);
        if f.selection.transport == "http" {
            failed_over += 1;
            assert_eq!(f.selection.failures[0].0, "posix-shm");
        }
    }
    assert!(failed_over > 0, "no garbage descriptor was met");
    assert_eq!(
        stat(&o, "posix-shm", "faults_garbage_descriptor_total"),
        failed_over,
        "each garbage descriptor made one fetch fail over"
    );
    drop(c);
    o.clear();
    drop(o);
    assert!(
        util::shm_segments("spf4").is_empty(),
        "a garbage export leaked a segment"
    );
}

/// Sends one JSON request line to a worker and reads its reply.
fn ask(
    stdin: &mut impl Write,
    stdout: &mut impl BufRead,
    req: serde_json::Value,
) -> serde_json::Value {
    writeln!(stdin, "{req}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad reply {line:?}: {e}"))
}

#[test]
fn a_full_dev_shm_is_a_clear_error_and_the_node_recovers() {
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!(
            "full /dev/shm test skipped: a private tmpfs on /dev/shm needs `unshare -m` and mount rights: {}",
            probe.map_or_else(
                |e| e.to_string(),
                |o| String::from_utf8_lossy(&o.stderr).into_owned()
            )
        );
        return;
    }
    let dir = util::temp_dir("faults-shm-full");
    let (cfg, _) = util::write_config(
        dir.path(),
        &format!(
            "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}",
            util::shm_plugin("pool-size = \"64MiB\"")
        ),
    );
    let script = format!(
        "mount -t tmpfs -o size=3m tmpfs /dev/shm && exec '{}' worker --config '{}'",
        util::shardport_bin().display(),
        cfg.display()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ids = Vec::new();
    let mut full = None;
    for seed in 0..16 {
        let r = ask(
            &mut stdin,
            &mut stdout,
            serde_json::json!({"op": "put", "len": 512 * 1024, "seed": seed}),
        );
        if r["ok"] == true {
            ids.push(r["id"].as_str().unwrap().to_owned());
        } else {
            full = Some(r["error"].as_str().unwrap().to_owned());
            break;
        }
    }
    let err = full.expect("a 3 MiB /dev/shm filled up");
    assert!(
        err.contains("No space left on device") || err.contains("no space"),
        "{err}"
    );
    assert!(!ids.is_empty(), "some puts fit before it filled");
    // Space comes back when shards are removed, and the node goes on.
    let r = ask(
        &mut stdin,
        &mut stdout,
        serde_json::json!({"op": "remove", "ids": ids}),
    );
    assert_eq!(r["ok"], true, "{r}");
    let r = ask(
        &mut stdin,
        &mut stdout,
        serde_json::json!({"op": "put", "len": 512 * 1024, "seed": 99}),
    );
    assert_eq!(r["ok"], true, "a put after the removals: {r}");
    let _ = ask(&mut stdin, &mut stdout, serde_json::json!({"op": "exit"}));
    assert!(child.wait().unwrap().success());
}
