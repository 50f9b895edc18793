//! Every `unsafe` operation of this crate, under safe owning types.
//!
//! # Overview
//! [`OwnedSegment`] is one POSIX shared-memory object: its name, its mapping
//! (none for a zero-length segment) and whether this value *owns the name*.
//! A segment this process created exclusively owns its name and unlinks it in
//! `Drop`; a segment opened from a peer's descriptor never does. Ownership is
//! a value: there are no module-level tables of handles, so dropping the
//! transport that holds the values is the whole cleanup story.
//!
//! # What the safe API relies on
//! - A mapping lives exactly as long as its `OwnedSegment`; every pointer and
//!   reference handed out borrows the segment or is documented (in the
//!   transport's memory contracts) to be used only while the owning value is
//!   alive.
//! - Memory shared with other processes is only touched in two ways: through
//!   `AtomicU64` (the lease board, where every access is atomic in every
//!   process), or by bulk copies through raw pointers ([`PeerSegment::copy_out`],
//!   [`OwnedSegment::write_export_data`]). No `&[u8]` or `&mut [u8]` to shared
//!   memory is ever formed here, so a peer that breaks the lease protocol can
//!   make us copy torn bytes, never observe a reference change under it.
//!   The lease protocol (see `board`) is what keeps the copied range stable.
//! - Consumers map peers' data segments read-only ([`PeerSegment`], over the
//!   plugin kit's `ReadOnlyMap`, whose `unsafe` constructor is called here
//!   with the lease protocol as its reason); only the lease board is mapped
//!   writable on both sides.
//!
//! The pidfd the crash-safety checks rely on ([`PidFd`]) and the sweep's
//! [`unlink_segment`] are safe calls; they live here so that every system
//! call of the crate is in one module (`kill(pid, 0)` is the plugin kit's,
//! `shardport_kit::lease::liveness::System`).
//!
//! # Failure modes
//! Every system call failure comes back as a [`SysError`] naming the call;
//! callers turn it into an actionable `AbiError` (see `errors`). A peer that
//! shrinks a segment we have mapped makes later reads fault (`SIGBUS`): this is
//! inherent to `mmap` and is why consumers only map segments whose names carry
//! their own configured prefix (segments of the same user, created `0600`).

use std::{fmt, os::fd::AsRawFd, ptr::NonNull, sync::atomic::AtomicU64};

use rustix::{
    event::{PollFd, PollFlags, Timespec},
    fd::OwnedFd,
    fs::{self, FallocateFlags, Mode},
    io::Errno,
    process::{self, Pid, PidfdFlags},
    shm,
};
use shardport_abi::{ExportRequest, Region};
use shardport_kit::ReadOnlyMap;

/// A failed system call: which one, and the OS error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SysError {
    /// The call (`shm_open`, `ftruncate`, `fallocate`, `fstat`, `mmap`).
    pub op: &'static str,
    /// The OS error.
    pub errno: Errno,
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.op,
            std::io::Error::from(self.errno)
        )
    }
}

fn fail(op: &'static str) -> impl FnOnce(Errno) -> SysError {
    move |errno| SysError { op, errno }
}

/// [`fail`] for the `std::io::Error`s of the memory-map layer.
fn io_fail(op: &'static str) -> impl FnOnce(std::io::Error) -> SysError {
    move |e| SysError {
        op,
        errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
    }
}

/// One read-write `mmap`ed region of a shared-memory object, unmapped on
/// drop (by the raw map it holds: other processes write the same memory,
/// so it is only reached through raw pointers and atomics, never a Rust
/// reference that could change under it).
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    _map: memmap2::MmapRaw,
}

