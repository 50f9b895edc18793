//! # shardport-cuda-ipc: the CUDA IPC transport
//!
//! An *implementation crate* of shardport's plugin system: moves GPU shards
//! between processes on one machine without copying, through CUDA's legacy
//! IPC handles. Built as a `cdylib` the host loads by config (and an `rlib`
//! so its tests run in-process). It builds and loads on a machine without
//! CUDA: the driver is loaded at run time, and without one the transport
//! reports itself unavailable with the reason (`health`), and every data
//! method returns `UNAVAILABLE` naming it, so the router falls back loudly.
//!
//! ```toml
//! [[plugin]]
//! name = "cuda-ipc"
//! path = "libshardport_cuda_ipc.so"
//! required = false            # machines without a GPU still start
//! [plugin.config]
//! cache = "keep"              # or "close-on-release"
//! max-idle-mappings = 64
//! lease-slots = 4096
//! lease-records = 4096
//! ```
//!
//! ## What earlier systems learned, and where it lives here
//! - An IPC handle describes a whole allocation: the owner sends the base's
//!   handle plus the shard's offset (`Owner::export`, `cuMemGetAddressRange`).
//! - A handle opens once per process: opened allocations are cached per
//!   (owner process, allocation generation) with a reference count, and a
//!   reallocation is detected by its new generation (`cache`).
//! - The exporter must not free memory a consumer still maps: leases on a
//!   shared-memory board (`board`), each recording who holds it, so the
//!   owner takes back the leases of consumers that provably died
//!   (`books`, `liveness`).
//! - The consumer never reads before the producer's writes finished: the
//!   owner records an interprocess event after them, the consumer waits on it
//!   (`sys::Driver::record_ipc_event` / `wait_ipc_event`).
//!
//! ## Where to start reading
//! This file (the transport, owner and consumer sides), then `descriptor`
//! (the wire format), `cache`, `board`, `books` (the owner's side of the
//! board), `liveness`, and `sys`, the only module with `unsafe`.

#![deny(unsafe_code)]

pub mod board;
mod books;
pub mod cache;
pub mod config;
pub mod descriptor;
mod fdpass;
pub mod liveness;
mod sweep;
#[allow(unsafe_code)]
mod sys;
pub mod testkit;
mod vmm;

#[cfg(test)]
mod reclaim_tests;
#[cfg(test)]
mod tests;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::OwnedFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use shardport_abi::{
    kit::{self, lock, Counter, PlainTransport, StatList},
    AbiError, Allocation, Capabilities, DeviceKind, ExportRequest, Health, IdentityParts,
    ImportInfo, PluginContext, PluginResult, Region, ShardId, ShardMeta, Stat, TransportBox,
    TransportInfo,
};

use crate::{
    board::{Board, Layout, LeaseError, Ticket},
    books::{Books, Published, Reaped, Scope},
    cache::{AllocKey, CacheError, OpenCache, OwnerKey},
    config::{Config, Unshareable},
    descriptor::{format_uuid, Descriptor, BOARD_PREFIX},
    fdpass::{FdServer, Shelf},
    sys::{
        AllocKind, BoardMap, CudaError, DeviceBuffer, Driver, Event, Gpu, IpcOpener, MemKind,
        IPC_HANDLE_LEN,
    },
    vmm::{VmmOpener, VmmSource},
};

/// The transport's name, the key its descriptors are filed under.
pub const TRANSPORT_NAME: &str = "cuda-ipc";

fn cuda(what: &str, e: CudaError) -> AbiError {
    AbiError::new(
        shardport_abi::ErrorKind::IO,
        format!("cuda-ipc {what}: {e}"),
    )
}

/// This process as an owner: boot id, pid and start time.
fn this_process() -> OwnerKey {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pid = std::process::id();
    OwnerKey {
        boot_id: descriptor::parse_boot_id(&boot).unwrap_or([0; 16]),
        pid,
        epoch: start_ticks(pid).unwrap_or(0),
    }
}

/// Start time of `pid` in clock ticks since boot (`/proc/PID/stat` field 22).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    liveness::parse_stat(&stat).map(|s| s.start_ticks)
}

