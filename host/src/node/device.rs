//! GPU shards: put a device pointer, fetch a device view or a device copy.
//!
//! A framework shares an existing tensor without copying it:
//! [`Node::put_device`] exports the caller's device memory through every
//! loaded transport with the `cuda` capability (cuda-ipc); a consumer on the
//! same machine gets a zero-copy [`DeviceView`] ([`Node::fetch_device`]), a
//! device-to-device copy into its own buffer ([`Node::fetch_device_into`]),
//! or, through the ordinary [`Node::fetch`], a host copy (device-to-host).
//!
//! The host never touches device memory: a [`DevicePtr`] is a number it
//! hands to the transport, and a [`DeviceView`] exposes an address and a
//! length, never a slice (this crate forbids `unsafe`).
//!
//! # Contracts
//! - The memory behind `put_device` belongs to the caller, who keeps it
//!   allocated and unmodified until [`Node::remove`] of the shard has
//!   returned **and** no consumer lease is left (the transport's
//!   `leases_held_on_owner` stat, see [`Node::device_leases_held`]). Writes
//!   must be complete or ordered on the legacy default stream before the put
//!   (the transport records an IPC event there, which consumers wait on).
//! - No checksum is computed for device shards (the host cannot read them).

use std::{collections::BTreeMap, fmt, time::Instant};

use shardport_abi::{
    AbiError, Capabilities, DeviceKind, ExportRequest, LeasedDeviceView, ROption, RSlice, ShardId,
    ShardMeta, SharedBytes,
};

use super::{
    fetch::Miss,
    plan::{keep_arm_if_first, Memory},
    put::{check_put_size, check_tags, exports_to, Exported},
    Generation, Node, Selection, Stored, TensorSpec,
};
use crate::vocab::{FetchMode, TransportName};
use crate::{error::HostError, handle::Handle};

/// A CUDA device address (a `CUdeviceptr`), as a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A zero-copy view of a GPU shard owned by another process: its device
/// address in this process and its length. Holds a lease on the owner's
/// memory until dropped.
#[derive(Debug)]
pub struct DeviceView {
    view: LeasedDeviceView,
    id: ShardId,
    meta: ShardMeta,
    selection: Selection,
}

impl DeviceView {
    /// Device address of the first byte, valid in this process while the view lives.
    pub fn addr(&self) -> DevicePtr {
        DevicePtr(self.view.device_addr())
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.view.len() as u64
    }

    /// True for an empty shard.
    pub fn is_empty(&self) -> bool {
        self.view.is_empty()
    }

    /// Shard id.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// Metadata from the handle.
    pub fn meta(&self) -> &ShardMeta {
        &self.meta
    }

    /// Which transport served it and why.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }
}

impl Node {
    /// Puts a GPU shard without copying it: the caller's `len` bytes of
    /// device memory at `addr` (`spec.device` must be `cuda:N`; `len` must
    /// equal what dtype and shape imply) are exported through every loaded
    /// transport with the `cuda` capability and selected by
    /// `put.export-to`. Fails naming why when none is loaded or none can
    /// export it (no driver, memory not IPC-exportable). See the module
    /// docs for how long the memory must stay allocated.
    pub fn put_device(
        &self,
        addr: DevicePtr,
        len: u64,
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
    ) -> Result<Handle, HostError> {
        let meta = spec.meta()?;
        check_device_put(addr, len, spec, &meta)?;
        check_tags(&tags)?;
        let g = self.inner.live();
        check_put_size(&g, meta.byte_len)?;
        let usable = self.device_exporters(&g, &meta)?;
        let id = self.next_id();
        let _span =
            tracing::debug_span!(target: "store", "put_device", shard = %id, bytes = len).entered();
        let mut done = Exported {
            exports: Vec::new(),
            exported_by: Vec::new(),
            failures: Vec::new(),
        };
        for pi in usable {
            let req = ExportRequest {
                id,
                meta: ShardMeta {
                    checksum: ROption::RNone,
                    ..meta.clone()
                },
                data: SharedBytes::device(addr.0, len as usize),
                allocation: 0,
            };
            done.export(&g.plugins[pi], id, req, "device export failed");
        }
        if done.exports.is_empty() {
            return Err(HostError::NoDeviceTransport {
                device: meta.device.to_string(),
                why: failure_list(&done.failures),
            });
        }
        // The bytes are the caller's device memory: nothing is stored here.
        self.keep(id, meta, tags, done, Stored::Heap(Box::default()))
    }

    /// The loaded transports with the `cuda` capability that `put.export-to`
    /// selects; an error naming what is loaded when there is none.
    fn device_exporters(&self, g: &Generation, meta: &ShardMeta) -> Result<Vec<usize>, HostError> {
        let usable: Vec<usize> = g
            .plugins
            .iter()
            .enumerate()
            .filter(|(_, p)| p.capabilities().contains(Capabilities::CUDA) && exports_to(g, p))
            .map(|(i, _)| i)
            .collect();
        if !usable.is_empty() {
            return Ok(usable);
        }
        let loaded: Vec<String> = g.plugins.iter().map(|p| p.name.to_string()).collect();
        Err(HostError::NoDeviceTransport {
            device: meta.device.to_string(),
            why: format!(
                "no loaded transport has the cuda capability (loaded: {}; load cuda-ipc, \
                 and check put.export-to)",
                if loaded.is_empty() {
                    "none".to_owned()
                } else {
                    loaded.join(", ")
                }
            ),
        })
    }

