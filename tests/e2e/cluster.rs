//! The simulated cluster (`shardport_cli::cluster`) and `shardport bench
//! cluster`'s runner on it: real namespaces, bridge, tbf-shaped links and
//! real worker processes, at a small size. Checks behaviour, not time: the
//! bytes every node received, that they went over http between distinct
//! addresses, that relays served most of the broadcast, that the consumers
//! of a relay killed mid-way resumed elsewhere with the right bytes, and
//! that nothing of the testbed is left; that a relay refuses the wrong
//! token and that the owner's removal reaches every copy. (Relays that
//! corrupt or stall, and forged holders, are tested between real
//! transport instances in the http plugin's own tests.) Skipped, with the
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
    // Every node's CPU share of each phase: the owner, 3 consumers (the
    // fan-in's owners) and the fan-in consumer, which did the fan-in's work.
    for shares in [&r.broadcast_node_cpu_share, &r.fanin_node_cpu_share] {
        assert_eq!(shares.len(), 5, "{r:?}");
        assert!(shares.iter().all(|s| s.is_finite() && *s >= 0.0), "{r:?}");
    }
    assert!(r.fanin_node_cpu_share[4] > 0.0, "{r:?}");
    assert_eq!(
        r.fanin_cpu_share,
        r.fanin_node_cpu_share.iter().copied().fold(0.0, f64::max)
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
    // They resumed where they were: what they received in all is their
    // copies and what was in flight or taken over twice, not the shard
    // again from its start.
    assert!(
        k.survivors_bytes_received >= k.survivors_bytes
            && k.survivors_bytes_received < k.survivors_bytes + k.survivors_bytes / 2,
        "{k:?}"
    );
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
/// and none returns bytes; a consumer that completed its copy before keeps
/// it, right.
#[test]
fn an_owner_killed_mid_broadcast_fails_its_consumers_naming_it() {
    use shardport_cli::worker::Request;
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    // 4 MiB at 20 Mbit/s: 1.7 s per copy; the owner dies after 0.4 s.
    // Node 3 fetched before the broadcast (a leaf: it relays nothing, so
    // no consumer of the broadcast is sent to it).
    let c = Cluster::create(&[20_000_000; 4]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut workers = http_workers(
        &c,
        dir.path(),
        &[true, true, true, false],
        "connect-timeout = \"1s\"",
    );
    let put = workers[0]
        .call(&Request::Put {
            len: 4 << 20,
            seed: 5,
            dtype: None,
            tags: Default::default(),
        })
        .unwrap();
    let handle = put.handle.unwrap();
    let id = put.id.unwrap();
    let mut done = workers.pop().unwrap();
    let before = done
        .call(&Request::Fetch {
            handle: handle.clone(),
            mode: Some(shardport_host::FetchMode::Copy),
            seed: Some(5),
            hold: true,
            only: None,
        })
        .unwrap();
    assert_eq!(before.verified, Some(true), "{before:?}");
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
    let kept = done.call(&Request::Check { id, seed: 5 }).unwrap();
    assert_eq!(
        kept.verified,
        Some(true),
        "the completed copy outlived its owner"
    );
    // Fetching it again, now that its owner is dead, fails naming it.
    let again = done.call(&Request::FetchBuffer {
        handle,
        only: None,
        seed: Some(5),
    });
    let e = again.expect_err("a dead owner's shard was fetched");
    assert!(
        e.to_string().contains(&owner_addr),
        "the error names the owner: {e}"
    );
}

/// Starts a worker on each node of `c` with an http instance bound to the
/// node's address, relaying where `relay[i]`, with the plugin config lines
/// `extra`.
fn http_workers(
    c: &Cluster,
    dir: &std::path::Path,
    relay: &[bool],
    extra: &str,
) -> Vec<shardport_cli::worker::WorkerProcess> {
    let lib = util::plugin_lib("shardport-http");
    relay
        .iter()
        .enumerate()
        .map(|(i, &relay)| {
            let addr = c.nodes[i].addr;
            let cfg = dir.join(format!("n{i}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "[node]\nname = \"n{i}\"\nadvertise = \"{addr}:7070\"\n[put]\nstorage = \"heap\"\n\
                     [[plugin]]\nname = \"http\"\npath = \"{}\"\nrequired = true\n\
                     [plugin.config]\nbind = \"{addr}:0\"\nrelay = \"{}\"\n{extra}\n",
                    lib.display(),
                    if relay { "on" } else { "off" }
                ),
            )
            .unwrap();
            let mut cmd = c.command(i, &util::shardport_bin());
            cmd.arg("worker").arg("--config").arg(&cfg);
            shardport_cli::worker::WorkerProcess::spawn_command(&format!("node {i}"), cmd).unwrap()
        })
        .collect()
}

/// The status line an HTTP GET of `/v1/health` at `addr` gets from node
/// `from`'s namespace with `token` (bash's `/dev/tcp`: no client of ours).
fn status_line(c: &Cluster, from: usize, addr: &str, token: &str) -> String {
    request_line(c, from, addr, "GET /v1/health", token)
}

/// The status line of `request` (`METHOD PATH`, an empty body) sent with
/// `token` to `addr` from node `from`'s namespace, by bash alone: another
/// process on another node that holds the token, as an attacker would be.
fn request_line(c: &Cluster, from: usize, addr: &str, request: &str, token: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = c
        .command(from, std::path::Path::new("bash"))
        .args([
            "-c",
            "exec 3<>\"/dev/tcp/$SP_HOST/$SP_PORT\" && \
             printf '%s HTTP/1.1\\r\\nhost: %s\\r\\nauthorization: Bearer %s\\r\\ncontent-length: 0\\r\\nconnection: close\\r\\n\\r\\n' \
               \"$SP_REQUEST\" \"$SP_HOST\" \"$SP_TOKEN\" >&3 && head -n 1 <&3",
        ])
        .env("SP_HOST", host)
        .env("SP_PORT", port)
        .env("SP_TOKEN", token)
        .env("SP_REQUEST", request)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

/// On the testbed, with a token: the second consumer gets the shard from
/// the first (a relay), which refuses a request with the wrong token as an
/// owner does; another node's token holder cannot drop or move the relay's
/// copy (no removal key); the owner's removal reaches both copies, and a
/// consumer that asks afterwards gets an error, not the bytes.
#[test]
fn a_relay_refuses_a_wrong_token_and_the_removal_reaches_every_copy() {
    use shardport_cli::worker::{plugin_stat, Request};
    if let Some(why) = Cluster::unavailable() {
        eprintln!("cluster test skipped: {why}");
        return;
    }
    let token = "tb-token-7f3a9c";
    // Four nodes: the broadcast test looks for what is left of its own
    // 5-node testbed by a fifth node's name, which this one has not.
    let c = Cluster::create(&[100_000_000; 4]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut w = http_workers(
        &c,
        dir.path(),
        &[false, true, true, false],
        &format!("auth-token = \"{token}\"\nrelay-keep = \"10m\""),
    );
    let len = (2 << 20) + 5;
    let put = w[0]
        .call(&Request::Put {
            len,
            seed: 9,
            dtype: None,
            tags: Default::default(),
        })
        .unwrap();
    let (handle, id) = (put.handle.unwrap(), put.id.unwrap());
    let fetch = |w: &mut shardport_cli::worker::WorkerProcess| {
        w.call(&Request::FetchBuffer {
            handle: handle.clone(),
            only: None,
            seed: Some(9),
        })
    };
    let first = fetch(&mut w[1]).unwrap();
    let second = fetch(&mut w[2]).unwrap();
    assert_eq!(first.verified, Some(true), "{first:?}");
    assert_eq!(second.verified, Some(true), "{second:?}");
    let reason = second.reason.unwrap_or_default();
    let relay = reason
        .split("from relay ")
        .nth(1)
        .and_then(|r| r.split([',', ')']).next())
        .unwrap_or_else(|| panic!("the second consumer's bytes came from a relay: {reason}"))
        .to_owned();
    assert!(
        relay.starts_with(&format!("{}:", c.nodes[1].addr)),
        "the relay is the first consumer: {reason}"
    );
    // The relay's server: the wrong token refused, the right one served.
    let stats = |w: &mut shardport_cli::worker::WorkerProcess, key: &str| {
        plugin_stat(
            &w.call(&Request::Stats).unwrap().stats.unwrap(),
            "http",
            key,
        )
    };
    let refused_before = stats(&mut w[1], "auth_failures_total");
    let wrong = status_line(&c, 3, &relay, "not-the-token");
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong:?}");
    let right = status_line(&c, 3, &relay, token);
    assert!(right.starts_with("HTTP/1.1 200"), "{right:?}");
    assert_eq!(stats(&mut w[1], "auth_failures_total"), refused_before + 1);
    // Both consumers hold a relay copy until the owner removes the shard:
    // another token holder, on another node, cannot drop or move it.
    for request in [
        format!("DELETE /v1/relay/{id}"),
        format!("POST /v1/relay/{id}"),
    ] {
        let refused = request_line(&c, 3, &relay, &request, token);
        assert!(
            refused.starts_with("HTTP/1.1 403"),
            "{request}: {refused:?}"
        );
    }
    assert_eq!(stats(&mut w[1], "relay_notices_refused_total"), 2);
    assert_eq!(stats(&mut w[1], "relay_copies"), 1);
    assert_eq!(stats(&mut w[2], "relay_copies"), 1);
    w[0].call(&Request::Remove { ids: vec![id] }).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (stats(&mut w[1], "relay_copies") + stats(&mut w[2], "relay_copies")) > 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        stats(&mut w[1], "relay_copies"),
        0,
        "the removal reached the first copy"
    );
    assert_eq!(
        stats(&mut w[2], "relay_copies"),
        0,
        "the removal reached the second copy"
    );
    let late = fetch(&mut w[3]);
    assert!(late.is_err(), "a removed shard was served: {late:?}");
}
