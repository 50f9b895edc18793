//! The lease board: a small shared segment through which consumers tell the
//! owner which pool bytes they are reading.
//!
//! # Layout
//! Every field is one little-endian `u64` word accessed only atomically
//! (`SeqCst`), in every process:
//!
//! ```text
//! header  (8 words)  magic, layout version, max_shards, max_leases, data_size,
//!                    pool state (1 open, 2 closed), 2 reserved
//! entries (4 words each, max_shards of them)
//!                    state (0 free, 1 reserved, 2 live, 3 retired),
//!                    generation, offset, len
//! leases  (8 words each, max_leases of them)
//!                    state (0 free, 1 claiming, 2 held), shard slot,
//!                    generation, offset, len, holder pid,
//!                    holder process start time (clock ticks since boot), reserved
//! ```
//!
//! # Protocol
//! A consumer **leases** a shard by claiming a free lease slot (CAS free ->
//! claiming), writing what it is about to read (shard slot, generation,
//! offset, len, pid, start time), marking the slot held, and only then
//! re-reading the shard's entry: it must still be live with the same
//! generation, offset and length, or the consumer frees the slot and reports
//! the shard as removed. The owner **retires** a shard by setting its entry to
//! retired first and only then scanning the lease slots for one overlapping
//! the shard's bytes; without one it frees the bytes at once, with one it
//! keeps them occupied and re-scans on later calls.
//!
//! Why no lease is ever missed: both sides write, then read the other's
//! location, all `SeqCst`, so in the single total order either the
//! consumer's lease writes precede the owner's scan (the owner sees the
//! lease) or the owner's retire precedes the consumer's re-check (the
//! consumer sees the shard gone). A scan that reads a half-written slot read
//! some field before the consumer wrote it, so the retire came before the
//! consumer's re-check too. A consumer that finds a reused entry sees a new
//! generation (generations only grow), never the old one.
//!
//! # Failure modes
//! Consumers map the board read-write; a hostile one can claim slots or write
//! nonsense ranges. The owner keeps its own books in process memory and only
//! reads lease ranges from the board (with saturating arithmetic), so the
//! worst a bad consumer can do is keep pool space occupied. A consumer that
//! dies holding a lease keeps the leased bytes occupied until the owner
//! exits; the pid and start time in the slot are recorded so a later sweep
//! can free them (it must check the consumer's PID namespace first).

use crate::sys::OwnedSegment;
use std::sync::atomic::Ordering::SeqCst;

/// `"SPSHMBRD"`: identifies a lease board.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SPSHMBRD");
/// Bumped on any change to the layout above.
pub(crate) const LAYOUT_VERSION: u64 = 1;

const HEADER_WORDS: usize = 8;
const ENTRY_WORDS: usize = 4;
const LEASE_WORDS: usize = 8;

const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_MAX_SHARDS: usize = 2;
const H_MAX_LEASES: usize = 3;
const H_DATA_SIZE: usize = 4;
const H_STATE: usize = 5;

const POOL_OPEN: u64 = 1;
const POOL_CLOSED: u64 = 2;

const E_STATE: usize = 0;
const E_GENERATION: usize = 1;
const E_OFFSET: usize = 2;
const E_LEN: usize = 3;

const L_STATE: usize = 0;
const L_SLOT: usize = 1;
const L_GENERATION: usize = 2;
const L_OFFSET: usize = 3;
const L_LEN: usize = 4;
const L_PID: usize = 5;
const L_START_TIME: usize = 6;

/// State of a shard-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum EntryState {
    /// Never used: the zero-filled state of a new board (named for readers;
    /// the owner never writes it).
    #[allow(dead_code)]
    Free = 0,
    /// Space allocated, not exported yet.
    Reserved = 1,
    /// Exported: consumers may lease it.
    Live = 2,
    /// Unexported (or the allocation freed): no new leases.
    Retired = 3,
}

const LEASE_FREE: u64 = 0;
const LEASE_CLAIMING: u64 = 1;
const LEASE_HELD: u64 = 2;

