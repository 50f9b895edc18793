//! The cuda-ipc transport through the real host and its real `.so`.
//!
//! Tests marked "GPU" need a CUDA driver and GPU; without one they print
//! `skipped ...: <reason>` and return. The others run everywhere (CI has no
//! GPU) and check what a machine without CUDA must do: load the plugin,
//! report it unavailable with the reason, and fail or fall back loudly.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use shardport_abi::{DType, Device, ErrorKind, RSlice, ShardMeta};
use shardport_cuda_ipc::{
    descriptor::{Descriptor, BOARD_PREFIX},
    testkit::unavailable_reason,
};
use shardport_host::{handle::Export, DevicePtr, FetchMode, HostError, Node, TensorSpec};

use crate::util;
use shardport_host::vocab::TransportName;

fn gpu_or_skip(test: &str) -> bool {
    match unavailable_reason() {
        Some(why) => {
            eprintln!("skipped {test}: no usable CUDA: {why}");
            false
        }
        None => true,
    }
}

/// The reason cuda-ipc is unavailable here, or `None` (then the test that
/// checks the unavailable path prints why it skips).
fn no_gpu_or_skip(test: &str) -> Option<String> {
    let why = unavailable_reason();
    if why.is_none() {
        eprintln!("skipped {test}: a CUDA driver is present (the in-process tests cover the unavailable path with an injected probe)");
    }
    why
}

fn node(with_cuda: bool) -> Node {
    let cuda = if with_cuda {
        util::cuda_plugin()
    } else {
        String::new()
    };
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}{cuda}",
        util::shm_plugin("pool-size = \"8MiB\"")
    )))
    .expect("node starts")
}

fn cuda_spec(len: u64) -> TensorSpec {
    TensorSpec {
        dtype: DType::U8,
        shape: vec![len],
        device: Device::cuda(0),
    }
}

#[test]
fn cuda_ipc_loads_from_its_real_so_and_reports_its_health() {
    let cfg = util::parse(&util::cuda_plugin());
    let (loaded, failures) = util::load(&cfg);
    assert!(failures.is_empty(), "{failures:?}");
    let p = &loaded[0];
    assert_eq!(p.name.as_str(), "cuda-ipc");
    assert!(p.capabilities().contains(shardport_abi::Capabilities::CUDA));
    let h = p.transport.health();
    match unavailable_reason() {
        Some(why) => {
            assert!(!h.ok, "unavailable transport reported healthy");
            assert!(
                h.message.contains(&why),
                "health {:?} should name {why:?}",
                h.message
            );
            // Data methods say why instead of panicking.
            let e = p
                .transport
                .import_view(RSlice::from_slice(b"x"), &ShardMeta::bytes(1))
                .into_result()
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::UNAVAILABLE, "{e:?}");
            assert!(e.message.contains(&why), "{e}");
        }
        None => assert!(h.ok, "{}", h.message),
    }
}

