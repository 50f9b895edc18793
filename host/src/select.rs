//! Transport selection: a pure function of (handle, local plugins, what is
//! known about the owner's locality, the routing rules, the requested mode)
//! returning the ordered attempts and, for each, the reason. No sockets, no
//! clocks: property-tested directly.
//!
//! Rules, in order:
//! 1. A candidate is an export in the handle whose transport is loaded here.
//! 2. It must handle the shard's device (`cpu` needs the CPU capability,
//!    `cuda:N` the CUDA capability).
//! 3. A same-node-only transport needs the owner to be on this node, judged
//!    per `locality.same-node`: the owner's address is local, the identity
//!    parts the transport needs agree, or both (the default). Otherwise it is
//!    skipped, and the reason names what differs.
//! 4. The first `[[route]]` whose conditions hold orders the candidates by its
//!    transport list and drops the others. Without a matching route:
//!    same-node transports first (they move bytes through memory), zero-copy
//!    ones first for `view` fetches, then the owner's export order.

use shardport_abi::{Capabilities, DeviceKind, IdentityParts};

use crate::{
    config::{Experiment, Route, RouteWhen},
    experiment,
    handle::Handle,
    identity::NodeIdentity,
    vocab::{DeviceSel, FetchMode, SameNodeMatch, TransportName},
};

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

/// The consumer's side of a selection.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    /// Loaded plugins.
    pub plugins: &'a [PluginFacts],
    /// This node's identity.
    pub identity: &'a NodeIdentity,
    /// Whether the owner's advertised address is local (`is_local_addr`).
    pub owner_addr_local: bool,
    /// Evidence policy for same-node transports.
    pub same_node: SameNodeMatch,
    /// Routing rules, first match wins.
    pub routes: &'a [Route],
    /// Experiments, first match wins, before routes.
    pub experiments: &'a [Experiment],
    /// Per experiment, its arms' gates: disabled, probing, ramp step
    /// (missing entries: every arm enabled, no ramp).
    pub gates: &'a [experiment::Gate],
    /// This fetch's sequence number on this node (per-fetch experiments).
    pub fetch_seq: u64,
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
    /// Name of the route that ordered the attempts, if any.
    pub route: Option<String>,
    /// The experiment arm this fetch belongs to, if any; its transport is
    /// `attempts[0]`.
    pub arm: Option<ArmChoice>,
}

/// The experiment arm of a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmChoice {
    /// Index into `Local::experiments`.
    pub experiment: usize,
    /// The arm whose transport goes first.
    pub arm: usize,
    /// The arm drawn, when it was disabled and the control took over.
    pub redirected_from: Option<usize>,
}

/// Whether the owner counts as on this node for a transport needing `parts`.
fn same_node(
    handle: &Handle,
    local: &Local<'_>,
    parts: IdentityParts,
) -> Result<&'static str, String> {
    let by_identity = || local.identity.agrees(&handle.owner.identity, parts);
    let by_address = || {
        if local.owner_addr_local {
            Ok(())
        } else {
            Err(format!("owner address {} is not local", handle.owner.addr))
        }
    };
    match local.same_node {
        SameNodeMatch::Address => by_address().map(|()| "owner address is local"),
        SameNodeMatch::Identity => by_identity().map(|()| "identity agrees"),
        SameNodeMatch::Both => {
            by_address()?;
            by_identity().map(|()| "address local, identity agrees")
        }
    }
}

fn route_matches(route: &Route, handle: &Handle, local: &Local<'_>) -> bool {
    when_matches(&route.when, handle, local)
}

fn when_matches(w: &RouteWhen, handle: &Handle, local: &Local<'_>) -> bool {
    let len = handle.meta.byte_len;
    let device_ok = match w.device {
        None => true,
        Some(DeviceSel::Cpu) => handle.meta.device.kind == DeviceKind::CPU,
        Some(DeviceSel::Cuda) => handle.meta.device.kind == DeviceKind::CUDA,
    };
    let local_ok = match w.local {
        None => true,
        Some(want) => same_node(handle, local, IdentityParts::BOOT_ID).is_ok() == want,
    };
    device_ok
        && local_ok
        && w.min_size.is_none_or(|m| len >= m)
        && w.max_size.is_none_or(|m| len <= m)
        && w.tags.iter().all(|(k, v)| handle.tags.get(k) == Some(v))
        && w.owner
            .as_ref()
            .is_none_or(|p| p.matches(&handle.owner.addr))
}

