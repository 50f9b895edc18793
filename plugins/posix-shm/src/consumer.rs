//! The consumer side: validating descriptors, leasing, copying and viewing.
//!
//! # Overview
//! A pool descriptor names the owner's data segment and lease board. The
//! consumer maps the data segment read-only and the board read-write once,
//! and keeps both in a small LRU cache keyed by the data segment's name
//! (`Arc`'d: a live lease keeps its mapping even after eviction). Every read
//! of pool bytes, a copy as much as a view, happens under a lease taken
//! through the board. A segment descriptor names a per-shard segment, mapped
//! read-only for one import and unmapped at `release` (views) or right after
//! the copy.
//!
//! # Validation
//! Everything in a descriptor is checked before use: the syntax and names in
//! `descriptor`, then `len` against the shard's metadata, `offset + len`
//! against the segment's real size (`fstat`), the board header against the
//! board's real size, and the shard slot against the board's table size.
//!
//! # Dead owners
//! Segment names carry their owner's pid, start time, namespaces and boot
//! (see `names`; a cached pool keeps its owner's record). Before touching a
//! shard the consumer asks its owner [`Watcher`] whether that process is
//! provably dead (see `liveness`; a pidfd makes the check one non-blocking
//! `poll`, done at most once per `owner-check-interval` per owner, so the
//! hot path makes no system call). If so the import fails `NOT_FOUND`
//! naming the dead pid, and cached mappings of its pools are dropped,
//! instead of serving bytes from an orphaned segment. Nothing here ever
//! waits on an owner, dead or alive.
//!
//! # Failure modes
//! A segment that no longer exists is `NOT_FOUND` (the owner removed the
//! shard, or exited). A shard whose board entry changed is `NOT_FOUND` too.
//! A full lease table is `RESOURCE_EXHAUSTED` naming `max-leases`. A board of
//! another layout version is `UNAVAILABLE` (owner and consumer run different
//! plugin versions). When an owner closes its pool, cached mappings of it
//! are dropped at the next import; those of an owner that died, at the next
//! import from it, `stats` or `sweep`.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU32, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use shardport_abi::{
    AbiError, ErrorKind, ImportInfo, ImportItem, OwnerClaim, PluginResult, Region, ShardMeta,
};

use crate::{
    board::{AttachError, Board, Holder, LeaseRefused, LeaseRequest, LeaseSlot},
    config::{MAX_MAX_LEASES, MAX_MAX_SHARDS},
    descriptor::{Descriptor, Mode},
    errors,
    liveness::{Here, ProcessRecord, Verdict, Watcher},
    lock,
    names::{self, Kind},
    stats::Counters,
    sys::{OwnedSegment, PeerSegment, PrivateMap},
};

/// Pools kept mapped at once: a consumer usually reads from a handful of
/// owners on its node; each entry costs two mappings and no memory of its own.
pub(crate) const MAX_CACHED_POOLS: usize = 16;

/// A peer's pool as this consumer maps it.
#[derive(Debug)]
pub(crate) struct PeerPool {
    data: PeerSegment,
    board: Board,
    /// Where the next lease-slot search starts (spreads claims out).
    hint: AtomicU32,
    /// The owner its names record (`None`: a node tag of another shape).
    owner: Option<ProcessRecord>,
}

/// A lease on pool bytes; dropping it frees the lease slot.
#[derive(Debug)]
struct PoolLease {
    pool: Arc<PeerPool>,
    slot: LeaseSlot,
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        if !self.pool.board.release(self.slot) {
            tracing::warn!(
                target: "posix_shm",
                board = %self.pool.board.name(),
                slot = self.slot.index,
                "lease slot was reclaimed by its owner while still held: the owner judged \
                 this process dead (an identity recorded by another process?)"
            );
        }
    }
}

/// Bytes this consumer may read until the value is dropped.
#[derive(Debug)]
enum Held {
    Pool {
        lease: PoolLease,
        offset: u64,
        len: u64,
    },
    Segment {
        seg: PeerSegment,
        len: u64,
    },
}

/// Leases one `import_many` holds at most at once (of the owner's
/// `max-leases`, 4096 by default): enough to take the lock once per many
/// small shards, few enough that batching consumers leave slots for others
/// (a group also ends early when the table is full).
const BATCH_LEASES: usize = 64;

