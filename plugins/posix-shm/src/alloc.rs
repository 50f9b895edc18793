//! The pool's allocator: a pure data structure, no I/O, no `unsafe`.
//!
//! Space is handed out **warm first**: the lowest free gap that fits. Freed
//! space is reused before the pool's high-water mark moves, so a job that
//! puts and removes shards of similar sizes keeps writing the same pages,
//! which are backed, mapped and cached already; untouched pages (a page
//! fault and the kernel zeroing them, ~1.3 GB/s here) are paid only when
//! the live set grows. A cursor (`low`) below which every byte is occupied
//! makes the common case (a shard freed, one of the same size put) a
//! constant-time search. Every range that a live shard uses, or that a
//! retired shard still has leased, is kept in the occupied map, so reuse
//! only ever takes space nobody uses. Starts are aligned to [`ALIGN`]
//! bytes. A new range that would overlap an occupied one is a bug and trips
//! an `assert!`.

use std::collections::BTreeMap;

/// Alignment of every allocation: one cache line, so no two shards share a
/// line and vectorised copies start aligned.
pub(crate) const ALIGN: u64 = 64;

/// Warm-first (lowest fit) allocator over `[0, capacity)`.
#[derive(Debug, Clone)]
pub(crate) struct BumpAllocator {
    capacity: u64,
    /// Every byte below `low` is occupied: searches start here.
    low: u64,
    /// The end of the highest range ever handed out: pages below it have
    /// been written at least once.
    high_water: u64,
    used: u64,
    /// Occupied ranges, `start -> end` (exclusive), non-overlapping.
    ranges: BTreeMap<u64, u64>,
}

/// `v` rounded up to [`ALIGN`], `None` on overflow.
fn align_up(v: u64) -> Option<u64> {
    v.checked_add(ALIGN - 1).map(|x| x & !(ALIGN - 1))
}

impl BumpAllocator {
    /// An empty allocator over `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Self {
        BumpAllocator {
            capacity,
            low: 0,
            high_water: 0,
            used: 0,
            ranges: BTreeMap::new(),
        }
    }

    /// Total bytes managed.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes in occupied ranges (live, reserved or retired-but-leased).
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// The end of the highest range ever handed out.
    #[cfg(test)]
    pub(crate) fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Occupied ranges in address order, `(start, end)`.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// First aligned position at or after `from` where `len` bytes fit.
    fn find_from(&self, from: u64, len: u64) -> Option<u64> {
        let mut pos = align_up(from)?;
        // A range that starts before `pos` may still cover it.
        if let Some((_, &end)) = self.ranges.range(..pos).next_back() {
            if end > pos {
                pos = align_up(end)?;
            }
        }
        for (&start, &end) in self.ranges.range(pos..) {
            if end <= pos {
                continue;
            }
            if start >= pos && start - pos >= len {
                return Some(pos);
            }
            pos = pos.max(align_up(end)?);
        }
        (self.capacity >= pos && self.capacity - pos >= len).then_some(pos)
    }

    /// Reserves `len > 0` bytes and returns their aligned start, or `None`
    /// when no gap of the pool fits them.
    pub(crate) fn alloc(&mut self, len: u64) -> Option<u64> {
        assert!(len > 0, "zero-length shards take no pool space");
        let start = self.find_from(self.low, len)?;
        let end = start + len;
        assert!(
            end <= self.capacity,
            "allocation [{start}, {end}) past the pool"
        );
        let before = self.ranges.range(..=start).next_back();
        let after = self.ranges.range(start..).next();
        assert!(
            before.is_none_or(|(_, &e)| e <= start) && after.is_none_or(|(&s, _)| s >= end),
            "allocation [{start}, {end}) overlaps an occupied range ({before:?}, {after:?})"
        );
        self.ranges.insert(start, end);
        self.used += len;
        if Some(start) == align_up(self.low) {
            // Filled from the cursor: everything below `end` is occupied.
            self.low = end;
        }
        self.high_water = self.high_water.max(end);
        Some(start)
    }

    /// Frees the range starting at `start`; returns its length, `None` when
    /// no range starts there.
    pub(crate) fn free(&mut self, start: u64) -> Option<u64> {
        let end = self.ranges.remove(&start)?;
        let len = end - start;
        self.used -= len;
        self.low = self.low.min(start);
        Some(len)
    }

    /// The largest request that would succeed right now.
    pub(crate) fn largest_free_gap(&self) -> u64 {
        let mut best = 0;
        let mut prev_end = 0;
        let ends = self
            .ranges
            .iter()
            .map(|(&s, &e)| (s, e))
            .chain(std::iter::once((self.capacity, self.capacity)));
        for (start, end) in ends {
            if let Some(a) = align_up(prev_end) {
                best = best.max(start.saturating_sub(a));
            }
            prev_end = prev_end.max(end);
        }
        best
    }
}

