//! The locality identity of a node: what makes two processes "the same
//! machine" for a same-node transport. An address alone is not proof (two
//! containers can share an IP and not `/dev/shm`), so handles carry this and
//! a same-node transport is a candidate only when the parts it needs agree.

use std::{fmt, os::unix::fs::MetadataExt, path::Path};

use serde::{Deserialize, Serialize};
use shardport_abi::IdentityParts;
use shardport_kit::lease::liveness;

/// Identity of the machine/container a node runs in.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Kernel boot id; empty when unknown.
    pub boot_id: String,
    /// Device id of the filesystem behind `/dev/shm`; 0 when unknown.
    pub shm_device: u64,
    /// IPC namespace inode; 0 when unknown.
    pub ipc_ns: u64,
    /// PID namespace inode; 0 when unknown.
    pub pid_ns: u64,
}

/// Longest boot id accepted from a peer.
pub const MAX_BOOT_ID: usize = 64;

impl NodeIdentity {
    /// Reads this process's identity from `/proc` and `/dev/shm`. Parts that
    /// cannot be read stay unknown (and then never agree).
    pub fn current() -> NodeIdentity {
        // Read (and parsed) by the plugin kit, as every transport reads it.
        let boot_id = liveness::boot_id()
            .map(liveness::format_boot_id)
            .unwrap_or_default();
        let ino = |p: &str| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);
        NodeIdentity {
            boot_id,
            shm_device: std::fs::metadata(Path::new("/dev/shm"))
                .map(|m| m.dev())
                .unwrap_or(0),
            ipc_ns: ino("/proc/self/ns/ipc"),
            pid_ns: ino("/proc/self/ns/pid"),
        }
    }

    /// Checks that the `parts` a transport needs agree with `other`'s.
    /// `Err` names the first part that differs or is unknown.
    pub fn agrees(&self, other: &NodeIdentity, parts: IdentityParts) -> Result<(), String> {
        let checks: [(IdentityParts, &str, bool, bool); 4] = [
            (
                IdentityParts::BOOT_ID,
                "boot id",
                !self.boot_id.is_empty(),
                self.boot_id == other.boot_id,
            ),
            (
                IdentityParts::SHM_DEVICE,
                "/dev/shm device",
                self.shm_device != 0,
                self.shm_device == other.shm_device,
            ),
            (
                IdentityParts::IPC_NS,
                "IPC namespace",
                self.ipc_ns != 0,
                self.ipc_ns == other.ipc_ns,
            ),
            (
                IdentityParts::PID_NS,
                "PID namespace",
                self.pid_ns != 0,
                self.pid_ns == other.pid_ns,
            ),
        ];
        for (part, name, known, equal) in checks {
            if !parts.contains(part) {
                continue;
            }
            if !known {
                return Err(format!("{name} unknown here"));
            }
            if !equal {
                return Err(format!("{name} differs"));
            }
        }
        // `GPU_UUID` is per shard, not per node: the transport checks the
        // device UUID its descriptor carries against the GPUs this process
        // sees (`Transport::can_import`), and the planner skips it otherwise.
        Ok(())
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "boot={} shm_dev={:#x} ipc_ns={} pid_ns={}",
            self.boot_id, self.shm_device, self.ipc_ns, self.pid_ns
        )
    }
}

/// Start time of a process in clock ticks since boot (`/proc/PID/stat` field
/// 22), as the plugin kit reads it.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    liveness::start_ticks(pid)
}

/// A unique tag for a node instance started at `epoch` (its Unix ns at
/// start, the epoch handles carry): `{pid}-{start ticks}-{epoch hex}g{n}`,
/// the owner's pid and process start time (so a sweep can tell whether it
/// is alive), the epoch (so a transport can check that a name it is given
/// belongs to the owner a handle claims, see `Transport::can_import_from`)
/// and a per-process counter.
pub fn new_node_tag(epoch: u64) -> String {
    let pid = std::process::id();
    let start = process_start_ticks(pid).unwrap_or(0);
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{pid}-{start}-{epoch:x}g{n}")
}

/// A name for a node whose config names none: `node-<pid>-<n>`, unique
/// among the live processes of this machine (`n` counts this process's
/// unnamed nodes).
pub fn unique_node_name() -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("node-{}-{n}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_this_process_agrees_with_itself() {
        let me = NodeIdentity::current();
        let all = IdentityParts::BOOT_ID
            .with(IdentityParts::SHM_DEVICE)
            .with(IdentityParts::IPC_NS)
            .with(IdentityParts::PID_NS);
        assert_eq!(me.agrees(&me, all), Ok(()));
    }

    #[test]
    fn differing_parts_are_named() {
        let me = NodeIdentity {
            boot_id: "a".into(),
            shm_device: 1,
            ipc_ns: 2,
            pid_ns: 3,
        };
        let other = NodeIdentity {
            shm_device: 9,
            ..me.clone()
        };
        assert_eq!(
            me.agrees(
                &other,
                IdentityParts::BOOT_ID.with(IdentityParts::SHM_DEVICE)
            ),
            Err("/dev/shm device differs".to_owned())
        );
        assert_eq!(me.agrees(&other, IdentityParts::BOOT_ID), Ok(()));
        let unknown = NodeIdentity::default();
        assert_eq!(
            unknown.agrees(&me, IdentityParts::BOOT_ID),
            Err("boot id unknown here".to_owned())
        );
    }

    #[test]
    fn node_tags_are_unique_and_safe() {
        let a = new_node_tag(0x1234);
        let b = new_node_tag(0x1234);
        assert_ne!(a, b);
        assert!(a.split('-').nth(2).unwrap().starts_with("1234g"), "{a}");
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
        assert!(a.starts_with(&format!("{}-", std::process::id())));
    }
}
