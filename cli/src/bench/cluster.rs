//! `shardport bench cluster`: broadcast and fan-in across a simulated
//! cluster ([`crate::cluster`]), each beside its physical floor computed
//! from the same run's link rates.
//!
//! For each node count N the testbed has N + 2 nodes: a broadcast owner,
//! N nodes that are the broadcast's consumers and then the fan-in's owners,
//! and a fan-in consumer whose link is `fanin_factor` times faster. Every
//! node is a real `shardport worker` process in its own namespace, with its
//! own address and an http transport bound to it (nothing else, so what
//! moves between nodes goes over the shaped links).
//!
//! - **Broadcast**: the owner puts S bytes; the N consumers fetch the
//!   shard at once (one thread each), each into a destination allocated
//!   and written beforehand (untimed, as a consumer's weight buffer is
//!   resident before the update); the time is from the first request to
//!   the last verified copy. Twice: through the `direct` http instance (the
//!   owner serves everyone: about N times the floor), then through the
//!   `http` instance, whose consumers relay (`relay = "on"`: each serves
//!   what it receives onward, a chain with the default fanout of 1). Floor:
//!   S / B (every consumer must receive S bytes through its own link of
//!   rate B), less what a full tbf bucket lets through at once (10 ms of
//!   traffic), as for every floor here.
//! - **Fan-in**: the N nodes each put S bytes; the fan-in consumer fetches
//!   all N shards in one `fetch_many`. Floor: the slower of N·S through the
//!   consumer's link and S through an owner's.
//!
//! Each floor is also reported with TCP/IP framing
//! ([`wire_bytes`]): tbf's rate is of frames, and S bytes of payload
//! take 4.6% more of them, so no transfer reaches S/B itself.
//!
//! CPU: each node's user + system time during each phase, from
//! `/proc/<pid>/stat` of its worker, reported as the busiest node's share
//! of the phase's wall time, so a run shows whether the links or the CPU
//! were the bottleneck; and, for the relayed broadcast, the whole
//! machine's (`/proc/stat`): how much of all its cores was busy, and how
//! much of that in the kernel, where the testbed's own network (the
//! bridge, the tbf qdiscs, every node's TCP) runs and no node's time
//! shows it.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;

use crate::{
    cluster::{burst_bytes, wire_bytes, Cluster},
    worker::{Request, WorkerProcess},
};

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Node counts N (consumers of the broadcast, owners of the fan-in).
    pub nodes: Vec<usize>,
    /// Shard sizes S.
    pub sizes: Vec<u64>,
    /// Link rate B of every node but the fan-in consumer, bits per second.
    pub rate_bps: u64,
    /// The fan-in consumer's link is this many times faster.
    pub fanin_factor: u64,
    /// Run the broadcast with the owner serving everyone too.
    pub owner_only: bool,
    /// Run the fan-in too.
    pub fanin: bool,
    /// `relay-piece` of every node (the owner's counts), if not the default.
    pub relay_piece: Option<u64>,
    /// `relay-window` of every consumer, if not the default (whole copies).
    pub relay_window: Option<u64>,
    /// `relay-sources` of every node, if not the default.
    pub relay_sources: Option<u32>,
    /// After the other runs of each N, a relayed broadcast of the largest
    /// size in which the chain's first relay is killed mid-way.
    pub kill_relay: bool,
    /// After the other runs of each N (before a kill), a relayed broadcast
    /// of the largest size in which the chain's first relay is stopped
    /// (SIGSTOP) a third of the way through for this long, then continued.
    pub stall_relay: Option<std::time::Duration>,
    /// `relay-lag` of every node, if not the default.
    pub relay_lag: Option<std::time::Duration>,
    /// The `shardport` executable the workers run.
    pub exe: PathBuf,
    /// Where the http plugin library is.
    pub plugin_dir: PathBuf,
}

/// One row: one N and one S.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRow {
    /// N.
    pub nodes: usize,
    /// S, bytes.
    pub size: u64,
    /// B, bits per second.
    pub rate_bps: u64,
    /// Broadcast time with relays, seconds.
    pub broadcast_s: f64,
    /// Whether relays took part.
    pub relays: bool,
    /// Share of the broadcast's bytes the consumers received from relays
    /// rather than from the owner.
    pub relay_share: f64,
    /// Share of the broadcast's bytes the consumers received from
    /// alternates (sources besides their parent) rather than the parent.
    pub alternate_share: f64,
    /// Runs of pieces alternates took over from late sources, all
    /// consumers together.
    pub takeovers: u64,
    /// When each consumer's verified copy was done, seconds after the
    /// first request (with relays), in node order: the chain's join order.
    pub consumer_done_s: Vec<f64>,
    /// Broadcast with the owner serving every consumer, seconds.
    pub owner_only_s: f64,
    /// Broadcast floor S / B, seconds.
    pub floor_s: f64,
    /// The same with TCP/IP framing: the link carries frames, and S bytes
    /// of payload take [`wire_bytes`]`(S)` of them (4.6% more), seconds.
    pub wire_floor_s: f64,
    /// Fan-in time, seconds.
    pub fanin_s: f64,
    /// Fan-in floor N·S / min(fan-in consumer rate, N·B), seconds.
    pub fanin_floor_s: f64,
    /// The same with TCP/IP framing, seconds.
    pub fanin_wire_floor_s: f64,
    /// The busiest node's CPU time over the broadcast's wall time (with
    /// relays).
    pub broadcast_cpu_share: f64,
    /// Every node's CPU time over the relayed broadcast's wall time, in
    /// node order: the owner, the N consumers, the fan-in consumer (idle
    /// here).
    pub broadcast_node_cpu_share: Vec<f64>,
    /// The same, with the owner serving everyone.
    pub owner_only_cpu_share: f64,
    /// The busiest node's CPU time over the fan-in's wall time.
    pub fanin_cpu_share: f64,
    /// Every node's CPU time over the fan-in's wall time, in node order
    /// (the broadcast's owner, idle here; the N fan-in owners; the fan-in
    /// consumer). Empty when the fan-in was skipped.
    pub fanin_node_cpu_share: Vec<f64>,
    /// The share of all the machine's cores busy during the relayed
    /// broadcast (`/proc/stat`; NaN where it cannot be read).
    pub broadcast_machine_busy: f64,
    /// The part of it in the kernel (system, irq and softirq time).
    pub broadcast_machine_kernel: f64,
    /// Every copy verified against the owner's pattern.
    pub verified: bool,
    /// With `kill_relay` (the last size of each N): the relayed broadcast
    /// whose first relay was killed a third of the way through the floor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_relay: Option<KilledRelay>,
    /// With `stall_relay` (the last size of each N): the relayed broadcast
    /// whose first relay was stopped for a while.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_relay: Option<StalledRelay>,
}

