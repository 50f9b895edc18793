//! The consumer's cache of opened IPC memory handles: pure logic, generic
//! over the driver calls it needs ([`Opener`]), so it is tested without a GPU.
//!
//! # Why a cache
//! A CUDA IPC memory handle names a whole allocation and can be opened only
//! once per process (and context): a second `cuIpcOpenMemHandle` of the same
//! allocation fails. Shards that share an allocation (a framework's caching
//! allocator packs many tensors into one block) must share one mapping, so
//! mappings are cached per (owner process, allocation) with a reference
//! count of the views using them.
//!
//! # Staleness
//! An owner may free an allocation and later allocate another one that the
//! driver describes with the same handle bytes (or at the same address). Each
//! allocation carries the owner's *generation* (its CUDA buffer id, never
//! reused within a process), so a descriptor with known handle bytes but a
//! new generation marks the old entry **stale**: it is never handed out
//! again, it is closed as soon as its last view is released (at once when
//! none is), and the new allocation is opened afresh.
//!
//! # Policy
//! [`Policy::Keep`] keeps idle mappings open (a later fetch of the same
//! allocation costs no open) up to `max_idle` idle entries, closing the
//! least recently used beyond that; [`Policy::CloseOnRelease`] closes a
//! mapping when its last view is released. Entries of owners that died are
//! closed by [`OpenCache::sweep`] once idle.

use std::collections::HashMap;

/// The driver calls the cache makes. The real ones wrap `cuIpcOpenMemHandle`
/// / `cuIpcCloseMemHandle` (legacy IPC, the handle its 64 bytes) and the
/// VMM import and mapping (the handle where to ask for the chunks); tests
/// use a fake (no real driver can exist on a machine without a GPU).
pub trait Opener {
    /// What opens an allocation; compared to tell a forged descriptor.
    type Handle: Clone + PartialEq + std::fmt::Debug;
    /// Error of a driver call.
    type Error: std::fmt::Display;
    /// Opens a handle; returns the allocation's base address here.
    fn open(&mut self, handle: &Self::Handle) -> Result<u64, Self::Error>;
    /// Closes a mapping returned by `open`, with no view left on it.
    fn close(&mut self, base: u64) -> Result<(), Self::Error>;
}

/// One owner process: boot id, pid and process start time (so a reused pid
/// is another owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerKey {
    /// Owner's boot id.
    pub boot_id: [u8; 16],
    /// Owner's pid.
    pub pid: u32,
    /// Owner's epoch (process start time).
    pub epoch: u64,
}

/// One allocation of one owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllocKey {
    /// The owner process.
    pub owner: OwnerKey,
    /// The owner's allocation generation (buffer id).
    pub generation: u64,
}

/// When idle mappings are closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Keep up to `max_idle` idle mappings open, closing the least recently used.
    Keep {
        /// Most idle (unreferenced) mappings kept open.
        max_idle: usize,
    },
    /// Close a mapping when its last view is released.
    CloseOnRelease,
}

#[derive(Debug)]
struct Entry<H> {
    base: u64,
    handle: H,
    refs: u32,
    stale: bool,
    last_used: u64,
}

/// How an acquire was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The allocation's base address in this process.
    pub base: u64,
    /// True when this call opened the handle (first open of the allocation).
    pub opened: bool,
    /// Stale entries (freed and reallocated by the owner) this call retired.
    pub retired_stale: u32,
}

/// Errors of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// The driver refused to open the handle.
    Open(String),
    /// The same allocation arrived with different handle bytes: one of the
    /// two descriptors is forged or corrupt.
    HandleMismatch,
    /// `release` of an allocation that holds no reference.
    NotAcquired,
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheError::Open(e) => write!(f, "cannot open the IPC memory handle: {e}"),
            CacheError::HandleMismatch => f.write_str(
                "the descriptor's memory handle differs from the one already open for the same \
                 owner allocation (forged or corrupt descriptor)",
            ),
            CacheError::NotAcquired => f.write_str("no view of this allocation is held"),
        }
    }
}

