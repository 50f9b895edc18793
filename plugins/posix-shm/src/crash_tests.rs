//! Crash safety with real processes: consumers and owners that die by
//! `SIGKILL`, pid reuse, and names the sweep must never touch.
//!
//! A child process is this test binary run again with [`CHILD_ROLE`] set:
//! the [`child_process`] test then plays that role (an owner, or a consumer
//! holding a view), prints a ready line and sleeps until the parent kills it
//! with `SIGKILL` (`Child::kill`) and reaps it. Run without the variable,
//! `child_process` does nothing. Every test uses a segment prefix of its own
//! (with this process's pid), so concurrent tests and test runs never sweep
//! each other's segments, and leaves nothing in `/dev/shm`. Waits on children
//! are bounded; nothing is timed.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering::Relaxed},
        mpsc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use shardport_abi::ErrorKind;

use crate::{
    liveness::{Death, Here, ProcessRecord, Verdict, Watcher},
    names::{self, identity},
    sys::OwnedSegment,
    tests::{pattern, Node},
};

/// Environment variable that makes [`child_process`] play a role.
const CHILD_ROLE: &str = "SHARDPORT_SHM_TEST_CHILD";
/// The segment prefix the child uses.
const CHILD_PREFIX: &str = "SHARDPORT_SHM_TEST_PREFIX";
/// For a consumer child: the descriptor (hex) to view.
const CHILD_DESC: &str = "SHARDPORT_SHM_TEST_DESC";
/// What a child prints, followed by its payload, once it is ready.
const READY: &str = "SHARDPORT-SHM-CHILD-READY";
/// Bound on waiting for a child to get ready (never reached unless broken).
const CHILD_WAIT: Duration = Duration::from_secs(120);
/// A child nobody kills exits by itself after this long, or when its parent
/// is gone, so a failed test never leaves a live owner behind.
const CHILD_LIFETIME: Duration = Duration::from_secs(600);

/// Sizes of the shards a child owner exports: the first in its 64 KiB
/// pool, the second too large for what is left, so it spills to a segment.
const OWNER_SHARDS: [usize; 2] = [1000, 65536];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A segment prefix for one test, unique to this process.
fn prefix(test: &str) -> String {
    format!("t{}{test}", std::process::id())
}

/// A node tag shaped like the host's (`{pid}-{start ticks}-{random}`), so the
/// segments it names can be judged by their owner.
fn host_tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let me = Here::current().process;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos:x}{}",
        me.pid,
        me.start_ticks,
        N.fetch_add(1, Relaxed)
    )
}

/// Names in /dev/shm with `prefix` recorded by owner `pid`.
fn segments_of_pid(prefix: &str, pid: u32) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| names::parse_owned(n, prefix).is_some_and(|o| o.owner.pid == pid))
        .collect();
    v.sort();
    v
}

/// `Transport::sweep`'s result by name.
fn sweep(n: &Node) -> HashMap<String, u64> {
    n.t()
        .sweep()
        .into_result()
        .unwrap()
        .iter()
        .map(|s| (s.name.to_string(), s.value))
        .collect()
}

/// The pid of a process that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_tests::no-such-test", "-q"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A child process playing a role; killed (`SIGKILL`) and reaped on drop,
/// and then whatever it left with its prefix swept, so even a failing test
/// leaves nothing in /dev/shm.
struct Child {
    proc: std::process::Child,
    pid: u32,
    prefix: String,
    /// What it printed after [`READY`].
    payload: String,
}

impl Child {
    fn spawn(role: &str, prefix: &str, desc: Option<&[u8]>) -> Child {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--exact",
            "crash_tests::child_process",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(CHILD_ROLE, role)
        .env(CHILD_PREFIX, prefix)
        .stdout(Stdio::piped());
        if let Some(d) = desc {
            cmd.env(CHILD_DESC, hex(d));
        }
        let mut proc = cmd.spawn().unwrap();
        let pid = proc.id();
        let out = proc.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + CHILD_WAIT;
        let mut child = Child {
            proc,
            pid,
            prefix: prefix.to_owned(),
            payload: String::new(),
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(i) = line.find(READY) {
                        child.payload = line[i + READY.len()..].trim().to_owned();
                        return child;
                    }
                }
                Err(e) => panic!("{role} child {pid} never got ready: {e}"),
            }
        }
    }

    /// `kill -9`, then reap it, so its pid is free and it is provably dead.
    fn kill(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
        let _ = crate::sweep::sweep_dead_owners(&self.prefix, &Here::current());
    }
}

