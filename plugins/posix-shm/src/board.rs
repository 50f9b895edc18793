//! The lease board: a small shared segment through which consumers tell the
//! owner which pool bytes they are reading, and who they are.
//!
//! # Layout (version 4)
//! Every field is one little-endian `u64` word accessed only atomically
//! (`SeqCst`), in every process:
//!
//! ```text
//! header  (8 words)  magic "SPSHMBR" + version byte ('4'), reserved,
//!                    max_shards, max_leases, data_size,
//!                    pool state (1 open, 2 closed), 2 reserved
//! in flight (16 x 8 words) leases in flight, one counter per 64-byte line
//!                    (a consumer uses counter `pid % 16`), the other 7 words
//!                    of each line unused
//! entries (4 words each, max_shards of them)
//!                    state (0 free, 1 reserved, 2 live, 3 retired),
//!                    generation, offset, len
//! leases  (8 words each, max_leases of them): the plugin kit's lease
//!                    records (`shardport_kit::lease::board`):
//!                    claim word: sequence << 2 | state (0 free, 1 claiming, 2 held),
//!                    holder pid | low 32 bits of the claim's sequence << 32,
//!                    holder process start time (clock ticks since boot),
//!                    holder namespaces: PID-namespace inode | time-namespace inode << 32,
//!                    then what the lease is on: shard slot, generation, offset, len
//! ```
//!
//! Version 1 had no sequence and a reserved last word; version 2 had no
//! count of leases in flight; version 3 put the claim's target before the
//! holder in a lease slot and spelled the magic "SPSHMBRD" with the version
//! in word 1 (so its "version byte" reads `D`). A consumer refuses a board
//! of another version ([`AttachError::Version`]); an owner's board carries
//! its version, so a consumer of another version refuses it too: owner and
//! consumer must run the same layout.
//!
//! # Protocol
//! The kit's lease protocol (see `shardport_kit::lease::board`, where its
//! proof is written), with a byte range as what a lease is on. A consumer
//! **leases** a shard by claiming a free lease slot for it (its identity,
//! then the shard slot, generation, offset and len, published `held`), and
//! only then re-reads the shard's entry: it must still be live with the
//! same generation, offset and length, or the consumer frees the slot and
//! reports the shard as removed. The owner **retires** a shard by setting
//! its entry to retired first and only then scanning the lease slots for
//! one overlapping the shard's bytes; without one it frees the bytes at
//! once, with one it keeps them occupied and re-scans on later calls.
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
//! Only the owner reclaims, under its books lock: [`Board::scan_leases`]
//! gives every taken slot with its holder where the scan proved the
//! identity complete and stable, and [`Board::reclaim`] frees the slot of a
//! holder proved dead (see `liveness`) by one CAS of exactly the claim word
//! the scan saw. The kit's `lease::board` has the argument why this never
//! takes a live holder's lease, and why a consumer that died before
//! tagging its pid keeps its slot taken, with a zero range. Reclaiming a
//! live holder's lease would let the owner overwrite bytes it reads, which
//! is why death must be proved, never guessed. A reclaimed lease is taken
//! off the count of leases in flight by the owner, from the counter of the
//! holder's recorded pid; the holder's late release then changes nothing
//! (its CAS fails), so nothing is counted off twice.
//!
//! # Failure modes
//! Consumers map the board read-write; a hostile one can claim slots or write
//! nonsense ranges. The owner keeps its own books in process memory and only
//! reads lease ranges from the board (with saturating arithmetic), so the
//! worst a bad consumer can do is keep pool space occupied, or write another
//! process's identity into its slot (which then counts as that process's).

use std::{fmt, sync::atomic::Ordering::SeqCst};

use shardport_kit::lease::board::{header, Claim, LeaseRecords, Refused, Scanned};
pub(crate) use shardport_kit::lease::liveness::Holder;

use crate::sys::OwnedSegment;

/// The magic's first seven bytes; the eighth is the layout version.
const MAGIC_STEM: &[u8; 7] = b"SPSHMBR";
/// Bumped on any change to the layout above. 2: claim sequence and holder
/// namespaces in lease slots; 3: the count of leases in flight; 4: the
/// kit's lease records, the version in the magic.
pub(crate) const LAYOUT_VERSION: u8 = b'4';
/// Word 0 of every board of this version: "SPSHMBR4".
pub(crate) const MAGIC: u64 = header::magic(MAGIC_STEM, LAYOUT_VERSION);

