//! The lease board: how an owner knows that consumers still map a shard's
//! device memory, so it never frees memory a consumer still reads.
//!
//! # Layout
//! A POSIX shared-memory segment per owner transport instance
//! (`/shardport-cuda-<node tag>`, mode 0600, created exclusively, unlinked
//! by its owner), an array of little-endian `u64` words:
//! word 0 is the magic [`BOARD_MAGIC`], word 1 the slot count, then one word
//! per exported shard:
//!
//! ```text
//! bits 63..24  slot generation (40 bits, never 0 once published)
//! bit  23      live: the shard is exported (new leases allowed)
//! bits 22..0   lease count
//! ```
//!
//! # Protocol (every change is one compare-and-swap on one word)
//! - owner `publish`: a free word (not live, no lease) becomes
//!   (generation + 1, live, 0); the descriptor carries the slot and the new
//!   generation.
//! - consumer `lease`: +1 only while the word is live with the descriptor's
//!   generation; otherwise the shard was unexported (`NOT_FOUND`).
//! - consumer `unlease`: -1 while the generation matches.
//! - owner `retire` (unexport): clears live; the memory is freed once the
//!   count reads 0 (at once, or by a later call: `reap`). A consumer can no
//!   longer take a lease on a retired word, so the owner's "count is 0"
//!   is final.
//!
//! # What is guaranteed, and what is not
//! Memory the plugin owns (staged copies) is freed only when no lease is
//! held. Memory the host lent (`put_device`, the caller's tensor) cannot be
//! kept alive by the plugin: `unexport` retires the slot and the host reports
//! how many leases are still held (`leases_held_on_owner`); the caller must
//! not free its tensor while that is non-zero. Leases of a consumer that
//! died without releasing are NOT reclaimed (posix-shm's board records
//! lessee pids; this one does not yet), so such a slot keeps its memory
//! until the owner exits.

use std::sync::atomic::{AtomicU64, Ordering};

/// Word 0 of every board: "SPCUBRD1".
pub const BOARD_MAGIC: u64 = u64::from_le_bytes(*b"SPCUBRD1");
/// Words before the first slot.
pub const HEADER_WORDS: usize = 2;
const LEASE_BITS: u32 = 23;
const LEASE_MASK: u64 = (1 << LEASE_BITS) - 1;
const LIVE: u64 = 1 << LEASE_BITS;
const GEN_SHIFT: u32 = 24;
const GEN_MASK: u64 = (1 << 40) - 1;
/// Most leases one slot counts.
pub const MAX_LEASES: u64 = LEASE_MASK;

/// A slot word, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Generation.
    pub generation: u64,
    /// Exported.
    pub live: bool,
    /// Leases held.
    pub leases: u64,
}

/// Unpacks a word.
pub fn unpack(w: u64) -> Slot {
    Slot {
        generation: (w >> GEN_SHIFT) & GEN_MASK,
        live: w & LIVE != 0,
        leases: w & LEASE_MASK,
    }
}

/// Packs a slot.
pub fn pack(s: Slot) -> u64 {
    ((s.generation & GEN_MASK) << GEN_SHIFT)
        | if s.live { LIVE } else { 0 }
        | (s.leases & LEASE_MASK)
}

/// Why a lease was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseError {
    /// The slot was unexported or reused (generation or live bit differ).
    Gone {
        /// What the word holds now.
        found: Slot,
    },
    /// The slot already counts [`MAX_LEASES`].
    Full,
}

/// Owner: publishes a free word. Returns the new generation, or `None` when
/// the word is not free (live, or leases still held).
pub fn publish(word: &AtomicU64) -> Option<u64> {
    let cur = word.load(Ordering::Acquire);
    let s = unpack(cur);
    if s.live || s.leases != 0 {
        return None;
    }
    let mut generation = (s.generation + 1) & GEN_MASK;
    if generation == 0 {
        generation = 1;
    }
    let new = pack(Slot {
        generation,
        live: true,
        leases: 0,
    });
    word.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
        .ok()
        .map(|_| generation)
}