/// Copies the bytes `held` keeps stable into `dst` (its length checked
/// against the shard's by the caller).
fn copy_held(held: &Held, dst: &mut [u8]) -> PluginResult<()> {
    let (offset, _) = held.range();
    if held.segment().copy_out(offset, dst) {
        Ok(())
    } else {
        Err(AbiError::internal("validated range is outside its segment"))
    }
}

impl Held {
    fn segment(&self) -> &PeerSegment {
        match self {
            Held::Pool { lease, .. } => &lease.pool.data,
            Held::Segment { seg, .. } => seg,
        }
    }

    fn range(&self) -> (u64, u64) {
        match self {
            Held::Pool { offset, len, .. } => (*offset, *len),
            Held::Segment { len, .. } => (0, *len),
        }
    }
}

/// A lent view: the lease, and for a private view its own mapping.
/// Fields drop in order: the private mapping goes before the lease.
#[derive(Debug)]
struct View {
    /// Held for its `Drop` (the unmapping) alone.
    #[allow(dead_code)]
    private: Option<PrivateMap>,
    held: Held,
}

#[derive(Debug)]
struct Cached {
    /// The data segment's name.
    name: String,
    pool: Arc<PeerPool>,
    last_used: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Mapped pools (at most [`MAX_CACHED_POOLS`]: searched linearly,
    /// cheaper than hashing a name per import).
    pools: Vec<Cached>,
    tick: u64,
    next_token: u64,
    views: HashMap<u64, View>,
    /// Liveness of the owners we fetch from.
    owners: Watcher,
    /// When this process last checked it is the one that created the
    /// instance (not a forked child).
    identity_checked_at: Option<Instant>,
}

/// Consumer-side gauges for `stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConsumerStats {
    pub leases_active: u64,
    pub segments_mapped: u64,
}

/// The consumer side of one transport instance.
#[derive(Debug)]
pub(crate) struct Consumer {
    prefix: String,
    /// Who this process is: recorded in every lease slot it takes.
    here: Here,
    /// `owner-check-interval`.
    check_interval: Duration,
    state: Mutex<State>,
    /// Owner marks of segment names already parsed (a consumer meets the
    /// same few pool segments and boards again and again), most recent
    /// last; a short list, searched linearly (cheaper than hashing names).
    marks: Mutex<Vec<(String, names::OwnerMark)>>,
    /// The last names and claim [`check_claim`](Self::check_claim) passed:
    /// a batch checks the same pool's names against the same owner once
    /// per shard, and this makes each check after the first a comparison.
    passed: Mutex<Passed>,
}

/// Segment and board names that passed the owner-binding check for a
/// claim with this epoch, PID namespace and boot id (empty: none yet).
#[derive(Debug, Default)]
struct Passed {
    segment: String,
    board: String,
    epoch: u64,
    pid_ns: u64,
    boot_id: String,
}

impl Passed {
    fn matches(&self, segment: &str, board: &str, claim: &OwnerClaim<'_>) -> bool {
        !self.segment.is_empty()
            && self.segment == segment
            && self.board == board
            && self.epoch == claim.epoch
            && self.pid_ns == claim.pid_ns
            && self.boot_id == claim.boot_id.as_str()
    }

    /// Remembers a check that passed (reusing the strings' space).
    fn set(&mut self, segment: &str, board: &str, claim: &OwnerClaim<'_>) {
        for (to, from) in [
            (&mut self.segment, segment),
            (&mut self.board, board),
            (&mut self.boot_id, claim.boot_id.as_str()),
        ] {
            to.clear();
            to.push_str(from);
        }
        self.epoch = claim.epoch;
        self.pid_ns = claim.pid_ns;
    }
}

/// Most segment names whose owner marks are kept.
const MAX_MARKS: usize = 64;

fn bad(field: &str, why: impl std::fmt::Display) -> AbiError {
    AbiError::invalid_descriptor(format!("posix-shm descriptor field `{field}`: {why}"))
}

impl Consumer {
    /// A consumer that accepts names with `prefix`, in the process `here`,
    /// re-checking an owner found alive every `check_interval`.
    pub(crate) fn new(prefix: &str, here: Here, check_interval: Duration) -> Consumer {
        Consumer {
            prefix: prefix.to_owned(),
            here,
            check_interval,
            marks: Mutex::default(),
            passed: Mutex::default(),
            state: Mutex::new(State {
                next_token: 1,
                owners: Watcher::new(check_interval),
                ..State::default()
            }),
        }
    }