/// A broadcast whose first relay stopped for a while.
#[derive(Debug, Clone, Serialize)]
pub struct StalledRelay {
    /// How long it was stopped, seconds.
    pub stopped_s: f64,
    /// When, seconds after the first request.
    pub stopped_at_s: f64,
    /// The stopped relay's own copy done, seconds after the first request.
    pub stalled_s: f64,
    /// The last of the other consumers done, seconds after the first
    /// request.
    pub others_s: f64,
    /// Every copy is the owner's.
    pub verified: bool,
    /// Runs alternates took over from late sources.
    pub takeovers: u64,
    /// Rejoins after a relay failed.
    pub failovers: u64,
    /// Relays the owner demoted (moved out of the path) after a child
    /// reported them failed or late.
    pub demotions: u64,
    /// Rejoins of consumers whose parent was late (reported, replaced).
    pub late_parents: u64,
    /// Rejoins of relays their owner moved (the stopped relay's, once it
    /// runs again).
    pub moves: u64,
    /// Every consumer's fetch, node 1 (the stopped relay) first: when it
    /// was done (seconds after the first request) and its reason.
    pub fetches: Vec<(f64, String)>,
}

/// A broadcast that lost a relay mid-way.
#[derive(Debug, Clone, Serialize)]
pub struct KilledRelay {
    /// From the first request to the last survivor's verified copy, seconds.
    pub survivors_s: f64,
    /// Every survivor's copy is the owner's.
    pub survivors_verified: bool,
    /// Survivors' rejoins after a relay failed.
    pub failovers: u64,
    /// When the relay was killed, seconds after the first request.
    pub killed_at_s: f64,
    /// Bytes of verified pieces the survivors received in all, from the
    /// owner and relays (a piece sent by two sources counts twice): beside
    /// their copies' bytes, what resuming fetched again.
    pub survivors_bytes_received: u64,
    /// The survivors' copies' bytes (N - 1 copies of the shard).
    pub survivors_bytes: u64,
}

/// A worker in one node of the testbed.
struct NodeWorker {
    w: WorkerProcess,
}

impl NodeWorker {
    fn start(
        c: &Cluster,
        i: usize,
        opts: &ClusterOptions,
        dir: &Path,
    ) -> Result<NodeWorker, String> {
        let node = &c.nodes[i];
        let cfg = dir.join(format!("node{i}.toml"));
        // The last node is the fan-in consumer: it relays nothing.
        let relay = if i + 1 == c.nodes.len() { "off" } else { "on" };
        let text = format!(
            "[node]\nname = \"n{i}\"\nadvertise = \"{addr}:7070\"\n\
             [put]\nstorage = \"heap\"\n\
             [[plugin]]\nname = \"http\"\npath = \"{lib}\"\nrequired = true\n\
             [plugin.config]\nbind = \"{addr}:0\"\nrequest-timeout = \"600s\"\n\
             relay = \"{relay}\"\nrelay-stall-timeout = \"5s\"\n{piece}\
             [[plugin]]\nname = \"direct\"\ntransport = \"http\"\npath = \"{lib}\"\n\
             required = true\n\
             [plugin.config]\nbind = \"{addr}:0\"\nrequest-timeout = \"600s\"\n",
            addr = node.addr,
            lib = opts.plugin_dir.join("libshardport_http.so").display(),
            piece = [
                opts.relay_piece.map(|p| format!("relay-piece = {p}\n")),
                opts.relay_window.map(|w| format!("relay-window = {w}\n")),
                opts.relay_sources.map(|n| format!("relay-sources = {n}\n")),
                opts.relay_lag
                    .map(|l| format!("relay-lag = \"{}ms\"\n", l.as_millis().max(1))),
            ]
            .into_iter()
            .flatten()
            .collect::<String>(),
        );
        std::fs::write(&cfg, text).map_err(|e| format!("writing {}: {e}", cfg.display()))?;
        let mut cmd = c.command(i, &opts.exe);
        cmd.arg("worker").arg("--config").arg(&cfg);
        let w =
            WorkerProcess::spawn_command(&format!("node {i}"), cmd).map_err(|e| e.to_string())?;
        Ok(NodeWorker { w })
    }

    fn call(&mut self, req: &Request) -> Result<crate::worker::Reply, String> {
        self.w.call(req).map_err(|e| e.to_string())
    }

    /// Puts `len` bytes of the pattern seeded by `seed`, untagged.
    fn put(&mut self, len: u64, seed: u64) -> Result<crate::worker::Reply, String> {
        self.call(&Request::Put {
            len,
            seed,
            dtype: None,
            tags: Default::default(),
        })
    }

