//! The lease board: how an owner knows that consumers still map a shard's
//! device memory, and who they are, so it never frees memory a live consumer
//! still reads and can take back the leases of consumers that died.
//!
//! # Layout (version 3)
//! A POSIX shared-memory segment per owner transport instance
//! (`/shardport-cuda-<node tag>`, mode 0600, created exclusively, unlinked
//! by its owner), an array of little-endian `u64` words every process
//! accesses only atomically (`SeqCst`):
//!
//! ```text
//! header   (4 words)   magic "SPCUBRD" + version byte ('3'), slot count,
//!                      record count, the owner's namespaces (PID-namespace
//!                      inode | time << 32; 0 on boards of older owners:
//!                      the dead-board sweep then leaves the board alone)
//! slots    (1 word each, one per exported shard)
//!                      generation (bits 63..24, 40 bits, never 0 once
//!                      published) | state (bits 1..0: 0 free, 1 live,
//!                      2 retired)
//! records  (5 words each, one per lease): the plugin kit's lease records
//!                      (`shardport_kit::lease::board`):
//!                      claim word: sequence << 2 | state (0 free,
//!                        1 claiming, 2 held)
//!                      holder pid | low 32 bits of the claim's sequence << 32
//!                      holder start time (clock ticks since boot)
//!                      holder namespaces: PID-namespace inode | time << 32
//!                      target: slot generation << 24 | slot (0: none yet)
//! ```
//!
//! Version 1 (magic "SPCUBRD1") counted leases in the slot word and recorded
//! no holder; version 2 put the target before the holder. The version is the
//! magic's last byte (the kit's `lease::board::header`); a consumer refuses
//! a board of another version naming both ([`AttachError::Version`]), so an
//! owner and its consumers must run the same layout.
//!
//! # Protocol (every change is one compare-and-swap or store on one word)
//! - owner **publish**: a free slot word becomes live with generation + 1;
//!   the descriptor carries the slot and the new generation.
//! - consumer **lease**: claims a free record with the kit's claim protocol
//!   (its identity, then its target: slot and generation; published
//!   `held`), and only then re-reads the slot word: it must still be live
//!   with that generation, or the consumer frees the record and reports the
//!   shard unexported (`NOT_FOUND`).
//! - consumer **release**: one CAS `held(s)` -> `free(s)`; it fails, having
//!   changed nothing, when the owner reclaimed the record.
//! - owner **retire** (unexport): the slot word becomes retired, and only
//!   then are the records scanned for one naming the slot and generation
//!   (claiming or held). Without one the memory is freed and the slot word
//!   made free; with one the owner keeps the memory and scans again on
//!   later calls (`reap`).
//!
//! Why no lease is missed: both sides write their own word, then read the
//! other's, all `SeqCst`, so in the single total order either the
//! consumer's record writes precede the owner's scan (the owner sees the
//! lease) or the owner's retire precedes the consumer's re-check (the
//! consumer sees the shard gone and never reads it). A scan that reads a
//! record whose target is still zero ignores it: it read the target before
//! the consumer wrote it, so the retire came before the consumer's re-check
//! too. A stale target of an earlier claim (read before the new claim
//! zeroed it) only makes the owner wait longer. Once a retired slot's
//! scan finds no lease, no lease of that generation can appear: "no lease"
//! is final, as with version 1's count.
//!
//! # Reclaiming the leases of dead consumers
//! Only the owner reclaims, under its books lock: [`Board::scan`] gives
//! every taken record with its holder where the scan proved the identity
//! complete and stable, and [`Board::reclaim`] frees the record of a holder
//! proved dead (the kit's `judge_holder`: `ESRCH` or a reused pid, judged
//! only within our PID namespace; a zombie is not proof) by one CAS of
//! exactly the claim word the scan saw. The kit's `lease::board` has the
//! argument why this never takes a live holder's lease. A consumer that
//! died before tagging its pid (a window of a few stores) keeps its record
//! taken, naming no slot (the target is written after the tag): a record
//! without its tag is never reclaimed, and holds no memory. A dead
//! process's device mappings are gone with it (the driver tears its context
//! down at exit), so freeing the memory it leased is safe.
//!
//! # Failure modes
//! Consumers map the board read-write; a hostile one can claim records or
//! write nonsense. The owner keeps its own books in process memory and only
//! counts leases from the board, so the worst a bad consumer can do is keep
//! memory occupied, or write another process's identity into its record
//! (which then counts as that process's).

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::SeqCst},
};