/// Whether the owner process `o` is alive on this boot (a reused pid with
/// another start time is another process).
fn owner_alive(o: &OwnerKey, here: &OwnerKey) -> bool {
    if o.boot_id != here.boot_id {
        return false;
    }
    match start_ticks(o.pid) {
        Some(t) => o.epoch == 0 || t == o.epoch,
        None => false,
    }
}

/// What the driver probe found.
struct Live {
    driver: Driver,
    /// Visible devices: (local ordinal, UUID).
    uuids: Vec<(u32, [u8; 16])>,
}

impl Live {
    /// Device `ordinal` with its primary context retained (once per device
    /// per process: `sys::Driver::gpu` shares one retain).
    fn gpu(&self, ordinal: u32) -> PluginResult<Gpu> {
        if ordinal >= self.driver.devices {
            return Err(AbiError::unavailable(format!(
                "cuda-ipc: device cuda:{ordinal} does not exist here ({} visible)",
                self.driver.devices
            )));
        }
        self.driver
            .gpu(ordinal)
            .map_err(|e| cuda(&format!("opening device cuda:{ordinal}"), e))
    }

    fn ordinal_of(&self, uuid: &[u8; 16]) -> Option<u32> {
        self.uuids.iter().find(|(_, u)| u == uuid).map(|(o, _)| *o)
    }
}

/// What one exported shard keeps alive on the owner side (its board slot
/// is in the books).
struct Exported {
    /// Staged copy of host bytes (freed with this record), or `None` for
    /// memory the host lent.
    staged: Option<DeviceBuffer>,
    /// Keeps the IPC event alive while consumers may open it.
    _event: Event,
    /// VMM memory: the exported chunks' descriptors (also on the shelf
    /// while exported), closed with this record.
    _vmm: Option<Arc<Vec<OwnedFd>>>,
    len: u64,
}

/// A consumer lease: cache reference + board lease.
struct LeaseRec {
    ordinal: u32,
    /// A VMM mapping (in `VMM_CACHES`), else a legacy one (in `CACHES`).
    vmm: bool,
    slot: u32,
    slot_generation: u64,
    key: AllocKey,
    /// The mapping's base here (tells a live entry from a retired one of the
    /// same key).
    base: u64,
    board: String,
    ticket: Ticket,
}

/// The consumer's opened allocations, by local device ordinal. Process-wide,
/// not per transport instance: CUDA lets a process open an allocation's
/// handle once per context, so two transport instances of one process (two
/// nodes) consuming the same allocation must share the mapping. Created
/// with the cache policy of the first instance that imports on a device.
/// Lock order: an instance's `consumer` lock, then this one.
static CACHES: Mutex<BTreeMap<u32, OpenCache<IpcOpener>>> = Mutex::new(BTreeMap::new());

/// The consumer's VMM mappings, by local device ordinal (process-wide like
/// [`CACHES`]; taken after it when both are).
static VMM_CACHES: Mutex<BTreeMap<u32, OpenCache<VmmOpener>>> = Mutex::new(BTreeMap::new());

/// The allocation generation of VMM exports: unique in this process (legacy
/// exports use the CUDA buffer id, unique too, in another cache).
static VMM_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Exports whose producer event a consumer has already waited for, per
/// owner board: their bytes are final, so later fetches skip the event.
/// Bounded per board (cleared when full).
const MAX_SYNCED_PER_BOARD: usize = 1 << 16;

#[derive(Default)]
struct ConsumerState {
    boards: HashMap<String, std::sync::Arc<Board<BoardMap>>>,
    leases: HashMap<u64, LeaseRec>,
    next_token: u64,
    /// (slot, slot generation) of exports already synchronized, per board.
    synced: HashMap<String, HashSet<(u32, u64)>>,
}

#[derive(Default)]
struct Counters {
    bytes_exported: Counter,
    exports_staged: Counter,
    exports_vmm: Counter,
    boards_swept: Counter,
    imports_copy: Counter,
    imports_view: Counter,
    imports_device: Counter,
    deferred_frees: Counter,
    leases_reclaimed: Counter,
}

