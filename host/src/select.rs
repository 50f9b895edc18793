//! Transport selection: a pure function of (handle, local plugins, local
//! identity, requested mode) returning the ordered attempts and, for each,
//! the reason. No sockets, no clocks: property-tested directly.
//!
//! Rules, in order:
//! 1. A candidate is an export in the handle whose transport is loaded here.
//! 2. It must handle the shard's device (`cpu` needs the CPU capability,
//!    `cuda:N` the CUDA capability).
//! 3. A same-node-only transport must see the owner's identity agree on the
//!    parts it needs (boot id, `/dev/shm` device, ...); else it is skipped,
//!    and the reason names the part that differs.
//! 4. Same-node transports come first (they move bytes through memory), and
//!    for `view` fetches zero-copy ones first among them; ties keep the
//!    owner's export order.

use shardport_abi::{Capabilities, DeviceKind, IdentityParts};

use crate::{config::FetchMode, config::TransportName, handle::Handle, identity::NodeIdentity};

/// What selection needs to know about one loaded plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFacts {
    /// Transport name.
    pub name: TransportName,
    /// Capabilities.
    pub capabilities: Capabilities,
    /// Identity parts a same-node transport needs.
    pub needs_identity: IdentityParts,
}

/// One attempt in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Index into the local plugin list.
    pub plugin: usize,
    /// Index into `handle.exports`.
    pub export: usize,
    /// Transport name.
    pub transport: TransportName,
    /// Whether this attempt returns a zero-copy view (only for `view` fetches).
    pub zero_copy: bool,
    /// Same-node transport.
    pub same_node: bool,
    /// Why this transport is a candidate here.
    pub reason: String,
}

/// The ordered attempts and the exports that were not candidates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Attempts, best first.
    pub attempts: Vec<Attempt>,
    /// `(transport, why not)` for exports that are not candidates.
    pub skipped: Vec<(TransportName, String)>,
}

