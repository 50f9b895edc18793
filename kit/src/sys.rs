//! Every `unsafe` operation of the kit, under two safe types.
//!
//! - [`ReadOnlyMap`]: a read-only `mmap` of a file or shared-memory object,
//!   unmapped on drop. Its constructor is `unsafe`: whether reading mapped
//!   bytes is sound depends on other processes not changing or shrinking
//!   them, which no type can check, so the caller states it once, where it
//!   knows why (ripgrep's mmap searcher does the same). Everything after
//!   construction is safe and bounds-checked.
//! - [`Lent`]: a [`SharedBytes`] whose validity the type system knows (a
//!   lifetime). Made safely from a slice or a mapping; the one `unsafe` door
//!   is [`Lent::from_raw`] / [`Lent::from_export`], for bytes that crossed
//!   the ABI, whose lifetime is a contract and not a Rust borrow.

use std::{ffi::c_void, fmt, fs::File, io, marker::PhantomData, ops::Deref, ptr::NonNull};

use rustix::{fd::AsFd, mm};

use shardport_abi::{
    error::PluginResult,
    transport::{ExportRequest, Region, SharedBytes},
};

/// A read-only mapping of the first `len` bytes of a file or shared-memory
/// object, unmapped on drop.
///
/// Hands out the bytes as a slice ([`as_slice`](Self::as_slice),
/// [`get`](Self::get)), copies ([`copy_out`](Self::copy_out)), zero-copy
/// [`Region`]s and [`Lent`] views, all bounds-checked. Share it with `Arc`
/// and keep a clone per lease, so the mapping outlives every region handed
/// out (see [`LeaseTable`](crate::map::LeaseTable)).
pub struct ReadOnlyMap {
    /// Start of the mapping; dangling (never read) when `len == 0`.
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping itself (unmapped when dropped); `None` when `len == 0`.
    /// Raw: other processes may change what the range shows, so it is only
    /// ever read through the bounds-checked accessors below.
    _map: Option<memmap2::MmapRaw>,
}

// SAFETY: the mapping is plain read-only memory owned by this value; any
// thread may read it, and nothing in it is tied to a thread.
unsafe impl Send for ReadOnlyMap {}
// SAFETY: shared access only reads.
unsafe impl Sync for ReadOnlyMap {}

/// The start of one piece of a [`ReadOnlyMap::copy_out`], handed to the
/// thread that copies it.
#[derive(Clone, Copy)]
struct MappedPiece(*const u8);

// SAFETY: the pointer is only read, inside a mapping that `copy_out`'s
// `&self` keeps mapped until `in_parallel` has joined every thread.
unsafe impl Send for MappedPiece {}

