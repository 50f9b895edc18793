//! The owner side of the transport: exporting a shard (which allocator made
//! its memory, and how it is shared: a legacy IPC handle, VMM chunks as file
//! descriptors, or a staged copy), unexporting it, and taking back the
//! leases of consumers that died (`books`).

use std::{
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use shardport_abi::{AbiError, DeviceKind, ExportRequest, PluginResult, ShardId};
use shardport_kit::lock;

use crate::{
    books::{Published, Reaped, Scope},
    config::Unshareable,
    cuda,
    descriptor::Descriptor,
    fdpass::{self, FdServer},
    sys::{AllocKind, DeviceBuffer, Driver, Event, Gpu, MemKind, IPC_HANDLE_LEN},
    CudaIpc,
};

/// What one exported shard keeps alive on the owner side (its board slot
/// is in the books).
pub(crate) struct Exported {
    /// Staged copy of host bytes (freed with this record), or `None` for
    /// memory the host lent.
    pub(crate) staged: Option<DeviceBuffer>,
    /// Keeps the IPC event alive while consumers may open it.
    pub(crate) _event: Event,
    /// VMM memory: the exported chunks' descriptors (also on the shelf
    /// while exported), closed with this record.
    pub(crate) _vmm: Option<Arc<Vec<OwnedFd>>>,
    pub(crate) len: u64,
}

/// The allocation generation of VMM exports: unique in this process (legacy
/// exports use the CUDA buffer id, unique too, in another cache).
pub(crate) static VMM_SERIAL: AtomicU64 = AtomicU64::new(1);

/// How an export's memory is shared: what its descriptor says beyond the
/// owner and the lease.
pub(crate) struct Shared {
    pub(crate) generation: u64,
    pub(crate) mem_handle: [u8; IPC_HANDLE_LEN],
    pub(crate) alloc_size: u64,
    pub(crate) offset: u64,
    /// VMM only: chunk sizes and their descriptors.
    pub(crate) chunks: Vec<u64>,
    pub(crate) fds: Option<Arc<Vec<OwnedFd>>>,
}

/// `cuMemAlloc` memory at `addr`: the legacy IPC handle of its allocation.
pub(crate) fn share_legacy(d: &Driver, addr: u64, len: u64) -> PluginResult<Shared> {
    let (base, alloc_size) = d
        .address_range(addr)
        .map_err(|e| cuda("finding the shard's allocation", e))?;
    // The driver returned the allocation containing `addr`, so base <= addr.
    let offset = addr - base;
    if offset.checked_add(len).is_none_or(|end| end > alloc_size) {
        return Err(AbiError::invalid_argument(format!(
            "the shard ({len} bytes at offset {offset}) overruns its allocation of {alloc_size} bytes"
        )));
    }
    let generation = d
        .buffer_id(base)
        .map_err(|e| cuda("reading the allocation's buffer id", e))?
        .max(1);
    let mem_handle = d
        .ipc_mem_handle(base)
        .map_err(|e| cuda("getting the allocation's IPC handle", e))?;
    Ok(Shared {
        generation,
        mem_handle,
        alloc_size,
        offset,
        chunks: Vec::new(),
        fds: None,
    })
}

impl CudaIpc {
    /// Starts the descriptor server of VMM exports, once.
    pub(crate) fn serve_fds(&self) -> PluginResult<()> {
        let mut server = lock(&self.fd_server);
        if server.is_none() {
            let name = fdpass::socket_name(&self.board_name());
            *server = Some(
                FdServer::start(&name, Arc::clone(&self.shelf)).map_err(|e| {
                    AbiError::new(
                        shardport_abi::ErrorKind::IO,
                        format!("cuda-ipc cannot serve VMM descriptors on @{name}: {e}"),
                    )
                })?,
            );
        }
        Ok(())
    }

    /// VMM memory: its chunks exported as file descriptors.
    pub(crate) fn share_vmm(&self, d: &Driver, req: &ExportRequest) -> PluginResult<Shared> {
        let exp = d
            .vmm_export(req.data.addr(), req.meta.byte_len)
            .map_err(|e| cuda("exporting VMM memory as file descriptors", e))?;
        let chunks: Vec<u64> = exp.chunks.iter().map(|(size, _)| *size).collect();
        let fds: Vec<OwnedFd> = exp.chunks.into_iter().map(|(_, fd)| fd).collect();
        Ok(Shared {
            generation: VMM_SERIAL.fetch_add(1, Ordering::Relaxed),
            mem_handle: [0; IPC_HANDLE_LEN],
            alloc_size: chunks.iter().sum(),
            offset: exp.offset,
            chunks,
            fds: Some(Arc::new(fds)),
        })
    }

    /// Memory no path shares: staged into a `cuMemAlloc` buffer (warned once
    /// per allocator), or refused naming the allocator.
    pub(crate) fn stage_unshareable(
        &self,
        d: &Driver,
        gpu: &Gpu,
        req: &ExportRequest,
        kind: AllocKind,
    ) -> PluginResult<DeviceBuffer> {
        if self.cfg.unshareable == Unshareable::Refuse {
            return Err(AbiError::invalid_argument(format!(
                "cuda-ipc cannot share memory of {}: no process can map it; allocate the \
                 tensor with cudaMalloc (PyTorch's default allocator) or expandable segments, \
                 or set `unshareable = \"stage\"` in the plugin config to copy it",
                kind.allocator()
            )));
        }
        if lock(&self.warned).insert(kind) {
            tracing::warn!(
                target: "cuda_ipc",
                allocator = kind.allocator(),
                "device memory of this allocator cannot be shared across processes; each \
                 export copies it into a buffer of its own (one device copy and the shard's \
                 size in device memory; `unshareable = \"refuse\"` makes it an error)"
            );
        }
        self.counters.exports_staged.inc();
        d.stage_device(gpu, req.data.addr(), req.meta.byte_len)
            .map_err(|e| cuda("copying the shard into a shareable buffer", e))
    }

    // ---- owner side ----

    pub(crate) fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        let live = self.live()?;
        if req.meta.device.kind != DeviceKind::CUDA {
            return Err(AbiError::unsupported(format!(
                "cuda-ipc moves cuda:N shards; this shard is on {}",
                req.meta.device
            )));
        }
        if req.data.len() as u64 != req.meta.byte_len {
            return Err(AbiError::invalid_argument(format!(
                "export of {} bytes for a shard of {}",
                req.data.len(),
                req.meta.byte_len
            )));
        }
        if req.allocation != 0 {
            return Err(AbiError::invalid_argument(
                "cuda-ipc hands out no allocations (no ALLOCATOR capability)",
            ));
        }
        self.reap(Scope::Retired);
        let gpu = live.gpu(req.meta.device.index)?;
        let d = &live.driver;
        d.bind(&gpu).map_err(|e| cuda("binding the device", e))?;
        let kind = if req.data.is_empty() {
            MemKind::Host
        } else {
            d.mem_kind(req.data.addr())
                .map_err(|e| cuda("classifying the shard's address", e))?
        };
        let staged = match kind {
            MemKind::Device { ordinal } if ordinal != gpu.ordinal => {
                return Err(AbiError::invalid_argument(format!(
                    "the shard's memory is on cuda:{ordinal}, its meta says {}",
                    req.meta.device
                )))
            }
            MemKind::Device { .. } => None,
            MemKind::Host => {
                self.counters.exports_staged.inc();
                Some(
                    d.stage_host(&gpu, &req.data)
                        .map_err(|e| cuda("staging host bytes into device memory", e))?,
                )
            }
        };
        let lent = staged.is_none();
        let alloc = if lent {
            d.alloc_kind(req.data.addr())
                .map_err(|e| cuda("asking which allocator made the shard's memory", e))?
        } else {
            AllocKind::Legacy
        };
        let staged = match alloc {
            AllocKind::Legacy | AllocKind::VmmFd => staged,
            other => Some(self.stage_unshareable(d, &gpu, req, other)?),
        };
        let shared = match (alloc, &staged) {
            (AllocKind::VmmFd, None) => self.share_vmm(d, req)?,
            _ => {
                let addr = staged.as_ref().map_or(req.data.addr(), DeviceBuffer::addr);
                share_legacy(d, addr, req.meta.byte_len)?
            }
        };
        let (event, event_handle) = d
            .record_ipc_event(&gpu)
            .map_err(|e| cuda("recording the IPC event", e))?;

        let mut o = lock(&self.owner);
        if o.contains(&req.id) {
            return Err(AbiError::invalid_argument(format!(
                "shard {} is already exported",
                req.id
            )));
        }
        o.board(&self.board_name()).map_err(|e| {
            AbiError::new(
                shardport_abi::ErrorKind::IO,
                format!("cuda-ipc cannot create its lease board: {e}"),
            )
        })?;
        if shared.fds.is_some() {
            // Before a slot is published: a server that cannot start must
            // not leave a live slot behind.
            self.serve_fds()?;
        }
        let Some((slot, slot_generation)) = o.publish() else {
            return Err(AbiError::new(
                shardport_abi::ErrorKind::RESOURCE_EXHAUSTED,
                format!(
                    "cuda-ipc: all {} lease slots are in use (plugin config `lease-slots`)",
                    self.cfg.lease_slots
                ),
            ));
        };
        if let Some(fds) = &shared.fds {
            self.shelf.put(slot, slot_generation, Arc::clone(fds));
            self.counters.exports_vmm.inc();
        }
        let desc = Descriptor {
            boot_id: self.here.boot_id,
            pid: self.here.pid,
            epoch: self.here.epoch,
            generation: shared.generation,
            device_uuid: gpu.uuid,
            mem_handle: shared.mem_handle,
            alloc_size: shared.alloc_size,
            offset: shared.offset,
            size: req.meta.byte_len,
            event_handle,
            slot,
            slot_generation,
            board: self.board_name(),
            chunks: shared.chunks,
        };
        o.insert(
            req.id,
            Published {
                slot,
                generation: slot_generation,
                value: Exported {
                    staged,
                    _event: event,
                    _vmm: shared.fds,
                    len: req.meta.byte_len,
                },
            },
        );
        self.counters.bytes_exported.add(req.meta.byte_len);
        Ok(desc.encode())
    }

    pub(crate) fn unexport(&self, id: ShardId) -> PluginResult<()> {
        self.live()?;
        let mut o = lock(&self.owner);
        let lent = o.get(&id).map(|p| p.value.staged.is_none());
        if let Some(p) = o.get(&id) {
            // No new consumer maps it; those that did keep their mappings.
            self.shelf.take(p.slot, p.generation);
        }
        let (held, reaped) = o
            .unexport(&id)
            .ok_or_else(|| AbiError::not_found(format!("cuda-ipc: shard {id} is not exported")))?;
        drop(o);
        self.count_reaped(reaped);
        if held > 0 {
            if lent == Some(true) {
                tracing::warn!(
                    target: "cuda_ipc",
                    shard = %id,
                    leases = held,
                    "unexported while consumers still map the caller's device memory; keep it \
                     allocated until leases_held_on_owner is 0"
                );
            }
            self.counters.deferred_frees.inc();
        }
        Ok(())
    }

    pub(crate) fn count_reaped(&self, r: Reaped) {
        self.counters.leases_reclaimed.add(r.reclaimed);
    }

    /// Takes back the leases of dead consumers in `scope` and frees
    /// unexported shards whose last lease has ended (dropping an
    /// [`Exported`] frees its staged buffer and destroys its event).
    pub(crate) fn reap(&self, scope: Scope) {
        let r = lock(&self.owner).reap(scope);
        self.count_reaped(r);
    }

    pub(crate) fn owner_leases(&self) -> (u64, u64, u64) {
        let o = lock(&self.owner);
        let staged = o
            .all()
            .filter(|p| p.value.staged.is_some())
            .map(|p| p.value.len)
            .sum();
        (o.leases_held(), o.deferred_len() as u64, staged)
    }
}