/// Counters of what the cache did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Handles opened.
    pub opens: u64,
    /// Mappings closed.
    pub closes: u64,
    /// Acquires served by an open mapping.
    pub hits: u64,
    /// Entries found stale.
    pub stale: u64,
    /// Close calls the driver refused (logged; the entry is dropped).
    pub close_errors: u64,
}

/// The cache of opened allocations.
#[derive(Debug)]
pub struct OpenCache<O: Opener> {
    opener: O,
    policy: Policy,
    live: HashMap<AllocKey, Entry<O::Handle>>,
    /// Stale entries still referenced, closed on their last release (a
    /// list: a key can be retired more than once if its owner reuses handle
    /// bytes across generations).
    retired: Vec<(AllocKey, Entry<O::Handle>)>,
    tick: u64,
    counters: CacheCounters,
}

impl<O: Opener> OpenCache<O> {
    /// An empty cache.
    pub fn new(opener: O, policy: Policy) -> Self {
        OpenCache {
            opener,
            policy,
            live: HashMap::new(),
            retired: Vec::new(),
            tick: 0,
            counters: CacheCounters::default(),
        }
    }

    /// The driver (tests inspect the fake).
    pub fn opener(&self) -> &O {
        &self.opener
    }

    /// What the cache did so far.
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    /// Open mappings (live and retired).
    pub fn open_count(&self) -> usize {
        self.live.len() + self.retired.len()
    }

    /// Views held across all mappings.
    pub fn refs(&self) -> u64 {
        self.live
            .values()
            .chain(self.retired.iter().map(|(_, e)| e))
            .map(|e| u64::from(e.refs))
            .sum()
    }

    /// Takes a reference on `key`'s mapping, opening `handle` if needed.
    pub fn acquire(&mut self, key: AllocKey, handle: &O::Handle) -> Result<Acquired, CacheError> {
        self.tick += 1;
        let tick = self.tick;
        if let Some(e) = self.live.get_mut(&key) {
            if e.handle != *handle {
                return Err(CacheError::HandleMismatch);
            }
            e.refs += 1;
            e.last_used = tick;
            self.counters.hits += 1;
            return Ok(Acquired {
                base: e.base,
                opened: false,
                retired_stale: 0,
            });
        }
        // A new generation with handle bytes we hold open for an older
        // generation of the same owner: the owner freed and reallocated.
        let stale: Vec<AllocKey> = self
            .live
            .iter()
            .filter(|(k, e)| {
                k.owner == key.owner && k.generation != key.generation && e.handle == *handle
            })
            .map(|(k, _)| *k)
            .collect();
        let retired_stale = stale.len() as u32;
        for k in stale {
            self.counters.stale += 1;
            self.retire(k);
        }
        let base = self
            .opener
            .open(handle)
            .map_err(|e| CacheError::Open(e.to_string()))?;
        self.counters.opens += 1;
        self.live.insert(
            key,
            Entry {
                base,
                handle: handle.clone(),
                refs: 1,
                stale: false,
                last_used: tick,
            },
        );
        Ok(Acquired {
            base,
            opened: true,
            retired_stale,
        })
    }

    /// Drops a reference taken by `acquire`; closes the mapping when the
    /// policy (or staleness) says so. When one key has both a retired and a
    /// live mapping (an owner that broke the contract), the retired one is
    /// released: use [`release_at`](Self::release_at) to say which.
    pub fn release(&mut self, key: AllocKey) -> Result<(), CacheError> {
        self.release_where(key, None)
    }

    /// [`release`](Self::release) of the mapping at `base` (what `acquire`
    /// returned), so a reference is never taken off the wrong mapping of a
    /// key that is both retired and live.
    pub fn release_at(&mut self, key: AllocKey, base: u64) -> Result<(), CacheError> {
        self.release_where(key, Some(base))
    }

