//! Live reconfiguration with real plugins: reloads under a fetch load that
//! must not see one failure, refused reloads that leave the node serving,
//! plugins added, removed and drained while fetches run, a removed plugin
//! kept alive by the lease of a view, and a new build of a transport rolled
//! out as a ramped canary (the first build caught by the guardrail, the
//! fixed one ramped to half the traffic).

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use shardport_host::{config::Origin, FetchMode, Handle, HostError, Node, TensorSpec};

use crate::util;

/// Parses and applies `text` as the node's new config.
fn reload(node: &Node, text: &str) -> Result<shardport_host::node::ReloadReport, HostError> {
    node.reload_text(
        text,
        Origin::Text {
            name: "reload.toml".into(),
            base_dir: util::profile_dir(),
            search_deps: true,
        },
    )
}

/// Puts `n` shards of 4 KiB to 64 KiB, each filled with its own byte.
fn put_many(owner: &Node, n: usize) -> Vec<Handle> {
    (0..n)
        .map(|i| {
            let len = 4096 << (i % 5);
            owner
                .put(
                    &vec![i as u8; len],
                    &TensorSpec::bytes(len as u64),
                    BTreeMap::new(),
                )
                .unwrap()
        })
        .collect()
}

/// Fetch threads over `handles` until `stop`; every result is checked.
/// Returns (fetches, failures as text).
fn load(node: &Node, handles: &[Handle], threads: usize, stop: &AtomicBool) -> (u64, Vec<String>) {
    let done = AtomicU64::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (done, failures) = (&done, &failures);
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let h = &handles[i % handles.len()];
                    let mode = if i % 2 == 0 {
                        FetchMode::View
                    } else {
                        FetchMode::Copy
                    };
                    match node.fetch_mode(h, mode) {
                        Ok(f) if f.data.iter().all(|&b| b == (i % handles.len()) as u8) => {}
                        Ok(f) => failures.lock().unwrap().push(format!(
                            "shard {} via {}: wrong bytes",
                            h.id, f.selection.transport
                        )),
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    i += threads;
                }
            });
        }
    });
    (done.into_inner(), failures.into_inner().unwrap())
}