use shardport_kit::lease::{
    board::{header, Claim, LeaseRecords, Refused},
    liveness::{Holder, Namespaces},
};

/// The layout version this plugin writes and accepts.
pub const LAYOUT_VERSION: u8 = b'3';
/// The magic's first seven bytes; the eighth is the layout version.
const MAGIC_STEM: &[u8; 7] = b"SPCUBRD";
/// Word 0 of every board of this version: "SPCUBRD3".
pub const BOARD_MAGIC: u64 = header::magic(MAGIC_STEM, LAYOUT_VERSION);
/// Words before the first slot.
pub const HEADER_WORDS: usize = 4;
/// A record's payload: its target word.
const TARGET_WORDS: usize = 1;
type Records<'a> = LeaseRecords<'a, TARGET_WORDS>;
/// Words of one lease record.
pub const RECORD_WORDS: usize = Records::RECORD_WORDS;

const H_MAGIC: usize = 0;
const H_SLOTS: usize = 1;
const H_RECORDS: usize = 2;
const H_OWNER_NS: usize = 3;

const GEN_SHIFT: u32 = 24;
const GEN_MASK: u64 = (1 << 40) - 1;
const SLOT_STATE_MASK: u64 = 0b11;
const TARGET_SLOT_MASK: u64 = (1 << GEN_SHIFT) - 1;
/// Most slots a board has (the target word's slot field).
pub const MAX_SLOTS: u32 = 1 << 20;
/// Most lease records a board has.
pub const MAX_RECORDS: u32 = 1 << 20;

/// State of a slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Not exported; reusable.
    Free = 0,
    /// Exported: new leases allowed.
    Live = 1,
    /// Unexported: no new leases; freed by its owner once no lease names it.
    Retired = 2,
}

/// A slot word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Generation (40 bits).
    pub generation: u64,
    /// State.
    pub state: SlotState,
}

/// Unpacks a slot word (an unknown state reads as retired: no lease, never
/// reused).
pub fn unpack(w: u64) -> Slot {
    Slot {
        generation: (w >> GEN_SHIFT) & GEN_MASK,
        state: match w & SLOT_STATE_MASK {
            0 => SlotState::Free,
            1 => SlotState::Live,
            _ => SlotState::Retired,
        },
    }
}

/// Packs a slot word.
pub fn pack(s: Slot) -> u64 {
    (s.generation & GEN_MASK) << GEN_SHIFT | s.state as u64
}

/// A record's target word: slot and generation (0 means none: generations
/// are never 0).
pub fn target_word(slot: u32, generation: u64) -> u64 {
    (generation & GEN_MASK) << GEN_SHIFT | u64::from(slot) & TARGET_SLOT_MASK
}

/// `(slot, generation)` of a target word.
pub fn split_target_word(w: u64) -> (u32, u64) {
    ((w & TARGET_SLOT_MASK) as u32, (w >> GEN_SHIFT) & GEN_MASK)
}

/// Table sizes of a board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Slots (shards exported at a time).
    pub slots: u32,
    /// Lease records (leases held at a time, all consumers together).
    pub records: u32,
}

impl Layout {
    /// Words the board needs.
    pub fn words(&self) -> usize {
        HEADER_WORDS + self.slots as usize + RECORD_WORDS * self.records as usize
    }

    fn slot(&self, slot: u32) -> usize {
        assert!(slot < self.slots, "slot {slot} out of range");
        HEADER_WORDS + slot as usize
    }

    /// `(first word, words)` of the lease records.
    fn records(&self) -> (usize, usize) {
        (
            HEADER_WORDS + self.slots as usize,
            Records::words_for(self.records),
        )
    }
}