// SAFETY: `Mapping` is an address range owned by this value; the memory is a
// MAP_SHARED mapping that any thread may read (and, for `ReadWrite`, write
// through the raw-pointer and atomic APIs below, which do not create aliasing
// references). Nothing in it is thread-affine.
unsafe impl Send for Mapping {}
// SAFETY: shared access only reads through raw pointers or atomics, see above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len > 0` bytes of `fd` from offset 0, read-write.
    fn new(fd: &OwnedFd, len: usize) -> Result<Mapping, SysError> {
        debug_assert!(len > 0, "zero-length mappings are represented by `None`");
        // A fresh, kernel-chosen range (`MAP_SHARED`, read-write), so it
        // cannot alias any Rust allocation; the fd is a shared-memory object
        // of at least `len` bytes (the callers size it with ftruncate or
        // fstat first).
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(fd.as_raw_fd())
            .map_err(io_fail("mmap"))?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or(SysError {
            op: "mmap",
            errno: Errno::FAULT,
        })?;
        Ok(Mapping {
            ptr,
            len,
            _map: map,
        })
    }
}

/// A POSIX shared-memory object: name, optional descriptor, mapping and
/// whether this value owns (and so unlinks) the name.
pub(crate) struct OwnedSegment {
    name: String,
    /// Kept only where later calls need it (`fallocate` on the pool).
    fd: Option<OwnedFd>,
    /// `None` for a zero-length segment (`mmap` refuses length 0).
    map: Option<Mapping>,
    size: u64,
    owns_name: bool,
}

impl fmt::Debug for OwnedSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedSegment")
            .field("name", &self.name)
            .field("size", &self.size)
            .field("owns_name", &self.owns_name)
            .finish_non_exhaustive()
    }
}