    /// User + system CPU seconds of the worker so far.
    fn cpu_s(&self) -> f64 {
        self.w.cpu_seconds()
    }

    /// A counter or gauge of the worker's `plugin` transport (0 if absent).
    fn plugin_stat(&mut self, plugin: &str, key: &str) -> Result<u64, String> {
        let stats = self.call(&Request::Stats)?.stats.unwrap_or_default();
        Ok(crate::worker::plugin_stat(&stats, plugin, key))
    }
}

/// Has every consumer's destination of `size` bytes allocated and written
/// once, all at once and untimed: a consumer's weight buffer is resident
/// before the broadcast that fills it. (Left in the timed window, 16
/// consumers faulting in 1 GiB each on 2 vCPUs took seconds of the
/// broadcast, more while the kernel reclaimed page cache for them.)
fn prepare_destinations(consumers: &mut [NodeWorker], size: u64) -> Result<(), String> {
    std::thread::scope(|s| {
        let joins: Vec<_> = consumers
            .iter_mut()
            .map(|w| s.spawn(move || w.call(&Request::Scratch { len: size }).map(|_| ())))
            .collect();
        joins.into_iter().try_for_each(|j| {
            j.join()
                .unwrap_or_else(|_| Err("a preparing thread panicked".into()))
        })
    })
}

