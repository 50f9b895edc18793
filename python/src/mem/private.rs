//! Private, writable copies of shards (copy mode) that Python writes to
//! through the pointers it is lent.

#[allow(clippy::wildcard_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Lending fetched bytes

/// A private, writable copy of a shard (copy mode): Python may write to it
/// through the pointers it is lent, so Rust never forms a reference to its
/// contents after construction (except to fill it, before lending it).
pub(crate) struct PrivateBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) alloc: Alloc,
}

pub(super) enum Alloc {
    /// The parts of a forgotten `Vec<u8>` (capacity).
    Vec(usize),
    /// `std::alloc::alloc_zeroed` with this layout.
    Zeroed(Layout),
    /// Nothing allocated (zero bytes).
    Empty,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; writes
// happen only through pointers lent to Python, which synchronises them the
// way it does for any NumPy array.
unsafe impl Send for PrivateBuf {}
// SAFETY: as above.
unsafe impl Sync for PrivateBuf {}

/// Alignment of fresh copy buffers: the allocator's own minimum on 64-bit
/// Linux, so `alloc_zeroed` is `calloc`, which maps large buffers as
/// untouched zero pages (a larger alignment would zero them by hand: one
/// more pass over every byte).
pub(super) const COPY_ALIGN: usize = 16;

impl PrivateBuf {
    pub(super) fn new(mut v: Vec<u8>) -> PrivateBuf {
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        std::mem::forget(v);
        PrivateBuf {
            ptr,
            len,
            alloc: Alloc::Vec(cap),
        }
    }

    /// `len` zero bytes whose pages are not touched yet (so a copy into
    /// them faults each page in once, as `np.copy` does), or an error
    /// naming the size when memory cannot be had.
    pub(crate) fn zeroed(len: usize) -> Result<PrivateBuf, String> {
        if len == 0 {
            return Ok(PrivateBuf {
                ptr: NonNull::<u8>::dangling().as_ptr(),
                len,
                alloc: Alloc::Empty,
            });
        }
        let layout =
            Layout::from_size_align(len, COPY_ALIGN).map_err(|e| format!("{len} bytes: {e}"))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(format!("cannot allocate {len} bytes for the copy"));
        }
        let mut buf = PrivateBuf {
            ptr,
            len,
            alloc: Alloc::Zeroed(layout),
        };
        if len >= HUGE_PAGES_FROM {
            // As the host does for its copy buffers (and NumPy for arrays).
            shardport_kit::advise_huge_pages(buf.as_mut_slice());
        }
        Ok(buf)
    }

    /// The bytes, to fill before the buffer is lent to Python.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes owned by self; `&mut self` excludes other access
        // (the buffer is not lent out yet).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PrivateBuf {
    fn drop(&mut self) {
        match self.alloc {
            // SAFETY: the parts came from a forgotten Vec<u8> in `new`.
            Alloc::Vec(cap) => drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, cap) }),
            // SAFETY: allocated in `zeroed` with this layout.
            Alloc::Zeroed(layout) => unsafe { std::alloc::dealloc(self.ptr, layout) },
            Alloc::Empty => {}
        }
    }
}
