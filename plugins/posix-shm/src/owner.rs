//! The owner side: allocating, exporting and reclaiming shard storage.
//!
//! # Overview
//! In `pool` mode the owner creates, on its first `allocate` or `export`
//! (or at construction with `create-pool = "eager"`), one sparse data
//! segment of `pool-size` bytes and one lease board (see `board`). A process
//! that only fetches never creates them: it leaves nothing in `/dev/shm`. Shards get space
//! from the [`BumpAllocator`] and a slot in the board's shard table. In
//! `segment-per-shard` mode (and for a shard spilled from a full pool) each
//! shard gets a segment of its own, unlinked at unexport: consumers that
//! mapped it keep a valid mapping (the kernel frees the pages with the last
//! mapping), so those shards need no lease board.
//!
//! # Reclaiming
//! `unexport` retires the shard's table entry *first*, then scans the lease
//! slots: space no lease overlaps is freed at once, the rest joins the
//! retired list, re-checked on every `allocate`, `unexport` and `stats`.
//! Leased space is never handed out again until released.
//!
//! # Leases of dead consumers
//! Each lease slot records its holder's pid, start time and namespaces. The
//! same re-checks free the slots of holders that are provably dead (see
//! `liveness`: our PID namespace, and no such process or a reused pid), so
//! space a killed consumer leased comes back. `allocate`, `free_allocation`
//! and `unexport` do this while retired ranges wait on leases (the scan they
//! make anyway); `stats` and `Transport::sweep` always do, which also frees
//! the lease slots dead consumers held on live shards. A live holder's lease
//! is never reclaimed; a holder that cannot be judged (another PID
//! namespace) keeps its lease.
//!
//! # Locking
//! One mutex guards the books (allocator, shard maps, retired list). It is
//! held only to decide; work proportional to a shard's size runs unlocked:
//! backing pool pages (`fallocate`), creating a shard segment, and copying
//! the bytes in `export`. Such a reservation stays marked internal until it
//! is ready, so no public token reaches it.

use std::{
    collections::HashMap,
    ptr::NonNull,
    sync::{Arc, Mutex, OnceLock},
    time::Instant,
};

use rustix::io::Errno;
use shardport_abi::{
    AbiError, Allocation, DeviceKind, ErrorKind, ExportRequest, PluginResult, ShardId,
};
use shardport_kit::{format_byte_size, hash::IdHashMap};

use crate::{
    alloc::{BackedRanges, BumpAllocator},
    board::{Board, EntryState, Holder, Layout},
    config::{self, Config, CreatePool, OnFull},
    descriptor::{Descriptor, Mode},
    errors,
    liveness::{Here, Verdict, Watcher},
    lock,
    names::{Kind, NameGen},
    stats::Counters,
    sys::OwnedSegment,
};

/// How many names to try when one already exists (another instance sharing
/// our node tag, or a leftover of a crashed process with the same tag).
const CREATE_ATTEMPTS: u32 = 16;

/// Removed shards whose space waits for a lease scan before `unexport`
/// runs one itself: one scan of the lease table per this many removes of a
/// batch, instead of one per remove. A put sweeps first anyway.
const RETIRED_SWEEP_BATCH: usize = 64;

/// The pool's two segments.
#[derive(Debug)]
struct Pool {
    /// Read-write; keeps its descriptor for `fallocate`.
    data: OwnedSegment,
    board: Board,
}

/// Where one shard's bytes live.
#[derive(Debug)]
enum Place {
    /// In the pool (zero-length shards: `len == 0`, no pool space).
    Pool {
        slot: u32,
        generation: u64,
        offset: u64,
        len: u64,
    },
    /// In a segment of its own (`Arc` so `export` can copy outside the lock).
    Segment(Arc<OwnedSegment>),
}

#[derive(Debug)]
struct Reservation {
    id: ShardId,
    place: Place,
    /// Made by `export` for its own copy: not usable through the public token.
    internal: bool,
}