#[test]
fn put_device_without_a_cuda_transport_says_so() {
    let n = node(false);
    let e = n
        .put_device(
            DevicePtr(0x7f00_0000_0000),
            64,
            &cuda_spec(64),
            Default::default(),
        )
        .unwrap_err();
    assert!(matches!(e, HostError::NoDeviceTransport { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no transport can export cuda:0 memory: no loaded transport has the cuda capability \
         (loaded: posix-shm; load cuda-ipc, and check put.export-to)"
    );
    // And a CPU spec is refused by put_device.
    let e = n
        .put_device(
            DevicePtr(0x1000),
            4,
            &TensorSpec::bytes(4),
            Default::default(),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("put_device needs a cuda:N device"),
        "{e}"
    );
}

#[test]
fn put_device_with_cuda_ipc_unavailable_names_the_reason() {
    let Some(why) = no_gpu_or_skip("put_device_with_cuda_ipc_unavailable_names_the_reason") else {
        return;
    };
    let n = node(true);
    let e = n
        .put_device(
            DevicePtr(0x7f00_0000_0000),
            64,
            &cuda_spec(64),
            Default::default(),
        )
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("no transport can export cuda:0 memory: cuda-ipc: "),
        "{text}"
    );
    assert!(text.contains(&why), "{text}");
}

#[test]
fn cpu_puts_are_not_offered_to_cuda_ipc() {
    let n = node(true);
    let h = n
        .put(&[5u8; 100], &TensorSpec::bytes(100), Default::default())
        .unwrap();
    let names: Vec<&str> = h.exports.iter().map(|e| e.transport.as_str()).collect();
    assert_eq!(names, ["posix-shm"]);
    let f = n.fetch_mode(&h, FetchMode::Copy).unwrap();
    assert!(f.data.iter().all(|&b| b == 5));
    assert!(!f.selection.downgraded);
}

/// A handle for a cuda shard on this machine whose only export is a
/// well-formed cuda-ipc descriptor (no owner behind it).
fn cuda_only_handle(owner: &Node, len: u64) -> shardport_host::Handle {
    let mut h = owner
        .put(
            &vec![1u8; len as usize],
            &TensorSpec::bytes(len),
            Default::default(),
        )
        .unwrap();
    h.meta.device = Device::cuda(0);
    let desc = Descriptor {
        boot_id: shardport_kit::lease::liveness::boot_id()
            .unwrap()
            .to_be_bytes(),
        pid: std::process::id(),
        epoch: 1,
        generation: 1,
        device_uuid: [0x5a; 16],
        mem_handle: [1; 64],
        alloc_size: len,
        offset: 0,
        size: len,
        event_handle: [2; 64],
        slot: 0,
        slot_generation: 1,
        board: format!("{BOARD_PREFIX}e2e-none"),
        chunks: Vec::new(),
    };
    h.exports = vec![Export {
        transport: TransportName::new("cuda-ipc").unwrap(),
        descriptor: desc.encode(),
    }];
    h
}

#[test]
fn fetching_a_cuda_ipc_only_shard_without_cuda_fails_naming_cuda_ipc_and_why() {
    let Some(why) =
        no_gpu_or_skip("fetching_a_cuda_ipc_only_shard_without_cuda_fails_naming_cuda_ipc_and_why")
    else {
        return;
    };
    let owner = node(false);
    let consumer = node(true);
    let h = cuda_only_handle(&owner, 256);
    // A host fetch of a cuda shard is never a host view of device memory.
    let plan = consumer.plan(&h, FetchMode::View);
    assert_eq!(plan.attempts.len(), 1, "{plan:?}");
    assert!(!plan.attempts[0].zero_copy, "{plan:?}");
    assert!(
        plan.attempts[0].reason.contains("device-to-host copy"),
        "{plan:?}"
    );
    for (what, e) in [
        (
            "fetch",
            consumer
                .fetch_mode(&h, FetchMode::Copy)
                .map(|_| ())
                .unwrap_err(),
        ),
        (
            "fetch_device",
            consumer.fetch_device(&h).map(|_| ()).unwrap_err(),
        ),
        (
            "fetch_device_into",
            consumer
                .fetch_device_into(&h, DevicePtr(0x1000), 256)
                .map(|_| ())
                .unwrap_err(),
        ),
    ] {
        let text = e.to_string();
        assert!(matches!(e, HostError::FetchFailed { .. }), "{what}: {e:?}");
        assert!(
            text.contains("cuda-ipc: cuda-ipc unavailable: "),
            "{what}: {text}"
        );
        assert!(text.contains(&why), "{what}: {text}");
    }
    // A consumer without the plugin says it is not loaded.
    let e = owner.fetch_mode(&h, FetchMode::Copy).unwrap_err();
    assert!(e.to_string().contains("cuda-ipc: not loaded here"), "{e}");
}

#[test]
fn a_gpu_that_is_not_visible_here_is_not_a_candidate() {
    // GPU: without a driver `can_import` cannot judge and defers to the import.
    if !gpu_or_skip("a_gpu_that_is_not_visible_here_is_not_a_candidate") {
        return;
    }
    let owner = node(false);
    let consumer = node(true);
    let h = cuda_only_handle(&owner, 256);
    let e = consumer.fetch_device(&h).unwrap_err();
    assert!(matches!(e, HostError::NoCandidate { .. }), "{e:?}");
    assert!(
        e.to_string().contains("is not visible to this process"),
        "{e}"
    );
}

/// A GPU shard reaches a node that cannot map it (another machine; here a
/// node without cuda-ipc) through http, staged through host memory piece by
/// piece. No GPU here: the http plugin's `test-device-is-host` makes the
/// "device" address host memory, so the host's planning, the export and
/// both fetch paths run for real, through the real `.so`, on real sockets;
/// the GPU check script runs the same path on a GPU.
#[test]
fn a_gpu_shard_reaches_a_node_without_cuda_ipc_through_http_staging() {
    let cfg = format!(
        "{}test-device-is-host = true\ndevice-piece = \"64KiB\"\n",
        util::http_plugin()
    );
    let owner = Node::start(util::parse(&cfg)).expect("owner starts");
    let consumer = Node::start(util::parse(&cfg)).expect("consumer starts");
    let len = (5 << 16) + 4099;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    let h = owner
        .put_device(
            DevicePtr(data.as_ptr() as u64),
            len as u64,
            &cuda_spec(len as u64),
            Default::default(),
        )
        .expect("a GPU put exported through http");
    let host = consumer
        .fetch_mode(&h, FetchMode::Copy)
        .expect("the ordinary fetch gives host bytes");
    assert!(host.data[..] == data[..], "host copy");
    assert_eq!(host.selection.transport.as_str(), "http");
    let mut dev = vec![0u8; len];
    let sel = consumer
        .fetch_device_into(&h, DevicePtr(dev.as_mut_ptr() as u64), len as u64)
        .expect("into device memory");
    assert!(dev == data, "device copy");
    assert_eq!(sel.transport.as_str(), "http");
    // In place is impossible across machines: said so, naming http.
    let e = consumer.fetch_device(&h).unwrap_err().to_string();
    assert!(e.contains("no zero-copy device view"), "{e}");
    assert!(owner.remove(&[h.id]).is_empty());
}

/// Device fetches take part in experiments like host fetches: each
/// `fetch_device_into` is assigned an arm, and what served it is recorded
/// per arm (so `shardport ab report` compares GPU transports). No GPU here:
/// the arms are two instances of http (a build and its candidate, as in a
/// rollout), with host memory standing in for the device.
#[test]
fn device_fetches_are_recorded_per_experiment_arm() {
    let stand_in = "test-device-is-host = true\ndevice-piece = \"64KiB\"\n";
    let http = format!(
        "{}{stand_in}{}{stand_in}",
        util::http_plugin(),
        util::http_plugin().replace(
            "name = \"http\"\n",
            "name = \"http-next\"\ntransport = \"http\"\n"
        )
    );
    let owner = Node::start(util::parse(&http)).expect("owner starts");
    let consumer = Node::start(util::parse(&format!(
        "[[experiment]]\nname = \"gpu\"\nunit = \"shard\"\narms = [\n  \
         {{ name = \"control\", transport = \"http\", weight = 50 }},\n  \
         {{ name = \"next\", transport = \"http-next\", weight = 50 }},\n]\n{http}"
    )))
    .expect("consumer starts");
    let len = 4096usize;
    let data = vec![9u8; len];
    let mut dev = vec![0u8; len];
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..60 {
        let h = owner
            .put_device(
                DevicePtr(data.as_ptr() as u64),
                len as u64,
                &cuda_spec(len as u64),
                Default::default(),
            )
            .unwrap();
        let sel = consumer
            .fetch_device_into(&h, DevicePtr(dev.as_mut_ptr() as u64), len as u64)
            .unwrap();
        assert!(
            sel.reason.starts_with("experiment `gpu` arm"),
            "{}",
            sel.reason
        );
        *served.entry(sel.transport.to_string()).or_default() += 1;
        assert!(owner.remove(&[h.id]).is_empty());
    }
    assert!(dev == data);
    let snap = consumer.metrics_snapshot();
    let e = &snap.experiments[0];
    for (arm, transport) in [("control", "http"), ("next", "http-next")] {
        let a = e.arms.iter().find(|a| a.series.name == arm).unwrap();
        let n = served.get(transport).copied().unwrap_or(0);
        assert!(n > 0, "{transport} served some of 60 at 50%");
        assert_eq!(a.series.fetches as usize, n, "{arm}");
        assert_eq!(a.assigned as usize, n, "{arm}");
        assert_eq!(
            a.series.latency.iter().map(|h| h.n()).sum::<u64>(),
            a.series.fetches
        );
    }
}

// ---- two real processes (GPU) ----

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn start(role: &str, dir: &std::path::Path) -> Peer {
        Peer::start_with(role, dir, "")
    }

    /// A peer whose cuda-ipc plugin gets `cuda_config` as its table.
    fn start_with(role: &str, dir: &std::path::Path, cuda_config: &str) -> Peer {
        Peer::start_text(
            role,
            &dir.join(format!("{role}.toml")),
            &format!(
                "[node]\nname = \"{role}\"\n{}{}[plugin.config]\n{cuda_config}\n",
                util::shm_plugin("pool-size = \"8MiB\""),
                util::cuda_plugin().replace("required = false", "required = true")
            ),
        )
    }

    /// A peer in `role` with the config `text`, written at `cfg`.
    fn start_text(role: &str, cfg: &std::path::Path, text: &str) -> Peer {
        std::fs::write(cfg, text).unwrap();
        let mut child = Command::new(util::example_bin("cuda_ipc_peer"))
            .args([role, cfg.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn cuda_ipc_peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
        };
        assert_eq!(p.line(), "READY");
        p
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.stdout.read_line(&mut s).expect("peer output");
        s.trim_end().to_owned()
    }

    fn call(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.line()
    }
}

impl Drop for Peer {
    /// Asks the peer to exit and gives it time to drop its node (which
    /// removes its lease board) before terminating it: a peer terminated
    /// while it handles EXIT leaves its board in /dev/shm.
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "EXIT");
        let _ = self.stdin.flush();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        util::terminate(&mut self.child);
    }
}

