//! Operating transports in production, as an operator does it: `shardport
//! serve` owners, long-lived consumers (`serve --fetch`) fetching in a loop,
//! experiments with guardrails and ramps, reloads by SIGHUP and by
//! `shardport reload`, `shardport ab reset`, and an upgrade finished as the
//! README says. Counters never go backwards, trips and ramps move only by
//! an operator's command or a documented rule, and no shard put before an
//! upgrade becomes unreachable.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::util;

/// A running `shardport serve`.
struct Served {
    child: Child,
    control: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        util::terminate(&mut self.child);
    }
}

/// Starts `shardport serve` on `config` (with `--fetch FILE` when given).
fn serve(config: &Path, fetch: Option<&Path>) -> Served {
    let mut cmd = Command::new(util::shardport_bin());
    cmd.args(["serve", "--config"]).arg(config);
    if let Some(f) = fetch {
        cmd.arg("--fetch").arg(f).args(["--fetch-every", "5ms"]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let (sink, pipe) = (Arc::clone(&stderr), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    let Some(control) = first.strip_prefix("control: ").map(str::to_owned) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve did not start: {first}\n{}", stderr.lock().unwrap());
    };
    std::thread::spawn(move || for _ in lines {});
    Served {
        child,
        control,
        stderr,
    }
}

impl Served {
    fn get(&self, path: &str) -> Value {
        shardport_control::client::call(
            &self.control,
            "GET",
            path,
            None,
            &[],
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    fn metrics(&self) -> Value {
        self.get("/v1/metrics.json")
    }

    /// Polls the metrics snapshot until `f` holds (bounded); returns it.
    fn wait_metrics(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let m = self.metrics();
            if f(&m) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "never happened: {what}; last experiments {} events {}\nnode log:\n{}",
                m["experiments"],
                m["events"],
                self.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn sighup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Puts `n` shards of 64 KiB (pattern seeds 1..=n); returns their handles.
    fn put(&self, n: u64) -> Vec<String> {
        (1..=n)
            .map(|seed| {
                let out = util::shardport_ok(&[
                    "put",
                    "--node",
                    &self.control,
                    "--size",
                    "64KiB",
                    "--seed",
                    &seed.to_string(),
                ]);
                out.trim().to_owned()
            })
            .collect()
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// The snapshot's arm `arm` of its first experiment.
fn arm(m: &Value, arm: usize) -> &Value {
    &m["experiments"][0]["arms"][arm]
}

fn trips(m: &Value, a: usize) -> u64 {
    arm(m, a)["guardrail_trips"].as_u64().unwrap()
}

fn ramp_step(m: &Value) -> Option<u64> {
    m["experiments"][0]["ramp_step"].as_u64()
}

/// The http plugin table named `name` from `lib`, with extra config lines.
fn http_instance(name: &str, lib: &Path, extra: &str) -> String {
    format!(
        "[[plugin]]\nname = \"{name}\"\ntransport = \"http\"\npath = \"{}\"\nrequired = true\n[plugin.config]\nbind = \"127.0.0.1:0\"\n{extra}\n",
        lib.display()
    )
}

/// An owner exporting through `http` and `http-next` (both from the http
/// library), with its shards on the heap.
fn http_owner(dir: &Path) -> Served {
    let lib = util::plugin_lib("shardport-http");
    let path = dir.join("owner.toml");
    std::fs::write(
        &path,
        format!(
            "[node]\nname = \"owner\"\n[control]\nbind = \"127.0.0.1:0\"\n{}{}",
            http_instance("http", &lib, ""),
            http_instance("http-next", &lib, "")
        ),
    )
    .unwrap();
    serve(&path, None)
}

/// A consumer config: a canary experiment `running` (http) vs `next`
/// (http-next, with `next_extra` plugin lines) ramped over `steps` (%).
fn ramp_consumer(steps: &str, interval: &str, next_extra: &str) -> String {
    let lib = util::plugin_lib("shardport-http");
    format!(
        "[node]\nname = \"consumer\"\n[control]\nbind = \"127.0.0.1:0\"\n[fetch]\nmode = \"copy\"\non-downgrade = \"allow\"
[[experiment]]
name = \"upgrade\"
unit = \"fetch\"
arms = [
  {{ name = \"running\", transport = \"http\", weight = 100 }},
  {{ name = \"next\", transport = \"http-next\", weight = 1 }},
]
guardrail = {{ max-error-rate = 0.3, min-samples = 10, window = \"60s\", cooldown = \"off\" }}
ramp = {{ arm = \"next\", steps = {steps}, interval = \"{interval}\" }}
{}{}",
        http_instance("http", &lib, ""),
        http_instance("http-next", &lib, next_extra)
    )
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

/// Events of `kind` in the snapshot's timeline.
fn events<'a>(m: &'a Value, kind: &str) -> Vec<&'a Value> {
    m["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == kind)
        .collect()
}

#[test]
fn a_trip_and_its_counter_survive_a_reload_that_replaces_the_arms_plugin() {
    let dir = util::temp_dir("operate-trip");
    let owner_cfg = dir.path().join("owner.toml");
    write(
        &owner_cfg,
        &format!(
            "[node]\nname = \"owner\"\n[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n[control]\nbind = \"127.0.0.1:0\"\n{}{}",
            util::shm_plugin("pool-size = \"16MiB\""),
            util::http_plugin()
        ),
    );
    let owner = serve(&owner_cfg, None);
    let handles = dir.path().join("handles.txt");
    write(&handles, &owner.put(16).join("\n"));
    // The canary's http fails every fetch (an injected reset) and its
    // guardrail, with no cool-down, keeps it off until an operator resets it.
    let consumer_cfg = |faults: &str| {
        format!(
            "[node]\nname = \"consumer\"\n[control]\nbind = \"127.0.0.1:0\"\n[fetch]\nmode = \"copy\"\non-downgrade = \"allow\"
[[experiment]]
name = \"shm-vs-http\"
arms = [
  {{ name = \"control\", transport = \"posix-shm\", weight = 50 }},
  {{ name = \"canary\", transport = \"http\", weight = 50 }},
]
guardrail = {{ max-error-rate = 0.2, min-samples = 10, window = \"60s\", cooldown = \"off\" }}
{}{}{faults}",
            util::shm_plugin("pool-size = \"1MiB\""),
            util::http_plugin()
        )
    };
    let path = dir.path().join("consumer.toml");
    write(
        &path,
        &consumer_cfg("[plugin.faults]\nseed = 7\nreset = 1.0\n"),
    );
    let c = serve(&path, Some(&handles));
    let tripped = c.wait_metrics("the canary trips", |m| arm(m, 1)["state"] == "tripped");
    let before = trips(&tripped, 1);
    assert!(before >= 1, "{}", tripped["experiments"]);
    // The fixed http: same instance name, another table, so a new instance.
    write(&path, &consumer_cfg(""));
    c.sighup();
    let m = c.wait_metrics("the reload", |m| m["reloads"] == 1);
    assert!(
        trips(&m, 1) >= before,
        "guardrail_trips went backwards from {before}: {}",
        m["experiments"]
    );
    assert_eq!(
        arm(&m, 1)["state"],
        "tripped",
        "a reload cleared the trip of a `cooldown = \"off\"` arm"
    );
    // Some fetches later the arm is still off: only a reset turns it on.
    let seen = arm(&m, 0)["assigned"].as_u64().unwrap();
    let m = c.wait_metrics("more fetches", |m| {
        arm(m, 0)["assigned"].as_u64().unwrap() > seen + 50
    });
    assert_eq!(arm(&m, 1)["state"], "tripped");
    let reload = events(&m, "reload");
    assert!(
        reload
            .iter()
            .any(|e| e["text"].as_str().unwrap().contains("canary")),
        "the reload event says what happened to the arm: {reload:?}"
    );
    let text = util::shardport_ok(&["metrics", "--node", &c.control]);
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("shardport_experiment_guardrail_trips_total{")
                && l.contains("arm=\"canary\"")
        })
        .unwrap_or_else(|| panic!("no trips series for the canary:\n{text}"));
    let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= before as f64, "{line}");
    util::shardport_ok(&["ab", "reset", "--node", &c.control]);
    let m = c.wait_metrics("the canary serves again", |m| {
        arm(m, 1)["state"] == "enabled" && arm(m, 1)["fetches"].as_u64().unwrap() > 0
    });
    assert!(trips(&m, 1) >= before);
}

#[test]
fn a_ramp_keeps_its_step_when_a_setting_of_the_new_build_changes() {
    let dir = util::temp_dir("operate-ramp-keep");
    let owner = http_owner(dir.path());
    let handles = dir.path().join("handles.txt");
    write(&handles, &owner.put(16).join("\n"));
    let path = dir.path().join("consumer.toml");
    write(&path, &ramp_consumer("[10, 50]", "1s", ""));
    // What the operator checks first: both instances and their transport,
    // and the share the canary really starts with (its first step).
    let check = util::shardport_ok(&["config", "check", path.to_str().unwrap()]);
    assert!(
        check.contains("plugin      http (transport http)")
            || check.contains("plugin      http <-"),
        "{check}"
    );
    assert!(
        check.contains("plugin      http-next (transport http)"),
        "{check}"
    );
    assert!(
        check.contains("running (control) via http 90.0%")
            && check.contains("next via http-next 10.0%"),
        "{check}"
    );
    assert!(check.contains("ramp: next takes 10% -> 50%"), "{check}");
    let c = serve(&path, Some(&handles));
    c.wait_metrics("the ramp's second step", |m| ramp_step(m) == Some(1));
    write(
        &path,
        &ramp_consumer("[10, 50]", "1s", "max-connections-per-owner = 3"),
    );
    let out = util::shardport_ok(&["reload", "--node", &c.control]);
    assert!(out.contains("generation 1"), "{out}");
    let m = c.metrics();
    assert_eq!(
        ramp_step(&m),
        Some(1),
        "the ramp went back from 50%: {}\n{out}",
        m["experiments"]
    );
    assert!((arm(&m, 1)["share"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(m["experiments"][0]["ramp_halted"], false);
}

#[test]
fn a_reset_resumes_a_halted_ramp_one_interval_later_not_at_once() {
    let dir = util::temp_dir("operate-ramp-reset");
    let owner = http_owner(dir.path());
    let handles = dir.path().join("handles.txt");
    write(&handles, &owner.put(16).join("\n"));
    let path = dir.path().join("consumer.toml");
    write(
        &path,
        &ramp_consumer(
            "[10, 25, 50]",
            "3s",
            "[plugin.faults]\nseed = 3\nreset = 1.0\n",
        ),
    );
    let c = serve(&path, Some(&handles));
    let m = c.wait_metrics("the canary trips and halts the ramp", |m| {
        m["experiments"][0]["ramp_halted"] == true
    });
    let halted_at = ramp_step(&m);
    // The step is long overdue when the operator resets.
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(ramp_step(&c.metrics()), halted_at, "a halted ramp stepped");
    util::shardport_ok(&["ab", "reset", "--node", &c.control]);
    let m = c.wait_metrics("the reset in the timeline", |m| {
        !events(m, "reset").is_empty()
    });
    let reset_at = events(&m, "reset")[0]["at_unix_ms"].as_u64().unwrap();
    // Let the consumer fetch a while after the reset.
    let seen = arm(&m, 0)["assigned"].as_u64().unwrap();
    let m = c.wait_metrics("fetches after the reset", |m| {
        arm(m, 0)["assigned"].as_u64().unwrap() > seen + 100
    });
    for e in events(&m, "ramp-step") {
        let at = e["at_unix_ms"].as_u64().unwrap();
        assert!(
            at + 100 < reset_at || at >= reset_at + 2900,
            "a ramp step {} ms after the reset, before any interval passed: {e}",
            at.saturating_sub(reset_at)
        );
    }
}

#[test]
fn finishing_an_upgrade_as_documented_keeps_every_shard_reachable_over_http() {
    let dir = util::temp_dir("operate-upgrade");
    let running = util::plugin_lib("shardport-http");
    let next = dir.path().join("libshardport_http-next.so");
    std::fs::copy(&running, &next).unwrap();
    let owner_cfg = dir.path().join("owner.toml");
    let owner_text = |http: &Path, with_next: bool| {
        format!(
            "[node]\nname = \"owner\"\n[put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\n[control]\nbind = \"127.0.0.1:0\"\n{}{}{}",
            util::shm_plugin("pool-size = \"16MiB\""),
            http_instance("http", http, ""),
            if with_next {
                http_instance("http-next", &next, "")
            } else {
                String::new()
            }
        )
    };
    write(&owner_cfg, &owner_text(&running, true));
    let owner = serve(&owner_cfg, None);
    let before = owner.put(3);
    // A remote consumer: http only.
    let consumer = dir.path().join("remote.toml");
    write(
        &consumer,
        &format!(
            "[fetch]\nmode = \"copy\"\n{}",
            http_instance("http", &running, "")
        ),
    );
    let fetch = |handle: &str, seed: usize| {
        let out = Command::new(util::shardport_bin())
            .arg("fetch")
            .arg("--config")
            .arg(&consumer)
            .args(["--handle", handle, "--verify-seed", &seed.to_string()])
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    for (i, h) in before.iter().enumerate() {
        let (ok, out) = fetch(h, i + 1);
        assert!(ok && out.contains("via http"), "{out}");
    }
    // Finish: the new file becomes `http`, `http-next` goes; reload.
    write(&owner_cfg, &owner_text(&next, false));
    let out = util::shardport_ok(&["reload", "--node", &owner.control]);
    assert!(out.contains("generation 1"), "{out}");
    for (i, h) in before.iter().enumerate() {
        let (ok, out) = fetch(h, i + 1);
        assert!(
            ok && out.contains("verified"),
            "a shard put before the upgrade is unreachable: {out}\nowner log:\n{}",
            owner.log()
        );
    }
    let after = owner.put(1);
    let (ok, out) = fetch(&after[0], 1);
    assert!(ok, "{out}");
    // The old instances serve the old shards until they are removed, then go.
    let st = owner.get("/v1/stats");
    assert!(
        !st["draining"].as_array().unwrap().is_empty(),
        "the old instances should be draining: {st}"
    );
    let ids: Vec<String> = before
        .iter()
        .map(|h| {
            let bytes = hex::decode(h).unwrap();
            shardport_host::Handle::from_bytes(&bytes)
                .unwrap()
                .id
                .to_string()
        })
        .collect();
    let body = serde_json::json!({ "ids": ids }).to_string();
    shardport_control::client::call(
        &owner.control,
        "POST",
        "/v1/remove",
        None,
        body.as_bytes(),
        Duration::from_secs(10),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The periodic sweep (or a stats call) drops what nothing holds.
        let st = owner.get("/v1/stats");
        if st["draining"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still draining: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn weight_zero_drains_an_arm_and_keeps_it_configured() {
    let dir = util::temp_dir("operate-weight0");
    let owner = http_owner(dir.path());
    let handles = dir.path().join("handles.txt");
    write(&handles, &owner.put(32).join("\n"));
    let lib = util::plugin_lib("shardport-http");
    let text = |w: u32| {
        format!(
            "[node]\nname = \"consumer\"\n[control]\nbind = \"127.0.0.1:0\"\n[fetch]\nmode = \"copy\"
[[experiment]]
name = \"ab\"
unit = \"fetch\"
arms = [
  {{ name = \"a\", transport = \"http\", weight = 50 }},
  {{ name = \"b\", transport = \"http-next\", weight = {w} }},
]
{}{}",
            http_instance("http", &lib, ""),
            http_instance("http-next", &lib, "")
        )
    };
    let path = dir.path().join("consumer.toml");
    write(&path, &text(50));
    let c = serve(&path, Some(&handles));
    c.wait_metrics("both arms serve", |m| {
        arm(m, 1)["assigned"].as_u64().unwrap() > 20
    });
    write(&path, &text(0));
    let check = util::shardport_ok(&["config", "check", path.to_str().unwrap()]);
    assert!(check.contains("b via http-next 0.0%"), "{check}");
    let out = util::shardport_ok(&["reload", "--node", &c.control]);
    assert!(
        out.contains("b=50 -> a=50 b=0") || out.contains("b=0"),
        "{out}"
    );
    let m = c.metrics();
    let (a0, b0) = (
        arm(&m, 0)["assigned"].as_u64().unwrap(),
        arm(&m, 1)["assigned"].as_u64().unwrap(),
    );
    let m = c.wait_metrics("fetches after the drain", |m| {
        arm(m, 0)["assigned"].as_u64().unwrap() > a0 + 300
    });
    // One fetch may have been planned under the old weights as the swap came.
    assert!(
        arm(&m, 1)["assigned"].as_u64().unwrap() <= b0 + 1,
        "a drained arm got traffic: {}",
        arm(&m, 1)
    );
    assert_eq!(arm(&m, 1)["share"].as_f64(), Some(0.0));
    assert_eq!(arm(&m, 1)["state"], "enabled");
}

#[test]
fn config_check_fails_like_serve_when_a_required_plugin_cannot_load() {
    let dir = util::temp_dir("operate-check");
    let path = dir.path().join("node.toml");
    write(
        &path,
        "[[plugin]]\nname = \"http\"\npath = \"nowhere/libshardport_http.so\"\nrequired = true\n",
    );
    let run = |cmd: &[&str]| {
        Command::new(util::shardport_bin())
            .args(cmd)
            .arg(&path)
            .output()
            .unwrap()
    };
    let check = run(&["config", "check"]);
    let serve = run(&["serve", "--control", "127.0.0.1:0", "--config"]);
    assert_eq!(check.status.code(), Some(3), "{check:?}");
    assert_eq!(serve.status.code(), Some(3), "{serve:?}");
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        out.contains("(file not found)") && out.contains("nowhere/libshardport_http.so"),
        "{out}"
    );
    assert!(
        String::from_utf8_lossy(&check.stderr).contains("required plugins did not load"),
        "{check:?}"
    );
}

#[test]
fn gc_reports_an_unavailable_transport_as_skipped_without_a_warning() {
    let dir = util::temp_dir("operate-gc");
    let path = dir.path().join("node.toml");
    write(
        &path,
        &format!("{}{}", util::shm_plugin(""), util::cuda_plugin()),
    );
    let out = Command::new(util::shardport_bin())
        .args(["gc", "--config"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(stdout.contains("posix-shm: "), "{stdout}");
    if stdout.contains("cuda-ipc: skipped") {
        assert!(!stderr.contains("sweep failed"), "{stderr}");
    } else {
        eprintln!("cuda-ipc is available here: its sweep ran ({stdout})");
    }
}