#[derive(Debug)]
struct Books {
    alloc: BumpAllocator,
    /// Pool bytes already backed by `fallocate` (never needed twice).
    backed: BackedRanges,
    free_slots: Vec<u32>,
    next_generation: u64,
    next_token: u64,
    /// Allocations not exported yet, by token.
    pending: IdHashMap<u64, Reservation>,
    /// Ids of `pending` (token 0: its segment is being created), to refuse a
    /// second allocation for the same shard.
    pending_ids: IdHashMap<ShardId, u64>,
    /// Shard segments being created outside the lock (count toward `max-shards`).
    creating: usize,
    live: IdHashMap<ShardId, Reservation>,
    /// Retired pool ranges `(offset, len)` still overlapped by a lease.
    retired: Vec<(u64, u64)>,
    /// Liveness of the consumers holding leases on our board.
    holders: Watcher,
}

/// How much a sweep point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// Only while retired ranges wait on leases (`allocate`, `unexport`).
    IfRetired,
    /// Every lease slot (`stats`, `Transport::sweep`).
    Always,
}

/// Owner-side gauges for `stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnerStats {
    pub pool_bytes_total: u64,
    pub pool_bytes_used: u64,
    pub pool_largest_free: u64,
    pub shards_live: u64,
    pub shards_retired_leased: u64,
    pub allocations_pending: u64,
    pub leases_held_on_owner: u64,
    pub segments_owned: u64,
}

/// The owner side of one transport instance.
#[derive(Debug)]
pub(crate) struct Owner {
    cfg: Config,
    /// This process, for judging lease holders and refusing use after fork.
    here: Here,
    names: NameGen,
    /// `Some` in pool mode.
    pool: Option<LazyPool>,
    books: Mutex<Books>,
}

/// The pool, created on first use.
#[derive(Debug, Default)]
struct LazyPool {
    created: OnceLock<Pool>,
    /// Why the last attempt to create it failed (for `health`); cleared by
    /// a later success. Creation runs under the books lock, so attempts
    /// never race.
    last_error: Mutex<Option<AbiError>>,
}

/// Creates a segment under the next free name of `kind`. Names record the
/// process that created the instance: refused in a forked child, where they
/// would name the parent, whose death would get them swept.
fn create_segment(
    here: &Here,
    names: &NameGen,
    kind: Kind,
    size: u64,
) -> PluginResult<OwnedSegment> {
    crate::liveness::check_not_forked(here)?;
    let mut last = None;
    for _ in 0..CREATE_ATTEMPTS {
        let name = names.next(kind);
        match OwnedSegment::create(&name, size) {
            Ok(seg) => return Ok(seg),
            Err(e) if e.op == "shm_open" && e.errno == Errno::EXIST => {
                tracing::debug!(target: "posix_shm", segment = %name, "name taken, trying the next");
                last = Some(name);
            }
            Err(e) => return Err(errors::create_failed(kind, &name, size, e)),
        }
    }
    Err(AbiError::new(
        ErrorKind::IO,
        format!(
            "cannot create a {kind}: {CREATE_ATTEMPTS} names up to {} already exist in /dev/shm",
            last.unwrap_or_default()
        ),
    ))
}

/// A per-shard segment with its pages reserved (a full /dev/shm fails here,
/// not with SIGBUS when the host writes the bytes).
fn create_shard_segment(here: &Here, names: &NameGen, len: u64) -> PluginResult<Arc<OwnedSegment>> {
    let mut seg = create_segment(here, names, Kind::Shard, len)?;
    seg.reserve(0, len)
        .map_err(|e| errors::create_failed(Kind::Shard, seg.name(), len, e))?;
    seg.close_fd();
    Ok(Arc::new(seg))
}

