//! `is_local_addr`: is an advertised `host:port` this machine?
//!
//! True for loopback, the unspecified address, this machine's hostname and
//! FQDN, and every address of its interfaces. Interface addresses and name
//! resolutions are cached and refreshed after [`REFRESH`], so a node notices
//! interfaces that come and go (containers, VPNs) without querying the kernel
//! on every fetch. An address is not proof that shared memory is reachable;
//! [`NodeIdentity`](crate::identity::NodeIdentity) covers that half.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, SocketAddr, ToSocketAddrs},
    sync::Mutex,
    time::{Duration, Instant},
};

/// How long interface addresses and resolutions stay cached: short enough to
/// follow an interface change within seconds, long enough that a busy
/// consumer queries the kernel a few times a minute at most.
pub const REFRESH: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Cache {
    fetched: Option<Instant>,
    addrs: HashSet<IpAddr>,
    names: HashSet<String>,
    verdicts: HashMap<String, bool>,
}

/// Decides whether advertised addresses are local. One per node.
#[derive(Default)]
pub struct Locality {
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for Locality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locality").finish_non_exhaustive()
    }
}

/// Splits `host:port` (`[v6]:port` too); `None` when malformed.
pub fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then_some((host, port))
}

fn this_host_names() -> HashSet<String> {
    let mut names = HashSet::new();
    for path in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(n) = std::fs::read_to_string(path) {
            let n = n.trim().to_ascii_lowercase();
            if !n.is_empty() {
                names.insert(n);
            }
        }
    }
    let domain = std::fs::read_to_string("/proc/sys/kernel/domainname")
        .map(|d| d.trim().to_ascii_lowercase())
        .unwrap_or_default();
    if !domain.is_empty() && domain != "(none)" {
        let short: Vec<String> = names.iter().cloned().collect();
        for n in short {
            names.insert(format!("{n}.{domain}"));
        }
    }
    names.insert("localhost".to_owned());
    names
}

impl Locality {
    /// A fresh cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn refresh(&self, c: &mut Cache) {
        let now = Instant::now();
        if c.fetched.is_some_and(|t| now.duration_since(t) < REFRESH) {
            return;
        }
        let mut addrs: HashSet<IpAddr> = if_addrs::get_if_addrs()
            .map(|v| v.into_iter().map(|i| i.ip()).collect())
            .unwrap_or_default();
        // if-addrs omits IPv6 link-local addresses; loopback is always local.
        addrs.insert(IpAddr::from([127, 0, 0, 1]));
        addrs.insert(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]));
        if addrs != c.addrs {
            tracing::debug!(target: "locality", count = addrs.len(), "interface addresses changed");
        }
        c.addrs = addrs;
        c.names = this_host_names();
        c.verdicts.clear();
        c.fetched = Some(now);
    }

    /// Reads the interface addresses and host names now, so that the first
    /// fetch does not pay for it (a node calls this when it starts).
    pub fn warm(&self) {
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut c);
    }

    /// True when `addr` (`host:port`) names this machine.
    pub fn is_local_addr(&self, addr: &str) -> bool {
        let Some((host, _)) = split_host_port(addr) else {
            return false;
        };
        // Loopback and unspecified literals are this machine whatever its
        // interfaces: no need to read them.
        if host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
        {
            return true;
        }
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(&mut c);
        if let Some(v) = c.verdicts.get(addr) {
            return *v;
        }
        let verdict = match host.parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip.is_unspecified() || c.addrs.contains(&ip),
            Err(_) => {
                let lower = host.to_ascii_lowercase();
                c.names.contains(&lower)
                    || resolve(host)
                        .iter()
                        .any(|ip| ip.is_loopback() || ip.is_unspecified() || c.addrs.contains(ip))
            }
        };
        c.verdicts.insert(addr.to_owned(), verdict);
        verdict
    }
}

fn resolve(host: &str) -> Vec<IpAddr> {
    (host, 0)
        .to_socket_addrs()
        .map(|it| it.map(|s: SocketAddr| s.ip()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_unspecified_and_hostname_are_local() {
        let l = Locality::new();
        assert!(l.is_local_addr("127.0.0.1:7070"));
        assert!(l.is_local_addr("127.3.4.5:1"));
        assert!(l.is_local_addr("[::1]:7070"));
        assert!(l.is_local_addr("0.0.0.0:1"));
        assert!(l.is_local_addr("localhost:80"));
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert!(l.is_local_addr(&format!("{}:9", host.trim())));
    }

    #[test]
    fn every_interface_address_is_local() {
        let l = Locality::new();
        for i in if_addrs::get_if_addrs().unwrap() {
            let a = match i.ip() {
                IpAddr::V4(v4) => format!("{v4}:1"),
                IpAddr::V6(v6) => format!("[{v6}]:1"),
            };
            assert!(l.is_local_addr(&a), "{a}");
        }
    }

    #[test]
    fn foreign_and_malformed_addresses_are_not() {
        let l = Locality::new();
        // TEST-NET-3 (RFC 5737): never assigned to a real interface.
        assert!(!l.is_local_addr("203.0.113.7:7070"));
        assert!(!l.is_local_addr("no-port"));
        assert!(!l.is_local_addr(":7070"));
        assert!(!l.is_local_addr("host:notaport"));
    }

    #[test]
    fn host_port_split() {
        assert_eq!(split_host_port("[::1]:80"), Some(("::1", 80)));
        assert_eq!(split_host_port("a.b:1"), Some(("a.b", 1)));
        assert_eq!(split_host_port("a.b"), None);
    }
}
