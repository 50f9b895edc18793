//! The simulated cluster (`shardport_cli::cluster`) and `shardport bench
//! cluster`'s runner on it: real namespaces, bridge, tbf-shaped links and
//! real worker processes, at a small size. Checks behaviour, not time: the
//! bytes every node received, that they went over http between distinct
//! addresses, that relays served most of the broadcast, that the consumers
//! of a relay killed mid-way resumed elsewhere with the right bytes, and
//! that nothing of the testbed is left. (Relays that corrupt, refuse the
//! token or stall, and removals reaching every copy, are tested between
//! real transport instances in the http plugin's own tests.) Skipped, with the
//! reason printed, where a testbed cannot be made (not root, no `ip`/`tc`).

use shardport_cli::{
    bench::cluster::{run_cluster, ClusterOptions},
    cluster::{existing_namespaces, Cluster},
};

use crate::util;

/// `n` consumers of a 4 MiB + 7 shard over 40 Mbit/s links (a fan-in link
/// 4 times faster), the plugins' defaults, no owner-only broadcast, no
/// fan-in, nobody killed or stopped: what a test then changes.
fn testbed(n: usize) -> ClusterOptions {
    ClusterOptions {
        nodes: vec![n],
        sizes: vec![(4 << 20) + 7],
        rate_bps: 40_000_000,
        fanin_factor: 4,
        kill_relay: false,
        stall_relay: None,
        relay_lag: None,
        owner_only: false,
        fanin: false,
        relay_piece: None,
        relay_window: None,
        relay_sources: None,
        exe: util::shardport_bin(),
        plugin_dir: util::plugin_lib("shardport-http")
            .parent()
            .unwrap()
            .to_path_buf(),
    }
}

#[test]
fn broadcast_and_fan_in_across_a_shaped_testbed_leave_nothing_behind() {
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    // 40 Mbit/s: a 4 MiB transfer takes 0.84 s, so the relay killed a
    // third of the way through is mid-stream (or, on a slow machine, dead
    // before its children connect: a failover either way).
    let opts = ClusterOptions {
        kill_relay: true,
        owner_only: true,
        fanin: true,
        // Relays keep half of the shard's 16 pieces: windowed copies serve
        // a chain as whole ones do.
        relay_window: Some(2 << 20),
        // relay_sources: the default, a parent and one alternate per fetch.
        ..testbed(3)
    };
    let rows = run_cluster(&opts, &mut |line| eprintln!("{line}")).unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert!(r.verified, "every copy matches the owner's bytes: {r:?}");
    assert_eq!((r.nodes, r.size), (3, (4 << 20) + 7));
    assert!(r.broadcast_s > 0.0 && r.owner_only_s > 0.0 && r.fanin_s > 0.0);
    // The machine's CPU during the relayed broadcast, read from /proc/stat.
    assert!(
        (0.0..=1.0).contains(&r.broadcast_machine_busy)
            && (0.0..=r.broadcast_machine_busy).contains(&r.broadcast_machine_kernel),
        "{r:?}"
    );
    // Consumers after the first fetched from relays (a chain: all but one).
    assert!(r.relays && r.relay_share > 0.0, "relays served: {r:?}");
    let burst = shardport_cli::cluster::burst_bytes(40_000_000);
    assert_eq!(r.floor_s, (r.size - burst) as f64 * 8.0 / 40e6);
    // The first relay killed mid-way: the survivors resumed elsewhere and
    // got the owner's bytes.
    let k = r.killed_relay.as_ref().expect("the kill run took place");
    assert!(k.survivors_verified, "{k:?}");
    assert!(k.failovers >= 1, "a survivor failed over: {k:?}");
    assert_eq!(r.consumer_done_s.len(), 3);
    assert!(
        r.alternate_share >= 0.0 && r.alternate_share <= 1.0,
        "{r:?}"
    );
    // Namespaces of this process's testbeds (the other test may run at
    // the same time, so only those of this run's runner are checked: it
    // made and removed them before returning).
    let ours = format!("sp{}", std::process::id() % 100_000);
    let left: Vec<String> = existing_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&ours))
        .collect();
    assert!(
        left.iter().all(|n| !n.ends_with("n4")),
        "the runner's 5-node testbed removed its namespaces: {left:?}"
    );
}

