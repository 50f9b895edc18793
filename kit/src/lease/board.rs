//! Lease records in shared memory: how an owner knows which consumers still
//! read memory it lent, and who they are, so it never frees or overwrites
//! memory a live consumer reads, and can take back the leases of consumers
//! that died.
//!
//! # Layout
//! A [`LeaseRecords`] is a run of records in an array of `u64` words that
//! every process accesses only atomically (`SeqCst`): in a transport's
//! board, a shared segment its owner creates and its consumers map
//! read-write, after the transport's own header and tables. Each record is
//! [`IDENTITY_WORDS`] words this module owns, then `P` payload words that
//! say what the lease is on (a shard slot and generation, a byte range),
//! which the transport defines:
//!
//! ```text
//! claim word: sequence << 2 | state (0 free, 1 claiming, 2 held)
//! holder pid | low 32 bits of the claim's sequence << 32
//! holder start time (clock ticks since boot)
//! holder namespaces: PID-namespace inode | time-namespace inode << 32
//! payload (P words)
//! ```
//!
//! A board's first words are usually its [`header`]: a magic that names
//! the transport and its layout version in one word.
//!
//! # Protocol
//! A consumer **claims** a free record (CAS `free(s - 1)` -> `claiming(s)`),
//! zeroes its payload, writes who it is (start time, namespaces, then the
//! pid tagged with `s`), then its payload, and marks the record `held(s)`
//! by a CAS from `claiming(s)` ([`LeaseRecords::claim`]). Only then does it
//! re-check, in the transport's own words, that what the payload names
//! still may be leased (the shard is still live, with that generation); if
//! not, it releases the record and reports the shard gone. It **releases**
//! by one CAS `held(s)` -> `free(s)` ([`LeaseRecords::release`]), which fails,
//! having changed nothing, when the owner reclaimed the record.
//!
//! The owner **retires** what a lease may name (in its own words) first,
//! and only then scans the records for a lease naming it
//! ([`LeaseRecords::scan`]): without one it frees the memory, with one it
//! keeps it and scans again later.
//!
//! Why no lease is ever missed: both sides write their own word, then read
//! the other's, all `SeqCst`, so in the single total order either the
//! consumer's record writes precede the owner's scan (the owner sees the
//! lease) or the owner's retire precedes the consumer's re-check (the
//! consumer sees the shard gone and never reads it). A scan that reads a
//! half-written record (a payload still zero) read some word before the
//! consumer wrote it, so the retire came before the consumer's re-check
//! too. A stale payload of an earlier claim (read before the new claim
//! zeroed it) only makes the owner wait longer.
//!
//! # Reclaiming the leases of dead consumers
//! Only the owner reclaims, under its own lock. [`LeaseRecords::scan`] reads a
//! taken record's claim word, then its pid word, start time, namespaces and
//! payload, then the claim word again. Each claim word value occurs once per
//! record (the sequence only grows), and a later claimer writes only after
//! its own CAS changed the word, so the same value twice means every word
//! read belongs to that claim or an earlier one; a pid word tagged with the
//! claim's sequence was written by that claim, and so were the start time
//! and namespaces, written before it (and read after it). Such a holder
//! ([`Scanned::holder`]), if provably dead (see
//! [`liveness`](super::liveness): `ESRCH` or a reused pid, judged only
//! within our PID namespace; a zombie is not proof), loses the record:
//! [`LeaseRecords::reclaim`] CASes exactly that claim word to `free`. A dead
//! holder never writes again, and only the holder otherwise moves a taken
//! record, so the CAS can only race with a holder that is alive, which
//! `judge` never calls dead (every doubt is `Unknown`, treated as alive);
//! had it wrongly, exactly one of the two CASes would win, and a release
//! never touches a record it no longer holds.
//!
//! That race is also why the consumer publishes its claim (`claiming` ->
//! `held`) with a CAS and not a store: the owner may have reclaimed the
//! claiming record meanwhile, and a store would revive a lease the owner no
//! longer counts ([`Refused::Reclaimed`]).
//!
//! A consumer that died before tagging its pid (a window of a few stores)
//! keeps its record taken, with a zero payload (the payload is written
//! after the tag): a record without its tag is never reclaimed, and names
//! nothing. Where the lent memory is mapped by the consumer, its mappings
//! die with it, so freeing the memory a dead holder leased is safe.
//!
//! # Failure modes
//! Consumers map the board read-write; a hostile one can claim records or
//! write nonsense. An owner keeps its own books in process memory and only
//! reads leases from the board (with saturating arithmetic), so the worst a
//! bad consumer can do is keep memory occupied, or write another process's
//! identity into its record (which then counts as that process's).

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering::SeqCst},
};

use super::liveness::{Holder, Namespaces};

/// Words of a record this module owns: claim, pid, start time, namespaces.
pub const IDENTITY_WORDS: usize = 4;

const R_CLAIM: usize = 0;
const R_PID: usize = 1;
const R_START: usize = 2;
const R_NS: usize = 3;

