//! Weight updates across the simulated cluster: a publisher and three
//! receivers, each a real `shardport worker` in its own namespace behind
//! 40 Mbit/s links, http with relays on (one receiver's relay flips a bit
//! in every piece it serves). What must hold, whoever dies: every live
//! receiver ends on a whole version (old or new, never mixed), checked
//! tensor by tensor against the publisher's patterns. A receiver killed
//! mid-update does not stop the others; the publisher killed mid-update
//! leaves every receiver on its previous version; a new publisher's next
//! version reaches them all, and a receiver that missed versions joins
//! the newest. Skipped, with the reason printed, where a testbed cannot be
//! made (not root, no `ip`/`tc`).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use shardport_cli::{
    cluster::Cluster,
    worker::{weights::UpdateReport, Request, WorkerProcess},
};

use crate::util;

/// A small GPT-like state dict: 3 large tensors, 40 of 64-200 KiB, 20 of
/// 1-4 KiB (about 6 MiB: 1.3 s through one 40 Mbit/s link).
fn sizes() -> Vec<u64> {
    let mut v = vec![1 << 20, 3 << 19, 1 << 20];
    v.extend((0..40u64).map(|i| (64 << 10) + i * 3_500));
    v.extend((0..20u64).map(|i| 1024 + i * 150));
    v
}

fn worker(c: &Cluster, i: usize, dir: &Path, extra: &str) -> WorkerProcess {
    let addr = c.nodes[i].addr;
    let cfg = dir.join(format!("node{i}.toml"));
    let text = format!(
        "[node]\nname = \"n{i}\"\nadvertise = \"{addr}:7070\"\n[put]\nstorage = \"heap\"\n\
         [[plugin]]\nname = \"http\"\npath = \"{lib}\"\nrequired = true\n\
         [plugin.config]\nbind = \"{addr}:0\"\nrelay = \"on\"\nrelay-stall-timeout = \"2s\"\n{extra}",
        lib = util::plugin_lib("shardport-http").display(),
    );
    std::fs::write(&cfg, text).unwrap();
    let mut cmd = c.command(i, &util::shardport_bin());
    cmd.arg("worker").arg("--config").arg(&cfg);
    WorkerProcess::spawn_command(&format!("node {i}"), cmd).unwrap()
}

fn publish(w: &mut WorkerProcess, version: u64) -> String {
    w.call(&Request::Publish {
        version,
        sizes: sizes(),
        seed: version,
        bucket_size: Some(1 << 20),
    })
    .expect("publish")
    .manifest
    .expect("a manifest")
}

fn update(w: &mut WorkerProcess, manifest: &str, seed: u64) -> Result<UpdateReport, String> {
    let r = w
        .call(&Request::Update {
            manifest: manifest.to_owned(),
            seed: Some(seed),
            prepare: false,
            memcpy: false,
            verify_always: false,
        })
        .map_err(|e| e.to_string())?;
    Ok(serde_json::from_value(r.weights.expect("a report")).unwrap())
}