/// The chain's first relay stopped (SIGSTOP) for 3 s a third of the way
/// through: its child takes pieces from its alternate (the owner), reports
/// it late, and the owner demotes it (moves it out of the chain); every
/// copy, the stopped relay's own included, is the owner's. A report needs
/// the parent silent for 4 lags (the lag: 16 usual gaps between pieces, at
/// least `relay-lag`) while 2 runs are taken over, so the shard has many
/// small pieces (16 KiB, 256 of them) and `relay-lag` is 20 ms: the report
/// comes a few hundred milliseconds into the stop, with most of the shard
/// still to come. Two consumers: its 4-node testbed is the only one of
/// that size among these tests (the broadcast test looks for its own).
#[test]
fn a_stalled_relay_is_demoted_and_every_copy_is_right() {
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    let opts = ClusterOptions {
        stall_relay: Some(std::time::Duration::from_secs(3)),
        relay_lag: Some(std::time::Duration::from_millis(20)),
        relay_piece: Some(16 << 10),
        ..testbed(2)
    };
    let rows = run_cluster(&opts, &mut |line| eprintln!("{line}")).unwrap();
    let st = rows[0]
        .stalled_relay
        .as_ref()
        .expect("the stall run took place");
    assert!(st.verified, "every copy is the owner's: {st:?}");
    assert!(st.demotions >= 1, "the stopped relay was demoted: {st:?}");
    assert!(
        st.late_parents + st.failovers >= 1,
        "its child reported it: {st:?}"
    );
}

#[test]
fn a_testbed_removes_itself_and_refuses_impossible_sizes() {
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    assert!(Cluster::create(&[]).is_err());
    let c = Cluster::create(&[100_000_000, 100_000_000]).unwrap();
    let names = c.namespaces();
    assert!(names.iter().all(|n| existing_namespaces().contains(n)));
    // Two nodes, two addresses of one /24, distinct.
    assert_ne!(c.nodes[0].addr, c.nodes[1].addr);
    drop(c);
    let left = existing_namespaces();
    assert!(names.iter().all(|n| !left.contains(n)), "{left:?}");
}

/// An owner killed mid-broadcast: every consumer, whether it was streaming
/// from the owner or from a relay, fails with an error naming the owner,
/// and none returns bytes.
#[test]
fn an_owner_killed_mid_broadcast_fails_its_consumers_naming_it() {
    use shardport_cli::worker::{Request, WorkerProcess};
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    // 4 MiB at 20 Mbit/s: 1.7 s per copy; the owner dies after 0.4 s.
    let c = Cluster::create(&[20_000_000; 3]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lib = util::plugin_lib("shardport-http");
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|i| {
            let addr = c.nodes[i].addr;
            let cfg = dir.path().join(format!("n{i}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "[node]\nname = \"n{i}\"\nadvertise = \"{addr}:7070\"\n[put]\nstorage = \"heap\"\n\
                     [[plugin]]\nname = \"http\"\npath = \"{}\"\nrequired = true\n\
                     [plugin.config]\nbind = \"{addr}:0\"\nrelay = \"on\"\nconnect-timeout = \"1s\"\n",
                    lib.display()
                ),
            )
            .unwrap();
            let mut cmd = c.command(i, &util::shardport_bin());
            cmd.arg("worker").arg("--config").arg(&cfg);
            WorkerProcess::spawn_command(&format!("node {i}"), cmd).unwrap()
        })
        .collect();
    let put = workers[0]
        .call(&Request::Put {
            len: 4 << 20,
            seed: 5,
            dtype: None,
            tags: Default::default(),
        })
        .unwrap();
    let handle = put.handle.unwrap();
    let owner_addr = c.nodes[0].addr.to_string();
    let owner = workers.remove(0);
    let replies = std::thread::scope(|s| {
        let joins: Vec<_> = workers
            .iter_mut()
            .map(|w| {
                let handle = handle.clone();
                s.spawn(move || {
                    w.call(&Request::FetchBuffer {
                        handle,
                        only: None,
                        seed: Some(5),
                    })
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(400));
        owner.kill().unwrap();
        joins
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect::<Vec<_>>()
    });
    for r in replies {
        let e = r.expect_err("a consumer returned bytes of a dead owner");
        assert!(e.contains(&owner_addr), "the error names the owner: {e}");
    }
}