fn handle_of(reply: &str) -> String {
    reply
        .strip_prefix("HANDLE ")
        .unwrap_or_else(|| panic!("expected a handle, got {reply:?}"))
        .to_owned()
}

#[test]
fn gpu_two_processes_share_a_device_buffer_zero_copy() {
    if !gpu_or_skip("gpu_two_processes_share_a_device_buffer_zero_copy") {
        return;
    }
    let dir = util::temp_dir("cuda-two");
    let mut owner = Peer::start("owner", dir.path());
    let mut consumer = Peer::start("consumer", dir.path());
    // A shard at an offset inside its allocation: base handle + offset.
    for (len, seed, offset) in [
        (1u64 << 20, 11u64, 4096u64),
        (4097, 12, 0),
        (64 << 20, 13, 512),
    ] {
        let h = handle_of(&owner.call(&format!("PUT {len} {seed} {offset}")));
        let r = consumer.call(&format!("FETCH {h} {seed}"));
        assert!(
            r.starts_with("OK transport=cuda-ipc host_transport=cuda-ipc"),
            "{len} bytes: {r}"
        );
    }
    let r = owner.call("LEASES");
    assert_eq!(r, "OK leases_held=0", "every lease ended");
}

#[test]
fn gpu_stale_handles_are_detected_after_free_and_realloc() {
    if !gpu_or_skip("gpu_stale_handles_are_detected_after_free_and_realloc") {
        return;
    }
    let dir = util::temp_dir("cuda-stale");
    let mut owner = Peer::start("owner", dir.path());
    let mut consumer = Peer::start("consumer", dir.path());
    let len = 2u64 << 20;
    let old = handle_of(&owner.call(&format!("REALLOC {len} 21")));
    assert!(consumer.call(&format!("FETCH {old} 21")).starts_with("OK "));
    assert!(owner
        .call(&format!("REMOVE {old}"))
        .starts_with("OK removed=true"));
    // The owner frees the allocation and allocates again (often at the same
    // address, with the same handle bytes): a new generation.
    let new = handle_of(&owner.call(&format!("REALLOC {len} 22")));
    let r = consumer.call(&format!("FETCH {old} 21"));
    assert!(
        r.starts_with("ERR ") && r.contains("unexported by its owner"),
        "old handle: {r}"
    );
    let r = consumer.call(&format!("FETCH {new} 22"));
    assert!(
        r.starts_with("OK "),
        "new handle must read the new bytes, never the stale mapping: {r}"
    );
}