/// Computes the plan for fetching `handle` here.
pub fn plan(handle: &Handle, local: &Local<'_>, mode: FetchMode) -> Plan {
    let mut out = Plan::default();
    for (ei, export) in handle.exports.iter().enumerate() {
        match candidate(handle, local, mode, ei, &export.transport) {
            Ok(attempt) => out.attempts.push(attempt),
            Err(why) => out.skipped.push((export.transport.clone(), why)),
        }
    }
    // Experiments need the candidates before a route filters them; most
    // nodes have none, so the copy is made only when there is one.
    let candidates = if local.experiments.is_empty() {
        Vec::new()
    } else {
        out.attempts.clone()
    };
    if let Some(route) = local
        .routes
        .iter()
        .find(|r| route_matches(r, handle, local))
    {
        apply_route(route, &mut out);
    } else {
        // Stable sort keeps the owner's export order among equals.
        out.attempts
            .sort_by_key(|a| (!a.same_node, !(a.zero_copy || mode == FetchMode::Copy)));
    }
    apply_experiment(handle, local, &candidates, &mut out);
    out
}

/// The attempt for export `ei` (through `transport`), or why it is not a
/// candidate: not loaded here, cannot move this device's shards, or a
/// same-node transport and the owner is elsewhere.
fn candidate(
    handle: &Handle,
    local: &Local<'_>,
    mode: FetchMode,
    ei: usize,
    transport: &TransportName,
) -> Result<Attempt, String> {
    let device_cap = match handle.meta.device.kind {
        DeviceKind::CUDA => Capabilities::CUDA,
        _ => Capabilities::CPU,
    };
    let Some(pi) = local.plugins.iter().position(|p| &p.name == transport) else {
        return Err("not loaded here".to_owned());
    };
    let facts = &local.plugins[pi];
    if !facts.capabilities.contains(device_cap) {
        return Err(format!("cannot move {} shards", handle.meta.device));
    }
    let is_same_node = facts.capabilities.contains(Capabilities::SAME_NODE_ONLY);
    let mut reason = if is_same_node {
        match same_node(handle, local, facts.needs_identity) {
            Ok(why) => format!("owner on this node ({why})"),
            Err(why) => return Err(format!("owner on another node: {why}")),
        }
    } else {
        "reaches any node".to_owned()
    };
    let zero_copy = mode == FetchMode::View && facts.capabilities.contains(Capabilities::ZERO_COPY);
    reason.push_str(if zero_copy {
        ", zero-copy view"
    } else if mode == FetchMode::View {
        ", copy (no zero-copy)"
    } else {
        ", copy"
    });
    Ok(Attempt {
        plugin: pi,
        export: ei,
        transport: transport.clone(),
        zero_copy,
        same_node: is_same_node,
        reason,
    })
}

/// Keeps only the route's transports, in the route's order; the others
/// are skipped naming the route.
fn apply_route(route: &Route, out: &mut Plan) {
    let (mut kept, dropped): (Vec<Attempt>, Vec<Attempt>) = std::mem::take(&mut out.attempts)
        .into_iter()
        .partition(|a| route.transports.contains(&a.transport));
    for a in dropped {
        out.skipped
            .push((a.transport, format!("not in route `{}`", route.name)));
    }
    kept.sort_by_key(|a| route.transports.iter().position(|t| t == &a.transport));
    for a in &mut kept {
        a.reason = format!("route `{}`: {}", route.name, a.reason);
    }
    out.attempts = kept;
    out.route = Some(route.name.clone());
}