/// Leases-in-flight counters, each alone on a 64-byte line.
const IN_FLIGHT_COUNTERS: usize = 16;
const WORDS_PER_LINE: usize = 8;
/// The first in-flight counter's word, after the 8 fixed header words.
const H_IN_FLIGHT: usize = 8;
const HEADER_WORDS: usize = H_IN_FLIGHT + IN_FLIGHT_COUNTERS * WORDS_PER_LINE;
const ENTRY_WORDS: usize = 4;

/// What a lease slot's payload holds: shard slot, generation, offset, len.
const LEASE_PAYLOAD: usize = 4;
type Leases<'a> = LeaseRecords<'a, LEASE_PAYLOAD>;
const LEASE_WORDS: usize = Leases::RECORD_WORDS;

const H_MAGIC: usize = 0;
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

    /// `(first word, words)` of the lease records.
    fn leases(&self) -> (usize, usize) {
        (
            HEADER_WORDS + ENTRY_WORDS * self.max_shards as usize,
            Leases::words_for(self.max_leases),
        )
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

/// A lease slot this consumer claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseSlot {
    pub index: u32,
    claim: Claim,
    /// The holder pid the lease was counted under (its in-flight counter).
    pid: u32,
}

/// One taken lease slot as the owner's scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScannedLease {
    pub index: u32,
    /// `[start, end)` of the leased bytes (saturating).
    pub range: (u64, u64),
    /// `None` while the identity is incomplete or changed during the scan.
    pub holder: Option<Holder>,
    scanned: Scanned<LEASE_PAYLOAD>,
}