/// Every receiver updates to `manifest` at once; `kill` (pid, after) is
/// sent SIGKILL meanwhile. One result per receiver.
fn update_all(
    receivers: &mut [&mut WorkerProcess],
    manifest: &str,
    seed: u64,
    kill: Option<(u32, Duration)>,
) -> Vec<Result<UpdateReport, String>> {
    std::thread::scope(|s| {
        let joins: Vec<_> = receivers
            .iter_mut()
            .map(|w| s.spawn(move || update(w, manifest, seed)))
            .collect();
        if let Some((pid, after)) = kill {
            std::thread::sleep(after);
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// The receiver holds `manifest`'s version whole: an update to it again is
/// a no-op, and every tensor has its pattern.
fn holds(w: &mut WorkerProcess, manifest: &str, version: u64) {
    let r = update(w, manifest, version).expect("a no-op update");
    assert_eq!(r.version, version);
    assert_eq!(r.correct, Some(true), "every tensor of version {version}");
}

#[test]
fn every_live_receiver_ends_on_a_whole_version_whoever_dies() {
    if let Some(why) = Cluster::unavailable() {
        eprintln!("weights cluster test skipped: {why}");
        return;
    }
    let dir = util::temp_dir("weights_cluster");
    let c = Cluster::create(&[40_000_000; 4]).unwrap();
    let mut publisher = worker(&c, 0, dir.path(), "");
    let mut r1 = worker(&c, 1, dir.path(), "test-corrupt-relay = true\n");
    let mut r2 = worker(&c, 2, dir.path(), "");
    let mut r3 = worker(&c, 3, dir.path(), "");

    // Version 1 everywhere, right although one relay corrupts what it serves.
    let m1 = publish(&mut publisher, 1);
    for r in update_all(&mut [&mut r1, &mut r2, &mut r3], &m1, 1, None) {
        let r = r.expect("version 1");
        assert_eq!((r.version, r.correct), (1, Some(true)), "{r:?}");
        assert_eq!(r.transports.get("http"), Some(&r.buckets));
    }

    // Version 2: receiver 3 killed a third of the way; the others commit.
    let m2 = publish(&mut publisher, 2);
    let pid3 = r3.pid();
    let done = update_all(
        &mut [&mut r1, &mut r2, &mut r3],
        &m2,
        2,
        Some((pid3, Duration::from_millis(450))),
    );
    assert!(done[2].is_err(), "receiver 3 was killed: {:?}", done[2]);
    for r in &done[..2] {
        let r = r.as_ref().expect("the live receivers commit version 2");
        assert_eq!((r.version, r.correct), (2, Some(true)), "{r:?}");
    }
    drop(r3);

    // Version 3: the publisher killed a third of the way. Every update
    // fails whole: both receivers still hold version 2, nothing mixed.
    let m3 = publish(&mut publisher, 3);
    let t = Instant::now();
    let done = update_all(
        &mut [&mut r1, &mut r2],
        &m3,
        3,
        Some((publisher.pid(), Duration::from_millis(450))),
    );
    for r in &done {
        let e = r.as_ref().expect_err("the publisher died mid-update");
        assert!(e.contains("nothing was changed"), "{e}");
    }
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "bounded: {:?}",
        t.elapsed()
    );
    drop(publisher);
    holds(&mut r1, &m2, 2);
    holds(&mut r2, &m2, 2);

    // A new publisher in the same node: version 4 reaches the survivors
    // and a new receiver that missed every version before.
    let mut publisher = worker(&c, 0, dir.path(), "");
    let m4 = publish(&mut publisher, 4);
    let mut r3 = worker(&c, 3, dir.path(), "");
    for r in update_all(&mut [&mut r1, &mut r2, &mut r3], &m4, 4, None) {
        let r = r.expect("version 4");
        assert_eq!((r.version, r.correct), (4, Some(true)), "{r:?}");
    }
    for w in [&mut publisher, &mut r1, &mut r2, &mut r3] {
        let _ = w.call(&Request::Exit);
    }
}

/// `shardport bench weights --local` on one node: an owner and a receiver
/// process, every update checked tensor by tensor, a floor measured.
#[test]
fn the_one_node_bench_updates_through_shared_memory_and_checks_every_tensor() {
    use shardport_cli::bench::weights::{run_weights, Dict, WeightsOptions};
    let opts = WeightsOptions {
        dicts: vec![Dict::Small],
        nodes: vec![],
        rate_bps: 0,
        local: true,
        steps: 1,
        bucket_size: None,
        exe: util::shardport_bin(),
        plugin_dir: util::plugin_lib("shardport-http")
            .parent()
            .unwrap()
            .to_path_buf(),
    };
    let rows = run_weights(&opts, &mut |line| eprintln!("{line}")).unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert!(r.correct, "{r:?}");
    assert_eq!((r.tensors, r.bytes, r.buckets), (1000, 4096 * 1000, 1));
    assert_eq!(r.transports, "posix-shm:1", "a same-node view");
    assert_eq!(r.steps_s.len(), r.warmup + 1);
    assert!(r.floor_s > 0.0 && r.update_s > 0.0, "{r:?}");
}
