//! The lease board: a small shared segment through which consumers tell the
//! owner which pool bytes they are reading, and who they are.
//!
//! # Layout (version 3)
//! Every field is one little-endian `u64` word accessed only atomically
//! (`SeqCst`), in every process:
//!
//! ```text
//! header  (8 words)  magic, layout version, max_shards, max_leases, data_size,
//!                    pool state (1 open, 2 closed), 2 reserved
//! in flight (16 x 8 words) leases in flight, one counter per 64-byte line
//!                    (a consumer uses counter `pid % 16`), the other 7 words
//!                    of each line unused
//! entries (4 words each, max_shards of them)
//!                    state (0 free, 1 reserved, 2 live, 3 retired),
//!                    generation, offset, len
//! leases  (8 words each, max_leases of them)
//!                    claim word: sequence << 2 | state (0 free, 1 claiming, 2 held),
//!                    shard slot, generation, offset, len,
//!                    holder pid | low 32 bits of the claim's sequence << 32,
//!                    holder process start time (clock ticks since boot),
//!                    holder namespaces: PID-namespace inode | time-namespace inode << 32
//! ```
//!
//! Version 1 had no sequence and a reserved last word; version 2 had no
//! count of leases in flight. A consumer refuses a
//! board of another version ([`AttachError::Version`]); an owner's board
//! carries its version, so a consumer of another version refuses it too:
//! owner and consumer must run the same layout.
//!
//! # Protocol
//! A consumer **leases** a shard by claiming a free lease slot (CAS
//! `free(s - 1)` -> `claiming(s)`), zeroing its range, writing who it is
//! (start time, namespaces, then pid tagged with `s`), then what it is about
//! to read (shard slot, generation, offset, len), marking the slot `held(s)`,
//! and only then re-reading the shard's entry: it must still be live with the
//! same generation, offset and length, or the consumer frees the slot and
//! reports the shard as removed. It frees the slot with one CAS, `held(s)` ->
//! `free(s)`. The owner **retires** a shard by setting its entry to retired
//! first and only then scanning the lease slots for one overlapping the
//! shard's bytes; without one it frees the bytes at once, with one it keeps
//! them occupied and re-scans on later calls.
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
//! **Leases in flight** (16 counters) let the owner skip the scan, which
//! reads every lease slot (`max-leases` x 64 bytes: ~2 us at the default
//! 4096) and would otherwise be paid by every put that follows a remove. A
//! consumer adds one to its counter (`pid % 16`, so consumers in other
//! processes rarely share a cache line) *before* it claims a slot and takes
//! one off *after* it freed the slot (or the owner takes it off, from the
//! counter of the holder's recorded pid, when it reclaims a dead holder's
//! slot). The owner reads all 16 after retiring: all zero means no consumer
//! is between its increment and its decrement, and a consumer that
//! increments later re-checks the entry later still, so it sees the retire:
//! no lease is missed, same argument as above. A consumer that dies between its increment and tagging its pid
//! leaves the count above zero for good: the owner then scans, as before
//! (correct, only slower). The count only lets the owner skip work, never
//! free bytes a scan would keep, except where a hostile consumer writes it,
//! which is no more than it can do to the claim words already.
//!
//! # Reclaiming the leases of dead consumers
//! Only the owner reclaims, under its books lock. [`Board::scan_leases`]
//! reads a taken slot's claim word, its other words, then the claim word
//! again. Each claim word value occurs once (the sequence only grows), and a
//! later claimer writes only after its own CAS changed the word, so the same
//! value twice means every word read belongs to that claim or to an earlier
//! one; a pid word tagged with that claim's sequence was written by it, and
//! so were the start time and namespaces, written before it. Such a holder,
//! if provably dead (see `liveness`), loses the slot: [`Board::reclaim`]
//! CASes exactly that claim word to `free`. A dead holder never writes again
//! and only the holder otherwise moves a taken slot, so the CAS cannot race
//! with anything but a holder wrongly judged dead, and then exactly one of
//! them wins: a release never touches a slot it no longer holds. A consumer
//! that died before tagging its pid (a window of a few instructions) keeps
//! its slot taken, with a zero range. Reclaiming a live holder's lease would
//! let the owner overwrite bytes it reads, which is why death must be
//! proved, never guessed.
//!
//! # Failure modes
//! Consumers map the board read-write; a hostile one can claim slots or write
//! nonsense ranges. The owner keeps its own books in process memory and only
//! reads lease ranges from the board (with saturating arithmetic), so the
//! worst a bad consumer can do is keep pool space occupied, or write another
//! process's identity into its slot (which then counts as that process's).