/// Owner: retires a published word (no new leases). Returns the leases still held.
pub fn retire(word: &AtomicU64, generation: u64) -> u64 {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let s = unpack(cur);
        if s.generation != generation || !s.live {
            return s.leases;
        }
        let new = pack(Slot { live: false, ..s });
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return s.leases,
            Err(now) => cur = now,
        }
    }
}

/// Leases held on a word now.
pub fn leases(word: &AtomicU64) -> u64 {
    unpack(word.load(Ordering::Acquire)).leases
}

/// Consumer: takes a lease on a live word of `generation`.
pub fn lease(word: &AtomicU64, generation: u64) -> Result<(), LeaseError> {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let s = unpack(cur);
        if s.generation != generation || !s.live {
            return Err(LeaseError::Gone { found: s });
        }
        if s.leases >= MAX_LEASES {
            return Err(LeaseError::Full);
        }
        let new = pack(Slot {
            leases: s.leases + 1,
            ..s
        });
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}

/// Consumer: ends a lease taken by [`lease`]. `false` when the word holds no
/// lease of that generation (a bug, or a board someone else rewrote).
pub fn unlease(word: &AtomicU64, generation: u64) -> bool {
    let mut cur = word.load(Ordering::Acquire);
    loop {
        let s = unpack(cur);
        if s.generation != generation || s.leases == 0 {
            return false;
        }
        let new = pack(Slot {
            leases: s.leases - 1,
            ..s
        });
        match word.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn lifecycle() {
        let w = AtomicU64::new(0);
        let g = publish(&w).unwrap();
        assert_eq!(g, 1);
        assert_eq!(publish(&w), None, "a live word is not free");
        lease(&w, g).unwrap();
        lease(&w, g).unwrap();
        assert!(matches!(lease(&w, g + 1), Err(LeaseError::Gone { .. })));
        assert_eq!(retire(&w, g), 2);
        assert!(
            matches!(lease(&w, g), Err(LeaseError::Gone { found }) if !found.live),
            "no lease after retire"
        );
        assert_eq!(publish(&w), None, "leases still held: not reusable");
        assert!(unlease(&w, g));
        assert!(unlease(&w, g));
        assert!(!unlease(&w, g), "no lease left");
        assert_eq!(leases(&w), 0);
        assert_eq!(publish(&w), Some(2), "free again, next generation");
        assert!(
            matches!(lease(&w, 1), Err(LeaseError::Gone { .. })),
            "old descriptors stay refused"
        );
    }

    #[test]
    fn generation_wraps_past_zero() {
        let w = AtomicU64::new(pack(Slot {
            generation: GEN_MASK,
            live: false,
            leases: 0,
        }));
        assert_eq!(publish(&w), Some(1));
    }

    #[test]
    fn full_slot_refuses() {
        let w = AtomicU64::new(pack(Slot {
            generation: 3,
            live: true,
            leases: MAX_LEASES,
        }));
        assert_eq!(lease(&w, 3), Err(LeaseError::Full));
    }

    #[test]
    fn concurrent_leases_balance() {
        let w = std::sync::Arc::new(AtomicU64::new(0));
        let g = publish(&w).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = std::sync::Arc::clone(&w);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        lease(&w, g).unwrap();
                        assert!(unlease(&w, g));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            unpack(w.load(Ordering::Acquire)),
            Slot {
                generation: g,
                live: true,
                leases: 0
            }
        );
    }

    proptest! {
        #[test]
        fn pack_roundtrip(generation in 0u64..=GEN_MASK, live: bool, leases in 0u64..=MAX_LEASES) {
            let s = Slot { generation, live, leases };
            prop_assert_eq!(unpack(pack(s)), s);
        }
    }
}