/// The consumer config of reload number `i`: experiment weights, route
/// order and cache policy all change from one reload to the next.
fn consumer_config(spool: &Path, i: usize) -> String {
    let (shm, sp) = if i % 2 == 0 { (90, 10) } else { (10, 90) };
    let route = if i % 3 == 0 {
        "[\"http\", \"spool-dir\"]"
    } else {
        "[\"spool-dir\", \"http\"]"
    };
    let cache = match i % 3 {
        0 => "[cache]\npolicy = \"lru\"\nmax-bytes = \"64KiB\"\n",
        1 => "[cache]\npolicy = \"none\"\n",
        _ => "[cache]\npolicy = \"lru\"\nmax-bytes = \"1MiB\"\n",
    };
    format!(
        "[fetch]\non-downgrade = \"allow\"\n{cache}
[[experiment]]
name = \"shm-vs-spool\"
max-size = \"16KiB\"
arms = [
  {{ name = \"control\", transport = \"posix-shm\", weight = {shm} }},
  {{ name = \"spool\", transport = \"spool-dir\", weight = {sp} }},
]
[[route]]
name = \"large\"
min-size = \"32KiB\"
transports = {route}
{}{}{}",
        util::shm_plugin("pool-size = \"4MiB\""),
        util::spool_plugin(spool),
        util::http_plugin()
    )
}

fn owner(spool: &Path) -> Node {
    Node::start(util::parse(&format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}{}{}",
        util::shm_plugin("pool-size = \"16MiB\""),
        util::spool_plugin(spool),
        util::http_plugin()
    )))
    .expect("owner starts")
}

#[test]
fn a_hundred_reloads_under_load_lose_no_fetch() {
    let dir = util::temp_dir("reload-load");
    let o = owner(dir.path());
    let handles = put_many(&o, 40);
    let c = Node::start(util::parse(&consumer_config(dir.path(), 0))).expect("consumer starts");
    let stop = AtomicBool::new(false);
    let (fetches, failures) = std::thread::scope(|s| {
        let worker = s.spawn(|| load(&c, &handles, 3, &stop));
        for i in 1..=100 {
            let r = reload(&c, &consumer_config(dir.path(), i))
                .unwrap_or_else(|e| panic!("reload {i}: {e}"));
            assert_eq!(r.generation, i as u64);
            assert!(!r.changes.is_empty(), "reload {i} changed something");
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap()
    });
    assert!(
        failures.is_empty(),
        "{} failed fetches: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(fetches > 100, "only {fetches} fetches ran");
    assert_eq!(c.generation(), 100);
    let snap = c.metrics_snapshot();
    assert_eq!((snap.reloads, snap.reloads_refused), (100, 0));
    // Every transport served, and the plugins are the ones loaded at start
    // (same config tables: a reload keeps their instances).
    let served: Vec<&str> = snap
        .transports
        .iter()
        .filter(|t| t.fetches > 0)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(served.len(), 3, "served by {served:?}");
    assert!(c.stats().draining.is_empty());
    assert!(snap
        .events
        .iter()
        .any(|e| e.kind == "reload" && e.text.contains("weights")));
    // The arm counters went on across every reload (one series per arm).
    let arms = &snap.experiments[0].arms;
    assert!(arms.iter().all(|a| a.assigned > 0), "{arms:?}");
}

#[test]
fn a_refused_reload_names_what_is_wrong_and_the_node_keeps_serving() {
    let dir = util::temp_dir("reload-refused");
    let o = owner(dir.path());
    let handles = put_many(&o, 4);
    let base = consumer_config(dir.path(), 0);
    let c = Node::start(util::parse(&base)).unwrap();
    let check_serving = || {
        for (i, h) in handles.iter().enumerate() {
            let f = c.fetch_mode(h, FetchMode::Copy).unwrap();
            assert!(f.data.iter().all(|&b| b == i as u8));
        }
    };
    // A bad value: the error points at the file, line and column.
    let bad = base.replace("on-downgrade = \"allow\"", "on-downgrade = \"sometimes\"");
    let e = c
        .reload_text(&bad, Origin::File("/etc/shardport/next.toml".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/etc/shardport/next.toml:2:"), "{e}");
    assert!(e.contains("sometimes"), "{e}");
    // A config file that vanished.
    let gone = dir.path().join("gone.toml");
    let e = c.reload_file(Some(&gone)).unwrap_err().to_string();
    assert!(
        e.contains("cannot read config file") && e.contains("gone.toml"),
        "{e}"
    );
    // A plugin file replaced by garbage.
    let garbage = dir.path().join("libgarbage.so");
    std::fs::write(&garbage, b"\x7fELF but not really").unwrap();
    let with_garbage = format!(
        "{base}[[plugin]]\nname = \"spool-next\"\ntransport = \"spool-dir\"\npath = \"{}\"\n",
        garbage.display()
    );
    let e = reload(&c, &with_garbage).unwrap_err().to_string();
    assert!(
        e.contains("spool-next") && e.contains("libgarbage.so") && e.contains("did not load"),
        "{e}"
    );
    // What only a restart can change.
    let e = reload(&c, &format!("[node]\nname = \"renamed\"\n{base}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("node.name") && e.contains("restart"), "{e}");
    // The node ran through all of it on its first config.
    assert_eq!(c.generation(), 0);
    assert_eq!(c.metrics_snapshot().reloads_refused, 4);
    check_serving();
    // A node started from text has no file to read again.
    let e = c.reload_file(None).unwrap_err().to_string();
    assert!(e.contains("name a config file"), "{e}");
    // A config without `node.name`: the node named itself, uniquely, and a
    // reload of another unnamed config keeps that name (not a rename); so
    // does a named node reloaded with a config that names none.
    let name = c.config().node.name.clone();
    assert!(
        name.starts_with(&format!("node-{}-", std::process::id())),
        "{name}"
    );
    assert_ne!(name, o.config().node.name);
    let r = reload(&c, &base).unwrap();
    assert_eq!(c.config().node.name, name);
    assert!(r.changes.is_empty(), "{:?}", r.changes);
    let named = Node::start(util::parse(&format!("[node]\nname = \"fixed\"\n{base}"))).unwrap();
    reload(&named, &base).unwrap();
    assert_eq!(named.config().node.name, "fixed");
    // What a reload changes, one readable line per key.
    let next = base.replace(
        "on-downgrade = \"allow\"",
        "on-downgrade = \"fail\"\nmode = \"view\"\nmax-batch = 64",
    );
    let r = reload(&c, &next).unwrap();
    assert_eq!(
        r.changes,
        [
            "fetch.mode: \"copy\" -> \"view\"",
            "fetch.on-downgrade: \"allow\" -> \"fail\"",
            "fetch.max-batch: 4096 -> 64",
        ]
    );
}

#[test]
fn a_reload_over_the_control_endpoint_needs_the_token() {
    let dir = util::temp_dir("reload-control");
    let (path, cfg) = util::write_config(dir.path(), &util::shm_plugin(""));
    let n = Node::start(cfg).unwrap();
    let server =
        shardport_control::ControlServer::start(&n, "127.0.0.1:0", Some("tok".into())).unwrap();
    let addr = server.addr().to_string();
    let t = Duration::from_secs(10);
    let call = |token: Option<&str>, body: &str| {
        shardport_control::client::request(&addr, "POST", "/v1/reload", token, body.as_bytes(), t)
            .unwrap()
    };
    let (status, _) = call(None, "");
    assert_eq!(status, 401);
    let (status, _) = call(Some("wrong"), "");
    assert_eq!(status, 401);
    assert_eq!(n.generation(), 0, "nothing reloaded without the token");
    // The file changed on disk: an empty body reads it again.
    std::fs::write(
        &path,
        format!("[cache]\npolicy = \"explicit\"\n{}", util::shm_plugin("")),
    )
    .unwrap();
    let (status, body) = call(Some("tok"), "");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let r: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(r["generation"], 1);
    // Change lines name the key and the values as a config writes them.
    assert_eq!(
        r["changes"][0].as_str().unwrap(),
        "cache.policy: \"none\" -> \"explicit\"",
        "{r}"
    );
    // Text in the body; a bad one is 409 with the reason.
    let (status, body) = call(
        Some("tok"),
        &serde_json::json!({"config": "[fetch]\nmode = 7\n", "path": path}).to_string(),
    );
    assert_eq!(status, 409);
    let msg = String::from_utf8_lossy(&body);
    assert!(
        msg.contains("reload_refused") && msg.contains("node.toml:2:"),
        "{msg}"
    );
    let (status, _) = call(Some("tok"), "{\"bogus\": 1}");
    assert_eq!(status, 400);
    assert_eq!(n.generation(), 1);
}

/// Polls `f` until it holds (bounded; the condition is what is tested).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_plugin_added_and_removed_while_fetches_run() {
    let dir = util::temp_dir("reload-plugins");
    let o = owner(dir.path());
    let handles = put_many(&o, 20);
    let only_shm = format!(
        "[fetch]\non-downgrade = \"allow\"\n{}",
        util::shm_plugin("")
    );
    let with_spool = format!(
        "{only_shm}[[route]]\nname = \"spool-first\"\ntransports = [\"spool-dir\", \"posix-shm\"]\n{}",
        util::spool_plugin(dir.path())
    );
    let c = Node::start(util::parse(&only_shm)).unwrap();
    let stop = AtomicBool::new(false);
    let spool_fetches = |c: &Node| {
        c.stats()
            .transports
            .get("spool-dir")
            .map_or(0, |t| t.fetches)
    };
    let (_, failures) = std::thread::scope(|s| {
        let worker = s.spawn(|| load(&c, &handles, 2, &stop));
        let r = reload(&c, &with_spool).unwrap();
        assert!(
            r.changes
                .iter()
                .any(|x| x.starts_with("plugin spool-dir loaded")),
            "{:?}",
            r.changes
        );
        eventually("a fetch served by the added plugin", || {
            spool_fetches(&c) > 0
        });
        let r = reload(&c, &only_shm).unwrap();
        assert!(
            r.changes
                .iter()
                .any(|x| x.starts_with("plugin spool-dir") && x.ends_with("removed")),
            "{:?}",
            r.changes
        );
        let after = spool_fetches(&c);
        // Once the fetches in flight at the swap end, nothing holds it.
        eventually("the removed plugin drained", || c.draining().is_empty());
        std::thread::sleep(Duration::from_millis(50));
        assert!(c.plugin("spool-dir").is_none());
        // Fetches planned after the swap never reach it (one in flight at
        // the swap may still finish there).
        assert!(spool_fetches(&c) <= after + 2);
        stop.store(true, Ordering::Relaxed);
        worker.join().unwrap()
    });
    assert!(failures.is_empty(), "{failures:?}");
}

#[test]
fn a_removed_plugin_stays_until_the_last_lease_it_issued_is_released() {
    let dir = util::temp_dir("reload-lease");
    let o = owner(dir.path());
    let handles = put_many(&o, 2);
    let both = format!(
        "[fetch]\non-downgrade = \"allow\"\n{}{}",
        util::shm_plugin(""),
        util::spool_plugin(dir.path())
    );
    let c = Node::start(util::parse(&both)).unwrap();
    let view = c.fetch_mode(&handles[0], FetchMode::View).unwrap();
    assert_eq!(view.selection.transport, "posix-shm");
    let spool_only = format!(
        "[fetch]\non-downgrade = \"allow\"\n{}",
        util::spool_plugin(dir.path())
    );
    let r = reload(&c, &spool_only).unwrap();
    assert_eq!(r.draining.len(), 1, "{:?}", r.draining);
    assert!(
        r.draining[0].starts_with("posix-shm") && r.draining[0].contains("1 leases"),
        "{:?}",
        r.draining
    );
    assert_eq!(c.stats().draining.len(), 1);
    // New fetches go to what the new config has.
    let f = c.fetch_mode(&handles[1], FetchMode::Copy).unwrap();
    assert_eq!(f.selection.transport, "spool-dir");
    // The held view still reads the owner's bytes.
    assert!(view.data.iter().all(|&b| b == 0));
    drop(view);
    assert!(c.draining().is_empty(), "released: dropped");

    // Owner side: a removed transport keeps serving the exports it made
    // (consumers hold handles that name them) until their shards are
    // removed, and takes no new puts.
    let shm_only = format!(
        "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n{}",
        util::shm_plugin("pool-size = \"16MiB\"")
    );
    let spool_files = || std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(spool_files(), 2, "one spool file per shard");
    let r = reload(&o, &shm_only).unwrap();
    // The owner's http goes too.
    assert!(
        r.draining.len() == 2 && r.draining.iter().any(|d| d.starts_with("spool-dir")),
        "{:?}",
        r.draining
    );
    assert!(
        r.changes
            .iter()
            .any(|c| c.contains("keep serving the 2 owned shard(s)")),
        "{:?}",
        r.changes
    );
    assert_eq!(spool_files(), 2, "spool exports still served");
    assert_eq!(
        c.fetch_mode(&handles[0], FetchMode::Copy)
            .unwrap()
            .selection
            .transport,
        "spool-dir",
        "a spool-only consumer still reaches a shard put before the reload"
    );
    let later = put_many(&o, 1);
    assert_eq!(spool_files(), 2, "no new export through a removed plugin");
    assert_eq!(later[0].exports.len(), 1, "{:?}", later[0].exports);
    // Removing the storage transport too is no longer a stranding: it keeps
    // the bytes and serves them until the shards go.
    let r = reload(&o, &util::spool_plugin(dir.path())).unwrap();
    assert_eq!(r.draining.len(), 3, "{:?}", r.draining);
    let c2 = Node::start(util::parse(&both)).unwrap();
    assert_eq!(
        c2.fetch(&handles[1]).unwrap().selection.transport,
        "posix-shm"
    );
    let mut ids: Vec<_> = handles.iter().map(|h| h.id).collect();
    ids.push(later[0].id);
    assert!(o.remove(&ids).is_empty());
    assert_eq!(spool_files(), 0, "removal unexports everywhere");
    assert!(o.draining().is_empty(), "{:?}", o.draining());
}

/// Builds the `faulty` fixture as build `name` (see its crate docs) and
/// copies the library to `dest`.
fn faulty_build(name: &str, dest: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Shares its dependencies with the out-of-tree plugin test's builds.
    let target = util::profile_dir()
        .parent()
        .expect("target dir")
        .join("out-of-tree");
    util::cargo_build_offline_env(
        &root.join("tests/fixtures/faulty-plugin/Cargo.toml"),
        &target,
        &["--lib"],
        &[("SHARDPORT_FAULTY_BUILD", name)],
        &format!("the faulty fixture, build {name}"),
    );
    std::fs::copy(target.join("debug/libshardport_faulty_plugin.so"), dest).unwrap();
}

/// The node config of the upgrade test: the running build (`faulty`), the
/// new one (`faulty-next`, from `next`), and the canary experiment.
fn upgrade_config(next: &Path) -> String {
    format!(
        "[fetch]\non-downgrade = \"allow\"
[[experiment]]
name = \"faulty-upgrade\"
arms = [
  {{ name = \"running\", transport = \"faulty\", weight = 100 }},
  {{ name = \"next\", transport = \"faulty-next\", weight = 1 }},
]
guardrail = {{ max-error-rate = 0.2, min-samples = 10, window = \"60s\", cooldown = \"off\" }}
ramp = {{ arm = \"next\", steps = [10, 50], interval = \"60s\" }}
[[plugin]]
name = \"faulty\"
path = \"{}\"
[[plugin]]
name = \"faulty-next\"
transport = \"faulty\"
path = \"{}\"
",
        util::plugin_lib("shardport-faulty-plugin").display(),
        next.display()
    )
}

/// Fetches every handle; returns the ids the `faulty-next` arm served.
fn served_by_next(n: &Node, handles: &[Handle]) -> std::collections::BTreeSet<u128> {
    handles
        .iter()
        .filter_map(|h| {
            let f = n
                .fetch_mode(h, FetchMode::Copy)
                .expect("every fetch is served");
            assert!(f.data.iter().all(|&b| b == f.data[0]));
            (f.selection.transport == "faulty-next").then_some(h.id.as_u128())
        })
        .collect()
}

#[test]
fn a_new_transport_build_rolls_out_as_a_ramped_canary() {
    let dir = util::temp_dir("reload-upgrade");
    let (broken, fixed) = (dir.path().join("next-1.so"), dir.path().join("next-2.so"));
    faulty_build("odd-imports-fail", &broken);
    faulty_build("fixed", &fixed);
    let clock = Arc::new(util::ManualClock::default());
    let n = Node::start_with_clock(util::parse(&upgrade_config(&broken)), clock.clone()).unwrap();
    let version = |name: &str| {
        n.plugin(name)
            .unwrap()
            .transport
            .describe()
            .version
            .to_string()
    };
    assert_eq!(version("faulty-next"), "0.1.0+odd-imports-fail");

    // The broken build on its first step (10%): half its imports fail, the
    // fetches fall back to the running build, and the guardrail stops the
    // canary and its ramp.
    let handles = put_many(&n, 400);
    let _ = served_by_next(&n, &handles);
    let snap = n.metrics_snapshot();
    let arm = &snap.experiments[0].arms[1];
    assert_eq!(arm.state, "tripped", "{arm:?}");
    assert_eq!(
        (
            snap.experiments[0].ramp_step,
            snap.experiments[0].ramp_halted
        ),
        (Some(0), true)
    );
    clock.advance(Duration::from_secs(600));
    let _ = served_by_next(&n, &handles[..10]);
    assert_eq!(
        n.metrics_snapshot().experiments[0].ramp_step,
        Some(0),
        "halted: no step"
    );
    let kinds: Vec<&str> = snap.events.iter().map(|e| e.kind.as_str()).collect();
    assert!(
        kinds.contains(&"trip") && kinds.contains(&"ramp-halt"),
        "{kinds:?}"
    );
    // Arm counters are cumulative across reloads (per experiment and arm name).
    let errors_of_broken = arm.series.errors;
    assert!(errors_of_broken > 0, "{arm:?}");

    // The fixed build replaces it under a live node: a new instance, whose
    // arm stays tripped (and its ramp halted) until the operator resets it.
    n.clear();
    let r = reload(&n, &upgrade_config(&fixed)).unwrap();
    assert!(
        r.changes
            .iter()
            .any(|c| c.contains("arm next is served by a new instance") && c.contains("tripped")),
        "{:?}",
        r.changes
    );
    let e = &n.metrics_snapshot().experiments[0];
    assert_eq!(e.arms[1].state, "tripped");
    assert_eq!(e.arms[1].guardrail_trips, 1, "the counter carried over");
    assert_eq!((e.ramp_step, e.ramp_halted), (Some(0), true));
    assert_eq!(
        n.reset_experiments(None).unwrap(),
        vec![("faulty-upgrade".to_owned(), "next".to_owned())]
    );
    assert!(
        r.changes
            .iter()
            .any(|c| c.contains("faulty-next") && c.contains("removed")),
        "{:?}",
        r.changes
    );
    assert!(
        r.changes
            .iter()
            .any(|c| c.contains("0.1.0") && c.contains("next-2.so")),
        "{:?}",
        r.changes
    );
    assert_eq!(version("faulty-next"), "0.1.0+fixed");
    assert!(n.draining().is_empty(), "the broken build is gone");
    // 1000 shards: a share's binomial standard deviation is <= 1.6
    // points, and each bound below is 5 of them away (ids are random per
    // run, so the split is too).
    let handles = put_many(&n, 1000);
    let step0 = served_by_next(&n, &handles);
    let share0 = step0.len() as f64 / handles.len() as f64;
    assert!((0.052..0.148).contains(&share0), "step 0 share {share0}");
    // One interval later the ramp takes its next step (50%), and every shard
    // the canary served stays with it.
    clock.advance(Duration::from_secs(61));
    let step1 = served_by_next(&n, &handles);
    let share1 = step1.len() as f64 / handles.len() as f64;
    assert!((0.42..0.58).contains(&share1), "step 1 share {share1}");
    assert!(
        step0.is_subset(&step1),
        "a ramp step moved shards out of the canary"
    );
    let snap = n.metrics_snapshot();
    let e = &snap.experiments[0];
    assert_eq!((e.ramp_step, e.ramp_halted), (Some(1), false));
    assert_eq!(e.arms[1].state, "enabled");
    assert_eq!(
        e.arms[1].series.errors, errors_of_broken,
        "the fixed build never failed"
    );
    assert!(snap
        .events
        .iter()
        .any(|x| x.kind == "ramp-step" && x.text.contains("50.0%")));
}

#[test]
fn a_tighter_cache_limit_evicts_at_once() {
    let dir = util::temp_dir("reload-cache");
    let o = owner(dir.path());
    let handles: Vec<Handle> = (0..8)
        .map(|i| {
            o.put(
                &[i as u8; 65536],
                &TensorSpec::bytes(65536),
                BTreeMap::new(),
            )
            .unwrap()
        })
        .collect();
    let cfg = |budget: &str| {
        format!(
            "[cache]\npolicy = \"lru\"\nmax-bytes = \"{budget}\"\n{}",
            util::shm_plugin("")
        )
    };
    let c = Node::start(util::parse(&cfg("1MiB"))).unwrap();
    for h in &handles {
        drop(c.fetch_mode(h, FetchMode::Copy).unwrap());
    }
    assert_eq!(c.cache_stats().entries, 8);
    let r = reload(&c, &cfg("128KiB")).unwrap();
    assert_eq!(r.evicted, 6, "{r:?}");
    assert_eq!(c.cache_stats().entries, 2);
    assert!(
        r.changes
            .iter()
            .any(|x| x == "cache.max-bytes: \"1MiB\" -> \"128KiB\""),
        "{:?}",
        r.changes
    );
    // The two most recently used stay: hits, with no transport involved.
    for h in &handles[6..] {
        assert_eq!(
            c.fetch_mode(h, FetchMode::Copy)
                .unwrap()
                .selection
                .transport,
            "cache"
        );
    }
    // Turning the cache off lets go of everything.
    let r = reload(&c, &util::shm_plugin("")).unwrap();
    assert_eq!((r.evicted, c.cache_stats().entries), (2, 0));
}

/// Puts through a pinned node keep the config generation it was pinned
/// under: a reload meanwhile (here, one that stops exporting through
/// posix-shm) changes the node's later puts, not the pinned ones.
#[test]
fn a_pinned_node_puts_under_the_generation_it_was_pinned_with() {
    let both = format!("{}{}", util::shm_plugin(""), util::http_plugin());
    let node = Node::start(util::parse(&both)).unwrap();
    let pinned = node.pinned();
    reload(&node, &format!("[put]\nexport-to = [\"http\"]\n{both}")).expect("reload applies");
    assert_eq!((pinned.generation(), node.generation()), (0, 1));
    let transports =
        |h: &Handle| -> Vec<String> { h.exports.iter().map(|e| e.transport.to_string()).collect() };
    let spec = TensorSpec::bytes(64);
    let old = pinned
        .put_with(&spec, Default::default(), |b| b.fill(1))
        .unwrap();
    let new = node
        .put_with(&spec, Default::default(), |b| b.fill(2))
        .unwrap();
    assert!(
        transports(&old).contains(&"posix-shm".to_owned()),
        "{:?}",
        transports(&old)
    );
    assert_eq!(transports(&new), vec!["http".to_owned()]);
    assert_eq!(&node.fetch(&old).unwrap().data[..], &[1u8; 64][..]);
}