/// Why a consumer cannot use a board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// The owner writes another layout version (the magic's last byte).
    Version {
        /// The version byte found.
        found: u8,
    },
    /// Not a board, or a header that disagrees with the board's real size.
    Invalid(String),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Version { found } => write!(
                f,
                "lease board layout version is {}, this plugin uses version {}",
                char::from(*found).escape_default(),
                char::from(LAYOUT_VERSION)
            ),
            AttachError::Invalid(why) => f.write_str(why),
        }
    }
}

/// Why a lease was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseError {
    /// The slot was unexported or reused (generation or state differ).
    Gone {
        /// What the slot word holds now.
        found: Slot,
    },
    /// Every lease record is taken.
    Full,
    /// The slot is outside the board.
    NoSuchSlot,
    /// The owner reclaimed the record while it was being claimed: it judged
    /// this process dead (an identity recorded wrongly).
    Reclaimed,
}

/// A lease this consumer holds: its record and the claim's sequence.
pub type Ticket = Claim;

/// One taken record as the owner's scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Record index.
    pub index: u32,
    /// `(slot, generation)` named by the record (generation 0: none yet).
    pub target: (u32, u64),
    /// `None` while the identity is incomplete or changed during the scan.
    pub holder: Option<Holder>,
    scanned: shardport_kit::lease::board::Scanned<TARGET_WORDS>,
}

impl Scanned {
    /// True when the record names `slot` of `generation`. A record whose
    /// target is not written yet names nothing: its consumer re-checks the
    /// slot after writing it (see the protocol).
    pub fn names(&self, slot: u32, generation: u64) -> bool {
        generation != 0 && self.target == (slot, generation)
    }
}

/// A board over its words: a [`crate::sys::BoardMap`], or a plain vector in
/// tests.
#[derive(Debug)]
pub struct Board<W> {
    words: W,
    layout: Layout,
}

impl<W: AsRef<[AtomicU64]>> Board<W> {
    /// Owner side: writes the header of a freshly created (zero-filled)
    /// board of at least `layout.words()` words.
    pub fn init(words: W, layout: Layout) -> Board<W> {
        assert!(words.as_ref().len() >= layout.words(), "board too small");
        assert!(layout.slots <= MAX_SLOTS && layout.records <= MAX_RECORDS);
        let b = Board { words, layout };
        b.word(H_SLOTS).store(u64::from(layout.slots), SeqCst);
        b.word(H_RECORDS).store(u64::from(layout.records), SeqCst);
        b.word(H_MAGIC).store(BOARD_MAGIC, SeqCst);
        b
    }

    /// Consumer side: checks a peer's board header against its real size.
    pub fn attach(words: W) -> Result<Board<W>, AttachError> {
        let w = words.as_ref();
        let invalid = |why: String| Err(AttachError::Invalid(why));
        if w.len() < HEADER_WORDS {
            return invalid(format!(
                "lease board is {} words, smaller than its {HEADER_WORDS}-word header",
                w.len()
            ));
        }
        match header::check(w[H_MAGIC].load(SeqCst), MAGIC_STEM, LAYOUT_VERSION) {
            Ok(()) => {}
            Err(header::HeaderError::Magic) => {
                return invalid("lease board magic is wrong (not a cuda-ipc lease board)".into())
            }
            Err(header::HeaderError::Version { found, .. }) => {
                return Err(AttachError::Version { found })
            }
        }
        let slots = w[H_SLOTS].load(SeqCst);
        let records = w[H_RECORDS].load(SeqCst);
        if !(1..=u64::from(MAX_SLOTS)).contains(&slots)
            || !(1..=u64::from(MAX_RECORDS)).contains(&records)
        {
            return invalid(format!(
                "lease board header says {slots} slots and {records} records, out of range"
            ));
        }
        let layout = Layout {
            slots: slots as u32,
            records: records as u32,
        };
        if w.len() != layout.words() {
            return invalid(format!(
                "lease board is {} words, its header needs {}",
                w.len(),
                layout.words()
            ));
        }
        Ok(Board { words, layout })
    }