/// Table sizes of a board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub max_shards: u32,
    pub max_leases: u32,
}

impl Layout {
    /// Bytes the board needs.
    pub(crate) fn size_bytes(&self) -> u64 {
        8 * (HEADER_WORDS as u64
            + ENTRY_WORDS as u64 * u64::from(self.max_shards)
            + LEASE_WORDS as u64 * u64::from(self.max_leases))
    }

    fn entry(&self, slot: u32, field: usize) -> usize {
        assert!(slot < self.max_shards, "shard slot {slot} out of range");
        HEADER_WORDS + ENTRY_WORDS * slot as usize + field
    }

    fn lease(&self, slot: u32, field: usize) -> usize {
        assert!(slot < self.max_leases, "lease slot {slot} out of range");
        HEADER_WORDS + ENTRY_WORDS * self.max_shards as usize + LEASE_WORDS * slot as usize + field
    }
}

/// What a consumer is about to read, recorded in its lease slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseRequest {
    pub shard_slot: u32,
    pub generation: u64,
    pub offset: u64,
    pub len: u64,
    pub pid: u32,
    pub start_time: u64,
}

/// Why a lease was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRefused {
    /// Every lease slot is taken.
    TableFull,
    /// The shard entry is no longer live with that generation/offset/len.
    Removed,
}

/// A mapped lease board, on either side.
#[derive(Debug)]
pub(crate) struct Board {
    seg: OwnedSegment,
    layout: Layout,
}

impl Board {
    /// Owner side: initialises a freshly created (zero-filled) board segment
    /// of at least `layout.size_bytes()` bytes for a pool of `data_size` bytes.
    pub(crate) fn init(seg: OwnedSegment, layout: Layout, data_size: u64) -> Board {
        assert!(seg.size() >= layout.size_bytes(), "board segment too small");
        let b = Board { seg, layout };
        b.word(H_MAGIC).store(MAGIC, SeqCst);
        b.word(H_VERSION).store(LAYOUT_VERSION, SeqCst);
        b.word(H_MAX_SHARDS)
            .store(u64::from(layout.max_shards), SeqCst);
        b.word(H_MAX_LEASES)
            .store(u64::from(layout.max_leases), SeqCst);
        b.word(H_DATA_SIZE).store(data_size, SeqCst);
        b.word(H_STATE).store(POOL_OPEN, SeqCst);
        b
    }

    /// Consumer side: checks an opened board against its real size and the
    /// real size of the pool's data segment. The error names the bad field.
    pub(crate) fn attach(
        seg: OwnedSegment,
        data_size: u64,
        max_shards_limit: u64,
        max_leases_limit: u64,
    ) -> Result<Board, String> {
        let header_bytes = 8 * HEADER_WORDS as u64;
        if seg.size() < header_bytes {
            return Err(format!(
                "board is {} bytes, smaller than its {header_bytes}-byte header",
                seg.size()
            ));
        }
        let read = |i: usize| seg.atomic_u64(i).load(SeqCst);
        if read(H_MAGIC) != MAGIC {
            return Err("board magic is wrong (not a posix-shm lease board)".into());
        }
        let version = read(H_VERSION);
        if version != LAYOUT_VERSION {
            return Err(format!(
                "board layout version is {version}, this plugin reads {LAYOUT_VERSION}"
            ));
        }
        let max_shards = read(H_MAX_SHARDS);
        if !(1..=max_shards_limit).contains(&max_shards) {
            return Err(format!("board max_shards {max_shards} is out of range"));
        }
        let max_leases = read(H_MAX_LEASES);
        if !(1..=max_leases_limit).contains(&max_leases) {
            return Err(format!("board max_leases {max_leases} is out of range"));
        }
        let layout = Layout {
            max_shards: max_shards as u32,
            max_leases: max_leases as u32,
        };
        if seg.size() < layout.size_bytes() {
            return Err(format!(
                "board is {} bytes, its header needs {}",
                seg.size(),
                layout.size_bytes()
            ));
        }
        let header_data = read(H_DATA_SIZE);
        if header_data != data_size {
            return Err(format!(
                "board data_size {header_data} differs from the data segment's real size {data_size}"
            ));
        }
        Ok(Board { seg, layout })
    }

    fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        self.seg.atomic_u64(i)
    }

    /// The board segment's name.
    pub(crate) fn name(&self) -> &str {
        self.seg.name()
    }

    /// Table sizes (validated).
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    // ---- owner side ----

    /// Fills entry `slot` for a new reservation: generation, offset and len
    /// first, then the state, so a reader that sees the new state sees the
    /// new generation. The slot must not be live.
    pub(crate) fn reserve_entry(&self, slot: u32, generation: u64, offset: u64, len: u64) {
        let l = self.layout;
        debug_assert_ne!(
            self.word(l.entry(slot, E_STATE)).load(SeqCst),
            EntryState::Live as u64
        );
        self.word(l.entry(slot, E_GENERATION))
            .store(generation, SeqCst);
        self.word(l.entry(slot, E_OFFSET)).store(offset, SeqCst);
        self.word(l.entry(slot, E_LEN)).store(len, SeqCst);
        self.set_entry_state(slot, EntryState::Reserved);
    }

    /// Sets entry `slot`'s state (`Live` publishes, `Retired` withdraws).
    pub(crate) fn set_entry_state(&self, slot: u32, state: EntryState) {
        self.word(self.layout.entry(slot, E_STATE))
            .store(state as u64, SeqCst);
    }

    /// Byte ranges `[start, end)` of every claimed or held lease. Read after
    /// retiring an entry (see the protocol above).
    pub(crate) fn leased_ranges(&self) -> Vec<(u64, u64)> {
        let l = self.layout;
        (0..l.max_leases)
            .filter(|&i| self.word(l.lease(i, L_STATE)).load(SeqCst) != LEASE_FREE)
            .map(|i| {
                let off = self.word(l.lease(i, L_OFFSET)).load(SeqCst);
                let len = self.word(l.lease(i, L_LEN)).load(SeqCst);
                (off, off.saturating_add(len))
            })
            .collect()
    }

    /// Number of lease slots not free.
    pub(crate) fn leases_held(&self) -> u64 {
        let l = self.layout;
        (0..l.max_leases)
            .filter(|&i| self.word(l.lease(i, L_STATE)).load(SeqCst) != LEASE_FREE)
            .count() as u64
    }

    /// Marks the pool closed (its owner is going away): consumers drop their
    /// cached mappings of it.
    pub(crate) fn close(&self) {
        self.word(H_STATE).store(POOL_CLOSED, SeqCst);
    }

    // ---- consumer side ----

    /// True once the owner closed the pool.
    pub(crate) fn is_closed(&self) -> bool {
        self.word(H_STATE).load(SeqCst) != POOL_OPEN
    }

    /// Claims a lease slot for `req`, searching from `hint`, then re-checks
    /// the shard entry. Returns the lease slot.
    pub(crate) fn lease(&self, req: &LeaseRequest, hint: u32) -> Result<u32, LeaseRefused> {
        let l = self.layout;
        let n = l.max_leases;
        let slot = (0..n)
            .map(|k| ((u64::from(hint) + u64::from(k)) % u64::from(n)) as u32)
            .find(|&i| {
                self.word(l.lease(i, L_STATE))
                    .compare_exchange(LEASE_FREE, LEASE_CLAIMING, SeqCst, SeqCst)
                    .is_ok()
            })
            .ok_or(LeaseRefused::TableFull)?;
        let w = |f: usize, v: u64| self.word(l.lease(slot, f)).store(v, SeqCst);
        w(L_SLOT, u64::from(req.shard_slot));
        w(L_GENERATION, req.generation);
        w(L_OFFSET, req.offset);
        w(L_LEN, req.len);
        w(L_PID, u64::from(req.pid));
        w(L_START_TIME, req.start_time);
        w(L_STATE, LEASE_HELD);
        if self.entry_is_live(req.shard_slot, req.generation, req.offset, req.len) {
            Ok(slot)
        } else {
            self.release(slot);
            Err(LeaseRefused::Removed)
        }
    }

    /// True when entry `slot` is live with exactly this generation and range.
    /// `slot` must be below `max_shards` (checked by the caller).
    pub(crate) fn entry_is_live(&self, slot: u32, generation: u64, offset: u64, len: u64) -> bool {
        let l = self.layout;
        // State first: see the ordering note on `reserve_entry`.
        self.word(l.entry(slot, E_STATE)).load(SeqCst) == EntryState::Live as u64
            && self.word(l.entry(slot, E_GENERATION)).load(SeqCst) == generation
            && self.word(l.entry(slot, E_OFFSET)).load(SeqCst) == offset
            && self.word(l.entry(slot, E_LEN)).load(SeqCst) == len
    }

    /// Frees lease slot `slot` (after the last read of the leased bytes).
    pub(crate) fn release(&self, slot: u32) {
        self.word(self.layout.lease(slot, L_STATE))
            .store(LEASE_FREE, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::Access;

    fn board(tag: &str, layout: Layout) -> (Board, String) {
        let name = format!("/shardport-board{}-{tag}", std::process::id());
        let seg = OwnedSegment::create(&name, layout.size_bytes()).unwrap();
        (Board::init(seg, layout, 4096), name)
    }

    const LAYOUT: Layout = Layout {
        max_shards: 4,
        max_leases: 2,
    };

    fn req(slot: u32, generation: u64) -> LeaseRequest {
        LeaseRequest {
            shard_slot: slot,
            generation,
            offset: 64,
            len: 100,
            pid: 1,
            start_time: 2,
        }
    }

    #[test]
    fn lease_needs_a_live_entry_with_the_same_generation() {
        let (owner, name) = board("a", LAYOUT);
        let consumer = Board::attach(
            OwnedSegment::open(&name, Access::ReadWrite).unwrap(),
            4096,
            1 << 22,
            1 << 20,
        )
        .unwrap();
        owner.reserve_entry(1, 7, 64, 100);
        assert_eq!(consumer.lease(&req(1, 7), 0), Err(LeaseRefused::Removed));
        owner.set_entry_state(1, EntryState::Live);
        assert_eq!(consumer.lease(&req(1, 6), 0), Err(LeaseRefused::Removed));
        let a = consumer.lease(&req(1, 7), 0).unwrap();
        let b = consumer.lease(&req(1, 7), 0).unwrap();
        assert_ne!(a, b);
        assert_eq!(consumer.lease(&req(1, 7), 0), Err(LeaseRefused::TableFull));
        assert_eq!(owner.leases_held(), 2);
        owner.set_entry_state(1, EntryState::Retired);
        assert_eq!(owner.leased_ranges(), vec![(64, 164), (64, 164)]);
        consumer.release(a);
        consumer.release(b);
        assert!(owner.leased_ranges().is_empty());
        assert!(!consumer.is_closed());
        owner.close();
        assert!(consumer.is_closed());
    }

    #[test]
    fn attach_rejects_bad_headers() {
        let (owner, name) = board("b", LAYOUT);
        let open = || OwnedSegment::open(&name, Access::ReadWrite).unwrap();
        assert!(Board::attach(open(), 4095, 1 << 22, 1 << 20)
            .unwrap_err()
            .contains("data_size"));
        assert!(Board::attach(open(), 4096, 3, 1 << 20)
            .unwrap_err()
            .contains("max_shards"));
        owner.word(H_MAGIC).store(1, SeqCst);
        assert!(Board::attach(open(), 4096, 1 << 22, 1 << 20)
            .unwrap_err()
            .contains("magic"));
        owner.word(H_MAGIC).store(MAGIC, SeqCst);
        owner.word(H_MAX_LEASES).store(1000, SeqCst);
        assert!(Board::attach(open(), 4096, 1 << 22, 1 << 20)
            .unwrap_err()
            .contains("needs"));
    }
}
