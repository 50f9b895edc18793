//! Copy destinations a node hands out again: a bounded shelf of buffers that
//! copy fetches left behind.
//!
//! A copy fetch needs a destination as long as the shard. A fresh one is
//! not free: the allocator hands it out zeroed (a calloc, so the copy
//! writes every byte a second time) or maps it fresh (the kernel faults and
//! zeroes every page). A consumer that fetches, reads and drops shards in a
//! loop asks for the same few lengths again and again, so a node keeps the
//! buffers its copies come back with (a [`CopyBuf`] hands its bytes back on
//! drop) and gives them out again for a fetch of the same length: the copy
//! then writes warm memory once.
//!
//! The shelf is bounded: at most [`MAX_KEPT`] buffers and the node's
//! `fetch.copy-buffers` bytes (a buffer longer than that is never kept),
//! the oldest dropped first; buffers under [`KEEP_FROM`] bytes are not
//! kept (the allocator's own free lists serve those as well). A reused
//! buffer still holds the bytes of the shard it carried before; every copy
//! path overwrites all of them (a transport's `import_into` fills the whole
//! destination or fails, and a failed fetch never returns its buffer).

use std::{
    collections::VecDeque,
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, Weak,
    },
};

use serde::Serialize;

use crate::vocab::{CopyBuf, TakeBack};

/// Buffers shorter than this are not kept.
pub const KEEP_FROM: usize = 64 << 10;

/// Most buffers a shelf keeps.
pub const MAX_KEPT: usize = 64;

/// Default byte budget of a node's shelf (`fetch.copy-buffers`).
pub const DEFAULT_BUDGET: u64 = 64 << 20;

/// What a shelf did, for [`NodeStats`](crate::node::NodeStats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ShelfStats {
    /// Buffers kept now.
    pub kept: usize,
    /// Their bytes.
    pub kept_bytes: u64,
    /// Copy destinations served from the shelf.
    pub reused: u64,
    /// Copy destinations of a keepable length allocated fresh (none kept).
    pub fresh: u64,
    /// Buffers that came back and were not kept, or were pushed out by newer
    /// ones (over the count or the byte budget).
    pub dropped: u64,
}

#[derive(Default)]
struct Kept {
    /// Oldest first.
    free: VecDeque<Vec<u8>>,
    bytes: u64,
}

struct Inner {
    kept: Mutex<Kept>,
    budget: AtomicU64,
    reused: AtomicU64,
    fresh: AtomicU64,
    dropped: AtomicU64,
}

