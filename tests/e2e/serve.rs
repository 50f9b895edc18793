//! `shardport serve` as an operator runs it: a long-lived owner with a
//! control endpoint, `shardport put` / `fetch` / `stats` against it, and a
//! clean shutdown on SIGTERM that leaves no segment behind.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::util;

struct Served {
    child: Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    control: String,
    tag: String,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        util::terminate(&mut self.child);
    }
}

fn serve(test: &str, extra: &str) -> Served {
    let dir = util::temp_dir(test);
    let (cfg, _) = util::write_config(
        dir.path(),
        &format!(
            "[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n[control]\nbind = \"127.0.0.1:0\"\n{extra}\n{}",
            util::shm_plugin("pool-size = \"16MiB\"")
        ),
    );
    let mut child = Command::new(util::shardport_bin())
        .args(["serve", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (sink, err_pipe) = (std::sync::Arc::clone(&stderr), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let control = lines.next().unwrap().unwrap();
    let control = control
        .strip_prefix("control: ")
        .expect("control line")
        .to_owned();
    let node = lines.next().unwrap().unwrap();
    let tag = node
        .rsplit("(tag ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .to_owned();
    // A long-lived node holds its pool from the start (`create-pool`, like
    // http's `listen`, defaults to eager under `serve`).
    let shm = lines.next().unwrap().unwrap();
    assert!(shm.starts_with("plugin: posix-shm ok, segments "), "{shm}");
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Served {
        child,
        stderr,
        control,
        tag,
        _dir: dir,
    }
}

fn shardport(args: &[&str]) -> std::process::Output {
    Command::new(util::shardport_bin())
        .args(args)
        .env("SHARDPORT_PLUGIN_DIR", util::profile_dir().join("deps"))
        .env_remove("SHARDPORT_TOKEN")
        .output()
        .unwrap()
}

#[test]
fn put_fetch_stats_and_clean_shutdown() {
    let s = serve("serve", "");
    let out = shardport(&[
        "put", "--node", &s.control, "--size", "1MiB", "--seed", "5", "--tag", "layer=3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let handle = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let h = shardport_host::Handle::from_bytes(&hex::decode(&handle).unwrap()).unwrap();
    assert_eq!(h.meta.byte_len, 1 << 20);
    assert_eq!(h.tags["layer"], "3");

    let out = shardport(&[
        "fetch",
        "--handle",
        &handle,
        "--mode",
        "copy",
        "--verify-seed",
        "5",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("via posix-shm"), "{text}");
    assert!(text.contains("verified: pattern seed 5"), "{text}");
    let out = shardport(&["fetch", "--handle", &handle, "--verify-seed", "6"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("do not match the pattern for seed 6"));

    let out = shardport(&["stats", "--node", &s.control]);
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["shards_owned"], 1);
    assert_eq!(stats["bytes_owned"], 1 << 20);

    assert!(!util::shm_segments(&s.tag).is_empty());
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let mut s = s;
    let status = s.child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100)); // let stderr drain
    assert!(
        status.success(),
        "serve exited with {status}; stderr:\n{}",
        s.stderr.lock().unwrap()
    );
    assert_eq!(util::shm_segments(&s.tag), Vec::<String>::new());
}

#[test]
fn the_control_endpoint_checks_tokens_and_survives_bad_requests() {
    let s = serve("serve-token", "auth-token = \"s3cret\"");
    let out = shardport(&["stats", "--node", &s.control]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("answered 401: missing or wrong bearer token"),
        "{err}"
    );
    let out = shardport(&["stats", "--node", &s.control, "--token", "s3cret"]);
    assert!(out.status.success());

    let raw = |req: &[u8]| -> String {
        let mut c = TcpStream::connect(&s.control).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = c.write_all(req);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut r = String::new();
        let _ = c.read_to_string(&mut r);
        r
    };
    assert!(raw(b"garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(
        raw(b"GET /v1/stats HTTP/1.1\r\nauthorization: Bearer nope\r\n\r\n")
            .starts_with("HTTP/1.1 401")
    );
    let huge = format!(
        "GET /v1/stats HTTP/1.1\r\nx: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    assert!(raw(huge.as_bytes()).starts_with("HTTP/1.1 431"));
    let r = raw(b"GET /v1/nope HTTP/1.1\r\nauthorization: Bearer s3cret\r\n\r\n");
    assert!(
        r.starts_with("HTTP/1.1 404") && r.contains("no endpoint /v1/nope"),
        "{r}"
    );
    let r = raw(b"POST /v1/put HTTP/1.1\r\nauthorization: Bearer s3cret\r\ncontent-length: 99999999999999\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    // A truncated body: the put is refused and nothing is kept.
    let r = raw(b"POST /v1/put HTTP/1.1\r\nauthorization: Bearer s3cret\r\ncontent-length: 100\r\n\r\nshort");
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    let out = shardport(&["stats", "--node", &s.control, "--token", "s3cret"]);
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        stats["shards_owned"], 0,
        "a truncated put left a shard behind"
    );
}

#[test]
fn cluster_drain_empties_every_consumers_cache_and_releases_leases() {
    use shardport_control::ControlServer;
    use shardport_host::{FetchMode, Node, TensorSpec};
    let owner = Node::start(util::parse(&util::shm_plugin("pool-size = \"1MiB\""))).unwrap();
    let handles: Vec<_> = (0..3u8)
        .map(|v| {
            owner
                .put(&[v; 2048], &TensorSpec::bytes(2048), Default::default())
                .unwrap()
        })
        .collect();
    let consumer = || {
        Node::start(util::parse(&format!(
            "[cache]\npolicy = \"explicit\"\n{}",
            util::shm_plugin("pool-size = \"1MiB\"")
        )))
        .unwrap()
    };
    let (a, b) = (consumer(), consumer());
    for n in [&a, &b] {
        for h in &handles {
            drop(n.fetch_mode(h, FetchMode::View).unwrap());
        }
    }
    let leases = || owner.stats().plugins[0].stats["leases_held_on_owner"];
    assert_eq!(leases(), 6, "cached views hold their leases");
    let sa = ControlServer::start(&a, "127.0.0.1:0", Some("tok".into())).unwrap();
    let sb = ControlServer::start(&b, "127.0.0.1:0", Some("tok".into())).unwrap();
    let ids = format!("{},{}", handles[0].id, handles[1].id);
    let (na, nb) = (sa.addr().to_string(), sb.addr().to_string());
    let out = shardport(&[
        "drain", "--node", &na, "--node", &nb, "--token", "tok", "--ids", &ids,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("{na}: drained 2")) && text.contains(&format!("{nb}: drained 2")),
        "{text}"
    );
    assert_eq!((a.cache_stats().entries, b.cache_stats().entries), (1, 1));
    assert_eq!(leases(), 2);
    let out = shardport(&[
        "drain", "--node", &na, "--node", &nb, "--token", "tok", "--all",
    ]);
    assert!(out.status.success());
    assert_eq!(leases(), 0);
    // A node that cannot be reached is reported, and the exit status says so.
    let out = shardport(&["drain", "--node", "127.0.0.1:1", "--token", "tok", "--all"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("127.0.0.1:1: FAILED"));
    // Wrong token: refused, nothing drained.
    for h in &handles {
        drop(a.fetch_mode(h, FetchMode::View).unwrap());
    }
    let out = shardport(&["drain", "--node", &na, "--token", "bad", "--all"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(a.cache_stats().entries, 3);
}

/// The node's stats over its control endpoint.
fn stats(control: &str) -> serde_json::Value {
    shardport_control::client::call(
        control,
        "GET",
        "/v1/stats",
        None,
        &[],
        Duration::from_secs(10),
    )
    .unwrap()
}

/// Polls the node's stats until `f` holds (bounded).
fn wait_for(control: &str, what: &str, f: impl Fn(&serde_json::Value) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = stats(control);
        if f(&s) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never happened: {what}; last stats {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_and_shardport_reload_apply_a_changed_config_without_a_restart() {
    let s = serve("serve-reload", "");
    let path = s._dir.path().join("node.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let hup = || {
        let ok = Command::new("kill")
            .args(["-HUP", &s.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    let out = shardport(&[
        "put", "--node", &s.control, "--size", "64KiB", "--seed", "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let handle = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // The unchanged file: serve's own adjustments are applied again, so the
    // plugin instances (and the shard in the pool) stay.
    hup();
    wait_for(&s.control, "generation 1", |v| v["generation"] == 1);
    let st = stats(&s.control);
    assert_eq!(st["shards_owned"], 1);
    assert!(st["draining"].as_array().unwrap().is_empty(), "{st}");
    // A changed file: its cache policy applies.
    std::fs::write(&path, format!("{text}\n[cache]\npolicy = \"explicit\"\n")).unwrap();
    hup();
    wait_for(&s.control, "generation 2", |v| v["generation"] == 2);
    // A broken file is refused; the node keeps the last good config.
    std::fs::write(&path, "[fetch\nmode = ").unwrap();
    hup();
    let metrics = || {
        shardport_control::client::call(
            &s.control,
            "GET",
            "/v1/metrics.json",
            None,
            &[],
            Duration::from_secs(10),
        )
        .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while metrics()["reloads_refused"] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the broken file was never refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stats(&s.control)["generation"], 2);
    // `shardport reload` with a bad file of its own: it reaches the node,
    // which refuses, counts and logs it (exit 2, naming file:line:col).
    let bad = s._dir.path().join("bad.toml");
    std::fs::write(&bad, "[fetch]\nmode = \"sideways\"\n").unwrap();
    let out = shardport(&[
        "reload",
        "--node",
        &s.control,
        "--config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad.toml:2:"),
        "{out:?}"
    );
    assert_eq!(metrics()["reloads_refused"], 2, "the node counted it");
    let good = s._dir.path().join("good.toml");
    std::fs::write(&good, &text).unwrap();
    let out = shardport(&[
        "reload",
        "--node",
        &s.control,
        "--config",
        good.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("generation 3"), "{stdout}");
    assert!(
        stdout.contains("cache.policy: "),
        "the cache policy went back: {stdout}"
    );
    // The shard put before any reload is still served.
    let out = shardport(&["fetch", "--handle", &handle, "--mode", "copy"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The reloads are in the metrics' event log, the refused one with its reason.
    let events = metrics()["events"].as_array().unwrap().clone();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "reload",
            "reload",
            "reload-refused",
            "reload-refused",
            "reload"
        ],
        "{events:?}"
    );
    // A later SIGHUP reads the file the node was started with, not the one
    // `reload --config` sent.
    std::fs::write(&path, format!("{text}\n[cache]\npolicy = \"explicit\"\n")).unwrap();
    std::fs::write(&good, format!("{text}\n[fetch]\nmode = \"copy\"\n")).unwrap();
    hup();
    wait_for(&s.control, "generation 4", |v| v["generation"] == 4);
    let last_event = || {
        let events = metrics()["events"].clone();
        events.as_array().unwrap().last().unwrap()["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let last = last_event();
    assert!(
        last.contains("cache.policy") && !last.contains("fetch.mode"),
        "{last}"
    );
    // Unless told: `--adopt` makes the sent file the node's own.
    let out = shardport(&[
        "reload",
        "--node",
        &s.control,
        "--config",
        good.to_str().unwrap(),
        "--adopt",
    ]);
    assert!(out.status.success(), "{out:?}");
    std::fs::write(&good, format!("{text}\n[fetch]\nmode = \"view\"\n")).unwrap();
    hup();
    wait_for(&s.control, "generation 6", |v| v["generation"] == 6);
    let last = last_event();
    assert!(last.contains("fetch.mode: \"copy\" -> \"view\""), "{last}");
    // Every reload is logged once at the default level, whoever asked; the
    // refused SIGHUP and the refused `reload --config` once each.
    let counts = || {
        let log = s.stderr.lock().unwrap().clone();
        let n = (
            log.matches("config reloaded: ").count(),
            log.matches("config reload refused").count(),
        );
        (n, log)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counts().0 != (6, 2) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (n, log) = counts();
    assert_eq!(n, (6, 2), "{log}");
}
