//! The consumer side of the transport: checking a descriptor against this
//! machine, taking a lease on the owner's board, opening (or reusing) the
//! mapping of the owner's memory, waiting once for the producer's event,
//! and the three imports (view, device-to-device, device-to-host).

use std::collections::{BTreeMap, HashMap, HashSet};

use shardport_abi::{AbiError, DeviceKind, ImportInfo, PluginResult, Region, ShardMeta};
use shardport_kit::{self as kit, lock};
use std::sync::Mutex;

use crate::{
    board::{self, Board, LeaseError, Ticket},
    cache::{AllocKey, CacheError, OpenCache, OwnerKey},
    cuda,
    descriptor::{format_uuid, Descriptor},
    sys::{BoardMap, Gpu, IpcOpener},
    vmm::{VmmOpener, VmmSource},
    CudaIpc, Live,
};

/// A consumer lease: cache reference + board lease.
pub(crate) struct LeaseRec {
    pub(crate) ordinal: u32,
    /// A VMM mapping (in `VMM_CACHES`), else a legacy one (in `CACHES`).
    pub(crate) vmm: bool,
    pub(crate) slot: u32,
    pub(crate) slot_generation: u64,
    pub(crate) key: AllocKey,
    /// The mapping's base here (tells a live entry from a retired one of the
    /// same key).
    pub(crate) base: u64,
    pub(crate) board: String,
    pub(crate) ticket: Ticket,
}

/// The consumer's opened allocations, by local device ordinal. Process-wide,
/// not per transport instance: CUDA lets a process open an allocation's
/// handle once per context, so two transport instances of one process (two
/// nodes) consuming the same allocation must share the mapping. Created
/// with the cache policy of the first instance that imports on a device.
/// Lock order: an instance's `consumer` lock, then this one.
pub(crate) static CACHES: Mutex<BTreeMap<u32, OpenCache<IpcOpener>>> = Mutex::new(BTreeMap::new());

/// The consumer's VMM mappings, by local device ordinal (process-wide like
/// [`CACHES`]; taken after it when both are).
pub(crate) static VMM_CACHES: Mutex<BTreeMap<u32, OpenCache<VmmOpener>>> =
    Mutex::new(BTreeMap::new());

/// Exports whose producer event a consumer has already waited for, per
/// owner board: their bytes are final, so later fetches skip the event.
/// Bounded per board (cleared when full).
pub(crate) const MAX_SYNCED_PER_BOARD: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct ConsumerState {
    pub(crate) boards: HashMap<String, std::sync::Arc<Board<BoardMap>>>,
    pub(crate) leases: HashMap<u64, LeaseRec>,
    pub(crate) next_token: u64,
    /// (slot, slot generation) of exports already synchronized, per board.
    pub(crate) synced: HashMap<String, HashSet<(u32, u64)>>,
}

pub(crate) fn cache_error(e: CacheError) -> AbiError {
    match e {
        CacheError::HandleMismatch => AbiError::invalid_descriptor(format!("cuda-ipc: {e}")),
        _ => AbiError::unavailable(format!("cuda-ipc: {e}")),
    }
}

/// Whether the owner still exports `s` (its board slot is live with that
/// generation); an unknown board counts as withdrawn.
pub(crate) fn export_live(c: &ConsumerState, s: &VmmSource) -> bool {
    c.boards.get(&s.board).is_some_and(|b| {
        b.slot(s.slot)
            == board::Slot {
                generation: s.slot_generation,
                state: board::SlotState::Live,
            }
    })
}

impl CudaIpc {
    /// Validates `desc` against `meta` and this machine: boot, visible GPU.
    pub(crate) fn check(
        &self,
        live: &Live,
        desc: &[u8],
        meta: &ShardMeta,
    ) -> PluginResult<(Descriptor, u32)> {
        let d = Descriptor::decode(desc)?;
        self.check_decoded(live, &d, meta).map(|o| (d, o))
    }

    pub(crate) fn check_decoded(
        &self,
        live: &Live,
        d: &Descriptor,
        meta: &ShardMeta,
    ) -> PluginResult<u32> {
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
    pub(crate) fn open(
        &self,
        live: &Live,
        d: &Descriptor,
        ordinal: u32,
    ) -> PluginResult<(LeaseRec, u64)> {
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
        if std::process::id() != self.me.process.pid {
            return Err(AbiError::internal(format!(
                "this cuda-ipc instance was created in process {} and is used in process {} \
                 (a fork): create a new node in the child",
                self.me.process.pid,
                std::process::id()
            )));
        }
        let hint = self.me.process.pid.wrapping_mul(0x9e37_79b9);
        let ticket = board
            .lease(d.slot, d.slot_generation, &self.me.holder(), hint)
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
    pub(crate) fn acquire_legacy(
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
    pub(crate) fn acquire_vmm(
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

    pub(crate) fn close(&self, rec: &LeaseRec) {
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

    pub(crate) fn import_into(
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

    pub(crate) fn import_into_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        let live = self.live()?;
        kit::check::device_destination(dst_len, meta)?;
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

    pub(crate) fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
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

    pub(crate) fn release(&self, token: u64) -> PluginResult<()> {
        self.live()?;
        let rec = lock(&self.consumer).leases.remove(&token).ok_or_else(|| {
            AbiError::invalid_argument(format!("cuda-ipc: unknown lease token {token}"))
        })?;
        self.close(&rec);
        Ok(())
    }

    pub(crate) fn can_import(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<()> {
        let d = Descriptor::decode(desc)?;
        match &self.state {
            // Broken here, not unreachable: let the import fail loudly.
            Err(_) => Ok(()),
            Ok(live) => self.check_decoded(live, &d, meta).map(|_| ()),
        }
    }
}

/// The real opener of the consumer's cache: the driver's IPC calls.
impl crate::cache::Opener for crate::sys::IpcOpener {
    type Handle = [u8; crate::sys::IPC_HANDLE_LEN];
    type Error = crate::sys::CudaError;

    fn open(&mut self, handle: &Self::Handle) -> Result<u64, Self::Error> {
        self.open_handle(handle)
    }

    fn close(&mut self, base: u64) -> Result<(), Self::Error> {
        self.close_base(base)
    }
}