impl TakeBack for Inner {
    fn take_back(&self, bytes: Vec<u8>) {
        self.give_back(bytes);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Kept> {
        // Every update below is complete before the lock is released.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes back `bytes` if they fit; what is pushed out (or refused) is
    /// freed after the lock is released.
    fn give_back(&self, bytes: Vec<u8>) {
        let budget = self.budget.load(Ordering::Relaxed);
        let len = bytes.len() as u64;
        if bytes.len() < KEEP_FROM || len > budget {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut out = Vec::new();
        {
            let mut k = self.lock();
            k.bytes += len;
            k.free.push_back(bytes);
            trim(&mut k, budget, &mut out);
        }
        self.dropped.fetch_add(out.len() as u64, Ordering::Relaxed);
        drop(out);
    }
}

/// Drops the oldest buffers until `k` is within `budget` bytes and
/// [`MAX_KEPT`] buffers; they go to `out`, to be freed outside the lock.
fn trim(k: &mut Kept, budget: u64, out: &mut Vec<Vec<u8>>) {
    while k.free.len() > MAX_KEPT || k.bytes > budget {
        let Some(old) = k.free.pop_front() else { break };
        k.bytes -= old.len() as u64;
        out.push(old);
    }
}

/// A node's shelf of copy destinations. Cheap to clone (shared).
#[derive(Clone)]
pub struct CopyBuffers {
    inner: Arc<Inner>,
}

impl fmt::Debug for CopyBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CopyBuffers").field(&self.stats()).finish()
    }
}

impl CopyBuffers {
    /// An empty shelf keeping at most `budget` bytes (0: keeps nothing).
    pub fn new(budget: u64) -> Self {
        CopyBuffers {
            inner: Arc::new(Inner {
                kept: Mutex::default(),
                budget: AtomicU64::new(budget),
                reused: AtomicU64::new(0),
                fresh: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// Changes the byte budget (a reload); what no longer fits is freed.
    pub fn set_budget(&self, budget: u64) {
        self.inner.budget.store(budget, Ordering::Relaxed);
        let mut out = Vec::new();
        trim(&mut self.inner.lock(), budget, &mut out);
        self.inner
            .dropped
            .fetch_add(out.len() as u64, Ordering::Relaxed);
    }

    /// A kept buffer of exactly `len` bytes (the most recently returned
    /// one), holding whatever it held before; `None` when there is none.
    /// A miss of a keepable length is counted as `fresh`: the caller
    /// allocates and [`adopt`](Self::adopt)s.
    pub fn reuse(&self, len: usize) -> Option<CopyBuf> {
        if len < KEEP_FROM {
            return None;
        }
        let found = {
            let mut k = self.inner.lock();
            let at = k.free.iter().rposition(|b| b.len() == len);
            let found = at.and_then(|i| k.free.remove(i));
            if let Some(b) = &found {
                k.bytes -= b.len() as u64;
            }
            found
        };
        match found {
            Some(bytes) => {
                self.inner.reused.fetch_add(1, Ordering::Relaxed);
                Some(self.adopt(bytes))
            }
            None => {
                self.inner.fresh.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// `bytes` as a buffer that comes back to this shelf when dropped.
    pub fn adopt(&self, bytes: Vec<u8>) -> CopyBuf {
        let home: Weak<Inner> = Arc::downgrade(&self.inner);
        CopyBuf::returning(bytes, home)
    }

    /// Frees every kept buffer.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.inner.lock());
        drop(all);
    }

    /// Counts and what is kept now.
    pub fn stats(&self) -> ShelfStats {
        let (kept, kept_bytes) = {
            let k = self.inner.lock();
            (k.free.len(), k.bytes)
        };
        ShelfStats {
            kept,
            kept_bytes,
            reused: self.inner.reused.load(Ordering::Relaxed),
            fresh: self.inner.fresh.load(Ordering::Relaxed),
            dropped: self.inner.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(shelf: &CopyBuffers, len: usize, fill: u8) -> CopyBuf {
        assert!(shelf.reuse(len).is_none(), "nothing of {len} bytes kept");
        shelf.adopt(vec![fill; len])
    }

    #[test]
    fn a_returned_buffer_is_handed_out_again_for_the_same_length() {
        let shelf = CopyBuffers::new(DEFAULT_BUDGET);
        let a = fresh(&shelf, KEEP_FROM, 1);
        let at = a.as_ptr();
        drop(a);
        assert_eq!(shelf.stats().kept, 1);
        assert!(shelf.reuse(KEEP_FROM + 1).is_none(), "only the same length");
        let b = shelf.reuse(KEEP_FROM).expect("kept");
        assert_eq!(b.as_ptr(), at, "the same memory");
        assert!(b.iter().all(|&x| x == 1), "its old bytes, untouched");
        let s = shelf.stats();
        assert_eq!((s.kept, s.kept_bytes, s.reused, s.fresh), (0, 0, 1, 2));
    }

    #[test]
    fn the_shelf_is_bounded_by_count_and_bytes_oldest_out_first() {
        let shelf = CopyBuffers::new(DEFAULT_BUDGET);
        // More buffers than it keeps.
        let held: Vec<CopyBuf> = (0..MAX_KEPT + 10)
            .map(|_| shelf.adopt(vec![0; KEEP_FROM]))
            .collect();
        drop(held);
        let s = shelf.stats();
        assert_eq!(s.kept, MAX_KEPT);
        assert_eq!(s.kept_bytes, (MAX_KEPT * KEEP_FROM) as u64);
        assert_eq!(s.dropped, 10);
        // Bytes: a budget of three buffers keeps the newest three.
        let shelf = CopyBuffers::new(3 * KEEP_FROM as u64);
        let bufs: Vec<CopyBuf> = (0..5u8).map(|i| shelf.adopt(vec![i; KEEP_FROM])).collect();
        drop(bufs);
        let s = shelf.stats();
        assert_eq!((s.kept, s.kept_bytes), (3, 3 * KEEP_FROM as u64));
        // Held, so that each comes back only after the three are out.
        let again: Vec<CopyBuf> = (0..3)
            .map(|_| shelf.reuse(KEEP_FROM).expect("kept"))
            .collect();
        let firsts: Vec<u8> = again.iter().map(|b| b[0]).collect();
        assert_eq!(firsts, vec![4, 3, 2], "newest first");
        assert!(shelf.reuse(KEEP_FROM).is_none(), "all three are out");
    }

    #[test]
    fn small_long_and_detached_buffers_are_not_kept() {
        let shelf = CopyBuffers::new(4 * KEEP_FROM as u64);
        drop(shelf.adopt(vec![0; KEEP_FROM - 1]));
        drop(shelf.adopt(vec![0; 5 * KEEP_FROM]));
        assert!(shelf.reuse(KEEP_FROM - 1).is_none());
        drop(shelf.adopt(vec![0; KEEP_FROM]).into_vec());
        drop(CopyBuf::detached(vec![0; KEEP_FROM]));
        let s = shelf.stats();
        assert_eq!((s.kept, s.dropped), (0, 2));
        // A shelf that is gone takes nothing back.
        let orphan = shelf.adopt(vec![0; KEEP_FROM]);
        drop(shelf);
        drop(orphan);
    }

    #[test]
    fn a_buffer_taken_apart_goes_back_through_its_home() {
        let shelf = CopyBuffers::new(2 * KEEP_FROM as u64);
        let (mut bytes, home) = fresh(&shelf, KEEP_FROM, 1).into_parts();
        let at = bytes.as_ptr();
        // Taken apart, it is not on the shelf: a fetch of its length gets
        // other memory meanwhile.
        assert_eq!(shelf.stats().kept, 0);
        let other = fresh(&shelf, KEEP_FROM, 2);
        assert_ne!(other.as_ptr(), at);
        bytes.fill(7);
        home.take_back(bytes);
        let s = shelf.stats();
        assert_eq!((s.kept, s.kept_bytes, s.dropped), (1, KEEP_FROM as u64, 0));
        let again = shelf.reuse(KEEP_FROM).expect("handed back");
        assert_eq!(again.as_ptr(), at, "the same memory");
        assert!(again.iter().all(|&x| x == 7), "with what its holder wrote");
        // Handed back again, it is kept again; so is `other`; a third
        // buffer is over the budget of two: the oldest goes.
        let (bytes, home) = again.into_parts();
        home.take_back(bytes);
        drop(other);
        let (bytes, home) = shelf.adopt(vec![3; KEEP_FROM]).into_parts();
        home.take_back(bytes);
        let s = shelf.stats();
        assert_eq!(
            (s.kept, s.kept_bytes, s.dropped),
            (2, 2 * KEEP_FROM as u64, 1)
        );
        // A detached buffer's home is nowhere; a dropped shelf's takes
        // nothing back (and handing back to it is safe).
        let (bytes, home) = CopyBuf::detached(vec![0; KEEP_FROM]).into_parts();
        assert_eq!(format!("{home:?}"), "CopyHome(nowhere)");
        home.take_back(bytes);
        assert_eq!(shelf.stats().kept, 2);
        let (bytes, home) = shelf.adopt(vec![0; KEEP_FROM]).into_parts();
        assert_eq!(format!("{home:?}"), "CopyHome(a shelf)");
        drop(shelf);
        assert_eq!(format!("{home:?}"), "CopyHome(a shelf that is gone)");
        home.take_back(bytes);
    }

    #[test]
    fn a_smaller_budget_frees_what_no_longer_fits_and_zero_keeps_nothing() {
        let shelf = CopyBuffers::new(DEFAULT_BUDGET);
        let bufs: Vec<CopyBuf> = (0..4).map(|_| shelf.adopt(vec![0; KEEP_FROM])).collect();
        drop(bufs);
        shelf.set_budget(2 * KEEP_FROM as u64);
        assert_eq!(shelf.stats().kept, 2);
        shelf.set_budget(0);
        assert_eq!(shelf.stats().kept, 0);
        drop(shelf.adopt(vec![0; KEEP_FROM]));
        assert_eq!(shelf.stats().kept, 0);
        shelf.set_budget(DEFAULT_BUDGET);
        drop(shelf.adopt(vec![0; KEEP_FROM]));
        shelf.clear();
        assert_eq!(
            shelf.stats(),
            ShelfStats {
                kept: 0,
                kept_bytes: 0,
                reused: 0,
                fresh: 0,
                dropped: 5
            }
        );
    }
}