use std::{fmt, sync::atomic::Ordering::SeqCst};

use crate::{
    liveness::{Namespaces, ProcessRecord},
    sys::OwnedSegment,
};

/// `"SPSHMBRD"`: identifies a lease board.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SPSHMBRD");
/// Bumped on any change to the layout above. 2: claim sequence and holder
/// namespaces in lease slots; 3: the count of leases in flight.
pub(crate) const LAYOUT_VERSION: u64 = 3;

/// Leases-in-flight counters, each alone on a 64-byte line.
const IN_FLIGHT_COUNTERS: usize = 16;
const WORDS_PER_LINE: usize = 8;
/// The first in-flight counter's word, after the 8 fixed header words.
const H_IN_FLIGHT: usize = 8;
const HEADER_WORDS: usize = H_IN_FLIGHT + IN_FLIGHT_COUNTERS * WORDS_PER_LINE;
const ENTRY_WORDS: usize = 4;
const LEASE_WORDS: usize = 8;

const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_MAX_SHARDS: usize = 2;
const H_MAX_LEASES: usize = 3;
const H_DATA_SIZE: usize = 4;
const H_STATE: usize = 5;

/// The word of the leases-in-flight counter of the consumer with `pid`.
fn in_flight_word(pid: u32) -> usize {
    H_IN_FLIGHT + (pid as usize % IN_FLIGHT_COUNTERS) * WORDS_PER_LINE
}

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
const L_NAMESPACES: usize = 7;

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
const LEASE_STATE_BITS: u32 = 2;
const LEASE_STATE_MASK: u64 = (1 << LEASE_STATE_BITS) - 1;

/// A lease slot's claim word: the claim's sequence and the slot's state.
fn claim_word(seq: u64, state: u64) -> u64 {
    seq << LEASE_STATE_BITS | state
}

fn claim_state(word: u64) -> u64 {
    word & LEASE_STATE_MASK
}

fn claim_seq(word: u64) -> u64 {
    word >> LEASE_STATE_BITS
}

/// The holder pid word: the pid, tagged with the low half of its claim's
/// sequence.
fn pid_word(pid: u32, seq: u64) -> u64 {
    u64::from(pid) | u64::from(seq as u32) << 32
}

/// `(pid, tag)` of a pid word.
fn split_pid_word(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

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

/// Who holds a lease, as recorded in its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Holder {
    pub pid: u32,
    pub start_ticks: u64,
    pub ns: Namespaces,
}

impl Holder {
    /// The holder of a lease on a board of this boot (a board is kernel
    /// memory of the boot it was created in).
    pub(crate) fn record(&self, boot: u128) -> ProcessRecord {
        ProcessRecord {
            pid: self.pid,
            start_ticks: self.start_ticks,
            ns: self.ns,
            boot,
        }
    }
}

/// What a consumer is about to read, recorded in its lease slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseRequest {
    pub shard_slot: u32,
    pub generation: u64,
    pub offset: u64,
    pub len: u64,
    pub holder: Holder,
}

/// A lease slot this consumer claimed: the slot and its claim's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseSlot {
    pub index: u32,
    seq: u64,
    /// The holder pid the lease was counted under (its in-flight counter).
    pid: u32,
}

/// One taken lease slot as the owner's scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScannedLease {
    pub index: u32,
    /// The claim word read before and after the other words.
    word: u64,
    /// `[start, end)` of the leased bytes (saturating).
    pub range: (u64, u64),
    /// `None` while the identity is incomplete or changed during the scan.
    pub holder: Option<Holder>,
}

/// Why a consumer cannot use a board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttachError {
    /// The owner writes another layout version.
    Version { found: u64 },
    /// The header is malformed or disagrees with the real sizes.
    Invalid(String),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Version { found } => write!(
                f,
                "board layout version is {found}, this plugin uses version {LAYOUT_VERSION}"
            ),
            AttachError::Invalid(why) => f.write_str(why),
        }
    }
}