/// One cuda-ipc transport instance.
struct CudaIpc {
    ctx: PluginContext,
    cfg: Config,
    state: Result<Live, String>,
    here: OwnerKey,
    /// This process as a lease holder (recorded in the owners' boards).
    me: liveness::Here,
    owner: Mutex<Books<Exported>>,
    /// VMM exports' descriptors, served by `fd_server` (started at the
    /// first VMM export).
    shelf: Arc<Shelf>,
    fd_server: Mutex<Option<FdServer>>,
    /// Allocators already warned about (staged once each).
    warned: Mutex<HashSet<AllocKind>>,
    consumer: Mutex<ConsumerState>,
    counters: Counters,
}

/// Builds a transport instance: validates the config, then probes the
/// driver. A missing driver is not an error: the instance reports itself
/// unavailable. This is the constructor the plugin exports.
pub fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
    create_with(ctx, probe)
}

/// [`create`] with the driver probe replaced (tests play a machine without
/// a driver on any machine).
fn create_with(
    ctx: PluginContext,
    probe: impl FnOnce() -> Result<Live, String>,
) -> PluginResult<TransportBox> {
    let cfg = Config::parse(ctx.instance(), ctx.config())?;
    let board_name = format!("{BOARD_PREFIX}{}", ctx.node_tag());
    descriptor::check_board_name(&board_name).map_err(|why| {
        AbiError::internal(format!(
            "the host passed a node tag unusable in a board name: {why}"
        ))
    })?;
    let state = probe();
    match &state {
        Ok(l) => tracing::info!(
            target: "cuda_ipc",
            driver = l.driver.version,
            gpus = l.uuids.len(),
            "cuda-ipc ready"
        ),
        // Info, not a warning: no GPU is the normal state of most machines
        // (a Python `Node()` on a laptop would warn at every start). A GPU
        // fetch or put that needs it fails naming this reason; `health` and
        // `shardport plugins` report it.
        Err(why) => tracing::info!(target: "cuda_ipc", reason = %why, "cuda-ipc unavailable"),
    }
    let me = liveness::Here::current();
    let counters = Counters::default();
    if cfg.sweep_on_start && state.is_ok() {
        let swept = sweep::dead_boards(&me);
        counters.boards_swept.add(swept);
    }
    let layout = Layout {
        slots: cfg.lease_slots,
        records: cfg.lease_records,
    };
    Ok(kit::into_transport_box(CudaIpc {
        ctx,
        cfg,
        state,
        here: this_process(),
        me,
        owner: Mutex::new(Books::new(layout, me)),
        shelf: Arc::default(),
        fd_server: Mutex::new(None),
        warned: Mutex::default(),
        consumer: Mutex::default(),
        counters,
    }))
}

/// Probes the driver, catching a panic inside cudarc (a driver library
/// missing a symbol) as a reason like any other.
fn probe() -> Result<Live, String> {
    if let Some(reason) = forced_unavailable() {
        return Err(reason);
    }
    std::panic::catch_unwind(|| {
        let driver = sys::probe()?;
        let uuids = driver
            .device_uuids()
            .map_err(|e| format!("cannot list GPUs: {e}"))?;
        Ok(Live { driver, uuids })
    })
    .map_err(|p| {
        format!(
            "CUDA driver probe panicked: {}",
            shardport_abi::plugin::panic_message(&*p)
        )
    })?
}

/// `SHARDPORT_CUDA_IPC_DISABLE=<reason>` makes the transport unavailable
/// even with a driver (to test the fallback on a GPU machine).
fn forced_unavailable() -> Option<String> {
    std::env::var("SHARDPORT_CUDA_IPC_DISABLE")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| format!("disabled by SHARDPORT_CUDA_IPC_DISABLE: {s}"))
}

/// How an export's memory is shared: what its descriptor says beyond the
/// owner and the lease.
struct Shared {
    generation: u64,
    mem_handle: [u8; IPC_HANDLE_LEN],
    alloc_size: u64,
    offset: u64,
    /// VMM only: chunk sizes and their descriptors.
    chunks: Vec<u64>,
    fds: Option<Arc<Vec<OwnedFd>>>,
}