fn create_pool(cfg: &Config, here: &Here, names: &NameGen) -> PluginResult<Pool> {
    // Sparse: no page of the data segment is touched here.
    let data = create_segment(here, names, Kind::PoolData, cfg.pool_size)?;
    let layout = Layout {
        max_shards: cfg.max_shards,
        max_leases: cfg.max_leases,
    };
    let size = layout.size_bytes();
    let mut board = create_segment(here, names, Kind::Board, size)?;
    // The board is small and written by consumers: back it now so a full
    // /dev/shm cannot SIGBUS a consumer taking a lease.
    board
        .reserve(0, size)
        .map_err(|e| errors::create_failed(Kind::Board, board.name(), size, e))?;
    board.close_fd();
    let board = Board::init(board, layout, cfg.pool_size);
    tracing::info!(
        target: "posix_shm",
        data = %data.name(),
        board = %board.name(),
        pool_size = cfg.pool_size,
        max_shards = cfg.max_shards,
        max_leases = cfg.max_leases,
        "pool created"
    );
    Ok(Pool { data, board })
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn nn(p: NonNull<u8>) -> *mut u8 {
    p.as_ptr()
}

impl Owner {
    /// Builds the owner side. In pool mode the pool is created on first
    /// use, or now with `create-pool = "eager"`. A pool that cannot be
    /// created leaves the instance usable as a consumer; the failure goes to
    /// the call that needed the pool, and `health` reports it.
    pub(crate) fn new(cfg: Config, node_tag: &str, here: Here) -> Owner {
        let names = NameGen::new(&cfg.segment_prefix, node_tag, &here.process);
        let (pool, alloc, free_slots) = match cfg.allocation {
            config::Allocation::Pool => {
                let slots = (0..cfg.max_shards).rev().collect();
                (
                    Some(LazyPool::default()),
                    BumpAllocator::new(cfg.pool_size),
                    slots,
                )
            }
            config::Allocation::SegmentPerShard => (None, BumpAllocator::new(0), Vec::new()),
        };
        let owner = Owner {
            books: Mutex::new(Books {
                alloc,
                backed: BackedRanges::default(),
                free_slots,
                next_generation: 1,
                next_token: 1,
                pending: IdHashMap::default(),
                pending_ids: IdHashMap::default(),
                creating: 0,
                live: IdHashMap::default(),
                retired: Vec::new(),
                holders: Watcher::default(),
            }),
            cfg,
            here,
            names,
            pool,
        };
        if owner.cfg.create_pool == CreatePool::Eager {
            let mut b = lock(&owner.books);
            if let Err(e) = owner.pool_or_create(&mut b) {
                tracing::error!(target: "posix_shm", error = %e.message, "pool creation failed");
            }
        }
        owner
    }

    /// The reason the last attempt to create the pool failed, while it
    /// has not been created.
    pub(crate) fn pool_error(&self) -> Option<AbiError> {
        let lazy = self.pool.as_ref()?;
        if lazy.created.get().is_some() {
            return None;
        }
        lock(&lazy.last_error).clone()
    }

    /// True in pool mode while the pool is not created yet.
    pub(crate) fn pool_pending(&self) -> bool {
        self.pool
            .as_ref()
            .is_some_and(|l| l.created.get().is_none())
    }

    /// The pool if it was created (`None` in segment-per-shard mode and
    /// before the first use).
    fn pool(&self) -> PluginResult<Option<&Pool>> {
        Ok(self.pool.as_ref().and_then(|l| l.created.get()))
    }

    /// The pool, created now if this is its first use (`None` in
    /// segment-per-shard mode). A failure goes to the caller; the next call
    /// tries again (`/dev/shm` may have room by then). The books lock
    /// serialises creation.
    fn pool_or_create(&self, _books: &mut Books) -> PluginResult<Option<&Pool>> {
        let Some(lazy) = &self.pool else {
            return Ok(None);
        };
        if let Some(p) = lazy.created.get() {
            return Ok(Some(p));
        }
        match create_pool(&self.cfg, &self.here, &self.names) {
            Ok(p) => {
                *lock(&lazy.last_error) = None;
                Ok(Some(lazy.created.get_or_init(|| p)))
            }
            Err(e) => {
                *lock(&lazy.last_error) = Some(e.clone());
                Err(AbiError::new(
                    e.kind,
                    format!("the posix-shm pool is unavailable: {}", e.message),
                ))
            }
        }
    }

    /// Frees the lease slots of provably dead holders, then the retired
    /// ranges no lease overlaps any more. Returns the leases reclaimed.
    fn sweep(&self, b: &mut Books, mode: Sweep, counters: &Counters) -> u64 {
        if mode == Sweep::IfRetired && b.retired.is_empty() {
            return 0;
        }
        let Ok(Some(pool)) = self.pool() else {
            return 0;
        };
        // One verdict per holder per sweep, however many slots it holds.
        let mut verdicts: HashMap<Holder, Verdict> = HashMap::new();
        let mut leased = Vec::new();
        let mut reclaimed = 0;
        // With no lease in flight (read after every retire above) no slot
        // can name these ranges: skip reading the whole table.
        let scan = if pool.board.no_leases_in_flight() {
            Vec::new()
        } else {
            pool.board.scan_leases()
        };
        for lease in scan {
            if let Some(holder) = lease.holder {
                let verdict = *verdicts.entry(holder).or_insert_with(|| {
                    b.holders.verdict(
                        &holder.record(self.here.process.boot),
                        &self.here,
                        Instant::now(),
                    )
                });
                if let Verdict::Dead(death) = verdict {
                    if pool.board.reclaim(&lease) {
                        reclaimed += 1;
                        tracing::info!(
                            target: "posix_shm",
                            board = %pool.board.name(),
                            slot = lease.index,
                            pid = holder.pid,
                            %death,
                            offset = lease.range.0,
                            len = lease.range.1 - lease.range.0,
                            "reclaimed the lease of a dead consumer"
                        );
                        continue;
                    }
                }
            }
            leased.push(lease.range);
        }
        counters.leases_reclaimed.add(reclaimed);
        if b.retired.is_empty() {
            return reclaimed;
        }
        let before = b.retired.len();
        let retired = std::mem::take(&mut b.retired);
        for (offset, len) in retired {
            if leased.iter().any(|&l| overlaps(l, (offset, offset + len))) {
                b.retired.push((offset, len));
            } else {
                let freed = b.alloc.free(offset);
                debug_assert_eq!(freed, Some(len));
            }
        }
        if b.retired.len() != before {
            tracing::debug!(target: "posix_shm", freed = before - b.retired.len(), still_leased = b.retired.len(), "swept retired ranges");
        }
        reclaimed
    }

    /// `Transport::sweep`, owner side: reclaims every lease slot of a dead
    /// holder and the space it kept. Returns the leases reclaimed.
    pub(crate) fn sweep_leases(&self, counters: &Counters) -> u64 {
        let mut b = lock(&self.books);
        self.sweep(&mut b, Sweep::Always, counters)
    }

    /// Withdraws a reservation: retire its entry, then free or keep its space.
    fn retire(&self, b: &mut Books, r: Reservation) {
        match r.place {
            Place::Segment(seg) => {
                tracing::debug!(target: "posix_shm", shard = %r.id, segment = %seg.name(), "unlinking shard segment");
                drop(seg);
            }
            Place::Pool {
                slot, offset, len, ..
            } => {
                let Ok(Some(pool)) = self.pool() else {
                    unreachable!("pool reservations exist only with a pool")
                };
                // Retire first, then look for leases (see `board`): the
                // lease scan happens in the next `sweep`, which frees the
                // range if no lease overlaps it. Deferring it lets a batch
                // of removes share one scan of the lease table instead of
                // one each (a scan reads every lease slot).
                pool.board.set_entry_state(slot, EntryState::Retired);
                b.free_slots.push(slot);
                if len > 0 {
                    b.retired.push((offset, len));
                }
            }
        }
    }

    fn full_error(&self, b: &Books, len: u64) -> AbiError {
        let retired: u64 = b.retired.iter().map(|r| r.1).sum();
        AbiError::new(
            ErrorKind::RESOURCE_EXHAUSTED,
            format!(
                "posix-shm pool is full: the shard needs {} ({len} bytes) but the pool of {} \
                 has at most {} in one free gap ({} in use, {} of it retired but still leased \
                 by consumers); raise `{}` or set `{} = \"spill\"` to give such shards \
                 their own segment",
                format_byte_size(len),
                format_byte_size(b.alloc.capacity()),
                format_byte_size(b.alloc.largest_free_gap()),
                format_byte_size(b.alloc.used()),
                format_byte_size(retired),
                self.cfg.key("pool-size"),
                self.cfg.key("on-full"),
            ),
        )
    }

    /// Space in the pool for `len` bytes, as a reserved table entry; `None`
    /// when the shard needs a segment of its own (segment-per-shard mode, or
    /// a full pool with `on-full = "spill"`). Cheap: runs under the lock.
    fn pool_space(&self, b: &mut Books, len: u64) -> PluginResult<Option<Place>> {
        let Some(pool) = self.pool_or_create(b)? else {
            return Ok(None);
        };
        let offset = if len == 0 {
            0
        } else {
            match b.alloc.alloc(len) {
                Some(offset) => offset,
                None if self.cfg.on_full == OnFull::Spill => return Ok(None),
                None => return Err(self.full_error(b, len)),
            }
        };
        let Some(slot) = b.free_slots.pop() else {
            if len > 0 {
                b.alloc.free(offset);
            }
            return Err(AbiError::internal("shard table has no free slot"));
        };
        let generation = b.next_generation;
        b.next_generation += 1;
        pool.board.reserve_entry(slot, generation, offset, len);
        Ok(Some(Place::Pool {
            slot,
            generation,
            offset,
            len,
        }))
    }

    fn writable_ptr(&self, place: &Place) -> PluginResult<NonNull<u8>> {
        let p = match place {
            Place::Pool { offset, len, .. } => self
                .pool()?
                .and_then(|pool| pool.data.ptr_mut(*offset, *len)),
            Place::Segment(seg) => seg.ptr_mut(0, seg.size()),
        };
        p.ok_or_else(|| AbiError::internal("reserved space is outside its segment"))
    }

    /// Withdraws pending allocation `token` after a failure.
    fn abandon(&self, token: u64) {
        let mut b = lock(&self.books);
        if let Some(r) = b.pending.remove(&token) {
            b.pending_ids.remove(&r.id);
            self.retire(&mut b, r);
        }
    }

    /// Reserves storage as a pending allocation; returns (token, pointer).
    ///
    /// The books are only locked to decide; backing pages (`fallocate`) and
    /// creating segments, which take time proportional to `len`, run
    /// unlocked. Until it is ready the reservation is marked internal, so no
    /// public token can reach it.
    fn reserve(
        &self,
        id: ShardId,
        len: u64,
        internal: bool,
        counters: &Counters,
    ) -> PluginResult<(u64, NonNull<u8>)> {
        crate::liveness::check_not_forked(&self.here)?;
        let pool_place = {
            let mut b = lock(&self.books);
            self.sweep(&mut b, Sweep::IfRetired, counters);
            if b.live.contains_key(&id) {
                return Err(AbiError::invalid_argument(format!(
                    "shard {id} is already exported"
                )));
            }
            if b.pending_ids.contains_key(&id) {
                return Err(AbiError::invalid_argument(format!(
                    "shard {id} already has an allocation that was neither exported nor freed"
                )));
            }
            let count = b.live.len() + b.pending.len() + b.creating;
            if count >= self.cfg.max_shards as usize {
                return Err(AbiError::new(
                    ErrorKind::RESOURCE_EXHAUSTED,
                    format!(
                        "posix-shm holds {count} shards, the limit set by `{}`; \
                         remove shards or raise it",
                        self.cfg.key("max-shards")
                    ),
                ));
            }
            match self.pool_space(&mut b, len)? {
                Some(place) => {
                    let (offset, ptr) = match &place {
                        Place::Pool { offset, .. } => (*offset, self.writable_ptr(&place)),
                        Place::Segment(_) => unreachable!("pool_space gives pool places"),
                    };
                    let token = b.next_token;
                    b.next_token += 1;
                    let r = Reservation {
                        id,
                        place,
                        internal: true,
                    };
                    match ptr {
                        Ok(ptr) => {
                            b.pending.insert(token, r);
                            b.pending_ids.insert(id, token);
                            let gaps = b.backed.gaps(offset, offset + len);
                            Some((token, gaps, ptr))
                        }
                        Err(e) => {
                            self.retire(&mut b, r);
                            return Err(e);
                        }
                    }
                }
                None => {
                    b.pending_ids.insert(id, 0);
                    b.creating += 1;
                    None
                }
            }
        };

        let (token, ptr) = match pool_place {
            Some((token, gaps, ptr)) => {
                // Only the part of the range never backed before; the
                // reservation is ours alone, so no one else backs it meanwhile.
                let pool = self.pool()?.expect("pool reservation");
                for &(start, end) in &gaps {
                    if let Err(e) = pool.data.reserve(start, end - start) {
                        self.abandon(token);
                        return Err(errors::reserve_failed(pool.data.name(), len, e));
                    }
                }
                if !gaps.is_empty() {
                    let mut b = lock(&self.books);
                    for (start, end) in gaps {
                        b.backed.insert(start, end);
                    }
                }
                (token, ptr)
            }
            None => {
                let created = create_shard_segment(&self.here, &self.names, len);
                let mut b = lock(&self.books);
                b.creating -= 1;
                b.pending_ids.remove(&id);
                let seg = created?;
                if self.pool.is_some() {
                    counters.spills.inc();
                    tracing::warn!(
                        target: "posix_shm",
                        shard = %id,
                        len,
                        segment = %seg.name(),
                        largest_free = b.alloc.largest_free_gap(),
                        "pool full, spilled shard to its own segment"
                    );
                }
                let place = Place::Segment(seg);
                let ptr = self.writable_ptr(&place)?;
                let token = b.next_token;
                b.next_token += 1;
                b.pending.insert(
                    token,
                    Reservation {
                        id,
                        place,
                        internal: true,
                    },
                );
                b.pending_ids.insert(id, token);
                (token, ptr)
            }
        };
        if !internal {
            if let Some(r) = lock(&self.books).pending.get_mut(&token) {
                r.internal = false;
            }
        }
        Ok((token, ptr))
    }

    /// `Transport::allocate`.
    pub(crate) fn allocate(
        &self,
        id: ShardId,
        len: u64,
        counters: &Counters,
    ) -> PluginResult<Allocation> {
        let len_usize = usize::try_from(len).map_err(|_| {
            AbiError::invalid_argument(format!("{len} bytes do not fit this address space"))
        })?;
        let (token, ptr) = self.reserve(id, len, false, counters)?;
        Ok(Allocation {
            ptr: nn(ptr),
            len: len_usize,
            token,
        })
    }

    /// `Transport::free_allocation`.
    pub(crate) fn free_allocation(&self, token: u64, counters: &Counters) -> PluginResult<()> {
        let mut b = lock(&self.books);
        match b.pending.get(&token) {
            Some(r) if !r.internal => {}
            _ => {
                return Err(AbiError::invalid_argument(format!(
                    "unknown allocation token {token} (never allocated, already exported or freed)"
                )))
            }
        }
        let r = b.pending.remove(&token).expect("checked above");
        b.pending_ids.remove(&r.id);
        self.retire(&mut b, r);
        self.sweep(&mut b, Sweep::IfRetired, counters);
        Ok(())
    }

    /// `Transport::export`.
    pub(crate) fn export(&self, req: &ExportRequest, counters: &Counters) -> PluginResult<Vec<u8>> {
        let len = req.data.len() as u64;
        if req.meta.device.kind != DeviceKind::CPU {
            return Err(AbiError::invalid_argument(format!(
                "posix-shm moves host-memory shards only; shard {} is on {}",
                req.id, req.meta.device
            )));
        }
        shardport_kit::check::lent(req)?;
        let token = if req.allocation != 0 {
            req.allocation
        } else {
            // Reserve under the lock, copy outside it.
            let (token, _) = self.reserve(req.id, len, true, counters)?;
            // Only this call knows the internal token, so the reservation
            // stays ours while the lock is released for the copy.
            enum Target {
                Pool(u64),
                Segment(Arc<OwnedSegment>),
            }
            let target = match &lock(&self.books).pending[&token].place {
                Place::Pool { offset, .. } => Target::Pool(*offset),
                Place::Segment(seg) => Target::Segment(Arc::clone(seg)),
            };
            let copied = match target {
                Target::Pool(offset) => {
                    let pool = self.pool()?.expect("pool reservation");
                    pool.data.write_export_data(offset, req)
                }
                Target::Segment(seg) => seg.write_export_data(0, req),
            };
            if !copied {
                let mut b = lock(&self.books);
                if let Some(r) = b.pending.remove(&token) {
                    b.pending_ids.remove(&r.id);
                    self.retire(&mut b, r);
                }
                return Err(AbiError::internal("reserved space is outside its segment"));
            }
            token
        };
        self.publish(req, token, counters)
    }

    /// Turns pending allocation `token` into the live shard `req.id`.
    fn publish(
        &self,
        req: &ExportRequest,
        token: u64,
        counters: &Counters,
    ) -> PluginResult<Vec<u8>> {
        let len = req.data.len() as u64;
        let mut b = lock(&self.books);
        let Some(r) = b.pending.get(&token) else {
            return Err(AbiError::invalid_argument(format!(
                "unknown allocation token {token} (never allocated, already exported or freed)"
            )));
        };
        if r.internal && req.allocation != 0 {
            return Err(AbiError::invalid_argument(format!(
                "unknown allocation token {token}"
            )));
        }
        if r.id != req.id {
            return Err(AbiError::invalid_argument(format!(
                "allocation {token} was made for shard {}, not {}",
                r.id, req.id
            )));
        }
        let (alloc_len, ptr) = match &r.place {
            Place::Pool { len, .. } => (*len, self.writable_ptr(&r.place)?),
            Place::Segment(seg) => (seg.size(), self.writable_ptr(&r.place)?),
        };
        let lent_elsewhere = !r.internal && len > 0 && req.data.as_ptr() != nn(ptr).cast_const();
        if alloc_len != len || lent_elsewhere {
            return Err(AbiError::invalid_argument(format!(
                "shard {}: export names allocation {token} but lends other bytes \
                 ({len} bytes, the allocation has {alloc_len})",
                req.id
            )));
        }
        let r = b.pending.remove(&token).expect("checked above");
        b.pending_ids.remove(&r.id);
        let desc = match &r.place {
            Place::Pool {
                slot,
                generation,
                offset,
                len,
            } => {
                let pool = self.pool()?.expect("pool reservation");
                pool.board.set_entry_state(*slot, EntryState::Live);
                Descriptor {
                    mode: Mode::Pool,
                    segment: pool.data.name().into(),
                    board: pool.board.name().into(),
                    offset: *offset,
                    len: *len,
                    slot: *slot,
                    generation: *generation,
                }
            }
            Place::Segment(seg) => Descriptor {
                mode: Mode::Segment,
                segment: seg.name().into(),
                board: "".into(),
                offset: 0,
                len,
                slot: 0,
                generation: 0,
            },
        };
        tracing::debug!(target: "posix_shm", shard = %req.id, segment = %desc.segment, offset = desc.offset, len, "exported");
        let bytes = desc.encode();
        b.live.insert(r.id, r);
        counters.bytes_exported.add(len);
        Ok(bytes)
    }

    /// `Transport::unexport`.
    pub(crate) fn unexport(&self, id: ShardId, counters: &Counters) -> PluginResult<()> {
        let mut b = lock(&self.books);
        let Some(r) = b.live.remove(&id) else {
            return Err(AbiError::not_found(format!(
                "shard {id} is not exported by posix-shm instance `{}`",
                self.cfg.instance
            )));
        };
        self.retire(&mut b, r);
        // Retired space is freed by the next put (which sweeps before it
        // allocates, so freed pages are reused warm), by `stats`, or here
        // once enough has piled up.
        if b.retired.len() >= RETIRED_SWEEP_BATCH {
            self.sweep(&mut b, Sweep::IfRetired, counters);
        }
        Ok(())
    }

    /// Gauges (sweeps first, dead holders' leases included, so freed space
    /// shows at once).
    pub(crate) fn stats(&self, counters: &Counters) -> OwnerStats {
        let mut b = lock(&self.books);
        self.sweep(&mut b, Sweep::Always, counters);
        let pool = self.pool().ok().flatten();
        let segments = b
            .live
            .values()
            .chain(b.pending.values())
            .filter(|r| matches!(r.place, Place::Segment(_)))
            .count() as u64;
        OwnerStats {
            pool_bytes_total: pool.map_or(0, |_| b.alloc.capacity()),
            pool_bytes_used: b.alloc.used(),
            pool_largest_free: pool.map_or(0, |_| b.alloc.largest_free_gap()),
            shards_live: b.live.len() as u64,
            shards_retired_leased: b.retired.len() as u64,
            allocations_pending: b.pending.len() as u64,
            leases_held_on_owner: pool.map_or(0, |p| p.board.leases_held()),
            segments_owned: segments + if pool.is_some() { 2 } else { 0 },
        }
    }

    /// Common start of this owner's segment names.
    pub(crate) fn name_base(&self) -> String {
        self.names.base().to_owned()
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Tell consumers with cached mappings that every shard is gone before
        // the names disappear; the segments themselves unlink as they drop.
        if let Ok(Some(pool)) = self.pool() {
            let b = lock(&self.books);
            for r in b.live.values().chain(b.pending.values()) {
                if let Place::Pool { slot, .. } = r.place {
                    pool.board.set_entry_state(slot, EntryState::Retired);
                }
            }
            pool.board.close();
            tracing::info!(
                target: "posix_shm",
                data = %pool.data.name(),
                live = b.live.len(),
                still_leased = b.retired.len(),
                "pool closed"
            );
        }
    }
}
