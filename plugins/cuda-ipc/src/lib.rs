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
//!   (`books`, and the plugin kit's lease-and-liveness core,
//!   `shardport_kit::lease`).
//! - The consumer never reads before the producer's writes finished: the
//!   owner records an interprocess event after them, the consumer waits on it
//!   (`sys::Driver::record_ipc_event` / `wait_ipc_event`).
//!
//! - Not every allocation can be opened through a legacy handle: the
//!   owner asks the driver which allocator made the memory; VMM memory
//!   (PyTorch's expandable segments) travels as file descriptors over a
//!   Unix socket (`fdpass`, `vmm`), and memory no process can map is staged.
//! - A killed owner leaves its board behind: the boards of provably dead
//!   owners are removed at start and on sweep (`sweep`).
//!
//! ## Where to start reading
//! This file (the transport: construction, stats, the ABI methods), then
//! `owner` (export: allocation kinds and how each is shared) and `consumer`
//! (leases, mappings, imports), `descriptor` (the wire format), `cache`,
//! `board`, `books` (the owner's side of the board), `fdpass`
//! and `vmm` (VMM memory), `sweep`, and `sys` (with `sys/vmm.rs`), the only
//! module with `unsafe`.

#![deny(unsafe_code)]

pub mod board;
mod books;
pub mod cache;
pub mod config;
mod consumer;
pub mod descriptor;
mod fdpass;
mod owner;
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
    collections::HashSet,
    sync::{Arc, Mutex},
};

use shardport_abi::{
    AbiError, Allocation, Capabilities, ExportRequest, Health, IdentityParts, ImportInfo,
    PluginContext, PluginResult, Region, ShardId, ShardMeta, Stat, TransportBox, TransportInfo,
};
use shardport_kit::{
    self as kit,
    lease::liveness::{self, Here},
    lock, Counter, PlainTransport, StatList,
};

use crate::{
    board::Layout,
    books::{Books, Scope},
    cache::OwnerKey,
    config::Config,
    consumer::{export_live, ConsumerState, LeaseRec, CACHES, VMM_CACHES},
    descriptor::{format_uuid, BOARD_PREFIX},
    fdpass::{FdServer, Shelf},
    owner::Exported,
    sys::{AllocKind, CudaError, Driver, Gpu},
};

/// The transport's name, the key its descriptors are filed under.
pub const TRANSPORT_NAME: &str = "cuda-ipc";

fn cuda(what: &str, e: CudaError) -> AbiError {
    AbiError::new(
        shardport_abi::ErrorKind::IO,
        format!("cuda-ipc {what}: {e}"),
    )
}

/// This process as an owner: boot id (its 16 bytes in text order), pid and
/// start time.
fn this_process(me: &Here) -> OwnerKey {
    OwnerKey {
        boot_id: me.process.boot.to_be_bytes(),
        pid: me.process.pid,
        epoch: me.process.start_ticks,
    }
}

/// Whether the owner process `o` is alive on this boot (a reused pid with
/// another start time is another process).
fn owner_alive(o: &OwnerKey, here: &OwnerKey) -> bool {
    if o.boot_id != here.boot_id {
        return false;
    }
    match liveness::start_ticks(o.pid) {
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
    me: Here,
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
    let me = Here::current();
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
        here: this_process(&me),
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

impl CudaIpc {
    fn live(&self) -> PluginResult<&Live> {
        self.state
            .as_ref()
            .map_err(|why| AbiError::unavailable(format!("cuda-ipc unavailable: {why}")))
    }

    fn board_name(&self) -> String {
        format!("{BOARD_PREFIX}{}", self.ctx.node_tag())
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