/// Why a consumer cannot use a board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttachError {
    /// The owner writes another layout version (the magic's last byte).
    Version { found: u8 },
    /// The header is malformed or disagrees with the real sizes.
    Invalid(String),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Version { found } => write!(
                f,
                "{}",
                header::HeaderError::Version {
                    found: *found,
                    expected: LAYOUT_VERSION
                }
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
        match header::check(read(H_MAGIC), MAGIC_STEM, LAYOUT_VERSION) {
            Ok(()) => {}
            Err(header::HeaderError::Magic) => {
                return invalid("board magic is wrong (not a posix-shm lease board)".into())
            }
            Err(header::HeaderError::Version { found, .. }) => {
                return Err(AttachError::Version { found })
            }
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

    /// The lease slots, as the kit's `LeaseRecords`.
    fn leases(&self) -> Leases<'_> {
        let (start, len) = self.layout.leases();
        Leases::new(self.seg.atomic_words(start, len))
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
        self.leases()
            .scan()
            .into_iter()
            .map(|scanned| {
                let [_slot, _generation, offset, len] = scanned.payload;
                ScannedLease {
                    index: scanned.index,
                    range: (offset, offset.saturating_add(len)),
                    holder: scanned.holder,
                    scanned,
                }
            })
            .collect()
    }

    /// Byte ranges `[start, end)` of every claimed or held lease. Read after
    /// retiring an entry (see the protocol above).
    #[cfg(test)]
    pub(crate) fn leased_ranges(&self) -> Vec<(u64, u64)> {
        self.scan_leases().iter().map(|l| l.range).collect()
    }

    /// Number of lease slots not free.
    pub(crate) fn leases_held(&self) -> u64 {
        u64::from(self.leases().taken())
    }

    /// Frees the slot `lease` describes, whose holder is proved dead, by one
    /// CAS of exactly the claim word the scan saw. `false` when the scan saw
    /// no stable holder or the slot changed since (which only its holder,
    /// so a live one, could have done).
    pub(crate) fn reclaim(&self, lease: &ScannedLease) -> bool {
        let freed = self.leases().reclaim(&lease.scanned);
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
        // Counted before any slot is claimed (see "Leases in flight").
        let counter = self.word(in_flight_word(req.holder.pid));
        counter.fetch_add(1, SeqCst);
        let payload = [
            u64::from(req.shard_slot),
            req.generation,
            req.offset,
            req.len,
        ];
        let claimed = self
            .leases()
            .claim_observed(&req.holder, payload, hint, || {
                #[cfg(test)]
                tests::BEFORE_HELD.with(|hook| {
                    if let Some(f) = hook.borrow_mut().as_mut() {
                        f();
                    }
                });
            });
        let claim = match claimed {
            Ok(claim) => claim,
            Err(Refused::Full) => {
                counter.fetch_sub(1, SeqCst);
                return Err(LeaseRefused::TableFull);
            }
            // The owner that reclaimed the claiming slot took this lease off
            // the in-flight count: counting it off here too would count it
            // twice.
            Err(Refused::Reclaimed) => return Err(LeaseRefused::Reclaimed),
        };
        let slot = LeaseSlot {
            index: claim.index,
            claim,
            pid: req.holder.pid,
        };
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
        let freed = self.leases().release(slot.claim);
        if freed {
            // Uncounted only after the slot is free; a reclaimed slot was
            // uncounted by the owner.
            self.word(in_flight_word(slot.pid)).fetch_sub(1, SeqCst);
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardport_kit::lease::liveness::Namespaces;

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

    /// The kit's race test, with what posix-shm counts around a lease: the
    /// owner reclaims the claiming slot (as if it had judged the consumer
    /// dead) in the middle of the consumer's lease, through its own mapping.
    #[test]
    fn a_lease_reclaimed_while_it_is_being_taken_is_counted_off_once() {
        let (owner, consumer, name) = live_entry("r");
        let racer = attach(&name);
        let reclaimed = std::rc::Rc::new(std::cell::Cell::new(0));
        let count = std::rc::Rc::clone(&reclaimed);
        BEFORE_HELD.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                assert!(!racer.no_leases_in_flight(), "counted before the claim");
                for lease in racer.scan_leases() {
                    assert_eq!(lease.holder, Some(HOLDER), "the identity is complete");
                    assert_eq!(lease.range, (64, 164), "so is the range");
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
    fn scans_see_ranges_and_holders_across_mappings() {
        let (owner, consumer, _name) = live_entry("c");
        let a = consumer.lease(&req(0, 1), 0).unwrap();
        let scan = owner.scan_leases();
        assert_eq!(scan.len(), 1);
        assert_eq!(scan[0].index, a.index);
        assert_eq!(scan[0].range, (64, 164));
        assert_eq!(scan[0].holder, Some(HOLDER));
        // A reclaimed lease frees its range; its holder's release then
        // changes nothing.
        assert!(owner.reclaim(&scan[0]));
        assert!(owner.leased_ranges().is_empty());
        assert!(!consumer.release(a));
        // A range that would overflow is read saturating.
        let huge = LeaseRequest {
            offset: u64::MAX - 1,
            len: 100,
            ..req(0, 1)
        };
        assert_eq!(consumer.lease(&huge, 0), Err(LeaseRefused::Removed));
        owner.reserve_entry(1, 2, u64::MAX - 1, 100);
        owner.set_entry_state(1, EntryState::Live);
        let h = consumer
            .lease(
                &LeaseRequest {
                    shard_slot: 1,
                    generation: 2,
                    ..huge
                },
                0,
            )
            .unwrap();
        assert_eq!(owner.leased_ranges(), vec![(u64::MAX - 1, u64::MAX)]);
        assert!(consumer.release(h));
    }

    #[test]
    fn attach_rejects_other_layout_versions() {
        let (owner, name) = board("d", LAYOUT);
        for (found, shown) in [(b'3', "3"), (b'5', "5"), (b'D', "D")] {
            owner
                .word(H_MAGIC)
                .store(header::magic(MAGIC_STEM, found), SeqCst);
            let e = Board::attach(OwnedSegment::open(&name).unwrap(), 4096, 1 << 22, 1 << 20)
                .unwrap_err();
            assert_eq!(e, AttachError::Version { found });
            assert_eq!(
                e.to_string(),
                format!("board layout version is {shown}, this plugin uses version 4")
            );
        }
        // A board of version 3 or older spelled the whole magic "SPSHMBRD".
        assert_eq!(
            header::magic(MAGIC_STEM, b'D'),
            u64::from_le_bytes(*b"SPSHMBRD")
        );
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