impl ReadOnlyMap {
    /// Maps the first `len` bytes of `fd` read-only (`PROT_READ`,
    /// `MAP_SHARED`). `len == 0` maps nothing (`mmap` refuses it) and
    /// yields an empty map.
    ///
    /// # Errors
    /// The `mmap` failure; the caller adds which file it was.
    ///
    /// # Safety
    /// While the returned value (or anything borrowed from it) lives, no
    /// process, this one included, may modify the bytes this map reads or
    /// shrink the object below `len` (a read past the end is `SIGBUS`):
    /// - a file written once and then only read or unlinked (an unlinked
    ///   file stays mapped) meets this for the whole map;
    /// - memory whose ranges are reused (a pool) meets it only for ranges
    ///   that are protected while they are read (a lease): read only those,
    ///   and only while protected.
    ///
    /// `fd` must be a file or shared-memory object of at least `len` bytes,
    /// opened for reading.
    pub unsafe fn map(fd: impl AsFd, len: usize) -> io::Result<ReadOnlyMap> {
        if len == 0 {
            return Ok(ReadOnlyMap {
                ptr: NonNull::dangling(),
                len: 0,
                _map: None,
            });
        }
        // A fresh, kernel-chosen range (`PROT_READ`, `MAP_SHARED`): it
        // cannot alias any Rust allocation, and this process never writes
        // through it. What the bytes are is the caller's promise above.
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw_read_only(std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd()))?;
        let ptr = NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(ReadOnlyMap {
            ptr,
            len,
            _map: Some(map),
        })
    }

    /// Maps all of `file` (its size from `fstat`), read-only.
    ///
    /// # Errors
    /// `fstat` or `mmap` failed, or the file does not fit the address space.
    ///
    /// # Safety
    /// As for [`map`](Self::map): nobody modifies or truncates the file
    /// while the mapping lives.
    pub unsafe fn map_file(file: &File) -> io::Result<ReadOnlyMap> {
        let size = file.metadata()?.len();
        let len = usize::try_from(size).map_err(|_| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("a file of {size} bytes does not fit this address space"),
            )
        })?;
        // SAFETY: the caller's promise, passed on; `file` is open for reading
        // and is `len` bytes long.
        unsafe { ReadOnlyMap::map(file, len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `offset..offset + len` as `usize`s, or `None` when it does not fit
    /// (overflow included).
    fn range(&self, offset: u64, len: u64) -> Option<(usize, usize)> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        Some((offset as usize, len as usize))
    }

    /// Address of `len` bytes at `offset`, bounds-checked; dangling (never
    /// read) for `len == 0`.
    fn at(&self, offset: u64, len: u64) -> Option<NonNull<u8>> {
        let (off, len) = self.range(offset, len)?;
        if len == 0 {
            return Some(NonNull::dangling());
        }
        // SAFETY: `range` proved `off + len <= self.len`, so the address is
        // inside the mapping.
        Some(unsafe { self.ptr.add(off) })
    }

    /// The whole mapping.
    pub fn as_slice(&self) -> &[u8] {
        self.get(0, self.len as u64).unwrap_or(&[])
    }

    /// `len` bytes at `offset`, or `None` when they are not all inside.
    pub fn get(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let p = self.at(offset, len)?;
        // SAFETY: `at` checked the range is inside the live mapping (or
        // empty); the constructor's caller promised the bytes do not change
        // while borrowed, and the borrow is tied to `self`, which unmaps only
        // in `Drop`.
        Some(unsafe { std::slice::from_raw_parts(p.as_ptr().cast_const(), len as usize) })
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`; `false` (and nothing
    /// copied) when the range is not inside. Goes through raw pointers, so
    /// a peer that breaks its promise yields torn bytes here, never a Rust
    /// reference that changes under it.
    pub fn copy_out(&self, offset: u64, dst: &mut [u8]) -> bool {
        let Some(src) = self.at(offset, dst.len() as u64) else {
            return false;
        };
        if dst.is_empty() {
            return true;
        }
        // Large copies in pieces across cores, as `kit::copy::copy` does.
        let piece = dst.len().div_ceil(super::copy::threads_now(dst.len()));
        let copy_piece = |from: MappedPiece, d: &mut [u8]| {
            // SAFETY: `from` is `d.len()` readable bytes inside the mapping
            // (see `MappedPiece`); `dst` is an exclusive Rust buffer, not
            // part of a read-only mapping, so the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(from.0, d.as_mut_ptr(), d.len()) };
        };
        if piece >= dst.len() {
            copy_piece(MappedPiece(src.as_ptr()), dst);
            return true;
        }
        let pieces: Vec<(MappedPiece, &mut [u8])> = dst
            .chunks_mut(piece)
            .enumerate()
            .map(|(k, d)| {
                // SAFETY: `at` proved `dst.len()` bytes from `src` lie
                // inside the mapping; piece `k` starts `k * piece <
                // dst.len()` bytes in.
                (MappedPiece(unsafe { src.as_ptr().add(k * piece) }), d)
            })
            .collect();
        super::copy::in_parallel(pieces, |(from, d)| copy_piece(from, d));
        true
    }

    /// A zero-copy [`Region`] of `len` bytes at `offset` with lease `token`,
    /// or `None` when the range is not inside. The caller keeps this map
    /// alive until `release(token)` (a clone of its `Arc` per lease).
    pub fn region(&self, offset: u64, len: u64, token: u64) -> Option<Region> {
        let p = self.at(offset, len)?;
        Some(Region {
            ptr: p.as_ptr().cast_const(),
            len: len as usize,
            token,
        })
    }

    /// A [`Lent`] view of `len` bytes at `offset`, borrowing this map.
    pub fn lent(&self, offset: u64, len: u64) -> Option<Lent<'_>> {
        self.get(offset, len).map(Lent::new)
    }
}