/// Byte ranges of the pool already backed with real pages (`fallocate`).
///
/// tmpfs keeps a backed page for the segment's lifetime (nothing here
/// punches holes), so each byte needs backing once: after the allocator
/// has moved through the whole pool, a put pays no `fallocate` at all
/// (backing 256 MiB of pages that are already there walks 65536 page-cache
/// entries, ~50 ms here, as long as copying the bytes). Ranges are kept
/// disjoint and coalesced, so a fully backed pool is one entry.
#[derive(Debug, Clone, Default)]
pub(crate) struct BackedRanges {
    /// `start -> end` (exclusive), disjoint, never adjacent.
    ranges: BTreeMap<u64, u64>,
}

impl BackedRanges {
    /// The parts of `[start, end)` not backed yet, in order.
    pub(crate) fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = start;
        if let Some((_, &e)) = self.ranges.range(..=start).next_back() {
            pos = pos.max(e);
        }
        for (&s, &e) in self.ranges.range(start..end) {
            if pos >= end {
                break;
            }
            if s > pos {
                out.push((pos, s));
            }
            pos = pos.max(e);
        }
        if pos < end {
            out.push((pos, end));
        }
        out
    }

    /// Records `[start, end)` as backed.
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.ranges.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.ranges.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.ranges.range(s..=e).next() {
            e = e.max(ne);
            self.ranges.remove(&ns);
        }
        self.ranges.insert(s, e);
    }

    /// Number of disjoint ranges.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn backed_ranges_coalesce_and_report_gaps() {
        let mut b = BackedRanges::default();
        assert_eq!(b.gaps(0, 100), vec![(0, 100)]);
        b.insert(10, 20);
        b.insert(30, 40);
        assert_eq!(b.gaps(0, 100), vec![(0, 10), (20, 30), (40, 100)]);
        assert_eq!(b.gaps(12, 18), vec![]);
        assert_eq!(b.gaps(15, 35), vec![(20, 30)]);
        b.insert(20, 30);
        assert_eq!(b.len(), 1);
        assert_eq!(b.gaps(10, 40), vec![]);
        b.insert(0, 100);
        assert_eq!((b.len(), b.gaps(0, 100)), (1, vec![]));
    }

    proptest! {
        #[test]
        fn backed_ranges_match_a_bitmap(
            ops in proptest::collection::vec((0u64..200, 0u64..40), 1..60),
            probe in (0u64..200, 0u64..60),
        ) {
            let mut b = BackedRanges::default();
            let mut model = [false; 260];
            for (s, l) in ops {
                b.insert(s, s + l);
                for m in &mut model[s as usize..(s + l) as usize] {
                    *m = true;
                }
            }
            let (ps, pl) = probe;
            let mut expect = Vec::new();
            let mut i = ps;
            while i < ps + pl {
                if model[i as usize] {
                    i += 1;
                    continue;
                }
                let from = i;
                while i < ps + pl && !model[i as usize] {
                    i += 1;
                }
                expect.push((from, i));
            }
            prop_assert_eq!(b.gaps(ps, ps + pl), expect);
            let mut prev_end = None;
            for (&s, &e) in &b.ranges {
                prop_assert!(s < e);
                prop_assert!(prev_end.is_none_or(|p| p < s), "adjacent or overlapping");
                prev_end = Some(e);
            }
        }
    }

    #[test]
    fn freed_space_is_reused_before_the_pool_grows() {
        let mut a = BumpAllocator::new(1024);
        assert_eq!(a.alloc(100), Some(0));
        assert_eq!(a.alloc(10), Some(128));
        assert_eq!(a.alloc(64), Some(192));
        assert_eq!(a.high_water(), 256);
        a.free(0).unwrap();
        // The warm gap at 0 is reused; the high-water mark stays.
        assert_eq!(a.alloc(100), Some(0));
        assert_eq!(a.high_water(), 256);
        // Too big for any gap below the mark: the pool grows.
        assert_eq!(a.alloc(600), Some(256));
        assert_eq!(a.high_water(), 856);
        // A gap too small is skipped, the next one that fits is taken.
        a.free(128).unwrap();
        assert_eq!(a.alloc(100), Some(896));
        assert_eq!(a.alloc(10), Some(128));
        assert_eq!(a.used(), 100 + 10 + 64 + 600 + 100);
    }

    #[test]
    fn full_pool_reports_largest_gap() {
        let mut a = BumpAllocator::new(256);
        let x = a.alloc(64).unwrap();
        let _y = a.alloc(64).unwrap();
        let _z = a.alloc(128).unwrap();
        assert_eq!(a.alloc(1), None);
        assert_eq!(a.largest_free_gap(), 0);
        a.free(x);
        assert_eq!(a.largest_free_gap(), 64);
        assert_eq!(a.alloc(65), None);
        assert_eq!(a.alloc(64), Some(0));
    }

    #[test]
    fn unaligned_capacity_and_exact_fit() {
        let mut a = BumpAllocator::new(100);
        assert_eq!(a.alloc(100), Some(0));
        assert_eq!(a.alloc(1), None);
        a.free(0);
        assert_eq!(a.alloc(36), Some(0));
        assert_eq!(a.alloc(36), Some(64));
        assert_eq!(a.largest_free_gap(), 0);
    }

    #[test]
    fn free_unknown_start_is_none() {
        let mut a = BumpAllocator::new(1024);
        a.alloc(10);
        assert_eq!(a.free(64), None);
        assert_eq!(a.free(0), Some(10));
        assert_eq!(a.free(0), None);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        /// Free the n-th live range (mod count).
        Free(usize),
        /// Retire the n-th live range under a lease: it stays occupied.
        Retain(usize),
        /// Release the n-th retained range: now it is freed.
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..300).prop_map(Op::Alloc),
            1 => (1u64..3000).prop_map(Op::Alloc),
            2 => any::<usize>().prop_map(Op::Free),
            1 => any::<usize>().prop_map(Op::Retain),
            1 => any::<usize>().prop_map(Op::Release),
        ]
    }

    /// Largest aligned gap, computed from the model alone.
    fn model_largest_gap(capacity: u64, ranges: &[(u64, u64)]) -> u64 {
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        let mut best = 0;
        let mut prev = 0u64;
        for (s, e) in sorted.into_iter().chain([(capacity, capacity)]) {
            let a = prev.div_ceil(ALIGN) * ALIGN;
            best = best.max(s.saturating_sub(a));
            prev = prev.max(e);
        }
        best
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_overlaps_always_aligned_fails_only_when_full(
            capacity in 64u64..8192,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut a = BumpAllocator::new(capacity);
            let mut live: Vec<(u64, u64)> = Vec::new();
            let mut retained: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(len) => {
                        let occupied: Vec<_> = live.iter().chain(&retained).copied().collect();
                        let largest = model_largest_gap(capacity, &occupied);
                        match a.alloc(len) {
                            Some(start) => {
                                let end = start + len;
                                prop_assert_eq!(start % ALIGN, 0);
                                prop_assert!(end <= capacity);
                                for &(s, e) in &occupied {
                                    prop_assert!(end <= s || start >= e,
                                        "[{}, {}) overlaps [{}, {})", start, end, s, e);
                                }
                                live.push((start, end));
                            }
                            None => prop_assert!(largest < len,
                                "refused {} bytes with a {}-byte gap", len, largest),
                        }
                        prop_assert_eq!(a.largest_free_gap(), model_largest_gap(
                            capacity, &live.iter().chain(&retained).copied().collect::<Vec<_>>()));
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (s, e) = live.swap_remove(i % live.len());
                        prop_assert_eq!(a.free(s), Some(e - s));
                    }
                    Op::Retain(i) if !live.is_empty() => {
                        let r = live.swap_remove(i % live.len());
                        retained.push(r);
                    }
                    Op::Release(i) if !retained.is_empty() => {
                        let (s, e) = retained.swap_remove(i % retained.len());
                        prop_assert_eq!(a.free(s), Some(e - s));
                    }
                    _ => {}
                }
                let used: u64 = live.iter().chain(&retained).map(|(s, e)| e - s).sum();
                prop_assert_eq!(a.used(), used);
                let mut prev_end = 0;
                for (s, e) in a.ranges() {
                    prop_assert!(s >= prev_end && e > s && e <= capacity);
                    prev_end = e;
                }
            }
        }

        #[test]
        fn the_lowest_fitting_gap_is_always_taken(
            ops in proptest::collection::vec((1u64..300, any::<bool>()), 1..80),
        ) {
            // Against a model that scans every gap from address 0: the
            // cursor never skips a gap the full scan would take.
            let mut a = BumpAllocator::new(8 << 10);
            let mut live: Vec<u64> = Vec::new();
            for (len, free_one) in ops {
                if free_one && !live.is_empty() {
                    let start = live.remove(len as usize % live.len());
                    a.free(start).unwrap();
                    continue;
                }
                let expected = a.find_from(0, len);
                let got = a.alloc(len);
                prop_assert_eq!(got, expected);
                live.extend(got);
            }
        }
    }
}