    /// Leases still held by consumers on device shards this node exported
    /// (the sum of the `leases_held_on_owner` stat of CUDA transports): the
    /// caller of [`put_device`](Self::put_device) must not free removed
    /// memory while this is non-zero.
    pub fn device_leases_held(&self) -> u64 {
        self.inner
            .live()
            .plugins
            .iter()
            .filter(|p| p.capabilities().contains(Capabilities::CUDA))
            .flat_map(|p| p.transport.stats().into_iter())
            .filter(|s| s.name.as_str() == "leases_held_on_owner")
            .map(|s| s.value)
            .sum()
    }

    /// Fetches a GPU shard as a zero-copy device view (CUDA IPC on the same
    /// machine). Fails naming every transport that was skipped or failed.
    pub fn fetch_device(&self, handle: &Handle) -> Result<DeviceView, HostError> {
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch_device", shard = %handle.id).entered();
        let g = self.inner.live();
        self.check_device_handle(&g, handle)?;
        let mut plan = self.plan_for(&g, handle, FetchMode::View, Memory::Device);
        let (views, copies): (Vec<_>, Vec<_>) = plan.attempts.drain(..).partition(|a| a.zero_copy);
        // The arm takes part only when its transport is the first view.
        keep_arm_if_first(&g, &mut plan, views.first());
        plan.skipped.extend(
            copies
                .into_iter()
                .map(|a| (a.transport, "no zero-copy device view".to_owned())),
        );
        let views = self.candidates(handle, &views, &plan.skipped)?;
        let (view, selection) =
            self.deliver(&g, handle, views, Some(&plan), start, |_, p, desc, _| {
                LeasedDeviceView::import(&p.transport, desc, &handle.meta).map_err(Miss::Failed)
            })?;
        Ok(DeviceView {
            view,
            id: handle.id,
            meta: handle.meta.clone(),
            selection,
        })
    }

    /// Fetches a GPU shard by a device-to-device copy into `len` bytes at
    /// `dst`, device memory the caller owns (`len` must equal the shard's
    /// byte length). The copy has finished when this returns.
    pub fn fetch_device_into(
        &self,
        handle: &Handle,
        dst: DevicePtr,
        len: u64,
    ) -> Result<Selection, HostError> {
        let start = Instant::now();
        let _span = tracing::debug_span!(target: "fetch", "fetch_device_into", shard = %handle.id)
            .entered();
        let g = self.inner.live();
        self.check_device_handle(&g, handle)?;
        if len != handle.meta.byte_len {
            return Err(HostError::InvalidShard(format!(
                "destination is {len} bytes, shard {} is {}",
                handle.id, handle.meta.byte_len
            )));
        }
        let plan = self.plan_for(&g, handle, FetchMode::Copy, Memory::Device);
        let attempts = self.candidates(handle, &plan.attempts, &plan.skipped)?;
        let ((), mut selection) = self.deliver(
            &g,
            handle,
            attempts,
            Some(&plan),
            start,
            |_, p, desc, note| {
                p.transport
                    .import_into_device(RSlice::from_slice(desc), &handle.meta, dst.0, len)
                    .into_result()
                    .map(|info| *note = info.note.into())
                    .map_err(Miss::Failed)
            },
        )?;
        selection.reason = selection
            .reason
            .replace(", copy", ", device-to-device copy");
        Ok(selection)
    }

    fn check_device_handle(&self, g: &Generation, handle: &Handle) -> Result<(), HostError> {
        if handle.meta.device.kind != DeviceKind::CUDA {
            return Err(HostError::InvalidShard(format!(
                "shard {} is on {}; fetch it with fetch/fetch_into",
                handle.id, handle.meta.device
            )));
        }
        self.check_claimed_size(g, handle)
    }
}

/// The arguments of `put_device` agree: a CUDA device, `len` as dtype and
/// shape imply, a non-null address.
fn check_device_put(
    addr: DevicePtr,
    len: u64,
    spec: &TensorSpec,
    meta: &ShardMeta,
) -> Result<(), HostError> {
    if meta.device.kind != DeviceKind::CUDA {
        return Err(HostError::InvalidShard(format!(
            "put_device needs a cuda:N device, the spec says {}",
            meta.device
        )));
    }
    if meta.byte_len != len {
        return Err(HostError::InvalidShard(format!(
            "{len} bytes given, dtype {} with shape {:?} needs {}",
            spec.dtype, spec.shape, meta.byte_len
        )));
    }
    if addr.0 == 0 && len > 0 {
        return Err(HostError::InvalidShard("device address is null".to_owned()));
    }
    Ok(())
}

/// `transport: error; ...` for a message.
fn failure_list(failures: &[(TransportName, AbiError)]) -> String {
    failures
        .iter()
        .map(|(t, e)| format!("{t}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}