impl OwnedSegment {
    /// Creates `name` exclusively (`O_CREAT | O_EXCL`, mode `0600`), sizes it
    /// to `size` bytes with `ftruncate` (sparse: no page is touched) and maps
    /// it read-write. The value owns the name from the moment `shm_open`
    /// succeeds, so a later failure unlinks it again.
    pub(crate) fn create(name: &str, size: u64) -> Result<OwnedSegment, SysError> {
        let len = usize::try_from(size).map_err(|_| SysError {
            op: "mmap",
            errno: Errno::NOMEM,
        })?;
        let fd = shm::open(
            name,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(fail("shm_open"))?;
        let mut seg = OwnedSegment {
            name: name.to_owned(),
            fd: Some(fd),
            map: None,
            size,
            owns_name: true,
        };
        let fd = seg.fd.as_ref().expect("just set");
        fs::ftruncate(fd, size).map_err(fail("ftruncate"))?;
        if len > 0 {
            seg.map = Some(Mapping::new(fd, len)?);
        }
        Ok(seg)
    }

    /// Opens a peer's segment `name` read-write (a lease board) and maps
    /// all of it (its real size, from `fstat`). The value does not own the
    /// name: dropping it unmaps, never unlinks. The descriptor is closed once
    /// mapped. Peers' data segments are opened read-only as [`PeerSegment`]s.
    pub(crate) fn open(name: &str) -> Result<OwnedSegment, SysError> {
        let (fd, size, len) = open_sized(name, shm::OFlags::RDWR)?;
        let map = if len > 0 {
            Some(Mapping::new(&fd, len)?)
        } else {
            None
        };
        Ok(OwnedSegment {
            name: name.to_owned(),
            fd: None,
            map,
            size,
            owns_name: false,
        })
    }

    /// The segment's name (`/prefix-tag-p0`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes (for opened segments: the real size from `fstat`).
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Closes the descriptor; the mapping stays. Saves one descriptor per
    /// per-shard segment (the process limit is often 1024).
    pub(crate) fn close_fd(&mut self) {
        self.fd = None;
    }

    /// Backs `[offset, offset + len)` with real tmpfs pages (`fallocate`), so
    /// a full `/dev/shm` is an `ENOSPC` error here instead of a `SIGBUS` when
    /// the bytes are first written.
    pub(crate) fn reserve(&self, offset: u64, len: u64) -> Result<(), SysError> {
        if len == 0 {
            return Ok(());
        }
        let fd = self.fd.as_ref().ok_or(SysError {
            op: "fallocate",
            errno: Errno::BADF,
        })?;
        match fs::fallocate(fd, FallocateFlags::empty(), offset, len) {
            // A filesystem without fallocate (not tmpfs, or a sandbox): the
            // pages are then allocated on first write, as without this call.
            Ok(()) | Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(()),
            Err(errno) => Err(SysError {
                op: "fallocate",
                errno,
            }),
        }
    }

    /// True while a segment called `name` exists (it may belong to anyone).
    pub(crate) fn exists(name: &str) -> bool {
        !matches!(
            shm::open(name, shm::OFlags::RDONLY, Mode::empty()),
            Err(Errno::NOENT)
        )
    }

    /// `offset..offset + len` as a `usize` range inside the mapping, or `None`
    /// when it does not fit (overflow included).
    fn checked_range(&self, offset: u64, len: u64) -> Option<(usize, usize)> {
        let end = offset.checked_add(len)?;
        if end > self.size {
            return None;
        }
        Some((usize::try_from(offset).ok()?, usize::try_from(len).ok()?))
    }

    /// Address of `len` bytes at `offset`, bounds-checked against the real
    /// size; a dangling (non-null, never read) pointer for `len == 0`.
    pub(crate) fn ptr(&self, offset: u64, len: u64) -> Option<NonNull<u8>> {
        let (off, len) = self.checked_range(offset, len)?;
        if len == 0 {
            return Some(NonNull::dangling());
        }
        let map = self.map.as_ref()?;
        // SAFETY: `checked_range` proved `off + len <= size == map.len`, so
        // `off < map.len` and the result stays inside the mapping.
        Some(unsafe { map.ptr.add(off) })
    }

    /// Like [`ptr`](Self::ptr), for writing (every `OwnedSegment` is mapped
    /// read-write).
    pub(crate) fn ptr_mut(&self, offset: u64, len: u64) -> Option<NonNull<u8>> {
        self.ptr(offset, len)
    }

    /// Copies the bytes lent in `req.data` to `offset`; `false` when the range
    /// does not fit or the mapping is read-only.
    ///
    /// Only `Transport::export` calls this, with the request it is handling:
    /// the host keeps `req.data` valid and unmodified until that shard's
    /// `unexport` returns, which is after this call.
    pub(crate) fn write_export_data(&self, offset: u64, req: &ExportRequest) -> bool {
        let Some(dst) = self.ptr_mut(offset, req.data.len() as u64) else {
            return false;
        };
        if req.data.is_empty() {
            return true;
        }
        // SAFETY: we are inside the `export` call that received `req`, within
        // the window in which the host guarantees `data` (see `SharedBytes`).
        let src = unsafe { req.data.as_slice() };
        // SAFETY: `dst` is `src.len()` writable bytes of our own read-write
        // mapping (bounds checked by `ptr_mut`), reserved for this shard by the
        // allocator; host memory and our mapping never overlap unless the host
        // passed our own allocation, which `export` handles without copying.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), src.len()) };
        true
    }

    /// `len` 8-byte words of a read-write mapping from word `start`, as
    /// atomics (a board's lease records, for the kit's lease table).
    ///
    /// # Panics
    /// As [`atomic_u64`](Self::atomic_u64): when the mapping is read-only or
    /// the words are outside it.
    pub(crate) fn atomic_words(&self, start: usize, len: usize) -> &[AtomicU64] {
        if len == 0 {
            return &[];
        }
        // Checks the last word is inside the mapping (and so all before it).
        let _ = self.atomic_u64(start + len - 1);
        let first: *const AtomicU64 = self.atomic_u64(start);
        // SAFETY: words `start..start + len` are inside the mapping (the
        // last one checked above), 8-byte aligned and contiguous; the
        // mapping outlives the returned slice, which borrows `self`; every
        // process accesses board words only atomically (see `atomic_u64`).
        unsafe { std::slice::from_raw_parts(first, len) }
    }

    /// The `index`-th 8-byte word of a read-write mapping as an atomic.
    ///
    /// # Panics
    /// When the mapping is read-only or the word is outside it: board layouts
    /// are validated against the real size first, so this is a bug.
    pub(crate) fn atomic_u64(&self, index: usize) -> &AtomicU64 {
        let map = match &self.map {
            Some(m) => m,
            None => panic!("segment {} is empty", self.name),
        };
        let end = index
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .filter(|&end| end <= map.len);
        assert!(
            end.is_some(),
            "word {index} is outside segment {} ({} bytes)",
            self.name,
            map.len
        );
        // SAFETY: the word is inside the mapping (checked above) and 8-byte
        // aligned (mmap returns page-aligned addresses); the mapping outlives
        // the returned reference, which borrows `self`. The memory is writable
        // and every process accesses board words only atomically, so treating
        // it as an `AtomicU64` is sound.
        unsafe { &*map.ptr.as_ptr().add(index * 8).cast::<AtomicU64>() }
    }
}

impl Drop for OwnedSegment {
    fn drop(&mut self) {
        // Unmap first, then close, then give the name back if it is ours.
        drop(self.map.take());
        drop(self.fd.take());
        if self.owns_name {
            match shm::unlink(self.name.as_str()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(errno) => {
                    tracing::warn!(target: "posix_shm", segment = %self.name, error = %errno, "shm_unlink failed");
                }
            }
        }
    }
}

/// Opens `name` with `flags`; returns the descriptor, its real size (from
/// `fstat`) and that size as a mapping length.
fn open_sized(name: &str, flags: shm::OFlags) -> Result<(OwnedFd, u64, usize), SysError> {
    let fd = shm::open(name, flags, Mode::empty()).map_err(fail("shm_open"))?;
    let st = fs::fstat(&fd).map_err(fail("fstat"))?;
    let size = u64::try_from(st.st_size).map_err(|_| SysError {
        op: "fstat",
        errno: Errno::INVAL,
    })?;
    let len = usize::try_from(size).map_err(|_| SysError {
        op: "mmap",
        errno: Errno::NOMEM,
    })?;
    Ok((fd, size, len))
}

/// A peer's data segment (a pool, or one shard's segment), mapped read-only
/// through the plugin kit's [`ReadOnlyMap`]: bounds-checked copies and
/// zero-copy regions without further `unsafe`. Dropping it unmaps; it never
/// owns the name.
pub(crate) struct PeerSegment {
    name: String,
    map: ReadOnlyMap,
}

impl fmt::Debug for PeerSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerSegment")
            .field("name", &self.name)
            .field("size", &self.map.len())
            .finish()
    }
}