/// Computes the plan for fetching `handle` here.
pub fn plan(handle: &Handle, local: &[PluginFacts], me: &NodeIdentity, mode: FetchMode) -> Plan {
    let mut out = Plan::default();
    let device_cap = match handle.meta.device.kind {
        DeviceKind::CUDA => Capabilities::CUDA,
        _ => Capabilities::CPU,
    };
    for (ei, export) in handle.exports.iter().enumerate() {
        let Some(pi) = local.iter().position(|p| p.name == export.transport) else {
            out.skipped
                .push((export.transport.clone(), "not loaded here".to_owned()));
            continue;
        };
        let facts = &local[pi];
        if !facts.capabilities.contains(device_cap) {
            out.skipped.push((
                export.transport.clone(),
                format!("cannot move {} shards", handle.meta.device),
            ));
            continue;
        }
        let same_node = facts.capabilities.contains(Capabilities::SAME_NODE_ONLY);
        let mut reason = if same_node {
            match me.agrees(&handle.owner.identity, facts.needs_identity) {
                Ok(()) => "owner on this node (identity agrees)".to_owned(),
                Err(why) => {
                    out.skipped.push((
                        export.transport.clone(),
                        format!("owner on another node: {why}"),
                    ));
                    continue;
                }
            }
        } else {
            "reaches any node".to_owned()
        };
        let zero_copy =
            mode == FetchMode::View && facts.capabilities.contains(Capabilities::ZERO_COPY);
        reason.push_str(if zero_copy {
            ", zero-copy view"
        } else if mode == FetchMode::View {
            ", copy (no zero-copy)"
        } else {
            ", copy"
        });
        out.attempts.push(Attempt {
            plugin: pi,
            export: ei,
            transport: export.transport.clone(),
            zero_copy,
            same_node,
            reason,
        });
    }
    // Stable sort keeps the owner's export order among equals.
    out.attempts
        .sort_by_key(|a| (!a.same_node, !(a.zero_copy || mode == FetchMode::Copy)));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use shardport_abi::{Device, RVec, ShardId, ShardMeta};

    use super::*;
    use crate::handle::{Export, Owner};

    fn name(s: &str) -> TransportName {
        TransportName::new(s).unwrap()
    }

    fn ident(boot: &str) -> NodeIdentity {
        NodeIdentity {
            boot_id: boot.into(),
            shm_device: 1,
            ipc_ns: 2,
            pid_ns: 3,
        }
    }

    fn shm() -> PluginFacts {
        PluginFacts {
            name: name("posix-shm"),
            capabilities: Capabilities::CPU
                .with(Capabilities::SAME_NODE_ONLY)
                .with(Capabilities::ZERO_COPY),
            needs_identity: IdentityParts::BOOT_ID.with(IdentityParts::SHM_DEVICE),
        }
    }

    fn http() -> PluginFacts {
        PluginFacts {
            name: name("http"),
            capabilities: Capabilities::CPU,
            needs_identity: IdentityParts::default(),
        }
    }

    fn handle(owner_boot: &str, exports: &[&str]) -> Handle {
        Handle {
            id: ShardId::from_u128(1),
            meta: ShardMeta {
                dtype: shardport_abi::DType::U8,
                shape: RVec::from(vec![4]),
                device: Device::CPU,
                byte_len: 4,
                checksum: shardport_abi::ROption::RNone,
            },
            tags: BTreeMap::new(),
            owner: Owner {
                addr: "127.0.0.1:1".into(),
                identity: ident(owner_boot),
                epoch: 1,
            },
            exports: exports
                .iter()
                .map(|t| Export {
                    transport: name(t),
                    descriptor: vec![0],
                })
                .collect(),
        }
    }

    #[test]
    fn same_node_zero_copy_first_even_if_exported_last() {
        let p = plan(
            &handle("a", &["http", "posix-shm"]),
            &[http(), shm()],
            &ident("a"),
            FetchMode::View,
        );
        let order: Vec<&str> = p.attempts.iter().map(|a| a.transport.as_str()).collect();
        assert_eq!(order, ["posix-shm", "http"]);
        assert_eq!(
            p.attempts[0].reason,
            "owner on this node (identity agrees), zero-copy view"
        );
    }

    #[test]
    fn remote_owner_skips_shm_with_reason() {
        let p = plan(
            &handle("a", &["posix-shm", "http"]),
            &[shm(), http()],
            &ident("b"),
            FetchMode::Copy,
        );
        assert_eq!(p.attempts.len(), 1);
        assert_eq!(p.attempts[0].transport.as_str(), "http");
        assert_eq!(
            p.skipped,
            vec![(
                name("posix-shm"),
                "owner on another node: boot id differs".to_owned()
            )]
        );
    }

    #[test]
    fn unloaded_and_wrong_device_are_skipped() {
        let mut h = handle("a", &["posix-shm", "cuda-ipc"]);
        h.meta.device = Device::cuda(0);
        let p = plan(&h, &[shm()], &ident("a"), FetchMode::View);
        assert!(p.attempts.is_empty());
        assert_eq!(
            p.skipped,
            vec![
                (name("posix-shm"), "cannot move cuda:0 shards".to_owned()),
                (name("cuda-ipc"), "not loaded here".to_owned())
            ]
        );
    }

    proptest! {
        // Never a same-node transport for an owner on another node; every
        // export is either attempted or skipped, exactly once.
        #[test]
        fn never_same_node_for_remote_owner(
            owner_boot in "[ab]", my_boot in "[ab]",
            order in proptest::sample::subsequence(vec!["posix-shm", "http"], 0..=2),
            view in any::<bool>(),
        ) {
            let mode = if view { FetchMode::View } else { FetchMode::Copy };
            let h = handle(&owner_boot, &order);
            let p = plan(&h, &[shm(), http()], &ident(&my_boot), mode);
            prop_assert_eq!(p.attempts.len() + p.skipped.len(), order.len());
            for a in &p.attempts {
                if a.same_node {
                    prop_assert_eq!(&owner_boot, &my_boot);
                }
            }
            // Same-node attempts precede the others.
            let first_remote = p.attempts.iter().position(|a| !a.same_node).unwrap_or(p.attempts.len());
            prop_assert!(p.attempts[first_remote..].iter().all(|a| !a.same_node));
            // Deterministic.
            prop_assert_eq!(p.clone(), plan(&h, &[shm(), http()], &ident(&my_boot), mode));
        }
    }
}