/// State of a record, the low bits of its claim word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum ClaimState {
    /// Nobody holds it.
    Free = 0,
    /// Claimed, its identity and payload being written.
    Claiming = 1,
    /// Claimed and published.
    Held = 2,
}

const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// The largest claim sequence (it wraps to 0 past it).
pub const SEQ_MASK: u64 = u64::MAX >> STATE_BITS;

/// A record's claim word: the claim's sequence and the record's state.
pub fn claim_word(seq: u64, state: ClaimState) -> u64 {
    (seq & SEQ_MASK) << STATE_BITS | state as u64
}

/// `(sequence, state bits)` of a claim word (a state of 3, which no claimer
/// writes, counts as taken).
fn split_claim_word(word: u64) -> (u64, u64) {
    (word >> STATE_BITS, word & STATE_MASK)
}

/// The holder pid word: the pid, tagged with the low half of its claim's
/// sequence.
pub fn pid_word(pid: u32, seq: u64) -> u64 {
    u64::from(pid) | u64::from(seq as u32) << 32
}

/// `(pid, tag)` of a pid word.
pub fn split_pid_word(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

/// A claim this consumer holds: the record and the claim's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    /// Record index.
    pub index: u32,
    seq: u64,
}

/// Why a claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every record is taken.
    Full,
    /// The owner reclaimed the record while it was being claimed: it judged
    /// this process dead (an identity recorded wrongly, e.g. by a forked
    /// child). Nothing is held.
    Reclaimed,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Full => "every lease record is taken",
            Refused::Reclaimed => "the owner reclaimed the lease while it was being claimed",
        })
    }
}

impl std::error::Error for Refused {}

/// One taken record as the owner's scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned<const P: usize> {
    /// Record index.
    pub index: u32,
    /// The claim word, read before and after the other words.
    word: u64,
    /// The payload words, as read (zero while not written yet).
    pub payload: [u64; P],
    /// `None` while the identity is incomplete or changed during the scan.
    pub holder: Option<Holder>,
}

/// A record written word by word, as a consumer interrupted at any point
/// (or a hostile one) could leave it ([`LeaseRecords::forge`], for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forged<const P: usize> {
    /// The claim's sequence.
    pub seq: u64,
    /// Its state.
    pub state: ClaimState,
    /// The identity written.
    pub holder: Holder,
    /// The tag of the pid word (the claim's sequence once complete).
    pub tag: u64,
    /// The payload written.
    pub payload: [u64; P],
}

/// The lease records of a board: a view of the words they occupy, each
/// record [`IDENTITY_WORDS`] words and `P` payload words.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRecords<'a, const P: usize> {
    words: &'a [AtomicU64],
    records: u32,
}

impl<'a, const P: usize> LeaseRecords<'a, P> {
    /// Words of one record.
    pub const RECORD_WORDS: usize = IDENTITY_WORDS + P;

    /// Words `records` records occupy.
    pub const fn words_for(records: u32) -> usize {
        Self::RECORD_WORDS * records as usize
    }

    /// The records in `words`, which hold a whole number of them (at most
    /// `u32::MAX`).
    ///
    /// # Panics
    /// When `words` is not a whole number of records: a transport validates
    /// its layout first, so this is a bug.
    pub fn new(words: &'a [AtomicU64]) -> Self {
        assert_eq!(
            words.len() % Self::RECORD_WORDS,
            0,
            "lease records of {} words do not fill {} words",
            Self::RECORD_WORDS,
            words.len()
        );
        let records = u32::try_from(words.len() / Self::RECORD_WORDS).expect("too many records");
        LeaseRecords { words, records }
    }

    /// Number of records.
    pub fn records(&self) -> u32 {
        self.records
    }

