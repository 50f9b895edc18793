//! Planning a fetch: the pure selection plan (`select::plan`: routes,
//! experiments, locality), refined by what the loaded transports say about
//! each descriptor here, for every fetch path (host views and copies,
//! batches, device views and copies).

use shardport_abi::{DeviceKind, OwnerClaim, RSlice};

use super::{Generation, Node};
use crate::{
    handle::Handle,
    select::{plan, Attempt, Local, Plan},
    vocab::FetchMode,
};

/// Which memory the fetch result lands in: host memory cannot hold a device
/// view, so host fetches of CUDA shards become (device-to-host) copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Memory {
    Host,
    Device,
}

impl Node {
    /// The selection plan, refined by what the loaded transports say about
    /// each descriptor (`Transport::can_import`: an export they cannot reach
    /// from here, such as a GPU not visible to this process, is not a
    /// candidate), and for host-memory results of CUDA shards, copies only.
    pub(super) fn plan_for(
        &self,
        g: &Generation,
        handle: &Handle,
        mode: FetchMode,
        memory: Memory,
    ) -> Plan {
        let gates = self.gates(g);
        let local = Local {
            plugins: &g.facts,
            identity: &self.inner.identity,
            owner_addr_local: self.inner.locality.is_local_addr(&handle.owner.addr),
            same_node: g.config.same_node,
            routes: &g.config.routes,
            experiments: &g.config.experiments,
            gates: &gates,
            fetch_seq: self
                .inner
                .fetch_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        let mut out = plan(handle, &local, mode);
        let cuda = handle.meta.device.kind == DeviceKind::CUDA;
        let attempts = std::mem::take(&mut out.attempts);
        let claim = owner_claim(&handle.owner);
        for mut a in attempts {
            let p = &g.plugins[a.plugin];
            let desc = &handle.exports[a.export].descriptor;
            if let Err(e) = p
                .transport
                .can_import_from(RSlice::from_slice(desc), &handle.meta, &claim)
                .into_result()
            {
                tracing::debug!(target: "select", transport = %a.transport, error = %e, "not a candidate");
                out.skipped
                    .push((a.transport, format!("not a candidate here: {}", e.message)));
                continue;
            }
            if cuda && memory == Memory::Host && a.zero_copy {
                a.zero_copy = false;
                a.reason = a.reason.replace(
                    ", zero-copy view",
                    ", device-to-host copy (host view of device memory impossible)",
                );
            }
            out.attempts.push(a);
        }
        // An experiment arm whose transport refused the shard: the shard
        // does not take part (arms are compared on shards both can reach).
        let first = out.attempts.first().cloned();
        keep_arm_if_first(g, &mut out, first.as_ref());
        out
    }

    /// Each experiment's gates for a fetch planned now: cool-downs that
    /// ended start probing and due ramp steps are taken first (logged).
    fn gates(&self, g: &Generation) -> Vec<crate::experiment::Gate> {
        if g.experiments.is_empty() {
            return Vec::new();
        }
        let now = self.inner.clock.monotonic_nanos();
        g.config
            .experiments
            .iter()
            .zip(&g.experiments)
            .map(|(e, st)| {
                for event in st.tick(e, now) {
                    self.log_arm_event(e, &event);
                }
                st.gate(e)
            })
            .collect()
    }
}

/// Drops `plan`'s experiment arm unless `first`, the attempt that will be
/// tried first, is through the arm's transport.
pub(super) fn keep_arm_if_first(g: &Generation, plan: &mut Plan, first: Option<&Attempt>) {
    if let Some(choice) = &plan.arm {
        let arm = &g.config.experiments[choice.experiment].arms[choice.arm];
        if first.map(|a| &a.transport) != Some(&arm.transport) {
            plan.arm = None;
        }
    }
}

/// What the handle says about its owner, for transports that bind
/// descriptors to their owner (`Transport::can_import_from`).
fn owner_claim(owner: &crate::handle::Owner) -> OwnerClaim<'_> {
    OwnerClaim {
        addr: owner.addr.as_str().into(),
        epoch: owner.epoch,
        boot_id: owner.identity.boot_id.as_str().into(),
        pid_ns: owner.identity.pid_ns,
        ipc_ns: owner.identity.ipc_ns,
    }
}