/// One broadcast: the N consumers fetch `handle` (`size` bytes) at once
/// through `only`, into destinations prepared beforehand; returns the wall
/// time, every node's CPU share, whether every copy was right and came
/// through that transport, and when each consumer was done.
fn broadcast(
    workers: &mut [NodeWorker],
    n: usize,
    (handle, size): (&str, u64),
    seed: u64,
    only: &str,
) -> Result<(f64, Vec<f64>, bool, Vec<f64>), String> {
    prepare_destinations(&mut workers[1..=n], size)?;
    let before: Vec<f64> = workers.iter().map(NodeWorker::cpu_s).collect();
    let start = Instant::now();
    let (consumers, _) = workers[1..].split_at_mut(n);
    let results: Vec<Result<(bool, f64), String>> = std::thread::scope(|s| {
        let joins: Vec<_> = consumers
            .iter_mut()
            .map(|w| {
                s.spawn(move || {
                    w.call(&Request::FetchBuffer {
                        handle: handle.to_owned(),
                        only: Some(only.to_owned()),
                        seed: Some(seed),
                    })
                    .map(|r| {
                        (
                            r.verified == Some(true) && r.transport.as_deref() == Some(only),
                            start.elapsed().as_secs_f64(),
                        )
                    })
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err("a fetch thread panicked".into()))
            })
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    let after: Vec<f64> = workers.iter().map(NodeWorker::cpu_s).collect();
    let mut verified = true;
    let mut done = Vec::with_capacity(results.len());
    for r in results {
        let (ok, at) = r?;
        verified &= ok;
        done.push(at);
    }
    Ok((wall, node_shares(&before, &after, wall), verified, done))
}

/// A relayed broadcast of `size` bytes in which node 1, the chain's first
/// relay (it joins 100 ms before the others), is killed a third of the
/// way through the floor time. Node 1 is dead afterwards.
fn killed_relay(
    workers: &mut [NodeWorker],
    n: usize,
    size: u64,
    rate_bps: u64,
) -> Result<KilledRelay, String> {
    let seed = 7000 + n as u64;
    let put = workers[0].put(size, seed)?;
    let handle = put.handle.ok_or("the owner's put gave no handle")?;
    let totals = |ws: &mut [NodeWorker]| -> Result<[u64; 2], String> {
        ws[2..=n].iter_mut().try_fold([0u64; 2], |[f, r], w| {
            Ok([
                f + w.plugin_stat("http", "relay_failovers_total")?,
                r + w.plugin_stat("http", "relay_bytes_received_total")?,
            ])
        })
    };
    let before = totals(workers)?;
    let d = disturbed_broadcast(workers, n, (&handle, seed), size, rate_bps, |victim| {
        signal("-KILL", victim);
    });
    let after = totals(workers)?;
    workers[0].call(&Request::Remove {
        ids: vec![put.id.unwrap_or_default()],
    })?;
    Ok(KilledRelay {
        survivors_s: d.others_s,
        survivors_verified: d.others_verified,
        failovers: after[0] - before[0],
        killed_at_s: d.at_s,
        survivors_bytes_received: after[1] - before[1],
        survivors_bytes: size * (n as u64 - 1),
    })
}

/// A relayed broadcast of `size` bytes in which node 1, the chain's first
/// relay (it joins 100 ms before the others), is stopped (SIGSTOP) a third
/// of the way through the floor time for `stop`, then continued.
fn stalled_relay(
    workers: &mut [NodeWorker],
    n: usize,
    size: u64,
    rate_bps: u64,
    stop: std::time::Duration,
) -> Result<StalledRelay, String> {
    let seed = 8000 + n as u64;
    let put = workers[0].put(size, seed)?;
    let handle = put.handle.ok_or("the owner's put gave no handle")?;
    let totals = |ws: &mut [NodeWorker]| -> Result<[u64; 5], String> {
        let mut t = [0u64; 5];
        for w in &mut ws[1..=n] {
            t[0] += w.plugin_stat("http", "relay_takeovers_total")?;
            t[1] += w.plugin_stat("http", "relay_failovers_total")?;
            t[2] += w.plugin_stat("http", "relay_late_parents_total")?;
            t[3] += w.plugin_stat("http", "relay_moves_total")?;
        }
        t[4] = ws[0].plugin_stat("http", "relay_demotions_total")?;
        Ok(t)
    };
    let before = totals(workers)?;
    let d = disturbed_broadcast(workers, n, (&handle, seed), size, rate_bps, |victim| {
        signal("-STOP", victim);
        std::thread::sleep(stop);
        signal("-CONT", victim);
    });
    let after = totals(workers)?;
    workers[0].call(&Request::Remove {
        ids: vec![put.id.unwrap_or_default()],
    })?;
    let (first_verified, stalled) = d.first.unwrap_or((false, f64::NAN));
    Ok(StalledRelay {
        stopped_s: stop.as_secs_f64(),
        stopped_at_s: d.at_s,
        stalled_s: stalled,
        others_s: d.others_s,
        verified: d.others_verified && first_verified,
        takeovers: after[0] - before[0],
        failovers: after[1] - before[1],
        late_parents: after[2] - before[2],
        moves: after[3] - before[3],
        demotions: after[4] - before[4],
        fetches: d.fetches,
    })
}

/// What a broadcast whose first relay was disturbed gave.
struct Disturbed {
    /// Node 1's fetch: whether its bytes verified, and when it ended
    /// (seconds from the start); `None` when it failed.
    first: Option<(bool, f64)>,
    /// When the last of the other nodes' fetches ended.
    others_s: f64,
    /// Whether every other node's fetch ended with the right bytes.
    others_verified: bool,
    /// When the disturbance began.
    at_s: f64,
    /// Every node's fetch (node 1 first): when it ended and its reason
    /// (where the bytes came from, and what happened on the way), or its
    /// error.
    fetches: Vec<(f64, String)>,
}

/// Nodes 1..=n fetch `handle` (the pattern for `seed`) over http; node 1,
/// the chain's first relay, joins 100 ms before the others, and a third of
/// the way through the floor time `disturb` is called with its pid.
fn disturbed_broadcast(
    workers: &mut [NodeWorker],
    n: usize,
    (handle, seed): (&str, u64),
    size: u64,
    rate_bps: u64,
    disturb: impl FnOnce(u32),
) -> Disturbed {
    let victim = workers[1].w.pid();
    let after = std::time::Duration::from_secs_f64(size as f64 * 8.0 / rate_bps as f64 / 3.0);
    if let Err(e) = prepare_destinations(&mut workers[1..=n], size) {
        return Disturbed {
            first: None,
            others_s: f64::NAN,
            others_verified: false,
            at_s: f64::NAN,
            fetches: vec![(f64::NAN, format!("preparing the destinations: {e}"))],
        };
    }
    let fetch = |w: &mut NodeWorker| {
        w.call(&Request::FetchBuffer {
            handle: handle.to_owned(),
            only: Some("http".to_owned()),
            seed: Some(seed),
        })
    };
    let start = Instant::now();
    let (first, rest) = workers[1..=n].split_at_mut(1);
    std::thread::scope(|s| {
        let first = s.spawn(|| (fetch(&mut first[0]), start.elapsed().as_secs_f64()));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let joins: Vec<_> = rest
            .iter_mut()
            .map(|w| s.spawn(|| (fetch(w), start.elapsed().as_secs_f64())))
            .collect();
        std::thread::sleep(after.saturating_sub(start.elapsed()));
        let at_s = start.elapsed().as_secs_f64();
        disturb(victim);
        let mut others_verified = true;
        let mut others_s = 0f64;
        let mut fetches = Vec::with_capacity(n);
        let note = |r: &Result<crate::worker::Reply, String>, t: f64| match r {
            Ok(r) => (t, r.reason.clone().unwrap_or_default()),
            Err(e) => (t, format!("failed: {e}")),
        };
        let first = match first.join() {
            Ok((r, t)) => {
                fetches.push(note(&r, t));
                r.ok().map(|r| (r.verified == Some(true), t))
            }
            Err(_) => None,
        };
        for j in joins {
            match j.join() {
                Ok((r, t)) => {
                    fetches.push(note(&r, t));
                    match r {
                        Ok(r) => {
                            others_verified &= r.verified == Some(true);
                            others_s = others_s.max(t);
                        }
                        Err(_) => others_verified = false,
                    }
                }
                Err(_) => others_verified = false,
            }
        }
        Disturbed {
            first,
            others_s,
            others_verified,
            at_s,
            fetches,
        }
    })
}

/// Sends `sig` (`-KILL`, `-STOP`...) to process `pid`.
fn signal(sig: &str, pid: u32) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// The busiest worker's CPU over `wall` seconds, from CPU readings taken
/// before and after.
fn node_shares(before: &[f64], after: &[f64], wall: f64) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| (a - b).max(0.0) / wall.max(1e-9))
        .collect()
}

/// The largest of `shares` (0 for none).
fn busiest(shares: &[f64]) -> f64 {
    shares.iter().copied().fold(0.0, f64::max)
}

/// The workers' config files, removed on drop.
struct ConfigDir(PathBuf);

impl ConfigDir {
    fn new() -> Result<ConfigDir, String> {
        // One per run of this process: two runs at once (tests) never
        // remove each other's files.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("shardport-cluster-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| format!("creating {}: {e}", p.display()))?;
        Ok(ConfigDir(p))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs every (N, S) and returns the rows; `progress` gets a line per step.
pub fn run_cluster(
    opts: &ClusterOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<ClusterRow>, String> {
    if let Some(why) = Cluster::unavailable() {
        return Err(format!("cannot make a simulated cluster here: {why}"));
    }
    let dir = ConfigDir::new()?;
    let mut rows = Vec::new();
    for &n in &opts.nodes {
        if n == 0 || n + 2 > crate::cluster::MAX_NODES {
            return Err(format!(
                "--nodes {n}: 1..={} (the testbed adds two nodes)",
                crate::cluster::MAX_NODES - 2
            ));
        }
        let mut rates = vec![opts.rate_bps; n + 1];
        rates.push(opts.rate_bps.saturating_mul(opts.fanin_factor.max(1)));
        progress(&format!("testbed: {} nodes", n + 2));
        let cluster = Cluster::create(&rates)?;
        let mut workers = (0..n + 2)
            .map(|i| NodeWorker::start(&cluster, i, opts, dir.path()))
            .collect::<Result<Vec<_>, _>>()?;
        for &size in &opts.sizes {
            progress(&format!("N = {n}, S = {size} bytes"));
            rows.push(one_row(&mut workers, n, size, opts)?);
        }
        if let (Some(stop), true) = (opts.stall_relay, n >= 2) {
            let size = opts.sizes.iter().copied().max().unwrap_or(0);
            progress(&format!(
                "N = {n}, S = {size} bytes: a relay stopped for {stop:?} mid-way"
            ));
            let st = stalled_relay(&mut workers, n, size, opts.rate_bps, stop)?;
            if let Some(row) = rows.iter_mut().rev().find(|r| r.size == size) {
                row.stalled_relay = Some(st);
            }
        }
        if opts.kill_relay && n >= 2 {
            let size = opts.sizes.iter().copied().max().unwrap_or(0);
            progress(&format!(
                "N = {n}, S = {size} bytes: a relay killed mid-way"
            ));
            let k = killed_relay(&mut workers, n, size, opts.rate_bps)?;
            if let Some(row) = rows.iter_mut().rev().find(|r| r.size == size) {
                row.killed_relay = Some(k);
            }
        }
        for w in &mut workers {
            let _ = w.call(&Request::Exit);
        }
        drop(workers);
        drop(cluster);
    }
    Ok(rows)
}

fn one_row(
    workers: &mut [NodeWorker],
    n: usize,
    size: u64,
    opts: &ClusterOptions,
) -> Result<ClusterRow, String> {
    let seed = 1000 + size % 997 + n as u64;
    // Broadcast: node 0 owns, nodes 1..=n fetch at once.
    let put = workers[0].put(size, seed)?;
    let handle = put.handle.ok_or("the owner's put gave no handle")?;
    let (owner_only, owner_only_cpu, direct_ok) = if opts.owner_only {
        let (t, cpu, ok, _) = broadcast(workers, n, (&handle, size), seed, "direct")?;
        (t, busiest(&cpu), ok)
    } else {
        (f64::NAN, f64::NAN, true)
    };
    let total = |ws: &mut [NodeWorker], key: &str| -> Result<u64, String> {
        ws[1..=n]
            .iter_mut()
            .try_fold(0u64, |t, w| Ok(t + w.plugin_stat("http", key)?))
    };
    let counters = |ws: &mut [NodeWorker]| -> Result<[u64; 3], String> {
        Ok([
            total(ws, "relay_bytes_from_holders_total")?,
            total(ws, "relay_bytes_from_alternates_total")?,
            total(ws, "relay_takeovers_total")?,
        ])
    };
    let before = counters(workers)?;
    let machine_before = MachineCpu::now();
    let (relayed, relayed_cpu, relayed_ok, consumer_done_s) =
        broadcast(workers, n, (&handle, size), seed, "http")?;
    let (machine_busy, machine_kernel) = MachineCpu::now()
        .zip(machine_before)
        .map_or((f64::NAN, f64::NAN), |(after, before)| {
            after.busy_since(&before)
        });
    let after = counters(workers)?;
    let [relay_bytes, alternate_bytes, takeovers] =
        [0, 1, 2].map(|i| after[i].saturating_sub(before[i]));
    let id = put.id.unwrap_or_default();
    // The removal also drops the relays' copies before the fan-in.
    workers[0].call(&Request::Remove { ids: vec![id] })?;
    let (fanin, fanin_cpu, fanin_ok) = if opts.fanin {
        fan_in(workers, n, size, seed)?
    } else {
        (f64::NAN, Vec::new(), true)
    };
    let verified = direct_ok && relayed_ok && fanin_ok;
    // What each link must carry, less what its full tbf bucket lets
    // through at once, over its rate.
    let link = |bytes: u64, rate_bps: u64| {
        bytes.saturating_sub(burst_bytes(rate_bps)) as f64 * 8.0 / rate_bps as f64
    };
    let wire = |bytes: u64, rate_bps: u64| link(wire_bytes(bytes), rate_bps);
    let consumer_rate = opts.rate_bps.saturating_mul(opts.fanin_factor.max(1));
    Ok(ClusterRow {
        nodes: n,
        size,
        rate_bps: opts.rate_bps,
        broadcast_s: relayed,
        relays: true,
        relay_share: relay_bytes as f64 / (size as f64 * n as f64),
        alternate_share: alternate_bytes as f64 / (size as f64 * n as f64),
        takeovers,
        consumer_done_s,
        owner_only_s: owner_only,
        floor_s: link(size, opts.rate_bps),
        fanin_s: fanin,
        fanin_floor_s: link(size * n as u64, consumer_rate).max(link(size, opts.rate_bps)),
        wire_floor_s: wire(size, opts.rate_bps),
        fanin_wire_floor_s: wire(size * n as u64, consumer_rate).max(wire(size, opts.rate_bps)),
        broadcast_cpu_share: busiest(&relayed_cpu),
        broadcast_node_cpu_share: relayed_cpu,
        owner_only_cpu_share: owner_only_cpu,
        fanin_cpu_share: if fanin_cpu.is_empty() {
            f64::NAN
        } else {
            busiest(&fanin_cpu)
        },
        fanin_node_cpu_share: fanin_cpu,
        broadcast_machine_busy: machine_busy,
        broadcast_machine_kernel: machine_kernel,
        verified,
        killed_relay: None,
        stalled_relay: None,
    })
}

/// The machine's CPU time so far, all cores together (the first line of
/// `/proc/stat`, in clock ticks).
#[derive(Debug, Clone, Copy, PartialEq)]
struct MachineCpu {
    total: u64,
    idle: u64,
    kernel: u64,
}

impl MachineCpu {
    fn now() -> Option<MachineCpu> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// From `cpu  user nice system idle iowait irq softirq steal ...`.
    fn parse(stat: &str) -> Option<MachineCpu> {
        let mut f = stat.lines().next()?.split_whitespace();
        if f.next()? != "cpu" {
            return None;
        }
        let v: Vec<u64> = f.take(8).map(str::parse).collect::<Result<_, _>>().ok()?;
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v[..] else {
            return None;
        };
        Some(MachineCpu {
            total: user + nice + system + idle + iowait + irq + softirq + steal,
            idle: idle + iowait,
            kernel: system + irq + softirq,
        })
    }

    /// Since `before`: the busy share of all cores, and the kernel's share.
    fn busy_since(&self, before: &MachineCpu) -> (f64, f64) {
        let total = self.total.saturating_sub(before.total).max(1) as f64;
        let idle = self.idle.saturating_sub(before.idle) as f64;
        let kernel = self.kernel.saturating_sub(before.kernel) as f64;
        (1.0 - idle / total, kernel / total)
    }
}

/// Fan-in: nodes 1..=n own one shard each; node n + 1 fetches them all in
/// one `fetch_many`. The wall time, every node's CPU share, and whether
/// every shard was right.
fn fan_in(
    workers: &mut [NodeWorker],
    n: usize,
    size: u64,
    seed: u64,
) -> Result<(f64, Vec<f64>, bool), String> {
    let mut handles = Vec::with_capacity(n);
    let mut seeds = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    for (i, w) in workers[1..=n].iter_mut().enumerate() {
        let s = seed + 1 + i as u64;
        let r = w.put(size, s)?;
        handles.push(r.handle.ok_or("a fan-in owner's put gave no handle")?);
        ids.push(r.id.unwrap_or_default());
        seeds.push(s);
    }
    let before: Vec<f64> = workers.iter().map(NodeWorker::cpu_s).collect();
    let start = Instant::now();
    let r = workers[n + 1].call(&Request::FetchMany {
        handles,
        seeds: Some(seeds),
    })?;
    let fanin = start.elapsed().as_secs_f64();
    let after: Vec<f64> = workers.iter().map(NodeWorker::cpu_s).collect();
    for (w, id) in workers[1..=n].iter_mut().zip(ids) {
        w.call(&Request::Remove { ids: vec![id] })?;
    }
    Ok((
        fanin,
        node_shares(&before, &after, fanin),
        r.verified == Some(true),
    ))
}

/// The rows as a table (`-`: a phase that was skipped).
pub fn table(rows: &[ClusterRow]) -> String {
    let secs = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.2} s")
        }
    };
    let times = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.2}x")
        }
    };
    let pct = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{:.1}%", v * 100.0)
        }
    };
    let mut out = String::from(
        "nodes  size          rate          relays    ratio  from relays  owner only    ratio     floor    fan-in     floor   ratio  busiest CPU (r / o / f)  verified\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:<6} {:<13} {:<11} {:>9} {:>8} {:>11.0}%  {:>10} {:>8} {:>9} {:>9} {:>9} {:>7}  {:>6} / {:>6} / {:>6}   {}\n",
            r.nodes,
            shardport_kit::format_byte_size(r.size),
            format!("{} Mbit/s", r.rate_bps / 1_000_000),
            secs(r.broadcast_s),
            times(r.broadcast_s / r.floor_s),
            r.relay_share * 100.0,
            secs(r.owner_only_s),
            times(r.owner_only_s / r.floor_s),
            secs(r.floor_s),
            secs(r.fanin_s),
            secs(r.fanin_floor_s),
            times(r.fanin_s / r.fanin_floor_s),
            pct(r.broadcast_cpu_share),
            pct(r.owner_only_cpu_share),
            pct(r.fanin_cpu_share),
            r.verified
        ));
        out.push_str(&format!(
            "       floors with TCP/IP framing ({} B per {} B segment): broadcast {} ({} with relays{}), fan-in {} ({})\n",
            crate::cluster::SEGMENT_FRAMING,
            crate::cluster::SEGMENT_PAYLOAD,
            secs(r.wire_floor_s),
            times(r.broadcast_s / r.wire_floor_s),
            if r.owner_only_s.is_nan() {
                String::new()
            } else {
                format!(", {} owner only", times(r.owner_only_s / r.wire_floor_s))
            },
            secs(r.fanin_wire_floor_s),
            times(r.fanin_s / r.fanin_wire_floor_s),
        ));
        if let Some(line) = per_node_line(r) {
            out.push_str(&line);
        }
        if r.broadcast_machine_busy.is_finite() {
            out.push_str(&format!(
                "       the machine during the relayed broadcast: {:.0}% of its cores busy, {:.0}% in the kernel\n",
                r.broadcast_machine_busy * 100.0,
                r.broadcast_machine_kernel * 100.0
            ));
        }
        if let Some(k) = &r.killed_relay {
            out.push_str(&format!(
                "       a relay killed at {:.2} s: survivors done in {:.2} s ({:.2}x the floor), \
                 {} failover(s), {:.2}x their copies' bytes received, verified {}\n",
                k.killed_at_s,
                k.survivors_s,
                k.survivors_s / r.floor_s,
                k.failovers,
                k.survivors_bytes_received as f64 / k.survivors_bytes.max(1) as f64,
                k.survivors_verified
            ));
        }
        if let Some(st) = &r.stalled_relay {
            out.push_str(&format!(
                "       a relay stopped at {:.2} s for {:.2} s: the others done in {:.2} s \
                 ({:.2}x the floor), it in {:.2} s; {} run(s) taken over, {} failover(s), \
                 {} late parent(s) replaced, {} demotion(s), {} relay move(s), verified {}\n",
                st.stopped_at_s,
                st.stopped_s,
                st.others_s,
                st.others_s / r.floor_s,
                st.stalled_s,
                st.takeovers,
                st.failovers,
                st.late_parents,
                st.demotions,
                st.moves,
                st.verified
            ));
        }
        if r.takeovers > 0 || r.alternate_share > 0.0 {
            out.push_str(&format!(
                "       from alternates: {:.1}% of the bytes, {} late run(s) taken over\n",
                r.alternate_share * 100.0,
                r.takeovers
            ));
        }
    }
    out
}