impl PeerSegment {
    /// Opens `name` read-only (`O_RDONLY`, `PROT_READ`: a consumer cannot
    /// write a peer's data) and maps all of it. The descriptor is closed
    /// once mapped.
    pub(crate) fn open(name: &str) -> Result<PeerSegment, SysError> {
        let (fd, _, len) = open_sized(name, shm::OFlags::RDONLY)?;
        // SAFETY: bytes are read through this map only where the lease
        // protocol keeps them stable: a pool range only while this consumer
        // holds a lease on it (an owner never overwrites or frees leased
        // space, see `board`), a per-shard segment only after its owner
        // wrote all of it (it is never written again, only unlinked). Owners
        // never shrink a segment, and only segments with the consumer's own
        // prefix, created `0600` by the same user, are opened. Copies go
        // through `ReadOnlyMap::copy_out` (raw pointers), so a peer that
        // breaks the protocol yields torn bytes, not a changing reference.
        let map = unsafe { ReadOnlyMap::map(&fd, len) }.map_err(|e| SysError {
            op: "mmap",
            errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        Ok(PeerSegment {
            name: name.to_owned(),
            map,
        })
    }

    /// The segment's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its real size.
    pub(crate) fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// Copies `dst.len()` bytes at `offset`; `false` when out of range.
    pub(crate) fn copy_out(&self, offset: u64, dst: &mut [u8]) -> bool {
        self.map.copy_out(offset, dst)
    }

    /// A zero-copy region of `len` bytes at `offset` under lease `token`;
    /// `None` when out of range. Valid while this value lives.
    pub(crate) fn region(&self, offset: u64, len: u64, token: u64) -> Option<Region> {
        self.map.region(offset, len, token)
    }
}

/// A private, writable, copy-on-write mapping of `len` bytes at `offset` of
/// a peer's segment (`MAP_PRIVATE`, `PROT_READ | PROT_WRITE`, the whole
/// pages around the range): what `import_view_private` lends. Until a page
/// is written it is the segment's own page (no copy); a write copies that
/// page into memory of this mapping alone, so nothing written here reaches
/// the owner, another process or another mapping. Unmapped on drop.
pub(crate) struct PrivateMap {
    /// Start of the range; dangling when `len == 0`.
    ptr: NonNull<u8>,
    len: usize,
    /// The private (copy-on-write) map, unmapped when dropped; `None` when
    /// `len == 0`. Its pages round the range out to whole pages.
    _map: Option<memmap2::MmapMut>,
}

// SAFETY: the mapping is memory owned by this value; nothing in it is tied
// to a thread. Writes go through the pointer lent in `region`, whose holder
// synchronises them as for any private buffer.
unsafe impl Send for PrivateMap {}
// SAFETY: as above; this type never reads or writes the bytes itself.
unsafe impl Sync for PrivateMap {}

impl fmt::Debug for PrivateMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateMap")
            .field("len", &self.len)
            .finish()
    }
}

