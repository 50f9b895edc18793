//! A simulated cluster on one machine: K nodes, each a Linux network
//! namespace with its own address, joined by one bridge, each node's link
//! rate-limited in both directions, so that the links (not the CPU) bound
//! what moves between nodes, as on a real cluster.
//!
//! # Topology
//! ```text
//!   ns sp<id>n0 (10.233.<x>.1)  eth0 --veth-- spv<id>x0 --+
//!   ns sp<id>n1 (10.233.<x>.2)  eth0 --veth-- spv<id>x1 --+-- bridge spbr<id>
//!   ...                                                   |
//! ```
//! A node's upload is shaped on its `eth0` (egress inside the namespace),
//! its download on the bridge side of its veth (that device's egress is
//! what the node receives): `tc ... tbf`, each direction at the node's rate
//! (netem is absent from some kernels; tbf is enough to make links the
//! bottleneck). Traffic goes only between the namespaces this testbed made
//! (addresses of its own /24); nothing is routed out of them.
//!
//! # Lifetime
//! Everything is made under one id (`sp<id>`: this process's pid and a
//! letter per testbed it made) and removed on drop, also when the making failed half-way or the caller
//! panicked (deleting a namespace deletes its veth end, and so the pair);
//! what a killed process left is removed by the next [`Cluster::create`]
//! with the same id. Needs root, `ip` and `tc`: [`Cluster::unavailable`]
//! says why not, for callers to skip with that reason.

use std::{
    net::Ipv4Addr,
    process::{Command, Stdio},
};

/// Most nodes a testbed makes (one /24, names within IFNAMSIZ).
pub const MAX_NODES: usize = 64;

/// One node's place in the testbed.
#[derive(Debug, Clone)]
pub struct NodeNet {
    /// Its network namespace.
    pub ns: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its link rate, bits per second, each direction.
    pub rate_bps: u64,
}