    fn release_where(&mut self, key: AllocKey, base: Option<u64>) -> Result<(), CacheError> {
        // Mappings open at the same time have distinct bases, so `base`
        // picks exactly one.
        let retired = self
            .retired
            .iter()
            .position(|(k, e)| *k == key && base.is_none_or(|b| b == e.base));
        if let Some(i) = retired {
            let e = &mut self.retired[i].1;
            e.refs -= 1;
            if e.refs == 0 {
                let (_, e) = self.retired.swap_remove(i);
                self.close_entry(&e);
            }
            return Ok(());
        }
        let e = self
            .live
            .get_mut(&key)
            .filter(|e| base.is_none_or(|b| b == e.base))
            .ok_or(CacheError::NotAcquired)?;
        if e.refs == 0 {
            return Err(CacheError::NotAcquired);
        }
        e.refs -= 1;
        if e.refs == 0 {
            match self.policy {
                Policy::CloseOnRelease => {
                    let e = self.live.remove(&key).expect("present");
                    self.close_entry(&e);
                }
                Policy::Keep { max_idle } => self.trim_idle(max_idle),
            }
        }
        Ok(())
    }

    /// Hands `key`'s mapping out no more (its owner withdrew the export):
    /// closed now when idle, else on its last release. False when `key` has
    /// no live mapping.
    pub fn retire(&mut self, key: AllocKey) -> bool {
        let Some(mut e) = self.live.remove(&key) else {
            return false;
        };
        e.stale = true;
        if e.refs == 0 {
            self.close_entry(&e);
        } else {
            self.retired.push((key, e));
        }
        true
    }

    /// Retires every idle mapping whose handle `withdrawn` says its owner
    /// no longer exports; returns how many (closed at once: they are idle).
    pub fn retire_idle_where(&mut self, mut withdrawn: impl FnMut(&O::Handle) -> bool) -> usize {
        let gone: Vec<AllocKey> = self
            .live
            .iter()
            .filter(|(_, e)| e.refs == 0 && withdrawn(&e.handle))
            .map(|(k, _)| *k)
            .collect();
        for k in &gone {
            self.retire(*k);
        }
        gone.len()
    }

    /// Closes idle mappings of owners `is_alive` says are gone; returns how many.
    pub fn sweep(&mut self, mut is_alive: impl FnMut(&OwnerKey) -> bool) -> usize {
        let dead: Vec<AllocKey> = self
            .live
            .iter()
            .filter(|(k, e)| e.refs == 0 && !is_alive(&k.owner))
            .map(|(k, _)| *k)
            .collect();
        for k in &dead {
            let e = self.live.remove(k).expect("listed");
            self.close_entry(&e);
        }
        dead.len()
    }

    /// Closes every idle mapping; returns how many.
    pub fn close_idle(&mut self) -> usize {
        self.sweep(|_| false)
    }

    fn trim_idle(&mut self, max_idle: usize) {
        let mut idle: Vec<(u64, AllocKey)> = self
            .live
            .iter()
            .filter(|(_, e)| e.refs == 0)
            .map(|(k, e)| (e.last_used, *k))
            .collect();
        if idle.len() <= max_idle {
            return;
        }
        idle.sort();
        let excess = idle.len() - max_idle;
        for (_, k) in idle.into_iter().take(excess) {
            let e = self.live.remove(&k).expect("listed");
            self.close_entry(&e);
        }
    }

    fn close_entry(&mut self, e: &Entry<O::Handle>) {
        debug_assert_eq!(e.refs, 0, "closing a mapping with views");
        self.counters.closes += 1;
        if let Err(err) = self.opener.close(e.base) {
            self.counters.close_errors += 1;
            tracing::warn!(target: "cuda_ipc", base = e.base, stale = e.stale, error = %err, "closing an IPC mapping failed");
        }
    }
}