/// Every node's CPU share during the relayed broadcast (the owner, then
/// the range over the consumers) and during the fan-in (the consumer,
/// then the range over the owners), as a table line.
fn per_node_line(r: &ClusterRow) -> Option<String> {
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{:.1}-{:.1}%", lo * 100.0, hi * 100.0)
    };
    let b = &r.broadcast_node_cpu_share;
    let consumers = b.get(1..=r.nodes)?;
    let mut line = format!(
        "       CPU per node, relayed broadcast: owner {:.1}%, consumers {}",
        b[0] * 100.0,
        range(consumers)
    );
    let f = &r.fanin_node_cpu_share;
    if let (Some(owners), Some(consumer)) = (f.get(1..=r.nodes), f.get(r.nodes + 1)) {
        line.push_str(&format!(
            "; fan-in: consumer {:.1}%, owners {}",
            consumer * 100.0,
            range(owners)
        ));
    }
    line.push('\n');
    Some(line)
}

/// The broadcast with relays, at most this many times its floor S/B
/// (issue 26's target, at 16 nodes; a guard at every N here).
pub const BROADCAST_TARGET: f64 = 1.25;
/// The fan-in, at most this many times its floor.
pub const FANIN_TARGET: f64 = 1.15;
/// A broadcast that lost a relay: its survivors, at most this many times
/// the floor.
pub const KILLED_RELAY_TARGET: f64 = 2.0;