impl PrivateMap {
    /// Opens `name` read-only again and maps `[offset, offset + len)`
    /// privately. Fails when the segment is gone (its owner unlinked it) or
    /// smaller than the range.
    ///
    /// The caller holds a lease on the range (or the segment is a per-shard
    /// segment, never written again): while the mapping's pages are not yet
    /// copied they show the segment's bytes, which the lease keeps stable.
    pub(crate) fn open(name: &str, offset: u64, len: u64) -> Result<PrivateMap, SysError> {
        let (fd, size, _) = open_sized(name, shm::OFlags::RDONLY)?;
        let too_big = SysError {
            op: "mmap",
            errno: Errno::INVAL,
        };
        let end = offset.checked_add(len).ok_or(too_big)?;
        if end > size {
            return Err(too_big);
        }
        let len = usize::try_from(len).map_err(|_| too_big)?;
        if len == 0 {
            return Ok(PrivateMap {
                ptr: NonNull::dangling(),
                len: 0,
                _map: None,
            });
        }
        // SAFETY: a fresh mapping chosen by the kernel (no address given),
        // private (`MAP_PRIVATE`: writes never reach the segment), of a range
        // inside the segment (checked above against its real size; the map
        // rounds it out to whole pages, which the segment has: segment sizes
        // are page multiples).
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_copy(fd.as_raw_fd())
        }
        .map_err(io_fail("mmap"))?;
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or(SysError {
            op: "mmap",
            errno: Errno::NOMEM,
        })?;
        Ok(PrivateMap {
            ptr,
            len,
            _map: Some(map),
        })
    }

    /// The mapped range as a region under lease `token`.
    pub(crate) fn region(&self, token: u64) -> Region {
        Region {
            ptr: if self.len == 0 {
                std::ptr::null()
            } else {
                self.ptr.as_ptr().cast_const()
            },
            len: self.len,
            token,
        }
    }
}

/// Unlinks the shared-memory object `name` (`/...`) that a sweep judged
/// orphaned. Only the dead-owner sweep calls this; owners unlink their own
/// names by dropping their [`OwnedSegment`].
pub(crate) fn unlink_segment(name: &str) -> Result<(), SysError> {
    shm::unlink(name).map_err(fail("shm_unlink"))
}

/// This process's effective user id (the sweep only removes segments it owns).
pub(crate) fn effective_uid() -> u32 {
    process::geteuid().as_raw()
}

/// A pidfd (`pidfd_open`, Linux 5.3+): a descriptor bound to one process,
/// which stays bound to it when its pid is reused, and becomes readable when
/// it exits. Checking it is one non-blocking `poll`, much cheaper than
/// reading `/proc/<pid>/stat`.
#[derive(Debug)]
pub(crate) struct PidFd(OwnedFd);

impl PidFd {
    /// Opens a pidfd on the process that has id `pid` in this process's PID
    /// namespace now. `ESRCH`: no such process; `EINVAL`: `pid` is a thread,
    /// not a process; `ENOSYS`/`EPERM`: an old kernel or a sandbox.
    pub(crate) fn open(pid: u32) -> Result<PidFd, SysError> {
        let pid = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or(SysError {
                op: "pidfd_open",
                errno: Errno::INVAL,
            })?;
        process::pidfd_open(pid, PidfdFlags::empty())
            .map(PidFd)
            .map_err(fail("pidfd_open"))
    }