/// A running testbed; removed on drop.
#[derive(Debug)]
pub struct Cluster {
    id: String,
    bridge: String,
    /// The nodes, in the order their rates were given.
    pub nodes: Vec<NodeNet>,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{program}`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// tbf's bucket for `rate_bps`: 10 ms of traffic, at least 64 KiB (a
/// smaller bucket cannot hold one TSO burst and caps the rate below the
/// setting). A full bucket lets this many bytes through at once, so a
/// link's floor for `n` bytes is `(n - burst) / rate`.
pub fn burst_bytes(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 100).max(64 << 10)
}

/// TCP payload bytes per full segment on the testbed's links (MTU 1500,
/// the veth default: 1500 less 20 bytes of IPv4 header, 20 of TCP header
/// and 12 of the timestamp option every Linux connection carries).
pub const SEGMENT_PAYLOAD: u64 = 1448;

/// What each segment adds on the link, as tbf counts it (the whole frame:
/// 14 bytes of Ethernet header, 20 of IPv4, 32 of TCP with timestamps).
pub const SEGMENT_FRAMING: u64 = 66;

/// The bytes a link carries for `payload` bytes of TCP payload in full
/// segments: tbf's rate is of frames, so no TCP stream moves its payload
/// at the link's rate (1448 / 1514 = 95.6% of it at most). Acknowledgements
/// and options beyond the timestamp add a little more, not counted: on a
/// 16-node broadcast a relay's link carried 1.050 frame bytes per payload
/// byte against the 1.046 here (tc's counters), so a floor from this is
/// still below what any transfer can reach.
pub fn wire_bytes(payload: u64) -> u64 {
    payload + payload.div_ceil(SEGMENT_PAYLOAD) * SEGMENT_FRAMING
}

impl Cluster {
    /// Why no testbed can be made here (not root, `ip` or `tc` missing,
    /// no network namespaces), or `None`.
    pub fn unavailable() -> Option<String> {
        if !rustix::process::geteuid().is_root() {
            return Some("needs root (network namespaces, bridges and tc)".to_owned());
        }
        for tool in [["ip", "-V"], ["tc", "-V"]] {
            if let Err(e) = Command::new(tool[0])
                .arg(tool[1])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
            {
                return Some(format!("`{}` is not available: {e}", tool[0]));
            }
        }
        None
    }

    /// Makes one node per entry of `rates_bps` (each its link rate, both
    /// directions). Removes whatever a previous testbed with this process's
    /// id left first.
    pub fn create(rates_bps: &[u64]) -> Result<Cluster, String> {
        if rates_bps.is_empty() || rates_bps.len() > MAX_NODES {
            return Err(format!(
                "a testbed has 1..={MAX_NODES} nodes, not {}",
                rates_bps.len()
            ));
        }
        if let Some(why) = Cluster::unavailable() {
            return Err(why);
        }
        // One id per testbed of this process (a letter after the pid), so
        // a testbed made right after another never meets what the kernel
        // still tears down of it.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let id = format!("{}{}", pid % 100_000, char::from(b'a' + (n % 26) as u8));
        let subnet = ((pid + n) % 250) as u8;
        let mut c = Cluster {
            bridge: format!("spbr{id}"),
            id,
            nodes: Vec::new(),
        };
        c.remove_leftovers();
        run("ip", &["link", "add", &c.bridge, "type", "bridge"])?;
        run("ip", &["link", "set", &c.bridge, "up"])?;
        for (i, &rate) in rates_bps.iter().enumerate() {
            let node = NodeNet {
                ns: format!("sp{}n{i}", c.id),
                addr: Ipv4Addr::new(10, 233, subnet, i as u8 + 1),
                rate_bps: rate.max(8_000),
            };
            run("ip", &["netns", "add", &node.ns])?;
            c.nodes.push(node.clone());
            let host = c.host_veth(i);
            let tmp = format!("spt{}x{i}", c.id);
            run(
                "ip",
                &["link", "add", &host, "type", "veth", "peer", "name", &tmp],
            )?;
            run("ip", &["link", "set", &tmp, "netns", &node.ns])?;
            let ns = node.ns.as_str();
            run("ip", &["-n", ns, "link", "set", &tmp, "name", "eth0"])?;
            run(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{}/24", node.addr),
                    "dev",
                    "eth0",
                ],
            )?;
            run("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            run("ip", &["link", "set", &host, "master", &c.bridge])?;
            run("ip", &["link", "set", &host, "up"])?;
            let rate = format!("{}bit", node.rate_bps);
            let burst = format!("{}b", burst_bytes(node.rate_bps));
            let tbf = [
                "root", "tbf", "rate", &rate, "burst", &burst, "latency", "50ms",
            ];
            // Upload: egress of the node's own end.
            let mut up = vec!["-n", ns, "qdisc", "add", "dev", "eth0"];
            up.extend_from_slice(&tbf);
            run("tc", &up)?;
            // Download: egress of the bridge's end, towards the node.
            let mut down = vec!["qdisc", "add", "dev", host.as_str()];
            down.extend_from_slice(&tbf);
            run("tc", &down)?;
        }
        Ok(c)
    }

    fn host_veth(&self, i: usize) -> String {
        format!("spv{}x{i}", self.id)
    }

    /// Removes namespaces and the bridge named with this id (what a killed
    /// run with the same pid-derived id left behind).
    fn remove_leftovers(&self) {
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            let prefix = format!("sp{}n", self.id);
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if name
                    .strip_prefix(&prefix)
                    .is_some_and(|n| n.parse::<usize>().is_ok())
                {
                    let _ = run("ip", &["netns", "del", name]);
                }
            }
        }
        if let Ok(out) = Command::new("ip").args(["-o", "link", "show"]).output() {
            let prefix = format!("spv{}x", self.id);
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // "7: spv123ax0@if6: <...>"
                let name = line
                    .split(": ")
                    .nth(1)
                    .unwrap_or("")
                    .split('@')
                    .next()
                    .unwrap_or("");
                if name.starts_with(&prefix) {
                    let _ = run("ip", &["link", "del", name]);
                }
            }
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }

    /// `program args` inside node `i`'s namespace.
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.nodes[i].ns]).arg(program);
        c
    }

    /// This testbed's namespaces (for a caller checking what is left).
    pub fn namespaces(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.ns.clone()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Deleting one end of a veth removes the pair at once; a namespace
        // goes when its last process has.
        for i in 0..self.nodes.len() {
            let _ = run("ip", &["link", "del", &self.host_veth(i)]);
        }
        for n in &self.nodes {
            if let Err(e) = run("ip", &["netns", "del", &n.ns]) {
                tracing::warn!(target: "cluster", ns = %n.ns, error = %e, "cannot remove a namespace");
            }
        }
        if let Err(e) = run("ip", &["link", "del", &self.bridge]) {
            tracing::warn!(target: "cluster", bridge = %self.bridge, error = %e, "cannot remove the bridge");
        }
    }
}

/// Namespaces that exist now (`ip netns list`), for checks that a testbed
/// left nothing behind.
pub fn existing_namespaces() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Parses a rate: `200mbit`, `1gbit`, `500kbit`, `1000000` (bits per second).
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("gbit") {
        (n, 1_000_000_000)
    } else if let Some(n) = t.strip_suffix("mbit") {
        (n, 1_000_000)
    } else if let Some(n) = t.strip_suffix("kbit") {
        (n, 1_000)
    } else if let Some(n) = t.strip_suffix("bit") {
        (n, 1)
    } else {
        (t.as_str(), 1)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a rate (e.g. 200mbit, 1gbit)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("`{text}`: a rate must be positive"));
    }
    Ok((v * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_rate("200mbit").unwrap(), 200_000_000);
        assert_eq!(parse_rate("1.5Gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("800kbit").unwrap(), 800_000);
        assert_eq!(parse_rate("12345").unwrap(), 12_345);
        for bad in ["fast", "-5mbit", "0mbit", "mbit"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_segment_adds_its_framing() {
        assert_eq!(wire_bytes(0), 0);
        assert_eq!(wire_bytes(1), 67);
        assert_eq!(wire_bytes(1448), 1514);
        assert_eq!(wire_bytes(1449), 1449 + 2 * 66);
        // 64 MiB: 4.6% more on the link than the payload.
        let ratio = wire_bytes(64 << 20) as f64 / (64u64 << 20) as f64;
        assert!((ratio - 1514.0 / 1448.0).abs() < 1e-4, "{ratio}");
    }

    #[test]
    fn buckets_hold_ten_milliseconds_and_at_least_64_kib() {
        assert_eq!(burst_bytes(200_000_000), 250_000);
        assert_eq!(burst_bytes(1_000_000), 64 << 10);
    }
}