impl fmt::Debug for ReadOnlyMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadOnlyMap")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Bytes lent for `'a`: a [`SharedBytes`] whose validity is a Rust
/// lifetime, so reading it needs no `unsafe`.
///
/// ```
/// use shardport_kit::Lent;
/// let data = vec![1u8, 2, 3];
/// let lent = Lent::new(&data);
/// let raw = lent.shared();          // what crosses the ABI
/// assert_eq!(raw.len(), 3);
/// assert_eq!(&*lent, &[1, 2, 3]);   // read safely while `data` is borrowed
/// ```
#[derive(Clone, Copy)]
pub struct Lent<'a> {
    raw: SharedBytes,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> Lent<'a> {
    /// Lends `bytes`: valid for as long as they are borrowed.
    pub fn new(bytes: &'a [u8]) -> Self {
        Lent {
            raw: SharedBytes::lend(bytes),
            _bytes: PhantomData,
        }
    }

    /// Wraps bytes that crossed the ABI.
    ///
    /// # Safety
    /// `raw` names `raw.len()` bytes of host memory (not a device address)
    /// that stay readable and unmodified for all of `'a`.
    pub unsafe fn from_raw(raw: SharedBytes) -> Self {
        Lent {
            raw,
            _bytes: PhantomData,
        }
    }

    /// The bytes of an export request, after checking that their length is
    /// `meta.byte_len` and that a non-empty range has an address
    /// (`INVALID_ARGUMENT` naming the shard otherwise).
    ///
    /// # Safety
    /// `req` is the request the host passed to this transport's `export`
    /// (never one built by hand), `meta.device` is the CPU (a CUDA shard's
    /// `data` is a device address), and `'a` ends before the `unexport` of
    /// `req.id` returns: the window in which the host keeps the bytes
    /// alive and unmodified. Borrowing `req` for `'a` bounds it to the
    /// `export` call unless the plugin copies the request.
    pub unsafe fn from_export(req: &'a ExportRequest) -> PluginResult<Self> {
        crate::check::lent(req)?;
        // SAFETY: the caller's promise, checked above for what can be checked.
        Ok(unsafe { Lent::from_raw(req.data) })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &'a [u8] {
        if self.raw.is_empty() {
            return &[];
        }
        // SAFETY: every constructor established that `len` bytes at `ptr`
        // stay readable and unmodified for `'a` (a borrow, or the unsafe
        // constructors' callers).
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr(), self.raw.len()) }
    }

    /// The raw form that crosses the ABI (`ExportRequest::data`).
    pub fn shared(&self) -> SharedBytes {
        self.raw
    }
}

impl Deref for Lent<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for Lent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("len", &self.raw.len())
            .finish()
    }
}

/// Asks for transparent huge pages under the whole pages of `buf`
/// (`MADV_HUGEPAGE`), so that a large destination not touched yet faults in
/// 2 MiB pages rather than 4 KiB ones (one fault and one zeroing per 2 MiB
/// instead of 512): what NumPy does for arrays of 4 MiB and up. Only advice:
/// the bytes do not change; an error (huge pages off, memory that cannot
/// have them) is ignored.
pub fn advise_huge_pages(buf: &mut [u8]) {
    let page = rustix::param::page_size();
    let start = (buf.as_mut_ptr() as usize).next_multiple_of(page);
    let end = (buf.as_mut_ptr() as usize + buf.len()) / page * page;
    if end > start {
        // SAFETY: `[start, end)` are whole pages inside `buf`, memory this
        // call borrows mutably; `MADV_HUGEPAGE` changes how later faults are
        // served, never the bytes.
        let _ =
            unsafe { mm::madvise(start as *mut c_void, end - start, mm::Advice::LinuxHugepage) };
    }
}