/// The targets, one line per row and target: `met`, `MISSED`, or `-` for
/// a phase that was skipped. A copy that was not the owner's misses
/// whatever its time.
pub fn targets(rows: &[ClusterRow]) -> String {
    let mut out = String::from("targets\n");
    let mut line = |r: &ClusterRow, what: String, ratio: f64, target: f64, right: bool| {
        let status = if ratio.is_nan() {
            "-"
        } else if right && ratio <= target {
            "met"
        } else {
            "MISSED"
        };
        let value = if ratio.is_nan() {
            "not measured".to_owned()
        } else if right {
            format!("{ratio:.2}x")
        } else {
            format!("{ratio:.2}x, wrong bytes")
        };
        out.push_str(&format!(
            "  {status:<7} N = {:<3} {:<10} {what:<48} {value}\n",
            r.nodes,
            shardport_kit::format_byte_size(r.size),
        ));
    };
    for r in rows {
        line(
            r,
            format!("broadcast with relays <= {BROADCAST_TARGET}x S/B"),
            r.broadcast_s / r.floor_s,
            BROADCAST_TARGET,
            r.verified,
        );
        line(
            r,
            format!("fan-in <= {FANIN_TARGET}x its floor"),
            r.fanin_s / r.fanin_floor_s,
            FANIN_TARGET,
            r.verified,
        );
        if let Some(k) = &r.killed_relay {
            line(
                r,
                format!("a relay killed: survivors <= {KILLED_RELAY_TARGET}x S/B"),
                k.survivors_s / r.floor_s,
                KILLED_RELAY_TARGET,
                k.survivors_verified,
            );
        }
    }
    out
}