    /// Owner side: records the owner's namespaces in the header, so a
    /// sweeper can tell whether the pid in the board's name means the same
    /// process to it.
    pub fn set_owner_namespaces(&self, ns: Namespaces) {
        self.word(H_OWNER_NS).store(ns.to_word(), SeqCst);
    }

    /// The owner's namespaces as its header records them (zero: unknown).
    pub fn owner_namespaces(&self) -> Namespaces {
        Namespaces::from_word(self.word(H_OWNER_NS).load(SeqCst))
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words.as_ref()[i]
    }

    /// The lease records, as the kit's `LeaseRecords`.
    fn records(&self) -> Records<'_> {
        let (start, len) = self.layout.records();
        Records::new(&self.words.as_ref()[start..start + len])
    }

    /// Table sizes (validated).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The slot word of `slot`, unpacked.
    pub fn slot(&self, slot: u32) -> Slot {
        unpack(self.word(self.layout.slot(slot)).load(SeqCst))
    }

    // ---- owner side ----

    /// Publishes free slot `slot`: returns its new generation, or `None`
    /// when the slot is not free.
    pub fn publish(&self, slot: u32) -> Option<u64> {
        let w = self.word(self.layout.slot(slot));
        let cur = w.load(SeqCst);
        let s = unpack(cur);
        if s.state != SlotState::Free {
            return None;
        }
        let mut generation = (s.generation + 1) & GEN_MASK;
        if generation == 0 {
            generation = 1;
        }
        let new = pack(Slot {
            generation,
            state: SlotState::Live,
        });
        w.compare_exchange(cur, new, SeqCst, SeqCst)
            .ok()
            .map(|_| generation)
    }

    /// Retires live slot `slot` of `generation` (no new leases). `false`
    /// when the slot does not hold that live generation.
    pub fn retire(&self, slot: u32, generation: u64) -> bool {
        self.swap_slot(slot, generation, SlotState::Live, SlotState::Retired)
    }

    /// Frees retired slot `slot` of `generation` for reuse; the caller found
    /// no lease naming it after retiring it.
    pub fn free(&self, slot: u32, generation: u64) -> bool {
        self.swap_slot(slot, generation, SlotState::Retired, SlotState::Free)
    }

    fn swap_slot(&self, slot: u32, generation: u64, from: SlotState, to: SlotState) -> bool {
        let old = pack(Slot {
            generation,
            state: from,
        });
        let new = pack(Slot {
            generation,
            state: to,
        });
        self.word(self.layout.slot(slot))
            .compare_exchange(old, new, SeqCst, SeqCst)
            .is_ok()
    }

    /// Every taken record: its target and, where complete and stable during
    /// the read, its holder (see "Reclaiming" above).
    pub fn scan(&self) -> Vec<Scanned> {
        self.records()
            .scan()
            .into_iter()
            .map(|scanned| Scanned {
                index: scanned.index,
                target: split_target_word(scanned.payload[0]),
                holder: scanned.holder,
                scanned,
            })
            .collect()
    }

    /// Records that may lease `slot` of `generation` now.
    pub fn leases_on(&self, slot: u32, generation: u64) -> u64 {
        self.scan()
            .iter()
            .filter(|s| s.names(slot, generation))
            .count() as u64
    }

    /// Frees the record `rec` describes, whose holder is proved dead, by one
    /// CAS of exactly the claim word the scan saw. `false` when the scan saw
    /// no complete holder, or the record changed since (which only its
    /// holder, so a live one, could have done).
    pub fn reclaim(&self, rec: &Scanned) -> bool {
        self.records().reclaim(&rec.scanned)
    }

    // ---- consumer side ----

    /// Takes a lease on `slot` of `generation` for `holder`, searching for
    /// a free record from `hint`.
    pub fn lease(
        &self,
        slot: u32,
        generation: u64,
        holder: &Holder,
        hint: u32,
    ) -> Result<Ticket, LeaseError> {
        let l = self.layout;
        if slot >= l.slots {
            return Err(LeaseError::NoSuchSlot);
        }
        let found = self.slot(slot);
        if found.state != SlotState::Live || found.generation != generation {
            return Err(LeaseError::Gone { found });
        }
        let claimed = self
            .records()
            .claim(holder, [target_word(slot, generation)], hint);
        let ticket = match claimed {
            Ok(ticket) => ticket,
            Err(Refused::Full) => return Err(LeaseError::Full),
            Err(Refused::Reclaimed) => return Err(LeaseError::Reclaimed),
        };
        let now = self.slot(slot);
        if now.state == SlotState::Live && now.generation == generation {
            Ok(ticket)
        } else {
            self.release(ticket);
            Err(LeaseError::Gone { found: now })
        }
    }

    /// Ends a lease: one CAS `held` -> `free` of this claim. `false`, having
    /// changed nothing, when the owner had reclaimed the record (it judged
    /// this process dead: an identity recorded wrongly).
    pub fn release(&self, ticket: Ticket) -> bool {
        self.records().release(ticket)
    }
}