/// `cuMemAlloc` memory at `addr`: the legacy IPC handle of its allocation.
fn share_legacy(d: &Driver, addr: u64, len: u64) -> PluginResult<Shared> {
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

fn cache_error(e: CacheError) -> AbiError {
    match e {
        CacheError::HandleMismatch => AbiError::invalid_descriptor(format!("cuda-ipc: {e}")),
        _ => AbiError::unavailable(format!("cuda-ipc: {e}")),
    }
}

/// Whether the owner still exports `s` (its board slot is live with that
/// generation); an unknown board counts as withdrawn.
fn export_live(c: &ConsumerState, s: &VmmSource) -> bool {
    c.boards.get(&s.board).is_some_and(|b| {
        b.slot(s.slot)
            == board::Slot {
                generation: s.slot_generation,
                state: board::SlotState::Live,
            }
    })
}

impl CudaIpc {
    fn live(&self) -> PluginResult<&Live> {
        self.state
            .as_ref()
            .map_err(|why| AbiError::unavailable(format!("cuda-ipc unavailable: {why}")))
    }

    fn board_name(&self) -> String {
        format!("{BOARD_PREFIX}{}", self.ctx.node_tag())
    }

    /// Starts the descriptor server of VMM exports, once.
    fn serve_fds(&self) -> PluginResult<()> {
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
    fn share_vmm(&self, d: &Driver, req: &ExportRequest) -> PluginResult<Shared> {
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
    fn stage_unshareable(
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

    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
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
            self.serve_fds()?;
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

    fn unexport(&self, id: ShardId) -> PluginResult<()> {
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

    fn count_reaped(&self, r: Reaped) {
        self.counters.leases_reclaimed.add(r.reclaimed);
    }

    /// Takes back the leases of dead consumers in `scope` and frees
    /// unexported shards whose last lease has ended (dropping an
    /// [`Exported`] frees its staged buffer and destroys its event).
    fn reap(&self, scope: Scope) {
        let r = lock(&self.owner).reap(scope);
        self.count_reaped(r);
    }

    fn owner_leases(&self) -> (u64, u64, u64) {
        let o = lock(&self.owner);
        let staged = o
            .all()
            .filter(|p| p.value.staged.is_some())
            .map(|p| p.value.len)
            .sum();
        (o.leases_held(), o.deferred_len() as u64, staged)
    }

    // ---- consumer side ----

    /// Validates `desc` against `meta` and this machine: boot, visible GPU.
    fn check(&self, live: &Live, desc: &[u8], meta: &ShardMeta) -> PluginResult<(Descriptor, u32)> {
        let d = Descriptor::decode(desc)?;
        self.check_decoded(live, &d, meta).map(|o| (d, o))
    }

    fn check_decoded(&self, live: &Live, d: &Descriptor, meta: &ShardMeta) -> PluginResult<u32> {
        if meta.device.kind != DeviceKind::CUDA {
            return Err(AbiError::invalid_argument(format!(
                "cuda-ipc descriptor for a shard whose meta says {}",
                meta.device
            )));
        }
        if d.size != meta.byte_len {
            return Err(AbiError::invalid_descriptor(format!(
                "cuda-ipc descriptor field `size`: {} bytes, the shard's meta says {}",
                d.size, meta.byte_len
            )));
        }
        if d.boot_id != self.here.boot_id {
            return Err(AbiError::unavailable(
                "cuda-ipc: the owner runs on another machine or boot (boot id differs)",
            ));
        }
        let ordinal = live.ordinal_of(&d.device_uuid).ok_or_else(|| {
            AbiError::unavailable(format!(
                "cuda-ipc: GPU {} is not visible to this process (visible: {})",
                format_uuid(&d.device_uuid),
                live.uuids
                    .iter()
                    .map(|(o, u)| format!("cuda:{o}={}", format_uuid(u)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        // CUDA refuses to open an IPC handle in the process that exported it
        // (cuIpcOpenMemHandle fails, typically CUDA_ERROR_INVALID_CONTEXT):
        // say so before any driver call, so the planner skips this export.
        if d.pid == self.here.pid {
            return Err(AbiError::unavailable(format!(
                "cuda-ipc: the shard was exported by this process (pid {}); CUDA cannot open \
                 a process's own IPC handle: use the device pointer that was put",
                d.pid
            )));
        }
        Ok(ordinal)
    }

    /// Takes a board lease and a cache reference, waits for the producer's
    /// event; returns the lease record (token not yet assigned) and the
    /// shard's device address here.
    fn open(&self, live: &Live, d: &Descriptor, ordinal: u32) -> PluginResult<(LeaseRec, u64)> {
        let mut c = lock(&self.consumer);
        if !c.boards.contains_key(&d.board) {
            let b = BoardMap::open(&d.board).map_err(|e| {
                AbiError::not_found(format!(
                    "cuda-ipc: the owner's lease board {} cannot be opened ({e}): the owner \
                     exited or unexported everything",
                    d.board
                ))
            })?;
            let b = Board::attach(b).map_err(|e| {
                AbiError::invalid_descriptor(format!(
                    "cuda-ipc: {} is not a lease board this plugin can use: {e}",
                    d.board
                ))
            })?;
            c.boards.insert(d.board.clone(), std::sync::Arc::new(b));
        }
        let board = std::sync::Arc::clone(&c.boards[&d.board]);
        if std::process::id() != self.me.holder.pid {
            return Err(AbiError::internal(format!(
                "this cuda-ipc instance was created in process {} and is used in process {} \
                 (a fork): create a new node in the child",
                self.me.holder.pid,
                std::process::id()
            )));
        }
        let hint = self.me.holder.pid.wrapping_mul(0x9e37_79b9);
        let ticket = board
            .lease(d.slot, d.slot_generation, &self.me.holder, hint)
            .map_err(|e| match e {
                LeaseError::Gone { .. } => AbiError::not_found(format!(
                    "cuda-ipc: the shard was unexported by its owner (pid {}, slot {} generation {})",
                    d.pid, d.slot, d.slot_generation
                )),
                LeaseError::Full => AbiError::new(
                    shardport_abi::ErrorKind::RESOURCE_EXHAUSTED,
                    format!(
                        "cuda-ipc: every lease record of the owner's board {} is taken (the \
                         owner's plugin config `lease-records`)",
                        d.board
                    ),
                ),
                LeaseError::Reclaimed => AbiError::unavailable(format!(
                    "cuda-ipc: the owner's board {} reclaimed this lease while it was being \
                     taken: the owner judged this process dead",
                    d.board
                )),
                LeaseError::NoSuchSlot => AbiError::invalid_descriptor(format!(
                    "cuda-ipc descriptor field `lease slot`: {} is outside the board {}",
                    d.slot, d.board
                )),
            })?;
        let rec = LeaseRec {
            ordinal,
            vmm: d.is_vmm(),
            slot: d.slot,
            slot_generation: d.slot_generation,
            key: AllocKey {
                owner: OwnerKey {
                    boot_id: d.boot_id,
                    pid: d.pid,
                    epoch: d.epoch,
                },
                generation: d.generation,
            },
            board: d.board.clone(),
            ticket,
            base: 0,
        };
        let synced = c
            .synced
            .get(&d.board)
            .is_some_and(|s| s.contains(&(d.slot, d.slot_generation)));
        // Under the lock: only the cache bookkeeping (and a first open).
        let acquired = if rec.vmm {
            self.acquire_vmm(live, ordinal, &c, d, rec.key)
        } else {
            self.acquire_legacy(live, ordinal, d, rec.key)
        };
        let (gpu, base) = match acquired {
            Ok(v) => v,
            Err(e) => {
                board.release(ticket);
                return Err(e);
            }
        };
        let rec = LeaseRec { base, ..rec };
        drop(c);
        // Outside the lock: the checks and the event wait, which blocks until
        // the producer's writes have finished.
        let checked = (|| {
            live.driver
                .bind(&gpu)
                .map_err(|e| cuda("binding the device", e))?;
            if !rec.vmm {
                let (found_base, size) = live
                    .driver
                    .address_range(base)
                    .map_err(|e| cuda("checking the opened allocation", e))?;
                if found_base != base || size < d.alloc_size {
                    return Err(AbiError::invalid_descriptor(format!(
                        "cuda-ipc descriptor field `allocation size`: {} bytes, the opened \
                         allocation has {size}",
                        d.alloc_size
                    )));
                }
            }
            if !synced {
                live.driver
                    .wait_ipc_event(&gpu, &d.event_handle)
                    .map_err(|e| cuda("waiting for the producer's event", e))?;
                let mut c = lock(&self.consumer);
                let set = c.synced.entry(d.board.clone()).or_default();
                if set.len() >= MAX_SYNCED_PER_BOARD {
                    set.clear();
                }
                set.insert((d.slot, d.slot_generation));
            }
            Ok(base + d.offset)
        })();
        match checked {
            Ok(addr) => Ok((rec, addr)),
            Err(e) => {
                self.close(&rec);
                Err(e)
            }
        }
    }

    /// A reference on the legacy mapping of `d`'s allocation (opened on
    /// first use): the device and the mapping's base.
    fn acquire_legacy(
        &self,
        live: &Live,
        ordinal: u32,
        d: &Descriptor,
        key: AllocKey,
    ) -> PluginResult<(Gpu, u64)> {
        let gpu = live.gpu(ordinal)?;
        let mut caches = lock(&CACHES);
        let cache = caches.entry(ordinal).or_insert_with(|| {
            OpenCache::new(
                IpcOpener {
                    driver: live.driver,
                    gpu: gpu.clone(),
                },
                self.cfg.cache,
            )
        });
        let got = cache.acquire(key, &d.mem_handle).map_err(cache_error)?;
        Ok((gpu, got.base))
    }

    /// A reference on the VMM mapping of `d`'s export (its chunks asked of
    /// the owner and mapped on first use). A new mapping first closes the
    /// idle ones whose exports their owners withdrew (each holds the owner's
    /// memory).
    fn acquire_vmm(
        &self,
        live: &Live,
        ordinal: u32,
        c: &ConsumerState,
        d: &Descriptor,
        key: AllocKey,
    ) -> PluginResult<(Gpu, u64)> {
        let gpu = live.gpu(ordinal)?;
        let source = VmmSource {
            board: d.board.clone(),
            owner_pid: d.pid,
            slot: d.slot,
            slot_generation: d.slot_generation,
            chunks: d.chunks.clone(),
        };
        let mut caches = lock(&VMM_CACHES);
        let cache = caches.entry(ordinal).or_insert_with(|| {
            OpenCache::new(
                VmmOpener {
                    driver: live.driver,
                    gpu: gpu.clone(),
                    maps: HashMap::new(),
                },
                self.cfg.cache,
            )
        });
        let got = cache.acquire(key, &source).map_err(cache_error)?;
        if got.opened {
            cache.retire_idle_where(|s| !export_live(c, s));
        }
        Ok((gpu, got.base))
    }

    fn close(&self, rec: &LeaseRec) {
        let c = lock(&self.consumer);
        let board = c.boards.get(&rec.board);
        let released = if rec.vmm {
            lock(&VMM_CACHES).get_mut(&rec.ordinal).map(|cache| {
                let r = cache.release_at(rec.key, rec.base);
                // A withdrawn export's mapping holds the owner's memory:
                // closed once idle, never kept for a later fetch.
                let live = board.is_some_and(|b| {
                    b.slot(rec.slot)
                        == board::Slot {
                            generation: rec.slot_generation,
                            state: board::SlotState::Live,
                        }
                });
                if !live {
                    cache.retire(rec.key);
                }
                r
            })
        } else {
            lock(&CACHES)
                .get_mut(&rec.ordinal)
                .map(|cache| cache.release_at(rec.key, rec.base))
        };
        if let Some(Err(e)) = released {
            tracing::warn!(target: "cuda_ipc", error = %e, "cache release failed");
        }
        let ok = board.is_some_and(|b| b.release(rec.ticket));
        if !ok {
            tracing::warn!(target: "cuda_ipc", board = %rec.board, record = rec.ticket.index, "lease was not on the board (reclaimed by its owner?)");
        }
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        let live = self.live()?;
        kit::check::destination(dst.len(), meta)?;
        let (d, ordinal) = self.check(live, desc, meta)?;
        let (rec, addr) = self.open(live, &d, ordinal)?;
        let r = live
            .driver
            .copy_dtoh(dst, addr)
            .map_err(|e| cuda("copying device to host", e));
        self.close(&rec);
        r?;
        self.counters.imports_copy.inc();
        Ok(ImportInfo {
            note: format!("device-to-host copy from cuda:{ordinal}").into(),
        })
    }

    fn import_into_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        let live = self.live()?;
        if dst_len != meta.byte_len {
            return Err(AbiError::invalid_argument(format!(
                "destination is {dst_len} bytes, the shard is {}",
                meta.byte_len
            )));
        }
        let (d, ordinal) = self.check(live, desc, meta)?;
        let (rec, addr) = self.open(live, &d, ordinal)?;
        let r = live
            .driver
            .copy_dtod(dst, addr, dst_len)
            .map_err(|e| cuda("copying device to device", e));
        self.close(&rec);
        r?;
        self.counters.imports_device.inc();
        Ok(ImportInfo {
            note: format!("device-to-device copy on cuda:{ordinal}").into(),
        })
    }

    fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        let live = self.live()?;
        let (d, ordinal) = self.check(live, desc, meta)?;
        let (rec, addr) = self.open(live, &d, ordinal)?;
        let mut c = lock(&self.consumer);
        c.next_token += 1;
        let token = c.next_token;
        c.leases.insert(token, rec);
        self.counters.imports_view.inc();
        Ok(Region {
            ptr: addr as usize as *const u8,
            len: meta.byte_len as usize,
            token,
        })
    }

    fn release(&self, token: u64) -> PluginResult<()> {
        self.live()?;
        let rec = lock(&self.consumer).leases.remove(&token).ok_or_else(|| {
            AbiError::invalid_argument(format!("cuda-ipc: unknown lease token {token}"))
        })?;
        self.close(&rec);
        Ok(())
    }

    fn can_import(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<()> {
        let d = Descriptor::decode(desc)?;
        match &self.state {
            // Broken here, not unreachable: let the import fail loudly.
            Err(_) => Ok(()),
            Ok(live) => self.check_decoded(live, &d, meta).map(|_| ()),
        }
    }

    fn sweep(&self) -> PluginResult<Vec<Stat>> {
        self.live()?;
        self.reap(Scope::All);
        let here = self.here;
        let mut closed: usize = lock(&CACHES)
            .values_mut()
            .map(|cache| cache.sweep(|o| owner_alive(o, &here)))
            .sum();
        {
            let c = lock(&self.consumer);
            closed += lock(&VMM_CACHES)
                .values_mut()
                .map(|cache| {
                    cache.sweep(|o| owner_alive(o, &here))
                        + cache.retire_idle_where(|s| !export_live(&c, s))
                })
                .sum::<usize>();
        }
        let boards = sweep::dead_boards(&self.me);
        self.counters.boards_swept.add(boards);
        Ok(vec![
            Stat::counter("mappings_closed", closed as u64),
            Stat::counter("boards_removed", boards),
        ])
    }

    fn stats(&self) -> Vec<Stat> {
        let (held, deferred, staged) = self.owner_leases();
        let exports = lock(&self.owner).exported_len() as u64;
        let leases_active = lock(&self.consumer).leases.len() as u64;
        // Process-wide: the caches are shared by every instance.
        let mut cc = cache::CacheCounters::default();
        let mut open = 0;
        let mut add = |k: cache::CacheCounters, n: usize| {
            cc.opens += k.opens;
            cc.closes += k.closes;
            cc.hits += k.hits;
            cc.stale += k.stale;
            open += n as u64;
        };
        for cache in lock(&CACHES).values() {
            add(cache.counters(), cache.open_count());
        }
        for cache in lock(&VMM_CACHES).values() {
            add(cache.counters(), cache.open_count());
        }
        let k = &self.counters;
        StatList::new()
            .gauge_value("available", u64::from(self.state.is_ok()))
            .gauge_value("shards_live", exports)
            .gauge_value("leases_held_on_owner", held)
            .gauge_value("shards_retired_leased", deferred)
            .gauge_value("staged_bytes", staged)
            .gauge_value("leases_active", leases_active)
            .gauge_value("mappings_open", open)
            .counter_value("handle_opens", cc.opens)
            .counter_value("handle_closes", cc.closes)
            .counter_value("handle_cache_hits", cc.hits)
            .counter_value("stale_mappings", cc.stale)
            .counter("bytes_exported", &k.bytes_exported)
            .counter("exports_staged", &k.exports_staged)
            .counter("exports_vmm", &k.exports_vmm)
            .counter("boards_swept", &k.boards_swept)
            .counter("imports_copy", &k.imports_copy)
            .counter("imports_view", &k.imports_view)
            .counter("imports_device", &k.imports_device)
            .counter("deferred_frees", &k.deferred_frees)
            .counter("leases_reclaimed", &k.leases_reclaimed)
            .finish()
    }
}

impl Drop for CudaIpc {
    /// Ends the leases this instance still holds (a view the host never
    /// released) so owners can free their memory, then lets the fields go:
    /// staged buffers and events (each holding its primary context), the
    /// board. Runs outside any method's `guard` (the host drops the
    /// transport across the FFI boundary), so it takes its own: a panic is
    /// logged and swallowed, and the warnings below reach the host.
    fn drop(&mut self) {
        self.ctx.clone().guard_infallible("drop", (), || {
            let leases: Vec<LeaseRec> = lock(&self.consumer)
                .leases
                .drain()
                .map(|(_, r)| r)
                .collect();
            if !leases.is_empty() {
                tracing::warn!(target: "cuda_ipc", leases = leases.len(), "transport dropped with device views still leased; ending them");
            }
            for rec in &leases {
                self.close(rec);
            }
            let (held, exports) = lock(&self.owner).drain();
            if held > 0 {
                tracing::warn!(target: "cuda_ipc", leases = held, "transport dropped while consumers still lease its exports; their memory is freed now");
            }
            drop(exports);
        });
    }
}

/// Plain types; `kit::Guarded` runs each method under the context's guard.
impl PlainTransport for CudaIpc {
    const NAME: &'static str = TRANSPORT_NAME;

    fn context(&self) -> &PluginContext {
        &self.ctx
    }

    fn describe(&self) -> TransportInfo {
        TransportInfo {
            name: TRANSPORT_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities::CUDA
                .with(Capabilities::SAME_NODE_ONLY)
                .with(Capabilities::ZERO_COPY),
            needs_identity: IdentityParts::BOOT_ID.with(IdentityParts::GPU_UUID),
        }
    }

    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        CudaIpc::export(self, req)
    }

    fn unexport(&self, id: ShardId) -> PluginResult<()> {
        CudaIpc::unexport(self, id)
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        CudaIpc::import_into(self, desc, meta, dst)
    }

    fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        CudaIpc::import_view(self, desc, meta)
    }

    fn release(&self, token: u64) -> PluginResult<()> {
        CudaIpc::release(self, token)
    }

    fn allocate(&self, _id: ShardId, _len: u64) -> PluginResult<Allocation> {
        Err(AbiError::unsupported(
            "cuda-ipc hands out no host-writable allocations; host bytes put as a cuda shard \
             are staged into device memory at export",
        ))
    }

    fn stats(&self) -> Vec<Stat> {
        CudaIpc::stats(self)
    }

    fn health(&self) -> Health {
        match &self.state {
            Ok(l) => kit::guard::ok(format!(
                "ok, CUDA driver {}, {} GPU(s): {}",
                l.driver.version,
                l.uuids.len(),
                l.uuids
                    .iter()
                    .map(|(o, u)| format!("cuda:{o}={}", format_uuid(u)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Err(why) => kit::guard::failing(format!("unavailable: {why}")),
        }
    }

    fn sweep(&self) -> PluginResult<Vec<Stat>> {
        CudaIpc::sweep(self)
    }

    fn can_import(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<()> {
        CudaIpc::can_import(self, desc, meta)
    }

    fn import_into_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        CudaIpc::import_into_device(self, desc, meta, dst_addr, dst_len)
    }
}

#[allow(unsafe_code)] // the macro emits the library header static and `export_name`
mod plugin_export {
    shardport_abi::export_plugin! {
        name: super::TRANSPORT_NAME,
        version: env!("CARGO_PKG_VERSION"),
        new: super::create,
    }
}