/// An SVG of the ratios to the floors against N: the broadcast with relays
/// (red), with the owner alone (orange) and the fan-in (blue), one polyline
/// per shard size, with the 1x line.
pub fn svg(rows: &[ClusterRow]) -> String {
    let (w, h, pad) = (640.0, 360.0, 50.0);
    let max_n = rows.iter().map(|r| r.nodes).max().unwrap_or(1).max(2) as f64;
    let max_ratio = rows
        .iter()
        .flat_map(|r| {
            [
                r.broadcast_s / r.floor_s,
                r.owner_only_s / r.floor_s,
                r.fanin_s / r.fanin_floor_s,
            ]
        })
        .filter(|v| v.is_finite())
        .fold(2.0, f64::max);
    let x = |n: usize| pad + (n as f64).log2() / max_n.log2() * (w - 2.0 * pad);
    let y = |v: f64| h - pad - v / max_ratio * (h - 2.0 * pad);
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut lines = format!(
        "<line x1=\"{pad}\" x2=\"{}\" y1=\"{y1:.1}\" y2=\"{y1:.1}\" stroke=\"#999\"/>\n",
        w - pad,
        y1 = y(1.0),
    );
    type Ratio = fn(&ClusterRow) -> f64;
    let ratios: [(&str, Ratio); 3] = [
        ("#d62728", |r| r.broadcast_s / r.floor_s),
        ("#ff7f0e", |r| r.owner_only_s / r.floor_s),
        ("#1f77b4", |r| r.fanin_s / r.fanin_floor_s),
    ];
    for size in sizes {
        for (color, ratio) in ratios {
            let points = rows
                .iter()
                .filter(|r| r.size == size && ratio(r).is_finite())
                .map(|r| (x(r.nodes), y(ratio(r))));
            lines.push_str(&super::plot::polyline(color, points));
        }
    }
    let title = format!(
        "shardport bench cluster: time over floor against nodes (log2, up to {max_n}); \
         broadcast with relays red, owner alone orange, fan-in blue; grey: the floor"
    );
    super::plot::page(w, h, pad, &title, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(nodes: usize, size: u64, owner_only_s: f64) -> ClusterRow {
        ClusterRow {
            nodes,
            size,
            rate_bps: 200_000_000,
            broadcast_s: 1.1,
            relays: true,
            relay_share: 0.5,
            alternate_share: 0.0,
            takeovers: 0,
            consumer_done_s: vec![1.1],
            owner_only_s,
            floor_s: 1.0,
            wire_floor_s: 1.05,
            fanin_s: 1.1,
            fanin_floor_s: 1.0,
            fanin_wire_floor_s: 1.05,
            broadcast_cpu_share: 0.01,
            broadcast_node_cpu_share: Vec::new(),
            owner_only_cpu_share: 0.01,
            fanin_cpu_share: 0.2,
            fanin_node_cpu_share: Vec::new(),
            broadcast_machine_busy: f64::NAN,
            broadcast_machine_kernel: f64::NAN,
            verified: true,
            killed_relay: None,
            stalled_relay: None,
        }
    }

    #[test]
    fn the_plot_has_a_broadcast_and_a_fan_in_line_per_size() {
        let rows = [
            row(2, 1, 2.0),
            row(4, 1, 4.0),
            row(2, 2, 2.1),
            row(4, 2, 4.2),
        ];
        let svg = svg(&rows);
        assert_eq!(svg.matches("<polyline").count(), 6);
        assert!(svg.trim_end().ends_with("</svg>"));
        let table = table(&rows);
        // A line per row, and one per row for the floors with framing.
        assert_eq!(table.lines().count(), 9);
        assert!(table.contains("4.00x"), "{table}");
        assert!(
            table.contains("broadcast 1.05 s (1.05x with relays, 3.81x owner only)"),
            "{table}"
        );
        let mut busy = row(2, 1, 2.0);
        (busy.broadcast_machine_busy, busy.broadcast_machine_kernel) = (0.44, 0.31);
        assert!(crate::bench::cluster::table(&[busy])
            .contains("44% of its cores busy, 31% in the kernel"),);
    }

    #[test]
    fn targets_are_met_missed_or_not_measured() {
        let mut rows = [row(16, 64 << 20, 15.0), row(16, 1 << 30, f64::NAN)];
        rows[0].broadcast_s = 1.25;
        rows[0].fanin_s = 1.2;
        rows[0].killed_relay = Some(KilledRelay {
            survivors_s: 1.5,
            survivors_verified: false,
            failovers: 1,
            killed_at_s: 0.3,
            survivors_bytes_received: 11,
            survivors_bytes: 10,
        });
        rows[1].broadcast_s = 1.3;
        rows[1].fanin_s = f64::NAN;
        let t = targets(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 1 + 3 + 2, "{t}");
        let status = |i: usize| lines[i].split_whitespace().next().unwrap_or_default();
        // At the line (1.25x) is met; 1.2x of the fan-in floor is not;
        // survivors in time but with wrong bytes miss.
        assert_eq!(
            [1, 2, 3, 4, 5].map(status),
            ["met", "MISSED", "MISSED", "MISSED", "-"],
            "{t}"
        );
        assert!(lines[3].ends_with("1.50x, wrong bytes"), "{t}");
        assert!(lines[5].ends_with("not measured"), "{t}");
        let mut bad = row(2, 1, 2.0);
        bad.verified = false;
        bad.broadcast_s = 1.0;
        assert!(targets(&[bad])
            .lines()
            .nth(1)
            .unwrap_or_default()
            .starts_with("  MISSED"));
    }

    #[test]
    fn every_node_s_cpu_is_shown() {
        let mut r = row(2, 1, 2.0);
        assert_eq!(per_node_line(&r), None, "no shares, no line");
        r.broadcast_node_cpu_share = vec![0.031, 0.012, 0.045, 0.0];
        assert_eq!(
            per_node_line(&r).as_deref(),
            Some("       CPU per node, relayed broadcast: owner 3.1%, consumers 1.2-4.5%\n")
        );
        r.fanin_node_cpu_share = vec![0.0, 0.1, 0.2, 0.5];
        let line = per_node_line(&r).unwrap_or_default();
        assert!(
            line.ends_with("; fan-in: consumer 50.0%, owners 10.0-20.0%\n"),
            "{line}"
        );
    }

    #[test]
    fn the_machine_s_cpu_is_read_from_proc_stat() {
        let a = MachineCpu::parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let b = MachineCpu::parse("cpu  160 0 90 860 50 0 40 0 0 0\n").unwrap();
        // 200 ticks: 60 idle, 80 kernel (40 system, 40 softirq).
        let (busy, kernel) = b.busy_since(&a);
        assert!(
            (busy - 0.7).abs() < 1e-12 && (kernel - 0.4).abs() < 1e-12,
            "{busy} {kernel}"
        );
        assert_eq!(MachineCpu::parse("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(MachineCpu::parse("cpu  1 2 3"), None);
        assert_eq!(MachineCpu::parse(""), None);
        assert!(
            MachineCpu::now().is_some(),
            "this machine's /proc/stat reads"
        );
    }
}