#[cfg(test)]
impl<W: AsRef<[AtomicU64]>> Board<W> {
    /// Writes record `index` word by word, as a consumer interrupted at any
    /// point (or a hostile one) could have left it (tests).
    pub fn forge(&self, index: u32, seq: u64, held: bool, holder: &Holder, tag: u64, target: u64) {
        use shardport_kit::lease::board::{ClaimState, Forged};
        self.records().forge(
            index,
            &Forged {
                seq,
                state: if held {
                    ClaimState::Held
                } else {
                    ClaimState::Claiming
                },
                holder: *holder,
                tag,
                payload: [target],
            },
        );
    }
}

/// Zeroed words for a board of `layout` in process memory (tests).
#[cfg(test)]
pub fn words_for(layout: Layout) -> Vec<AtomicU64> {
    (0..layout.words()).map(|_| AtomicU64::new(0)).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const LAYOUT: Layout = Layout {
        slots: 4,
        records: 3,
    };

    const HOLDER: Holder = Holder {
        pid: 1,
        start_ticks: 2,
        ns: Namespaces { pid: 3, time: 4 },
    };

    fn board() -> Board<Vec<AtomicU64>> {
        Board::init(words_for(LAYOUT), LAYOUT)
    }

    #[test]
    fn lifecycle() {
        let b = board();
        let g = b.publish(1).unwrap();
        assert_eq!(g, 1);
        assert_eq!(b.publish(1), None, "a live slot is not free");
        let t1 = b.lease(1, g, &HOLDER, 0).unwrap();
        let t2 = b.lease(1, g, &HOLDER, 0).unwrap();
        assert_ne!(t1, t2);
        assert!(matches!(
            b.lease(1, g + 1, &HOLDER, 0),
            Err(LeaseError::Gone { .. })
        ));
        assert_eq!(b.lease(9, g, &HOLDER, 0), Err(LeaseError::NoSuchSlot));
        assert_eq!(b.leases_on(1, g), 2);
        assert_eq!(b.leases_on(2, g), 0);
        assert!(b.retire(1, g));
        assert!(!b.retire(1, g), "already retired");
        assert!(
            matches!(b.lease(1, g, &HOLDER, 0), Err(LeaseError::Gone { found }) if found.state == SlotState::Retired),
            "no lease after retire"
        );
        assert_eq!(b.publish(1), None, "retired: not reusable");
        assert!(b.release(t1));
        assert!(!b.release(t1), "a second release changes nothing");
        assert_eq!(b.leases_on(1, g), 1);
        assert!(b.release(t2));
        assert_eq!(b.leases_on(1, g), 0);
        assert!(b.free(1, g));
        assert_eq!(b.publish(1), Some(2), "free again, next generation");
        assert!(
            matches!(b.lease(1, 1, &HOLDER, 0), Err(LeaseError::Gone { .. })),
            "old descriptors stay refused"
        );
    }

    #[test]
    fn a_full_table_refuses_and_frees_nothing() {
        let b = board();
        let g = b.publish(0).unwrap();
        let t: Vec<_> = (0..3).map(|i| b.lease(0, g, &HOLDER, i).unwrap()).collect();
        assert_eq!(b.lease(0, g, &HOLDER, 0), Err(LeaseError::Full));
        assert_eq!(b.leases_on(0, g), 3);
        for t in t {
            assert!(b.release(t));
        }
    }

    #[test]
    fn generation_wraps_past_zero() {
        let b = board();
        b.word(b.layout.slot(0)).store(
            pack(Slot {
                generation: GEN_MASK,
                state: SlotState::Free,
            }),
            SeqCst,
        );
        assert_eq!(b.publish(0), Some(1));
    }

    /// What a record that is not whole names (the kit tests that it has no
    /// holder and is never reclaimed): nothing while its target is zero, an
    /// earlier claim's slot while its target is stale.
    #[test]
    fn a_torn_record_names_nothing_or_waits() {
        let b = board();
        let g = b.publish(0).unwrap();
        // A claimer that died after its claim CAS, before tagging its pid:
        // its target was zeroed by the claim.
        let corpse = Holder {
            pid: 77,
            start_ticks: 5,
            ns: HOLDER.ns,
        };
        b.forge(1, 41, false, &corpse, 40, 0);
        let scan = b.scan();
        assert_eq!(scan.len(), 1);
        assert_eq!(scan[0].holder, None, "untagged pid: no holder");
        assert!(!b.reclaim(&scan[0]));
        assert!(!scan[0].names(0, g));
        assert_eq!(b.leases_on(0, g), 0, "holds no memory back");
        // Died after writing its target, before tagging? Impossible: the
        // target is written after the pid. A stale target of an earlier
        // claim does hold the slot back (the owner waits, never guesses).
        b.forge(1, 41, false, &corpse, 40, target_word(0, g));
        assert_eq!(b.leases_on(0, g), 1);
        assert!(!b.reclaim(&b.scan()[0]));
    }

    #[test]
    fn attach_checks_the_header_and_refuses_other_versions() {
        let b = board();
        let words = b.words;
        let attach = |w: &[AtomicU64]| {
            let v: Vec<AtomicU64> = w.iter().map(|x| AtomicU64::new(x.load(SeqCst))).collect();
            Board::attach(v).map(|b| b.layout())
        };
        assert_eq!(attach(&words), Ok(LAYOUT));
        words[H_MAGIC].store(u64::from_le_bytes(*b"SPCUBRD2"), SeqCst);
        let e = attach(&words).unwrap_err();
        assert_eq!(e, AttachError::Version { found: b'2' });
        assert_eq!(
            e.to_string(),
            "lease board layout version is 2, this plugin uses version 3"
        );
        words[H_MAGIC].store(u64::from_le_bytes(*b"SPSHMBRD"), SeqCst);
        assert!(attach(&words).unwrap_err().to_string().contains("magic"));
        words[H_MAGIC].store(BOARD_MAGIC, SeqCst);
        words[H_RECORDS].store(4, SeqCst);
        assert!(attach(&words).unwrap_err().to_string().contains("needs"));
        words[H_RECORDS].store(0, SeqCst);
        assert!(attach(&words)
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        assert!(attach(&words[..2])
            .unwrap_err()
            .to_string()
            .contains("header"));
    }

    proptest! {
        #[test]
        fn slot_words_roundtrip(generation in 0u64..=GEN_MASK, state in 0u64..3) {
            let state = unpack(state).state;
            let s = Slot { generation, state };
            prop_assert_eq!(unpack(pack(s)), s);
        }

        #[test]
        fn target_words_roundtrip(slot in 0u32..MAX_SLOTS, generation in 1u64..=GEN_MASK) {
            prop_assert_eq!(split_target_word(target_word(slot, generation)), (slot, generation));
            prop_assert_ne!(target_word(slot, generation), 0);
        }
    }
}