/// Every allocator frameworks use: VMM memory (PyTorch's expandable
/// segments; here several 2 MiB chunks, the shard at an offset, and one
/// within a single chunk) is viewed in place through file descriptors;
/// stream-ordered pool and managed memory, which no process can map, are
/// staged (and counted); with `unshareable = "refuse"` the put fails
/// naming the allocator. Removing a VMM shard retires the consumer's idle
/// mapping (it would hold the owner's memory).
#[test]
fn gpu_every_allocator_s_memory_is_shared_or_staged() {
    if !gpu_or_skip("gpu_every_allocator_s_memory_is_shared_or_staged") {
        return;
    }
    let dir = util::temp_dir("cuda-alloc");
    let mut owner = Peer::start("owner", dir.path());
    let mut consumer = Peer::start("consumer", dir.path());
    let mut vmm = Vec::new();
    for (i, (alloc, len, offset)) in [
        ("vmm", (5u64 << 20) + 123, 4096u64),
        ("vmm:1", 4097, 64),
        ("pool", 1 << 20, 0),
        ("managed", 1 << 20, 0),
        ("plain", 1 << 20, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 40 + i as u64;
        let h = handle_of(&owner.call(&format!("PUT {len} {seed} {offset} {alloc}")));
        let r = consumer.call(&format!("FETCH {h} {seed}"));
        assert!(
            r.starts_with("OK transport=cuda-ipc host_transport=cuda-ipc"),
            "{alloc}, {len} bytes at {offset}: {r}"
        );
        if alloc.starts_with("vmm") {
            vmm.push(h);
        }
    }
    let stats = owner.call("STATS");
    assert!(stats.contains("\"exports_vmm_total\":2"), "owner: {stats}");
    assert!(
        stats.contains("\"exports_staged_total\":2"),
        "owner: {stats}"
    );
    let before = consumer.call("STATS");
    assert!(before.contains("\"mappings_open\":"), "consumer: {before}");
    for h in &vmm {
        assert!(owner
            .call(&format!("REMOVE {h}"))
            .starts_with("OK removed=true"));
        let r = consumer.call(&format!("FETCH {h} 0"));
        assert!(
            r.starts_with("ERR ") && r.contains("unexported"),
            "a removed VMM shard: {r}"
        );
    }
    // A new VMM export's first open retires the idle mappings of removed ones.
    let h = handle_of(&owner.call("PUT 65536 50 0 vmm"));
    assert!(consumer.call(&format!("FETCH {h} 50")).starts_with("OK "));
    let after = consumer.call("STATS");
    let opens = |s: &str| -> u64 {
        let at = s.find("\"mappings_open\":").expect("mappings_open") + 16;
        s[at..].split([',', '}']).next().unwrap().parse().unwrap()
    };
    assert_eq!(
        opens(&after),
        opens(&before) - 1,
        "the two removed VMM shards' mappings are closed, the new one opened: {before} -> {after}"
    );
    let mut strict = Peer::start_with("owner", dir.path(), "unshareable = \"refuse\"");
    let r = strict.call("PUT 4096 1 0 pool");
    assert!(
        r.starts_with("ERR ") && r.contains("stream-ordered memory pool"),
        "refused naming the allocator: {r}"
    );
}

/// A GPU shard reaches a process that cannot map it (a consumer on another
/// machine: its config loads http, not cuda-ipc) through http, staged
/// through pinned host memory into the consumer's own device memory, and as
/// host bytes: from cudaMalloc memory, VMM memory over several chunks, and
/// pool memory.
#[test]
fn gpu_a_gpu_shard_reaches_a_process_without_cuda_ipc_through_http() {
    if !gpu_or_skip("gpu_a_gpu_shard_reaches_a_process_without_cuda_ipc_through_http") {
        return;
    }
    let dir = util::temp_dir("cuda-http");
    let mut owner = Peer::start_text(
        "owner",
        &dir.path().join("owner.toml"),
        &format!(
            "[node]\nname = \"owner\"\n{}{}{}device-piece = \"1MiB\"\n",
            util::shm_plugin("pool-size = \"8MiB\""),
            util::cuda_plugin().replace("required = false", "required = true"),
            util::http_plugin()
        ),
    );
    let mut remote = Peer::start_text(
        "consumer",
        &dir.path().join("remote.toml"),
        &format!("[node]\nname = \"remote\"\n{}", util::http_plugin()),
    );
    for (len, seed, alloc) in [
        ((1u64 << 20) + 5, 61u64, "plain"),
        ((9 << 20) + 3, 62, "vmm"),
        (4097, 63, "pool"),
    ] {
        let h = handle_of(&owner.call(&format!("PUT {len} {seed} 0 {alloc}")));
        let r = remote.call(&format!("COPYFETCH {h} {seed}"));
        assert_eq!(
            r, "OK transport=http host_transport=http",
            "{alloc}, {len} bytes"
        );
    }
}

/// A GPU shard broadcast through relays: two consumers without cuda-ipc
/// (other machines, as far as the owner's shard is concerned) with
/// `relay = "on"`; the second gets its device and host copies with the
/// first as its relay. Every piece is checked against the owner's hashes
/// on the way; the bytes are checked against the pattern at the end.
#[test]
fn gpu_a_gpu_shard_is_relayed_between_consumers_without_cuda_ipc() {
    if !gpu_or_skip("gpu_a_gpu_shard_is_relayed_between_consumers_without_cuda_ipc") {
        return;
    }
    let dir = util::temp_dir("cuda-relay");
    let mut owner = Peer::start_text(
        "owner",
        &dir.path().join("owner.toml"),
        &format!(
            "[node]\nname = \"owner\"\n{}{}{}device-piece = \"1MiB\"\nrelay-piece = \"64KiB\"\n",
            util::shm_plugin("pool-size = \"8MiB\""),
            util::cuda_plugin().replace("required = false", "required = true"),
            util::http_plugin()
        ),
    );
    let relay_consumer = |name: &str| {
        Peer::start_text(
            "consumer",
            &dir.path().join(format!("{name}.toml")),
            &format!(
                "[node]\nname = \"{name}\"\n{}relay = \"on\"\n",
                util::http_plugin()
            ),
        )
    };
    let mut first = relay_consumer("first");
    let mut second = relay_consumer("second");
    for (len, seed, alloc) in [
        ((9u64 << 20) + 3, 71u64, "vmm"),
        ((2 << 20) + 1, 72, "plain"),
    ] {
        let h = handle_of(&owner.call(&format!("PUT {len} {seed} 0 {alloc}")));
        for c in [&mut first, &mut second] {
            let r = c.call(&format!("COPYFETCH {h} {seed}"));
            assert_eq!(
                r, "OK transport=http host_transport=http",
                "{alloc}, {len} bytes"
            );
        }
    }
}

/// A consumer killed (SIGKILL) while it holds a zero-copy view: the owner
/// takes its lease back once the death is proved (the process is reaped),
/// so the caller's memory may be freed; a live consumer's lease is never
/// taken back.
#[test]
fn gpu_a_killed_consumer_s_lease_is_reclaimed_and_a_live_one_is_not() {
    if !gpu_or_skip("gpu_a_killed_consumer_s_lease_is_reclaimed_and_a_live_one_is_not") {
        return;
    }
    let dir = util::temp_dir("cuda-kill");
    let mut owner = Peer::start("owner", dir.path());
    let mut doomed = Peer::start("consumer", dir.path());
    let mut alive = Peer::start("consumer", dir.path());
    let a = handle_of(&owner.call("PUT 65536 31 0"));
    let b = handle_of(&owner.call("PUT 65536 32 0"));
    assert_eq!(doomed.call(&format!("HOLD {a}")), "OK held=1");
    assert_eq!(alive.call(&format!("HOLD {b}")), "OK held=1");
    assert_eq!(owner.call("LEASES"), "OK leases_held=2");
    doomed.child.kill().expect("SIGKILL the consumer");
    doomed.child.wait().expect("reap it");
    // Removing the dead consumer's shard reclaims its lease at once.
    assert_eq!(
        owner.call(&format!("REMOVE {a}")),
        "OK removed=true leases_held=1"
    );
    // The live consumer keeps its lease through removal and sweeps.
    assert_eq!(
        owner.call(&format!("REMOVE {b}")),
        "OK removed=true leases_held=1"
    );
    assert_eq!(owner.call("SWEEP"), "OK leases_held=1");
    let stats = owner.call("STATS");
    assert!(
        stats.contains("\"leases_reclaimed_total\":1"),
        "owner stats: {stats}"
    );
    assert_eq!(alive.call("DROP"), "OK held=0");
    assert_eq!(owner.call("LEASES"), "OK leases_held=0");
}

/// The planner's `can_import` pre-check, shown with the `faulty` fixture
/// (runs without a GPU): an export its transport refuses is "not a
/// candidate" with the transport's reason, and the next candidate serves.
/// The faulty fixture's `can_import` refusal (`UNREACHABLE_MESSAGE` in
/// tests/fixtures/faulty-plugin). Written out rather than imported: linking
/// a second plugin rlib into this binary would give it two copies of the
/// exported library-header symbol, which fails to link in release builds.
const FAULTY_UNREACHABLE: &str = "faulty plugin told to refuse every descriptor in can_import";

#[test]
fn exports_refused_by_can_import_are_not_candidates() {
    let n = Node::start(util::parse(&format!(
        "[put]\nstorage = \"heap\"\n{}[[plugin]]\nname = \"faulty\"\npath = \"{}\"\n[plugin.config]\nmode = \"unreachable\"\n",
        util::shm_plugin("pool-size = \"8MiB\""),
        util::plugin_lib("shardport-faulty-plugin").display()
    )))
    .unwrap();
    let h = n
        .put(&[3u8; 64], &TensorSpec::bytes(64), Default::default())
        .unwrap();
    assert_eq!(h.exports.len(), 2, "both transports export");
    let plan = n.plan(&h, FetchMode::Copy);
    assert_eq!(plan.attempts.len(), 1);
    assert_eq!(plan.attempts[0].transport.as_str(), "posix-shm");
    assert_eq!(
        plan.skipped,
        [(
            TransportName::new("faulty").unwrap(),
            format!("not a candidate here: {}", FAULTY_UNREACHABLE)
        )]
    );
    let f = n.fetch_mode(&h, FetchMode::Copy).unwrap();
    assert_eq!(f.selection.transport, "posix-shm");
    assert!(f.data.iter().all(|&b| b == 3));
    // With only the refused export left, the fetch fails naming the reason.
    let mut only = h.clone();
    assert!(only.keep_only("faulty"));
    let e = n.fetch_mode(&only, FetchMode::Copy).unwrap_err();
    assert!(matches!(e, HostError::NoCandidate { .. }), "{e:?}");
    assert!(e.to_string().contains(FAULTY_UNREACHABLE), "{e}");
}