/// Plays [`CHILD_ROLE`] when set (see the module docs); otherwise does nothing.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    let prefix = std::env::var(CHILD_PREFIX).unwrap();
    let parent = std::os::unix::process::parent_id();
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    let payload = match role.as_str() {
        "owner" => {
            let cfg = format!(
                "segment-prefix = \"{prefix}\"\npool-size = \"64KiB\"\non-full = \"spill\""
            );
            let owner = Node::build(&cfg, &host_tag(), Here::current()).unwrap();
            let descs: Vec<String> = OWNER_SHARDS
                .iter()
                .zip(1u8..)
                .map(|(&len, seed)| hex(&owner.put(u128::from(seed), &pattern(len, seed)).unwrap()))
                .collect();
            keep.push(Box::new(owner));
            descs.join(" ")
        }
        "consumer" => {
            let desc = unhex(&std::env::var(CHILD_DESC).unwrap());
            // A consumer only: it creates no segments of its own.
            let cfg = format!("segment-prefix = \"{prefix}\"\nallocation = \"segment-per-shard\"");
            let consumer = Node::build(&cfg, &host_tag(), Here::current()).unwrap();
            let len = decode_with(&desc, &prefix).len;
            let view = consumer.view(&desc, len).unwrap();
            keep.push(Box::new(view));
            keep.push(Box::new(consumer));
            "viewing".to_owned()
        }
        "sleeper" => String::new(),
        other => panic!("unknown child role {other}"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{READY} {payload}").unwrap();
    out.flush().unwrap();
    drop(out);
    let born = Instant::now();
    while std::os::unix::process::parent_id() == parent && born.elapsed() < CHILD_LIFETIME {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Views before their transport.
    while let Some(k) = keep.pop() {
        drop(k);
    }
}

fn decode_with(desc: &[u8], prefix: &str) -> crate::descriptor::Descriptor<'static> {
    crate::descriptor::Descriptor::decode(desc, prefix)
        .unwrap()
        .into_owned()
}

#[test]
fn a_killed_consumers_lease_is_reclaimed_and_its_space_reused() {
    let prefix = prefix("lease");
    let cfg = format!("segment-prefix = \"{prefix}\"\npool-size = \"64KiB\"");
    let owner = Node::build(&cfg, &host_tag(), Here::current()).unwrap();
    let shard = pattern(16 << 10, 3);
    let d = owner.put(1, &shard).unwrap();
    let mut child = Child::spawn("consumer", &prefix, Some(&d));
    assert_eq!(child.payload, "viewing");
    assert_eq!(owner.stat("leases_held_on_owner"), 1);

    // A live consumer's lease is never reclaimed, by any sweep point.
    assert_eq!(sweep(&owner)["leases_reclaimed"], 0);
    owner.unexport(1).unwrap();
    assert_eq!(owner.stat("shards_retired_leased"), 1);
    let full = vec![7u8; 64 << 10];
    let e = owner.put(2, &full).unwrap_err();
    assert_eq!(e.kind, ErrorKind::RESOURCE_EXHAUSTED, "{e}");
    assert_eq!(owner.stat("leases_held_on_owner"), 1);
    assert_eq!(owner.stat("leases_reclaimed"), 0);

    child.kill();

    // The next allocation sweeps: the dead consumer's lease goes and the
    // space it kept comes back (the whole pool fits again).
    let (d2, g) = owner.put_in_place(2, &full).unwrap();
    assert_eq!(decode_with(&d2, &prefix).offset, 0);
    assert_eq!(owner.stat("leases_reclaimed"), 1);
    assert_eq!(owner.stat("leases_held_on_owner"), 0);
    assert_eq!(owner.stat("shards_retired_leased"), 0);
    assert_eq!(owner.copy(&d2, full.len() as u64).unwrap(), full);
    owner.unexport(2).unwrap();
    drop(g);
    assert_eq!(owner.stat("pool_bytes_used"), 0);
    assert_eq!(segments_of_pid(&prefix, child.pid), Vec::<String>::new());
}

#[test]
fn a_killed_owner_is_not_found_and_its_segments_are_swept() {
    let prefix = prefix("owner");
    let cfg = format!("segment-prefix = \"{prefix}\"");
    // Checks its owners on every import, so the first one after the kill
    // sees it (by default an "alive" verdict is trusted for 50 us).
    let consumer = Node::new(&format!("{cfg}\nowner-check-interval = \"0us\""));
    let mut child = Child::spawn("owner", &prefix, None);
    let pid = child.pid;
    let descs: Vec<Vec<u8>> = child.payload.split(' ').map(unhex).collect();
    assert_eq!(descs.len(), OWNER_SHARDS.len());
    let theirs = || segments_of_pid(&prefix, pid);
    assert_eq!(theirs().len(), 3, "pool data, board, spilled shard");

    // While the owner lives, its shards are served and no sweep touches them.
    for ((d, &len), seed) in descs.iter().zip(&OWNER_SHARDS).zip(1u8..) {
        assert_eq!(consumer.copy(d, len as u64).unwrap(), pattern(len, seed));
    }
    assert_eq!(consumer.stat("segments_mapped"), 2, "the pool stays mapped");
    let observer = Node::new(&cfg);
    assert_eq!(observer.stat("segments_swept"), 0);
    assert_eq!(sweep(&observer)["segments_swept"], 0);
    assert_eq!(theirs().len(), 3);
    drop(observer);

    child.kill();

    // Its shards are gone, said so by pid, and its pool is no longer mapped.
    let want = format!("owner process {pid} has exited; its shards are gone");
    for (d, &len) in descs.iter().zip(&OWNER_SHARDS) {
        let len = len as u64;
        for e in [
            consumer.copy(d, len).unwrap_err(),
            consumer.view(d, len).unwrap_err(),
        ] {
            assert_eq!(e.kind, ErrorKind::NOT_FOUND, "{e}");
            assert!(e.message.contains(&want), "{}", e.message);
        }
    }
    assert_eq!(consumer.stat("segments_mapped"), 0);

    // Without sweep-on-start nothing is swept; a new instance with it
    // removes every segment the dead owner left.
    let lazy = Node::new(&format!("{cfg}\nsweep-on-start = false"));
    assert_eq!(lazy.stat("segments_swept"), 0);
    assert_eq!(theirs().len(), 3);
    drop(lazy);
    let next = Node::new(&format!("{cfg}\npool-size = \"64KiB\""));
    assert_eq!(next.stat("segments_swept"), 3);
    assert!(
        next.stat("bytes_swept") >= OWNER_SHARDS[1] as u64,
        "{}",
        next.stat("bytes_swept")
    );
    assert_eq!(theirs(), Vec::<String>::new());
    assert_eq!(sweep(&next)["segments_swept"], 0, "nothing left to sweep");
}

#[test]
fn a_killed_owner_not_reaped_yet_is_dead_too() {
    // A zombie keeps its pid and start time in /proc; the pidfd knows better.
    let prefix = prefix("zombie");
    let cfg = format!("segment-prefix = \"{prefix}\"\nallocation = \"segment-per-shard\"");
    let consumer = Node::new(&cfg);
    let mut child = Child::spawn("owner", &prefix, None);
    let pid = child.pid;
    let desc = unhex(child.payload.split(' ').next().unwrap());
    let len = OWNER_SHARDS[0] as u64;
    assert!(consumer.copy(&desc, len).is_ok());
    child.proc.kill().unwrap(); // SIGKILL, not reaped
                                // The signal takes effect asynchronously: bounded retries until it has.
    let deadline = Instant::now() + CHILD_WAIT;
    let err = loop {
        match consumer.copy(&desc, len) {
            Err(e) if e.kind == ErrorKind::NOT_FOUND => break e,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            other => panic!("owner {pid} still serving after SIGKILL: {other:?}"),
        }
    };
    assert!(
        err.message
            .contains(&format!("owner process {pid} has exited")),
        "{}",
        err.message
    );
    // Still a zombie: in /proc, with its start time, in state Z.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let state = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .next();
    assert_eq!(state, Some("Z"), "{stat}");
    assert_eq!(sweep(&consumer)["segments_swept"], 3);
    assert_eq!(segments_of_pid(&prefix, pid), Vec::<String>::new());
    child.kill();
}

#[test]
fn live_owners_segments_are_never_swept() {
    let prefix = prefix("live");
    let here = Here::current();
    let pool = Node::build(
        &format!("segment-prefix = \"{prefix}\"\npool-size = 4096\non-full = \"spill\""),
        &host_tag(),
        here,
    )
    .unwrap();
    let per_shard = Node::build(
        &format!("segment-prefix = \"{prefix}\"\nallocation = \"segment-per-shard\""),
        &host_tag(),
        here,
    )
    .unwrap();
    let d1 = pool.put(1, &[1; 100]).unwrap();
    let d2 = pool.put(2, &[2; 8192]).unwrap();
    let d3 = per_shard.put(3, &[3; 300]).unwrap();
    let mine = segments_of_pid(&prefix, here.process.pid);
    assert_eq!(mine.len(), 4, "{mine:?}");

    let sweeper =
        Node::build(&format!("segment-prefix = \"{prefix}\""), &host_tag(), here).unwrap();
    assert_eq!(sweeper.stat("segments_swept"), 0);
    assert_eq!(sweep(&sweeper)["segments_swept"], 0);
    assert_eq!(sweep(&pool)["segments_swept"], 0);
    for n in &mine {
        assert!(OwnedSegment::exists(&format!("/{n}")), "{n} was swept");
    }
    assert_eq!(sweeper.copy(&d1, 100).unwrap(), [1; 100]);
    assert_eq!(sweeper.copy(&d2, 8192).unwrap(), [2; 8192]);
    assert_eq!(sweeper.copy(&d3, 300).unwrap(), [3; 300]);
    pool.unexport(1).unwrap();
    pool.unexport(2).unwrap();
    per_shard.unexport(3).unwrap();
}

#[test]
fn foreign_names_are_never_touched() {
    let prefix = prefix("foreign");
    let dead = dead_pid();
    let here = Here::current().process;
    let rec = ProcessRecord {
        pid: dead,
        start_ticks: 12345,
        ..here
    };
    let id = identity(&rec);
    let mut other_ns = rec;
    other_ns.ns.pid ^= 1;
    let other_boot = ProcessRecord {
        boot: rec.boot ^ 1,
        ..rec
    };
    let foreign = [
        // Another prefix, ours extended or embedded.
        format!("/{prefix}x-{id}-{dead}-12345-ab-p0"),
        format!("/u{prefix}-{id}-{dead}-12345-ab-p0"),
        // The older shape, the test harness's tags, foreign patterns.
        format!("/{prefix}-{dead}-12345-ab-p0"),
        format!("/{prefix}-{id}-t{dead}-12345-ab-p0"),
        format!("/{prefix}-{id}-{dead}-12345-ab-x-p0"),
        format!("/{prefix}-{id}-{dead}-12345-ab-q0"),
        format!("/{prefix}-{id}-{dead}-12345-AB-p0"),
        format!("/{prefix}-{id}-{dead}-012345-ab-p0"),
        // Owners we cannot judge: another PID namespace, another boot.
        format!("/{prefix}-{}-{dead}-12345-ab-p0", identity(&other_ns)),
        format!("/{prefix}-{}-{dead}-12345-ab-b1", identity(&other_boot)),
    ];
    let keep: Vec<OwnedSegment> = foreign
        .iter()
        .map(|n| OwnedSegment::create(n, 4096).unwrap())
        .collect();
    // The control: the same dead owner, our exact pattern.
    let orphan = format!("/{prefix}-{id}-{dead}-12345-ab-s0");
    let orphan_seg = OwnedSegment::create(&orphan, 4096).unwrap();

    let sweeper = Node::new(&format!(
        "segment-prefix = \"{prefix}\"\nallocation = \"segment-per-shard\""
    ));
    assert_eq!(sweeper.stat("segments_swept"), 1, "only the orphan");
    assert!(!OwnedSegment::exists(&orphan));
    for n in &foreign {
        assert!(OwnedSegment::exists(n), "{n} was touched");
    }
    assert_eq!(sweep(&sweeper)["segments_swept"], 0);
    drop(orphan_seg);
    drop(keep);
}

#[test]
fn pid_reuse_counts_as_dead() {
    let prefix = prefix("reuse");
    let here = Here::current();
    // Eager: the owner's own pool exists before the sweep below.
    let cfg =
        format!("segment-prefix = \"{prefix}\"\npool-size = \"64KiB\"\ncreate-pool = \"eager\"");
    // Our own pid, alive, with a fabricated start time: a process that had
    // our pid before us.
    let impostor = Here {
        process: ProcessRecord {
            start_ticks: here.process.start_ticks - 1,
            ..here.process
        },
        ..here
    };

    // A segment named by it is swept; ours (the true start time) are not.
    let owner = Node::build(&cfg, &host_tag(), here).unwrap();
    let old_tag = format!(
        "{}-{}-ab",
        impostor.process.pid, impostor.process.start_ticks
    );
    let old = names::NameGen::new(&prefix, &old_tag, &impostor.process).next(names::Kind::Shard);
    let old_seg = OwnedSegment::create(&old, 4096).unwrap();
    let swept = sweep(&owner);
    assert_eq!(swept["segments_swept"], 1);
    assert!(!OwnedSegment::exists(&old));
    assert_eq!(owner.segments().len(), 2, "{:?}", owner.segments());
    drop(old_seg);

    // A lease recorded by it is reclaimed; a lease of the true process is not.
    let d = owner.put(1, &pattern(4096, 5)).unwrap();
    // Consumers only: no segments of their own.
    let consumer_cfg = format!("segment-prefix = \"{prefix}\"\nallocation = \"segment-per-shard\"");
    let stale = Node::build(&consumer_cfg, &testing_tag(), impostor).unwrap();
    let live = Node::new(&consumer_cfg);
    let stale_view = stale.view(&d, 4096).unwrap();
    let live_view = live.view(&d, 4096).unwrap();
    assert_eq!(sweep(&owner)["leases_reclaimed"], 1);
    assert_eq!(owner.stat("leases_held_on_owner"), 1);
    owner.unexport(1).unwrap();
    assert_eq!(
        owner.stat("shards_retired_leased"),
        1,
        "the live lease keeps it"
    );
    assert_eq!(&*live_view, &pattern(4096, 5)[..]);
    drop(live_view);
    assert_eq!(owner.stat("shards_retired_leased"), 0);
    assert_eq!(owner.stat("pool_bytes_used"), 0);
    // The impostor's release finds its slot reclaimed and changes nothing.
    drop(stale_view);
    assert_eq!(owner.stat("leases_held_on_owner"), 0);
    assert_eq!(owner.stat("leases_reclaimed"), 1);
    assert_eq!(owner.stat("pool_bytes_used"), 0);
}

#[test]
fn alive_is_trusted_for_the_recheck_window_only() {
    let here = Here::current();
    let mut child = Child::spawn("sleeper", &prefix("window"), None);
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.pid)).unwrap();
    let rec = ProcessRecord {
        pid: child.pid,
        start_ticks: shardport_kit::lease::liveness::parse_stat_start_ticks(&stat).unwrap(),
        ..here.process
    };
    let window = Duration::from_secs(3600);
    let mut w = Watcher::new(window);
    let t0 = Instant::now();
    assert_eq!(w.verdict(&rec, &here, t0), Verdict::Alive);
    child.kill();
    // Dead now, but within the window "alive" is not checked again...
    assert_eq!(w.verdict(&rec, &here, t0 + window / 2), Verdict::Alive);
    // ...once it has passed, it is.
    assert_eq!(
        w.verdict(&rec, &here, t0 + window),
        Verdict::Dead(Death::Exited)
    );
    // Death is final, whatever the clock says.
    assert_eq!(w.verdict(&rec, &here, t0), Verdict::Dead(Death::Exited));
    // A zero window checks every time.
    assert_eq!(
        Watcher::new(Duration::ZERO).verdict(&rec, &here, t0),
        Verdict::Dead(Death::Exited)
    );
}

#[test]
fn a_node_tag_naming_another_process_is_refused() {
    let me = Here::current().process;
    let theirs = format!("{}-{}-ab0", dead_pid(), me.start_ticks);
    let reused = format!("{}-{}-ab0", me.pid, me.start_ticks + 1);
    for tag in [theirs, reused] {
        let e = Node::build("allocation = \"segment-per-shard\"", &tag, Here::current())
            .err()
            .unwrap();
        assert_eq!(e.kind, ErrorKind::INTERNAL);
        assert!(
            e.message
                .starts_with(&format!("the host's node tag {tag} names process ")),
            "{}",
            e.message
        );
    }
    // A tag with an unknown start time names us by pid alone.
    drop(
        Node::build(
            "allocation = \"segment-per-shard\"",
            &format!("{}-0-ab0", me.pid),
            Here::current(),
        )
        .unwrap(),
    );
}

fn testing_tag() -> String {
    shardport_kit::testing::unique_node_tag()
}