    /// Refuses use in a forked child (its leases would carry the parent's
    /// identity), checked at most once per `check_interval`: `getpid` is a
    /// system call.
    fn check_identity(&self, st: &mut State, now: Instant) -> PluginResult<()> {
        let fresh = st
            .identity_checked_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.check_interval);
        if !fresh {
            crate::liveness::check_not_forked(&self.here)?;
            st.identity_checked_at = Some(now);
        }
        Ok(())
    }

    /// Fails `NOT_FOUND` when `owner` (recorded in `segment`'s name) is
    /// provably dead, and drops our cached mappings of its pools.
    fn check_owner(
        &self,
        st: &mut State,
        owner: Option<ProcessRecord>,
        segment: &str,
        now: Instant,
    ) -> PluginResult<()> {
        let Some(owner) = owner else {
            return Ok(());
        };
        match st.owners.verdict(&owner, &self.here, now) {
            Verdict::Dead(death) => {
                let base = names::owner_base(segment);
                st.pools.retain(|c| names::owner_base(&c.name) != base);
                tracing::debug!(target: "posix_shm", segment, pid = owner.pid, %death, "owner is dead");
                Err(errors::owner_dead(owner.pid, death, segment))
            }
            Verdict::Alive | Verdict::Unknown(_) => Ok(()),
        }
    }

    /// The owner `segment`'s name records, if it has one.
    fn owner_of(&self, segment: &str) -> Option<ProcessRecord> {
        names::parse_owned(segment, &self.prefix).map(|n| n.owner)
    }

    /// Drops cached pools whose owner closed them, whose data segment is
    /// gone or whose owner is provably dead: a cached mapping would
    /// otherwise pin the dead pool's memory until this consumer exits.
    /// Leases keep their own pool alive.
    fn forget_gone_pools(&self, st: &mut State) {
        let now = Instant::now();
        let State { pools, owners, .. } = st;
        pools.retain(|c| {
            let name = &c.name;
            let dead = c
                .pool
                .owner
                .is_some_and(|o| matches!(owners.verdict(&o, &self.here, now), Verdict::Dead(_)));
            let keep = !dead && !c.pool.board.is_closed() && OwnedSegment::exists(name);
            if !keep {
                tracing::debug!(target: "posix_shm", pool = %name, dead, "dropping cached mapping of a closed or orphaned pool");
            }
            keep
        });
    }

    /// The mapped pool named by `d`, from the cache or freshly opened, after
    /// checking that its owner is not dead.
    fn pool(
        &self,
        st: &mut State,
        d: &Descriptor<'_>,
        now: Instant,
    ) -> PluginResult<Arc<PeerPool>> {
        // Forget pools whose owner has closed them (leases keep theirs alive).
        st.pools.retain(|c| !c.pool.board.is_closed());
        st.tick += 1;
        let tick = st.tick;
        if let Some(c) = st.pools.iter_mut().find(|c| c.name == d.segment) {
            if c.pool.board.name() != d.board {
                return Err(bad(
                    "board",
                    format!(
                        "pool {} uses board {}, the descriptor names {}",
                        d.segment,
                        c.pool.board.name(),
                        d.board
                    ),
                ));
            }
            c.last_used = tick;
            let pool = Arc::clone(&c.pool);
            self.check_owner(st, pool.owner, &d.segment, now)?;
            return Ok(pool);
        }
        let owner = self.owner_of(&d.segment);
        self.check_owner(st, owner, &d.segment, now)?;
        if names::owner_base(&d.segment) != names::owner_base(&d.board) {
            return Err(bad(
                "board",
                format!("{} and {} belong to different owners", d.board, d.segment),
            ));
        }
        let data = PeerSegment::open(&d.segment)
            .map_err(|e| errors::open_failed(Kind::PoolData, &d.segment, e))?;
        let board_seg = OwnedSegment::open(&d.board)
            .map_err(|e| errors::open_failed(Kind::Board, &d.board, e))?;
        let board =
            Board::attach(board_seg, data.size(), MAX_MAX_SHARDS, MAX_MAX_LEASES).map_err(|e| {
                match e {
                    AttachError::Version { found } => errors::board_version(&d.board, found),
                    AttachError::Invalid(why) => bad("board", format!("{}: {why}", d.board)),
                }
            })?;
        if board.is_closed() {
            return Err(AbiError::not_found(format!(
                "pool {} was closed by its owner",
                d.segment
            )));
        }
        if st.pools.len() >= MAX_CACHED_POOLS {
            if let Some(oldest) = (0..st.pools.len()).min_by_key(|&i| st.pools[i].last_used) {
                let gone = st.pools.swap_remove(oldest);
                tracing::debug!(target: "posix_shm", pool = %gone.name, "evicting cached pool mapping");
            }
        }
        tracing::debug!(target: "posix_shm", pool = %d.segment, size = data.size(), "mapped peer pool");
        let pool = Arc::new(PeerPool {
            data,
            board,
            hint: AtomicU32::new(0),
            owner,
        });
        st.pools.push(Cached {
            name: d.segment.clone().into_owned(),
            pool: Arc::clone(&pool),
            last_used: tick,
        });
        Ok(pool)
    }

    /// Validates `desc` and obtains the right to read its bytes.
    /// Refuses a descriptor whose segments (data, and board in pool mode)
    /// belong to another owner than `claim` (see `names::check_owner`).
    /// A descriptor without that shape, or a name this consumer would not
    /// open anyway (another prefix, not a host's name), passes: the import
    /// refuses it and reports why (a failed attempt, so the fetch is a
    /// downgrade), as before binding. What is refused here is a name this
    /// consumer would open that belongs to another owner.
    pub(crate) fn check_claim(&self, desc: &[u8], claim: &OwnerClaim<'_>) -> PluginResult<()> {
        let Some((segment, board)) = Descriptor::names(desc) else {
            return Ok(());
        };
        if lock(&self.passed).matches(segment, board, claim) {
            return Ok(());
        }
        for (field, name) in [("segment", segment), ("board", board)] {
            if name.is_empty() {
                continue;
            }
            let Ok(mark) = self.mark(name) else {
                return Ok(());
            };
            names::check_owner(name, &mark, claim).map_err(|why| bad(field, why))?;
        }
        lock(&self.passed).set(segment, board, claim);
        Ok(())
    }

    /// The owner mark of segment `name`, parsed once and kept.
    fn mark(&self, name: &str) -> Result<names::OwnerMark, String> {
        if let Some((_, m)) = lock(&self.marks).iter().rev().find(|(n, _)| n == name) {
            return Ok(*m);
        }
        let m = names::owner_mark(name, &self.prefix)?;
        let mut marks = lock(&self.marks);
        if marks.len() >= MAX_MARKS {
            marks.remove(0);
        }
        marks.push((name.to_owned(), m));
        Ok(m)
    }

    fn hold(
        &self,
        st: &mut State,
        desc: &[u8],
        meta: &ShardMeta,
        counters: &Counters,
    ) -> PluginResult<Held> {
        let now = Instant::now();
        self.check_identity(st, now)?;
        // The names of a pool this consumer has mapped were checked when it
        // mapped it (the same bytes): most imports skip the check.
        let d = Descriptor::decode_unless_known(desc, &self.prefix, |d| {
            d.mode == Mode::Pool
                && st
                    .pools
                    .iter()
                    .any(|c| c.name == d.segment && c.pool.board.name() == d.board)
        })?;
        if d.len != meta.byte_len {
            return Err(bad(
                "len",
                format!(
                    "{} bytes, but the shard's metadata says byte_len {}",
                    d.len, meta.byte_len
                ),
            ));
        }
        if usize::try_from(d.len).is_err() {
            return Err(bad(
                "len",
                format!("{} bytes do not fit this address space", d.len),
            ));
        }
        // `decode` proved `offset + len` does not overflow.
        let end = d.offset + d.len;
        match d.mode {
            Mode::Segment => {
                self.check_owner(st, self.owner_of(&d.segment), &d.segment, now)?;
                let seg = PeerSegment::open(&d.segment)
                    .map_err(|e| errors::open_failed(Kind::Shard, &d.segment, e))?;
                if end > seg.size() {
                    return Err(bad(
                        "len",
                        format!(
                            "{} bytes run past the end of {} ({} bytes)",
                            d.len,
                            d.segment,
                            seg.size()
                        ),
                    ));
                }
                Ok(Held::Segment { seg, len: d.len })
            }
            Mode::Pool => {
                let pool = self.pool(st, &d, now)?;
                if end > pool.data.size() {
                    let field = if d.offset > pool.data.size() {
                        "offset"
                    } else {
                        "len"
                    };
                    return Err(bad(
                        field,
                        format!(
                            "bytes {}..{end} run past the end of {} ({} bytes)",
                            d.offset,
                            d.segment,
                            pool.data.size()
                        ),
                    ));
                }
                let layout = pool.board.layout();
                if d.slot >= layout.max_shards {
                    return Err(bad(
                        "slot",
                        format!(
                            "{} is outside the shard table of {} ({} entries)",
                            d.slot, d.board, layout.max_shards
                        ),
                    ));
                }
                let req = LeaseRequest {
                    shard_slot: d.slot,
                    generation: d.generation,
                    offset: d.offset,
                    len: d.len,
                    holder: Holder {
                        pid: self.here.process.pid,
                        start_ticks: self.here.process.start_ticks,
                        ns: self.here.process.ns,
                    },
                };
                match pool.board.lease(&req, pool.hint.load(Relaxed)) {
                    Ok(slot) => {
                        pool.hint
                            .store((slot.index + 1) % layout.max_leases, Relaxed);
                        counters.leases_granted.inc();
                        Ok(Held::Pool {
                            lease: PoolLease { pool, slot },
                            offset: d.offset,
                            len: d.len,
                        })
                    }
                    Err(LeaseRefused::Removed) => Err(AbiError::not_found(format!(
                        "shard at slot {} (generation {}) of pool {} was removed by its owner",
                        d.slot, d.generation, d.segment
                    ))),
                    Err(LeaseRefused::Reclaimed) => Err(AbiError::unavailable(format!(
                        "pool {} reclaimed this lease while it was being taken: its owner \
                         judged this process dead (pid {} as recorded in the lease)",
                        d.segment, self.here.process.pid
                    ))),
                    Err(LeaseRefused::TableFull) => Err(AbiError::new(
                        ErrorKind::RESOURCE_EXHAUSTED,
                        format!(
                            "all {} lease slots of pool {} are held; raise `max-leases` in \
                             the owner's posix-shm config, or release views sooner",
                            layout.max_leases, d.segment
                        ),
                    )),
                }
            }
        }
    }

    /// `Transport::import_into`.
    pub(crate) fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
        counters: &Counters,
    ) -> PluginResult<ImportInfo> {
        shardport_kit::check::destination(dst.len(), meta)?;
        let held = {
            let mut st = lock(&self.state);
            self.hold(&mut st, desc, meta, counters)?
        };
        // Copy outside the lock; the lease (or our own mapping) keeps the
        // bytes stable until `held` drops.
        copy_held(&held, dst)?;
        let (offset, _) = held.range();
        let note = format!(
            "{} bytes {}..{}",
            held.segment().name(),
            offset,
            offset + dst.len() as u64
        );
        drop(held);
        counters.imports_copy.inc();
        Ok(ImportInfo { note: note.into() })
    }

    /// `Transport::import_many`: the items in groups of at most
    /// [`BATCH_LEASES`]; each group's leases are taken under one lock, its
    /// bytes copied outside it and its leases given back before the next
    /// group. A group ends early when the owner's lease table is full, so
    /// a small `max-leases` (or other consumers holding most of it) costs
    /// more groups, never a refused item that one at a time would get. A
    /// failed item fails alone. The notes are empty: the host reads a
    /// batch's notes nowhere, and formatting them cost more than a 4 KiB
    /// copy.
    pub(crate) fn import_many(
        &self,
        items: &mut [ImportItem<'_>],
        counters: &Counters,
    ) -> Vec<PluginResult<ImportInfo>> {
        let mut out = Vec::with_capacity(items.len());
        let mut next = 0;
        while next < items.len() {
            let mut held: Vec<PluginResult<Held>> = Vec::new();
            {
                let mut st = lock(&self.state);
                while next < items.len() && held.len() < BATCH_LEASES {
                    let item = &items[next];
                    let h = shardport_kit::check::destination(item.dst.len(), item.meta).and_then(
                        |()| self.hold(&mut st, item.desc.as_slice(), item.meta, counters),
                    );
                    let table_full =
                        matches!(&h, Err(e) if e.kind == ErrorKind::RESOURCE_EXHAUSTED);
                    if table_full && held.iter().any(Result::is_ok) {
                        // Copy and give back what this group holds first.
                        break;
                    }
                    held.push(h);
                    next += 1;
                }
            }
            let first = next - held.len();
            for (item, h) in items[first..next].iter_mut().zip(held) {
                out.push(h.and_then(|h| {
                    copy_held(&h, item.dst.as_mut_slice())?;
                    counters.imports_copy.inc();
                    Ok(ImportInfo::default())
                }));
            }
        }
        out
    }

    /// `Transport::import_view`.
    pub(crate) fn import_view(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        counters: &Counters,
    ) -> PluginResult<Region> {
        let mut st = lock(&self.state);
        let held = self.hold(&mut st, desc, meta, counters)?;
        let (offset, len) = held.range();
        let token = st.next_token;
        let region = held
            .segment()
            .region(offset, len, token)
            .ok_or_else(|| AbiError::internal("validated range is outside its segment"))?;
        st.next_token += 1;
        st.views.insert(
            token,
            View {
                private: None,
                held,
            },
        );
        counters.imports_view.inc();
        Ok(region)
    }

    /// `Transport::import_view_private`: the lease as for a view, and the
    /// range mapped again, privately (copy-on-write), from the segment
    /// opened anew by its name (the name was checked when the lease was
    /// taken; the consumer keeps no descriptor open per segment). The
    /// mapping is made outside the state lock.
    pub(crate) fn import_view_private(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        counters: &Counters,
    ) -> PluginResult<Region> {
        let held = {
            let mut st = lock(&self.state);
            self.hold(&mut st, desc, meta, counters)?
        };
        let (offset, len) = held.range();
        // On failure `held` drops here: the lease is given back. Errors as
        // for opening the segment the first time (a removed segment is
        // NOT_FOUND, as for a plain view).
        let kind = match &held {
            Held::Pool { .. } => Kind::PoolData,
            Held::Segment { .. } => Kind::Shard,
        };
        let map = PrivateMap::open(held.segment().name(), offset, len)
            .map_err(|e| errors::open_failed(kind, held.segment().name(), e))?;
        let mut st = lock(&self.state);
        let token = st.next_token;
        st.next_token += 1;
        let region = map.region(token);
        st.views.insert(
            token,
            View {
                private: Some(map),
                held,
            },
        );
        counters.imports_view_private.inc();
        Ok(region)
    }

    /// `Transport::sweep`, consumer side: drops cached mappings of pools
    /// whose owner is dead or gone.
    pub(crate) fn sweep(&self) {
        let mut st = lock(&self.state);
        self.forget_gone_pools(&mut st);
    }

    /// `Transport::release`.
    pub(crate) fn release(&self, token: u64) -> PluginResult<()> {
        let view = lock(&self.state).views.remove(&token);
        match view {
            // Dropping the view unmaps a private mapping, then frees the
            // lease slot or unmaps the segment.
            Some(view) => {
                drop(view);
                Ok(())
            }
            None => Err(AbiError::invalid_argument(format!(
                "unknown lease token {token} (never issued or already released)"
            ))),
        }
    }

    /// Gauges. Also drops cached pools that are gone (see
    /// [`forget_gone_pools`](Self::forget_gone_pools)).
    pub(crate) fn stats(&self) -> ConsumerStats {
        let mut st = lock(&self.state);
        self.forget_gone_pools(&mut st);
        let mut pools: HashSet<*const PeerPool> =
            st.pools.iter().map(|c| Arc::as_ptr(&c.pool)).collect();
        let mut per_shard = 0;
        for v in st.views.values() {
            match &v.held {
                Held::Pool { lease, .. } => {
                    pools.insert(Arc::as_ptr(&lease.pool));
                }
                Held::Segment { .. } => per_shard += 1,
            }
        }
        ConsumerStats {
            leases_active: st.views.len() as u64,
            segments_mapped: 2 * pools.len() as u64 + per_shard,
        }
    }
}