impl<O: Opener> Drop for OpenCache<O> {
    /// Closes every mapping. Views hold the transport alive, so none is
    /// left when the cache (owned by the transport) is dropped.
    fn drop(&mut self) {
        let live: Vec<Entry<O::Handle>> = self.live.drain().map(|(_, e)| e).collect();
        let retired: Vec<Entry<O::Handle>> = self.retired.drain(..).map(|(_, e)| e).collect();
        for e in live.iter().chain(retired.iter()) {
            if let Err(err) = self.opener.close(e.base) {
                tracing::warn!(target: "cuda_ipc", base = e.base, error = %err, "closing an IPC mapping at shutdown failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The real driver cannot exist on a machine without a GPU, so these
    //! tests use `FakeOpener`, a declared mock that models the one rule that
    //! matters: a handle may be open at most once per process.

    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;
    use crate::sys::IPC_HANDLE_LEN;

    #[derive(Debug, Default)]
    struct FakeOpener {
        open: HashMap<u64, [u8; IPC_HANDLE_LEN]>,
        next: u64,
        opens: u32,
        fail_next_open: bool,
    }

    impl Opener for FakeOpener {
        type Handle = [u8; IPC_HANDLE_LEN];
        type Error = String;
        fn open(&mut self, handle: &[u8; IPC_HANDLE_LEN]) -> Result<u64, String> {
            if std::mem::take(&mut self.fail_next_open) {
                return Err("CUDA_ERROR_INVALID_HANDLE".into());
            }
            if self.open.values().any(|h| h == handle) {
                return Err("CUDA_ERROR_ALREADY_MAPPED: handle opened twice".into());
            }
            self.next += 0x10_0000;
            self.opens += 1;
            self.open.insert(self.next, *handle);
            Ok(self.next)
        }
        fn close(&mut self, base: u64) -> Result<(), String> {
            self.open
                .remove(&base)
                .map(|_| ())
                .ok_or_else(|| format!("close of unknown base {base:#x}"))
        }
    }

    fn owner(pid: u32) -> OwnerKey {
        OwnerKey {
            boot_id: [1; 16],
            pid,
            epoch: 7,
        }
    }

    fn key(pid: u32, generation: u64) -> AllocKey {
        AllocKey {
            owner: owner(pid),
            generation,
        }
    }

    fn h(b: u8) -> [u8; IPC_HANDLE_LEN] {
        [b; IPC_HANDLE_LEN]
    }

    fn keep() -> OpenCache<FakeOpener> {
        OpenCache::new(FakeOpener::default(), Policy::Keep { max_idle: 8 })
    }

    #[test]
    fn opens_once_and_counts_references() {
        let mut c = keep();
        let a = c.acquire(key(1, 1), &h(1)).unwrap();
        assert!(a.opened);
        let b = c.acquire(key(1, 1), &h(1)).unwrap();
        assert!(!b.opened, "second acquire must reuse the mapping");
        assert_eq!(a.base, b.base);
        assert_eq!(c.opener().opens, 1);
        assert_eq!(c.refs(), 2);
        c.release(key(1, 1)).unwrap();
        c.release(key(1, 1)).unwrap();
        assert_eq!(c.refs(), 0);
        assert_eq!(c.open_count(), 1, "keep policy keeps the idle mapping");
        assert_eq!(c.release(key(1, 1)), Err(CacheError::NotAcquired));
        assert!(!c.acquire(key(1, 1), &h(1)).unwrap().opened);
    }

    #[test]
    fn release_at_takes_the_reference_off_the_right_mapping() {
        let mut c = keep();
        // (1, 1) is retired with a view held, then the same key opens again
        // with other handle bytes (an owner that broke the contract).
        let old = c.acquire(key(1, 1), &h(5)).unwrap();
        // Retires (1, 1); the fake refuses the second open of h(5).
        c.acquire(key(1, 2), &h(5)).unwrap_err();
        let new = c.acquire(key(1, 1), &h(6)).unwrap();
        assert!(new.opened);
        assert_ne!(old.base, new.base);
        c.release_at(key(1, 1), new.base).unwrap();
        assert!(
            c.opener().open.contains_key(&old.base),
            "the retired mapping still has its view"
        );
        c.release_at(key(1, 1), old.base).unwrap();
        assert!(
            !c.opener().open.contains_key(&old.base),
            "last view of the retired mapping closes it"
        );
        assert_eq!(
            c.release_at(key(1, 1), old.base),
            Err(CacheError::NotAcquired)
        );
    }

    #[test]
    fn close_on_release_closes_on_last_release() {
        let mut c = OpenCache::new(FakeOpener::default(), Policy::CloseOnRelease);
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.release(key(1, 1)).unwrap();
        assert_eq!(c.opener().open.len(), 1);
        c.release(key(1, 1)).unwrap();
        assert!(c.opener().open.is_empty(), "last release closes");
        assert_eq!(c.counters().closes, 1);
    }

    #[test]
    fn new_generation_with_the_same_handle_retires_the_stale_mapping() {
        let mut c = keep();
        // Idle stale entry: closed at once, the new one opens.
        c.acquire(key(1, 1), &h(5)).unwrap();
        c.release(key(1, 1)).unwrap();
        let a = c.acquire(key(1, 2), &h(5)).unwrap();
        assert!(a.opened);
        assert_eq!(a.retired_stale, 1);
        assert_eq!(c.open_count(), 1);
        assert_eq!(c.counters().stale, 1);
    }

    #[test]
    fn stale_mapping_with_views_closes_on_its_last_release() {
        let mut c = OpenCache::new(FakeOpener::default(), Policy::Keep { max_idle: 8 });
        c.acquire(key(1, 1), &h(5)).unwrap();
        // The fake refuses a second open of the same handle bytes while the
        // first is open, as the driver does: the new generation's open fails,
        // but the stale entry is retired and never handed out again.
        let e = c.acquire(key(1, 2), &h(5)).unwrap_err();
        assert!(
            matches!(e, CacheError::Open(ref m) if m.contains("ALREADY_MAPPED")),
            "{e:?}"
        );
        assert_eq!(
            c.open_count(),
            1,
            "the stale mapping stays while a view holds it"
        );
        c.release(key(1, 1)).unwrap();
        assert_eq!(c.open_count(), 0, "closed on its last release");
        assert!(c.acquire(key(1, 2), &h(5)).unwrap().opened);
        // The old generation is gone for good.
        assert_eq!(c.release(key(1, 1)), Err(CacheError::NotAcquired));
    }

    #[test]
    fn same_allocation_with_other_handle_bytes_is_refused() {
        let mut c = keep();
        c.acquire(key(1, 1), &h(1)).unwrap();
        assert_eq!(c.acquire(key(1, 1), &h(2)), Err(CacheError::HandleMismatch));
    }

    #[test]
    fn owners_are_separate_and_sweep_closes_dead_owners_idle_mappings() {
        let mut c = keep();
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.acquire(key(2, 1), &h(2)).unwrap();
        c.release(key(1, 1)).unwrap();
        c.release(key(2, 1)).unwrap();
        assert_eq!(c.open_count(), 2);
        assert_eq!(c.sweep(|o| o.pid == 2), 1);
        assert_eq!(c.open_count(), 1);
        assert_eq!(c.close_idle(), 1);
        assert!(c.opener().open.is_empty());
    }

    #[test]
    fn failed_open_leaves_no_entry() {
        let mut c = keep();
        c.opener = FakeOpener {
            fail_next_open: true,
            ..FakeOpener::default()
        };
        assert!(matches!(
            c.acquire(key(1, 1), &h(1)),
            Err(CacheError::Open(_))
        ));
        assert_eq!(c.open_count(), 0);
        assert!(c.acquire(key(1, 1), &h(1)).unwrap().opened);
    }

    #[test]
    fn a_retired_mapping_closes_at_once_when_idle_and_at_its_last_release_otherwise() {
        let mut c = keep();
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.release(key(1, 1)).unwrap();
        assert_eq!(c.open_count(), 1, "kept idle");
        assert!(c.retire(key(1, 1)));
        assert_eq!(c.open_count(), 0, "idle: closed at once");
        assert!(!c.retire(key(1, 1)), "nothing left to retire");
        let a = c.acquire(key(1, 2), &h(2)).unwrap();
        assert!(c.retire(key(1, 2)));
        assert_eq!(c.open_count(), 1, "still viewed");
        // A new acquire of the key opens afresh; the retired one is not handed out.
        let b = c.acquire(key(1, 2), &h(2)).unwrap_err();
        assert!(
            matches!(b, CacheError::Open(_)),
            "the fake refuses a second open of one handle"
        );
        c.release_at(key(1, 2), a.base).unwrap();
        assert_eq!(c.open_count(), 0);
        assert_eq!(c.counters().closes, 2);
    }

    #[test]
    fn retire_idle_where_closes_only_idle_withdrawn_mappings() {
        let mut c = keep();
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.acquire(key(1, 2), &h(2)).unwrap();
        c.acquire(key(1, 3), &h(3)).unwrap();
        c.release(key(1, 1)).unwrap();
        c.release(key(1, 3)).unwrap();
        // 1 and 2 withdrawn; 2 is still viewed, 3 is idle but exported.
        assert_eq!(c.retire_idle_where(|h| h[0] != 3), 1);
        assert_eq!(c.open_count(), 2);
        assert!(!c.acquire(key(1, 3), &h(3)).unwrap().opened, "3 kept");
    }

    #[test]
    fn dropping_the_cache_closes_everything() {
        use std::sync::{Arc, Mutex};
        /// Records closes in a shared list, so they are visible after the drop.
        struct Recording(Arc<Mutex<Vec<u64>>>, u64);
        impl Opener for Recording {
            type Handle = [u8; IPC_HANDLE_LEN];
            type Error = String;
            fn open(&mut self, _h: &[u8; IPC_HANDLE_LEN]) -> Result<u64, String> {
                self.1 += 1;
                Ok(self.1)
            }
            fn close(&mut self, base: u64) -> Result<(), String> {
                self.0.lock().unwrap().push(base);
                Ok(())
            }
        }
        let closed = Arc::new(Mutex::new(Vec::new()));
        let mut c = OpenCache::new(
            Recording(Arc::clone(&closed), 0),
            Policy::Keep { max_idle: 8 },
        );
        c.acquire(key(1, 1), &h(1)).unwrap();
        c.acquire(key(1, 2), &h(2)).unwrap();
        c.release(key(1, 2)).unwrap();
        drop(c);
        let mut v = closed.lock().unwrap().clone();
        v.sort();
        assert_eq!(v, [1, 2]);
    }

    #[test]
    fn keep_policy_bounds_idle_mappings_lru() {
        let mut c = OpenCache::new(FakeOpener::default(), Policy::Keep { max_idle: 2 });
        for g in 1..=3u8 {
            c.acquire(key(1, u64::from(g)), &h(g)).unwrap();
            c.release(key(1, u64::from(g))).unwrap();
        }
        assert_eq!(c.open_count(), 2);
        // The least recently used (generation 1) went.
        assert!(c.acquire(key(1, 1), &h(1)).unwrap().opened);
    }

    proptest! {
        /// Under any sequence of acquires and releases: a handle is never
        /// open twice (the fake would refuse), references never go negative,
        /// and with no view left and `close_idle`, nothing stays open.
        #[test]
        fn invariants_hold(ops in proptest::collection::vec((0u8..3, 1u64..4, 0u8..3, any::<bool>()), 1..80)) {
            let mut c = OpenCache::new(FakeOpener::default(), Policy::Keep { max_idle: 2 });
            let mut held: Vec<AllocKey> = Vec::new();
            for (pid, generation, hb, acquire) in ops {
                let k = key(u32::from(pid) + 1, generation);
                // Handle bytes are a function of (owner, hb): a reallocation
                // may reuse them under a new generation.
                let handle = h(pid * 10 + hb);
                if acquire {
                    if c.acquire(k, &handle).is_ok() {
                        held.push(k);
                    }
                } else if let Some(i) = held.iter().position(|x| *x == k) {
                    prop_assert!(c.release(k).is_ok());
                    held.remove(i);
                }
                prop_assert_eq!(c.refs(), held.len() as u64);
                let open: HashSet<_> = c.opener().open.values().collect();
                prop_assert_eq!(open.len(), c.opener().open.len());
                prop_assert_eq!(c.opener().open.len(), c.open_count());
            }
            for k in held.drain(..) {
                prop_assert!(c.release(k).is_ok());
            }
            c.close_idle();
            prop_assert_eq!(c.open_count(), 0);
            prop_assert!(c.opener().open.is_empty());
        }
    }
}