    /// `Some(true)` once the process has exited (the pidfd polls readable,
    /// or hung up once it was reaped), `Some(false)` while it runs, `None`
    /// when `poll` fails. Never blocks: the timeout is zero.
    pub(crate) fn has_exited(&self) -> Option<bool> {
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(0) => Some(false),
            Ok(_) => {
                let r = fds[0].revents();
                if r.intersects(PollFlags::ERR | PollFlags::NVAL) {
                    None
                } else {
                    Some(r.intersects(PollFlags::IN | PollFlags::HUP))
                }
            }
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::SeqCst as ORD;

    fn name(tag: &str) -> String {
        format!("/shardport-sys{}-{tag}", std::process::id())
    }

    #[test]
    fn create_is_exclusive_and_drop_unlinks() {
        let n = name("a");
        let seg = OwnedSegment::create(&n, 4096).unwrap();
        let again = OwnedSegment::create(&n, 4096).unwrap_err();
        assert_eq!(again.errno, Errno::EXIST);
        assert_eq!(again.op, "shm_open");
        drop(seg);
        assert_eq!(PeerSegment::open(&n).unwrap_err().errno, Errno::NOENT);
    }

    #[test]
    fn opened_segment_is_read_only_and_does_not_unlink() {
        let n = name("b");
        let owner = OwnedSegment::create(&n, 100).unwrap();
        owner.atomic_u64(3).store(7, ORD);
        let reader = PeerSegment::open(&n).unwrap();
        assert_eq!(reader.size(), 100);
        let mut buf = [0u8; 8];
        assert!(reader.copy_out(24, &mut buf));
        assert_eq!(u64::from_ne_bytes(buf), 7);
        assert!(!reader.copy_out(96, &mut buf), "past the end");
        assert!(reader.region(u64::MAX, 2, 1).is_none(), "overflow");
        assert_eq!(reader.region(8, 16, 3).unwrap().len, 16);
        drop(reader);
        assert!(PeerSegment::open(&n).is_ok());
        drop(owner);
    }

    #[test]
    fn zero_length_segments_work() {
        let n = name("c");
        let owner = OwnedSegment::create(&n, 0).unwrap();
        assert!(owner.ptr_mut(0, 0).is_some());
        assert!(owner.ptr(1, 0).is_none());
        let reader = PeerSegment::open(&n).unwrap();
        assert_eq!(reader.size(), 0);
        assert!(reader.copy_out(0, &mut []));
    }

    #[test]
    fn reserve_backs_pages() {
        let n = name("d");
        let mut owner = OwnedSegment::create(&n, 1 << 16).unwrap();
        owner.reserve(4096, 8192).unwrap();
        owner.close_fd();
        assert_eq!(owner.reserve(0, 1).unwrap_err().errno, Errno::BADF);
        assert!(OwnedSegment::exists(&n));
        drop(owner);
        assert!(!OwnedSegment::exists(&n));
    }

    #[test]
    fn process_probes() {
        use shardport_kit::lease::liveness::{Probe, System};
        let me = std::process::id();
        let fd = PidFd::open(me).unwrap();
        assert_eq!(fd.has_exited(), Some(false));

        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "no-such-test", "-q"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let fd = PidFd::open(pid).unwrap();
        child.wait().unwrap();
        assert_eq!(fd.has_exited(), Some(true), "readable once it exited");
        assert_eq!(System.exists(pid), Some(false), "reaped: ESRCH");
        assert_eq!(PidFd::open(pid).unwrap_err().errno, Errno::SRCH);
    }

    #[test]
    fn unlink_segment_removes_a_name() {
        let n = name("e");
        let seg = OwnedSegment::create(&n, 8).unwrap();
        unlink_segment(&n).unwrap();
        assert!(!OwnedSegment::exists(&n));
        assert_eq!(unlink_segment(&n).unwrap_err().errno, Errno::NOENT);
        drop(seg);
    }
}