/// Why a lease was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRefused {
    /// Every lease slot is taken.
    TableFull,
    /// The shard entry is no longer live with that generation/offset/len.
    Removed,
    /// The owner reclaimed the slot while it was being claimed: it judged
    /// this process dead (an identity recorded wrongly).
    Reclaimed,
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
    ) -> Result<Board, AttachError> {
        let invalid = |why: String| Err(AttachError::Invalid(why));
        let header_bytes = 8 * HEADER_WORDS as u64;
        if seg.size() < header_bytes {
            return invalid(format!(
                "board is {} bytes, smaller than its {header_bytes}-byte header",
                seg.size()
            ));
        }
        let read = |i: usize| seg.atomic_u64(i).load(SeqCst);
        if read(H_MAGIC) != MAGIC {
            return invalid("board magic is wrong (not a posix-shm lease board)".into());
        }
        let version = read(H_VERSION);
        if version != LAYOUT_VERSION {
            return Err(AttachError::Version { found: version });
        }
        let max_shards = read(H_MAX_SHARDS);
        if !(1..=max_shards_limit).contains(&max_shards) {
            return invalid(format!("board max_shards {max_shards} is out of range"));
        }
        let max_leases = read(H_MAX_LEASES);
        if !(1..=max_leases_limit).contains(&max_leases) {
            return invalid(format!("board max_leases {max_leases} is out of range"));
        }
        let layout = Layout {
            max_shards: max_shards as u32,
            max_leases: max_leases as u32,
        };
        if seg.size() < layout.size_bytes() {
            return invalid(format!(
                "board is {} bytes, its header needs {}",
                seg.size(),
                layout.size_bytes()
            ));
        }
        let header_data = read(H_DATA_SIZE);
        if header_data != data_size {
            return invalid(format!(
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

    /// Every taken lease slot: its range and, where complete and stable
    /// during the read, its holder (see "Reclaiming" above).
    pub(crate) fn scan_leases(&self) -> Vec<ScannedLease> {
        let l = self.layout;
        let mut out = Vec::new();
        for i in 0..l.max_leases {
            let word = self.word(l.lease(i, L_STATE)).load(SeqCst);
            if claim_state(word) == LEASE_FREE {
                continue;
            }
            let r = |f: usize| self.word(l.lease(i, f)).load(SeqCst);
            let offset = r(L_OFFSET);
            let len = r(L_LEN);
            let (pid, tag) = split_pid_word(r(L_PID));
            let start_ticks = r(L_START_TIME);
            let ns = Namespaces::from_word(r(L_NAMESPACES));
            let stable = r(L_STATE) == word;
            let holder = (stable && pid != 0 && tag == claim_seq(word) as u32).then_some(Holder {
                pid,
                start_ticks,
                ns,
            });
            out.push(ScannedLease {
                index: i,
                word,
                range: (offset, offset.saturating_add(len)),
                holder,
            });
        }
        out
    }

    /// Byte ranges `[start, end)` of every claimed or held lease. Read after
    /// retiring an entry (see the protocol above).
    #[cfg(test)]
    pub(crate) fn leased_ranges(&self) -> Vec<(u64, u64)> {
        self.scan_leases().iter().map(|l| l.range).collect()
    }

    /// Number of lease slots not free.
    pub(crate) fn leases_held(&self) -> u64 {
        let l = self.layout;
        (0..l.max_leases)
            .filter(|&i| claim_state(self.word(l.lease(i, L_STATE)).load(SeqCst)) != LEASE_FREE)
            .count() as u64
    }

    /// Frees the slot `lease` describes, whose holder is proved dead, by one
    /// CAS of exactly the claim word the scan saw. `false` when the scan saw
    /// no stable holder or the slot changed since (which only its holder,
    /// so a live one, could have done).
    pub(crate) fn reclaim(&self, lease: &ScannedLease) -> bool {
        let freed = lease.holder.is_some()
            && self.move_claim(
                lease.index,
                claim_seq(lease.word),
                claim_state(lease.word),
                LEASE_FREE,
            );
        if let (true, Some(h)) = (freed, lease.holder) {
            // The dead holder's decrement, which it will never make.
            self.word(in_flight_word(h.pid)).fetch_sub(1, SeqCst);
        }
        freed
    }

    /// True when no consumer is leasing: read after retiring, zero proves
    /// that no lease slot needs scanning (see "Leases in flight" above).
    pub(crate) fn no_leases_in_flight(&self) -> bool {
        (0..IN_FLIGHT_COUNTERS as u32).all(|k| self.word(in_flight_word(k)).load(SeqCst) == 0)
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
    pub(crate) fn lease(&self, req: &LeaseRequest, hint: u32) -> Result<LeaseSlot, LeaseRefused> {
        let l = self.layout;
        let n = l.max_leases;
        // Counted before any slot is claimed (see "Leases in flight").
        let counter = self.word(in_flight_word(req.holder.pid));
        counter.fetch_add(1, SeqCst);
        let Some(slot) = (0..n)
            .map(|k| ((u64::from(hint) + u64::from(k)) % u64::from(n)) as u32)
            .find_map(|i| {
                let w = self.word(l.lease(i, L_STATE));
                let free = w.load(SeqCst);
                if claim_state(free) != LEASE_FREE {
                    return None;
                }
                let seq = claim_seq(free).wrapping_add(1) & (u64::MAX >> LEASE_STATE_BITS);
                w.compare_exchange(free, claim_word(seq, LEASE_CLAIMING), SeqCst, SeqCst)
                    .ok()
                    .map(|_| LeaseSlot {
                        index: i,
                        seq,
                        pid: req.holder.pid,
                    })
            })
        else {
            counter.fetch_sub(1, SeqCst);
            return Err(LeaseRefused::TableFull);
        };
        let w = |f: usize, v: u64| self.word(l.lease(slot.index, f)).store(v, SeqCst);
        // No stale range from an earlier claim while this one is claiming.
        w(L_OFFSET, 0);
        w(L_LEN, 0);
        // Identity, the pid word last: tagged with this claim, it says the
        // identity is complete (see "Reclaiming").
        w(L_START_TIME, req.holder.start_ticks);
        w(L_NAMESPACES, req.holder.ns.to_word());
        w(L_PID, pid_word(req.holder.pid, slot.seq));
        w(L_SLOT, u64::from(req.shard_slot));
        w(L_GENERATION, req.generation);
        w(L_OFFSET, req.offset);
        w(L_LEN, req.len);
        #[cfg(test)]
        tests::BEFORE_HELD.with(|hook| {
            if let Some(f) = hook.borrow_mut().as_mut() {
                f();
            }
        });
        // A CAS, not a store: the owner may have reclaimed the claiming
        // slot (and taken this lease off the in-flight count) meanwhile;
        // a store would revive it and the release would count it off twice.
        if !self.move_claim(slot.index, slot.seq, LEASE_CLAIMING, LEASE_HELD) {
            return Err(LeaseRefused::Reclaimed);
        }
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

    /// Frees lease slot `slot` (after the last read of the leased bytes):
    /// one CAS `held` -> `free` of this claim. Returns `false`, having changed
    /// nothing, when the owner had reclaimed the slot (it judged this process
    /// dead: an identity recorded wrongly, e.g. by a forked child).
    pub(crate) fn release(&self, slot: LeaseSlot) -> bool {
        let freed = self.move_claim(slot.index, slot.seq, LEASE_HELD, LEASE_FREE);
        if freed {
            // Uncounted only after the slot is free; a reclaimed slot was
            // uncounted by the owner.
            self.word(in_flight_word(slot.pid)).fetch_sub(1, SeqCst);
        }
        freed
    }

    /// Moves lease slot `index` from state `from` to `to` of claim `seq`, by
    /// one CAS of exactly that claim word: `false`, having changed nothing,
    /// when the slot holds anything else (another claim, another state).
    fn move_claim(&self, index: u32, seq: u64, from: u64, to: u64) -> bool {
        self.word(self.layout.lease(index, L_STATE))
            .compare_exchange(claim_word(seq, from), claim_word(seq, to), SeqCst, SeqCst)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(tag: &str, layout: Layout) -> (Board, String) {
        let name = format!("/shardport-board{}-{tag}", std::process::id());
        let seg = OwnedSegment::create(&name, layout.size_bytes()).unwrap();
        (Board::init(seg, layout, 4096), name)
    }

    const LAYOUT: Layout = Layout {
        max_shards: 4,
        max_leases: 2,
    };

    const HOLDER: Holder = Holder {
        pid: 1,
        start_ticks: 2,
        ns: Namespaces { pid: 3, time: 4 },
    };

    fn req(slot: u32, generation: u64) -> LeaseRequest {
        LeaseRequest {
            shard_slot: slot,
            generation,
            offset: 64,
            len: 100,
            holder: HOLDER,
        }
    }

    /// An owner's board with entry 0 live (generation 1, bytes 64..164),
    /// a consumer's mapping of it, and its name.
    fn live_entry(tag: &str) -> (Board, Board, String) {
        let (owner, name) = board(tag, LAYOUT);
        let consumer = attach(&name);
        owner.reserve_entry(0, 1, 64, 100);
        owner.set_entry_state(0, EntryState::Live);
        (owner, consumer, name)
    }

    fn attach(name: &str) -> Board {
        Board::attach(OwnedSegment::open(name).unwrap(), 4096, 1 << 22, 1 << 20).unwrap()
    }

    #[test]
    fn lease_needs_a_live_entry_with_the_same_generation() {
        let (owner, name) = board("a", LAYOUT);
        let consumer = attach(&name);
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
        assert!(consumer.release(a));
        assert!(consumer.release(b));
        assert!(!consumer.release(b), "a second release changes nothing");
        assert!(owner.leased_ranges().is_empty());
        assert!(!consumer.is_closed());
        owner.close();
        assert!(consumer.is_closed());
    }

    #[test]
    fn the_count_of_leases_in_flight_follows_every_way_a_lease_ends() {
        let (owner, name) = board("n", LAYOUT);
        let consumer = attach(&name);
        assert!(owner.no_leases_in_flight(), "a new board");
        // Refused leases leave nothing counted.
        owner.reserve_entry(0, 1, 64, 100);
        assert_eq!(consumer.lease(&req(0, 1), 0), Err(LeaseRefused::Removed));
        assert!(owner.no_leases_in_flight());
        owner.set_entry_state(0, EntryState::Live);
        let a = consumer.lease(&req(0, 1), 0).unwrap();
        assert!(!owner.no_leases_in_flight(), "a held lease counts");
        let b = consumer.lease(&req(0, 1), 0).unwrap();
        assert_eq!(consumer.lease(&req(0, 1), 0), Err(LeaseRefused::TableFull));
        assert!(consumer.release(a));
        assert!(!owner.no_leases_in_flight(), "one lease still held");
        // The owner reclaims b as if its holder were dead; the holder's
        // late release then changes nothing, and the count is back to 0.
        let scan = owner.scan_leases();
        assert_eq!(scan.len(), 1);
        assert!(owner.reclaim(&scan[0]));
        assert!(owner.no_leases_in_flight());
        assert!(!consumer.release(b));
        assert!(owner.no_leases_in_flight(), "no double decrement");
    }

    thread_local! {
        /// Runs inside `lease` once the claim's identity is written and
        /// before the claim becomes held: the window in which an owner
        /// that judged the consumer dead can reclaim the slot.
        pub(super) static BEFORE_HELD: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
            const { std::cell::RefCell::new(None) };
    }

    #[test]
    fn a_claim_reclaimed_while_it_is_being_taken_is_refused_not_revived() {
        let (owner, consumer, name) = live_entry("r");
        // The owner (its own mapping) reclaims the claiming slot, as if it
        // had judged the consumer dead, in the middle of the consumer's lease.
        let racer = attach(&name);
        let reclaimed = std::rc::Rc::new(std::cell::Cell::new(0));
        let count = std::rc::Rc::clone(&reclaimed);
        BEFORE_HELD.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                for lease in racer.scan_leases() {
                    assert_eq!(lease.holder, Some(HOLDER), "the identity is complete");
                    if racer.reclaim(&lease) {
                        count.set(count.get() + 1);
                    }
                }
            }));
        });
        let refused = consumer.lease(&req(0, 1), 0);
        BEFORE_HELD.with(|h| h.borrow_mut().take());
        assert_eq!(reclaimed.get(), 1);
        assert_eq!(refused, Err(LeaseRefused::Reclaimed));
        // Nothing revived, nothing counted twice: the slot is free and the
        // count of leases in flight is exactly zero (one decrement, the
        // owner's), so the owner may skip its lease scans again.
        assert_eq!(owner.leases_held(), 0);
        assert!(owner.no_leases_in_flight());
        // The table works as before.
        let a = consumer.lease(&req(0, 1), 0).unwrap();
        assert!(!owner.no_leases_in_flight());
        assert!(consumer.release(a));
        assert!(owner.no_leases_in_flight());
    }

    #[test]
    fn scans_see_whole_holders_and_reclaim_only_that_claim() {
        let (owner, consumer, _name) = live_entry("c");
        let a = consumer.lease(&req(0, 1), 0).unwrap();
        let scan = owner.scan_leases();
        assert_eq!(scan.len(), 1);
        assert_eq!(scan[0].index, a.index);
        assert_eq!(scan[0].range, (64, 164));
        assert_eq!(scan[0].holder, Some(HOLDER));
        assert_eq!(
            HOLDER.record(9),
            ProcessRecord {
                pid: 1,
                start_ticks: 2,
                ns: Namespaces { pid: 3, time: 4 },
                boot: 9
            }
        );

        // The holder released and the slot was claimed again: the old scan
        // no longer describes it, so reclaiming it changes nothing.
        assert!(consumer.release(a));
        let again = consumer.lease(&req(0, 1), a.index).unwrap();
        assert_eq!(again.index, a.index);
        assert!(!owner.reclaim(&scan[0]));
        assert_eq!(owner.leases_held(), 1);

        // Reclaiming the current claim frees the slot; its holder's release
        // then fails without touching the slot, even once it is claimed anew.
        let now = owner.scan_leases();
        assert!(owner.reclaim(&now[0]));
        assert_eq!(owner.leases_held(), 0);
        assert!(owner.leased_ranges().is_empty());
        let next = consumer.lease(&req(0, 1), a.index).unwrap();
        assert!(!consumer.release(again));
        assert_eq!(owner.leases_held(), 1);
        assert!(consumer.release(next));

        // A claim whose pid is not tagged with its sequence (a consumer that
        // died before writing it) has no holder and is never reclaimed.
        let l = owner.layout;
        let w = owner.word(l.lease(1, L_STATE));
        w.store(
            claim_word(claim_seq(w.load(SeqCst)) + 1, LEASE_CLAIMING),
            SeqCst,
        );
        owner
            .word(l.lease(1, L_PID))
            .store(pid_word(77, 12345), SeqCst);
        let stuck = owner.scan_leases();
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].holder, None);
        assert!(!owner.reclaim(&stuck[0]));
        w.store(claim_word(0, LEASE_FREE), SeqCst);
    }

    #[test]
    fn attach_rejects_other_layout_versions() {
        let (owner, name) = board("d", LAYOUT);
        for found in [2, 4] {
            owner.word(H_VERSION).store(found, SeqCst);
            let e = Board::attach(OwnedSegment::open(&name).unwrap(), 4096, 1 << 22, 1 << 20)
                .unwrap_err();
            assert_eq!(e, AttachError::Version { found });
            assert_eq!(
                e.to_string(),
                format!("board layout version is {found}, this plugin uses version 3")
            );
        }
    }

    #[test]
    fn attach_rejects_bad_headers() {
        let (owner, name) = board("b", LAYOUT);
        let open = || OwnedSegment::open(&name).unwrap();
        let err = |r: Result<Board, AttachError>| r.unwrap_err().to_string();
        assert!(err(Board::attach(open(), 4095, 1 << 22, 1 << 20)).contains("data_size"));
        assert!(err(Board::attach(open(), 4096, 3, 1 << 20)).contains("max_shards"));
        owner.word(H_MAGIC).store(1, SeqCst);
        assert!(err(Board::attach(open(), 4096, 1 << 22, 1 << 20)).contains("magic"));
        owner.word(H_MAGIC).store(MAGIC, SeqCst);
        owner.word(H_MAX_LEASES).store(1000, SeqCst);
        assert!(err(Board::attach(open(), 4096, 1 << 22, 1 << 20)).contains("needs"));
    }
}