    fn word(&self, index: u32, field: usize) -> &'a AtomicU64 {
        assert!(index < self.records, "lease record {index} out of range");
        &self.words[Self::RECORD_WORDS * index as usize + field]
    }

    // ---- consumer side ----

    /// Claims a free record for `holder` with `payload`, searching from
    /// `hint` (a consumer's own hint spreads consumers over the table), and
    /// publishes it `held`. The caller then re-checks that what the payload
    /// names may still be leased, and [releases](Self::release) the claim
    /// if not (see the module docs).
    pub fn claim(&self, holder: &Holder, payload: [u64; P], hint: u32) -> Result<Claim, Refused> {
        self.claim_observed(holder, payload, hint, || {})
    }

    /// [`claim`](Self::claim), running `before_held` once the identity and
    /// payload are written and before the claim is published: the window
    /// in which an owner that judged the claimer dead can reclaim the
    /// record. For tests that force that race (a transport checking what it
    /// counts around a lease); `claim` runs nothing there.
    pub fn claim_observed(
        &self,
        holder: &Holder,
        payload: [u64; P],
        hint: u32,
        before_held: impl FnOnce(),
    ) -> Result<Claim, Refused> {
        let n = u64::from(self.records);
        let claim = (0..n)
            .map(|k| ((u64::from(hint) + k) % n) as u32)
            .find_map(|i| {
                let w = self.word(i, R_CLAIM);
                let free = w.load(SeqCst);
                let (seq, state) = split_claim_word(free);
                if state != ClaimState::Free as u64 {
                    return None;
                }
                let seq = seq.wrapping_add(1) & SEQ_MASK;
                w.compare_exchange(free, claim_word(seq, ClaimState::Claiming), SeqCst, SeqCst)
                    .ok()
                    .map(|_| Claim { index: i, seq })
            })
            .ok_or(Refused::Full)?;
        let w = |f: usize, v: u64| self.word(claim.index, f).store(v, SeqCst);
        // No stale payload from an earlier claim while this one is claiming.
        for f in 0..P {
            w(IDENTITY_WORDS + f, 0);
        }
        // Identity, the pid word last: tagged with this claim, it says the
        // identity is complete (see "Reclaiming").
        w(R_START, holder.start_ticks);
        w(R_NS, holder.ns.to_word());
        w(R_PID, pid_word(holder.pid, claim.seq));
        for (f, v) in payload.into_iter().enumerate() {
            w(IDENTITY_WORDS + f, v);
        }
        before_held();
        // A CAS, not a store: a record the owner reclaimed meanwhile stays
        // its own (a store would revive a lease the owner no longer counts).
        if !self.move_claim(
            claim.index,
            claim.seq,
            ClaimState::Claiming,
            ClaimState::Held,
        ) {
            return Err(Refused::Reclaimed);
        }
        Ok(claim)
    }

    /// Ends a claim: one CAS `held` -> `free` of this claim. `false`, having
    /// changed nothing, when the owner had reclaimed the record (it judged
    /// this process dead: an identity recorded wrongly, e.g. by a forked
    /// child), or `claim` is not of this table.
    pub fn release(&self, claim: Claim) -> bool {
        claim.index < self.records
            && self.move_claim(claim.index, claim.seq, ClaimState::Held, ClaimState::Free)
    }

    // ---- owner side ----

    /// Every taken record: its payload and, where complete and stable during
    /// the read, its holder (see "Reclaiming" above).
    pub fn scan(&self) -> Vec<Scanned<P>> {
        let mut out = Vec::new();
        for i in 0..self.records {
            let r = |f: usize| self.word(i, f).load(SeqCst);
            let word = r(R_CLAIM);
            let (seq, state) = split_claim_word(word);
            if state == ClaimState::Free as u64 {
                continue;
            }
            // The pid word before the identity it vouches for.
            let (pid, tag) = split_pid_word(r(R_PID));
            let start_ticks = r(R_START);
            let ns = Namespaces::from_word(r(R_NS));
            let payload = std::array::from_fn(|f| r(IDENTITY_WORDS + f));
            let stable = r(R_CLAIM) == word;
            let holder = (stable && pid != 0 && tag == seq as u32).then_some(Holder {
                pid,
                start_ticks,
                ns,
            });
            out.push(Scanned {
                index: i,
                word,
                payload,
                holder,
            });
        }
        out
    }

    /// Number of records not free.
    pub fn taken(&self) -> u32 {
        (0..self.records)
            .filter(|&i| split_claim_word(self.word(i, R_CLAIM).load(SeqCst)).1 != 0)
            .count() as u32
    }

    /// Frees the record `rec` describes, whose holder is proved dead, by one
    /// CAS of exactly the claim word the scan saw. `false` when the scan saw
    /// no complete holder, or the record changed since (which only its
    /// holder, so a live one, could have done).
    pub fn reclaim(&self, rec: &Scanned<P>) -> bool {
        rec.holder.is_some()
            && self
                .word(rec.index, R_CLAIM)
                .compare_exchange(rec.word, rec.word & !STATE_MASK, SeqCst, SeqCst)
                .is_ok()
    }

    /// Writes record `index` word by word, identity and payload first and
    /// the claim word last, as a consumer interrupted at any point (or a
    /// hostile one) could have left it. For tests of what an owner does
    /// with such records.
    pub fn forge(&self, index: u32, rec: &Forged<P>) {
        let w = |f: usize, v: u64| self.word(index, f).store(v, SeqCst);
        w(R_START, rec.holder.start_ticks);
        w(R_NS, rec.holder.ns.to_word());
        w(R_PID, pid_word(rec.holder.pid, rec.tag));
        for (f, v) in rec.payload.into_iter().enumerate() {
            w(IDENTITY_WORDS + f, v);
        }
        w(R_CLAIM, claim_word(rec.seq, rec.state));
    }

    /// Moves record `index` from state `from` to `to` of claim `seq`, by one
    /// CAS of exactly that claim word: `false`, having changed nothing, when
    /// the record holds anything else (another claim, another state).
    fn move_claim(&self, index: u32, seq: u64, from: ClaimState, to: ClaimState) -> bool {
        self.word(index, R_CLAIM)
            .compare_exchange(claim_word(seq, from), claim_word(seq, to), SeqCst, SeqCst)
            .is_ok()
    }
}

pub mod header;

#[cfg(test)]
mod tests;