/// The first experiment whose conditions hold and every one of whose
/// enabled arms' transports is a candidate (so arms are compared on the same
/// shards; a drained arm, weight 0, takes no part) puts the assigned arm's
/// transport first; the route's or default order follows as the fallback.
fn apply_experiment(handle: &Handle, local: &Local<'_>, candidates: &[Attempt], out: &mut Plan) {
    for (ei, e) in local.experiments.iter().enumerate() {
        if !when_matches(&e.when, handle, local) {
            continue;
        }
        let gate = local.gates.get(ei).copied().unwrap_or_default();
        let disabled = gate.disabled;
        let reachable = |t: &TransportName| candidates.iter().any(|a| &a.transport == t);
        let missing: Vec<&str> = e
            .arms
            .iter()
            .enumerate()
            .filter(|(i, a)| {
                (*i == 0 || (disabled & (1 << i) == 0 && a.weight > 0)) && !reachable(&a.transport)
            })
            .map(|(_, a)| a.transport.as_str())
            .collect();
        if !missing.is_empty() {
            // Not this experiment's shard: someone's transport cannot reach it.
            continue;
        }
        let pick = experiment::assign(e, experiment::draw(e, handle.id, local.fetch_seq), &gate);
        let arm = &e.arms[pick.arm];
        let mut first = candidates
            .iter()
            .find(|a| a.transport == arm.transport)
            .expect("every enabled arm is a candidate")
            .clone();
        let redirected = match pick.redirected_from {
            Some(d) if disabled & (1 << d) != 0 => {
                format!(", drawn `{}` is disabled by its guardrail", e.arms[d].name)
            }
            Some(d) => format!(
                ", drawn `{}` is probing and this is not a probe",
                e.arms[d].name
            ),
            None if pick.probe => ", a probe of this arm after its cool-down".to_owned(),
            None => String::new(),
        };
        let share = match gate.ramp {
            Some((r, p)) if r == pick.arm => format!("ramp share {:.1}%", p * 100.0),
            _ => format!("weight {}/{}", arm.weight, e.total_weight()),
        };
        first.reason = format!(
            "experiment `{}` arm `{}` ({}, {share}{redirected}): {}",
            e.name, arm.name, e.unit, first.reason
        );
        out.attempts.retain(|a| a.transport != arm.transport);
        out.attempts.insert(0, first);
        out.arm = Some(ArmChoice {
            experiment: ei,
            arm: pick.arm,
            redirected_from: pick.redirected_from,
        });
        return;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use shardport_abi::{Device, RVec, ShardId, ShardMeta};

    use super::*;
    use crate::config::{AddrPattern, RouteWhen};
    use crate::handle::{Export, Owner};

    fn local<'a>(plugins: &'a [PluginFacts], me: &'a NodeIdentity, owner_local: bool) -> Local<'a> {
        Local {
            plugins,
            identity: me,
            owner_addr_local: owner_local,
            same_node: SameNodeMatch::Both,
            routes: &[],
            experiments: &[],
            gates: &[],
            fetch_seq: 0,
        }
    }

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

    fn route(name: &str, when: RouteWhen, transports: &[&str]) -> Route {
        Route {
            name: name.into(),
            when,
            transports: transports
                .iter()
                .map(|t| crate::vocab::TransportName::new(t).unwrap())
                .collect(),
        }
    }

    #[test]
    fn same_node_zero_copy_first_even_if_exported_last() {
        let (plugins, me) = ([http(), shm()], ident("a"));
        let p = plan(
            &handle("a", &["http", "posix-shm"]),
            &local(&plugins, &me, true),
            FetchMode::View,
        );
        let order: Vec<&str> = p.attempts.iter().map(|a| a.transport.as_str()).collect();
        assert_eq!(order, ["posix-shm", "http"]);
        assert_eq!(
            p.attempts[0].reason,
            "owner on this node (address local, identity agrees), zero-copy view"
        );
    }

    #[test]
    fn remote_owner_skips_shm_with_reason() {
        let (plugins, me) = ([shm(), http()], ident("b"));
        let p = plan(
            &handle("a", &["posix-shm", "http"]),
            &local(&plugins, &me, true),
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
    fn same_identity_but_foreign_address_is_remote_by_default() {
        // Two network namespaces on one kernel: identity agrees, address does not.
        let (plugins, me) = ([shm(), http()], ident("a"));
        let h = handle("a", &["posix-shm", "http"]);
        let p = plan(&h, &local(&plugins, &me, false), FetchMode::View);
        assert_eq!(p.attempts.len(), 1);
        assert_eq!(
            p.skipped[0].1,
            "owner on another node: owner address 127.0.0.1:1 is not local"
        );
        // `same-node = "identity"` trusts the identity alone.
        let mut l = local(&plugins, &me, false);
        l.same_node = SameNodeMatch::Identity;
        assert_eq!(
            plan(&h, &l, FetchMode::View).attempts[0].transport.as_str(),
            "posix-shm"
        );
    }

    #[test]
    fn unloaded_and_wrong_device_are_skipped() {
        let mut h = handle("a", &["posix-shm", "cuda-ipc"]);
        h.meta.device = Device::cuda(0);
        let (plugins, me) = ([shm()], ident("a"));
        let p = plan(&h, &local(&plugins, &me, true), FetchMode::View);
        assert!(p.attempts.is_empty());
        assert_eq!(
            p.skipped,
            vec![
                (name("posix-shm"), "cannot move cuda:0 shards".to_owned()),
                (name("cuda-ipc"), "not loaded here".to_owned())
            ]
        );
    }

    #[test]
    fn first_matching_route_orders_and_filters() {
        let (plugins, me) = ([shm(), http()], ident("a"));
        let routes = [
            route(
                "tiny",
                RouteWhen {
                    max_size: Some(2),
                    ..Default::default()
                },
                &["posix-shm"],
            ),
            route(
                "kv-over-http",
                RouteWhen {
                    tags: [("layer".to_owned(), "3".to_owned())].into(),
                    owner: Some(AddrPattern::new("127.*")),
                    ..Default::default()
                },
                &["http", "posix-shm"],
            ),
        ];
        let mut l = local(&plugins, &me, true);
        l.routes = &routes;
        let mut h = handle("a", &["posix-shm", "http"]);
        // 4 bytes: not tiny; no tag: no route -> default order.
        assert_eq!(plan(&h, &l, FetchMode::View).route, None);
        h.tags.insert("layer".into(), "3".into());
        let p = plan(&h, &l, FetchMode::View);
        assert_eq!(p.route.as_deref(), Some("kv-over-http"));
        let order: Vec<&str> = p.attempts.iter().map(|a| a.transport.as_str()).collect();
        assert_eq!(order, ["http", "posix-shm"]);
        assert!(p.attempts[0]
            .reason
            .starts_with("route `kv-over-http`: reaches any node"));
        h.meta.shape = shardport_abi::RVec::from(vec![2]);
        h.meta.byte_len = 2;
        let p = plan(&h, &l, FetchMode::Copy);
        assert_eq!(p.route.as_deref(), Some("tiny"));
        assert_eq!(p.attempts.len(), 1);
        assert_eq!(
            p.skipped,
            vec![(name("http"), "not in route `tiny`".to_owned())]
        );
    }

    proptest! {
        // Never a same-node transport for an owner on another node (by
        // address or identity); every export is attempted or skipped exactly
        // once; routes never add a transport; deterministic.
        #[test]
        fn never_same_node_for_remote_owner(
            owner_boot in "[ab]", my_boot in "[ab]", addr_local in any::<bool>(),
            order in proptest::sample::subsequence(vec!["posix-shm", "http"], 0..=2),
            view in any::<bool>(),
            route_list in proptest::sample::subsequence(vec!["http", "posix-shm"], 1..=2),
            route_local in proptest::option::of(any::<bool>()),
            with_route in any::<bool>(),
        ) {
            let mode = if view { FetchMode::View } else { FetchMode::Copy };
            let h = handle(&owner_boot, &order);
            let (plugins, me) = ([shm(), http()], ident(&my_boot));
            let routes = [route("r", RouteWhen { local: route_local, ..Default::default() }, &route_list)];
            let mut l = local(&plugins, &me, addr_local);
            if with_route {
                l.routes = &routes;
            }
            let p = plan(&h, &l, mode);
            prop_assert_eq!(p.attempts.len() + p.skipped.len(), order.len());
            for a in &p.attempts {
                if a.same_node {
                    prop_assert!(owner_boot == my_boot && addr_local);
                }
                if p.route.is_some() {
                    prop_assert!(route_list.contains(&a.transport.as_str()));
                }
            }
            if p.route.is_none() {
                let first_remote = p.attempts.iter().position(|a| !a.same_node).unwrap_or(p.attempts.len());
                prop_assert!(p.attempts[first_remote..].iter().all(|a| !a.same_node));
            }
            prop_assert_eq!(p.clone(), plan(&h, &l, mode));
        }
    }
}
