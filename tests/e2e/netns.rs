//! Two nodes on real, distinct network addresses: two Linux network
//! namespaces joined by a veth pair, made (and always removed) by the test.
//! A shard owned in namespace A is fetched by a consumer in B over http, and
//! by a consumer in A over shared memory; the reported reasons say why.
//! Skipped, with the reason printed, where `ip netns` is unavailable
//! (no iproute2, or no privilege to create namespaces).

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Output, Stdio},
};

use crate::util;

/// Two namespaces and the veth between them; removed on drop.
struct Netns {
    a: String,
    b: String,
    addr_a: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let id = std::process::id() % 10_000;
        let n = Netns {
            a: format!("spa-{id}"),
            b: format!("spb-{id}"),
            addr_a: format!("10.231.{}.1", id % 250),
        };
        let addr_b = format!("10.231.{}.2", id % 250);
        let (va, vb) = (format!("spva{id}"), format!("spvb{id}"));
        ip(&["netns", "add", &n.a])?;
        // From here on, Drop removes whatever was made.
        ip(&["netns", "add", &n.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &n.a])?;
        ip(&["link", "set", &vb, "netns", &n.b])?;
        for (ns, dev, addr) in [(&n.a, &va, &n.addr_a), (&n.b, &vb, &addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth, and so the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn in_ns(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(util::shardport_bin())
        .args(args);
    c
}

fn config(dir: &std::path::Path, name: &str, advertise: &str, http_bind: &str) -> String {
    let path = dir.join(name);
    let text = format!(
        "[node]\nname = \"{name}\"\nadvertise = \"{advertise}\"\n\
         [put]\nstorage = \"pool\"\npool-transport = \"posix-shm\"\nchecksum = \"xxh3\"\n\
         [control]\nbind = \"127.0.0.1:0\"\n\
         {}[[plugin]]\nname = \"http\"\npath = \"{}\"\nrequired = true\n[plugin.config]\nbind = \"{http_bind}\"\n",
        util::shm_plugin("pool-size = \"16MiB\""),
        util::plugin_lib("shardport-http").display()
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A `serve` process stopped cleanly (SIGTERM) when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        util::terminate(&mut self.0);
    }
}

fn stdout_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn two_namespaces_http_across_shm_within() {
    let net = match Netns::create() {
        Ok(n) => n,
        Err(why) => {
            eprintln!("netns test skipped: {why}");
            return;
        }
    };
    let dir = util::temp_dir("netns");
    let owner_cfg = config(
        dir.path(),
        "owner-a",
        &format!("{}:7070", net.addr_a),
        &format!("{}:0", net.addr_a),
    );
    let consumer_b = config(dir.path(), "consumer-b", "127.0.0.1:7070", "127.0.0.1:0");
    let consumer_a = config(dir.path(), "consumer-a", "127.0.0.1:7070", "127.0.0.1:0");

    let mut owner = in_ns(&net.a, &["serve", "--config", &owner_cfg])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(owner.stdout.take().unwrap()).lines();
    let owner = Killed(owner);
    let control = lines
        .next()
        .unwrap()
        .unwrap()
        .strip_prefix("control: ")
        .unwrap()
        .to_owned();
    std::thread::spawn(move || for _ in lines {});

    let put = in_ns(
        &net.a,
        &["put", "--node", &control, "--size", "3MiB", "--seed", "11"],
    )
    .output()
    .unwrap();
    assert!(put.status.success(), "{}", stdout_of(&put));
    let handle = String::from_utf8(put.stdout).unwrap().trim().to_owned();

    // Namespace B: another address; identity agrees (same kernel, same
    // /dev/shm), but the owner's address is not local, so http.
    let b = in_ns(
        &net.b,
        &[
            "fetch",
            "--config",
            &consumer_b,
            "--handle",
            &handle,
            "--mode",
            "view",
            "--verify-seed",
            "11",
        ],
    )
    .output()
    .unwrap();
    let text = stdout_of(&b);
    assert!(b.status.success(), "{text}");
    assert!(text.contains("via http"), "{text}");
    assert!(
        text.contains("reason: reaches any node, copy (no zero-copy)"),
        "{text}"
    );
    assert!(text.contains("verified: pattern seed 11"), "{text}");

    // Namespace A: same address space, shared memory, zero-copy.
    let a = in_ns(
        &net.a,
        &[
            "fetch",
            "--config",
            &consumer_a,
            "--handle",
            &handle,
            "--mode",
            "view",
            "--verify-seed",
            "11",
        ],
    )
    .output()
    .unwrap();
    let text = stdout_of(&a);
    assert!(a.status.success(), "{text}");
    assert!(text.contains("via posix-shm"), "{text}");
    assert!(
        text.contains(
            "reason: owner on this node (address local, identity agrees), zero-copy view"
        ),
        "{text}"
    );
    drop(owner);
}
