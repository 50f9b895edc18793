//! Private, writable copies of shards (copy mode) that Python writes to
//! through the pointers it is lent.

use shardport_host::vocab::{CopyBuf, CopyHome};

// ---------------------------------------------------------------------------
// Lending fetched bytes

/// A private, writable copy of a shard (copy mode): Python may write to it
/// through the pointers it is lent, so Rust never forms a reference to its
/// contents after construction (except to fill it, before lending it).
/// It holds the parts of a forgotten `Vec<u8>` (the host's copy buffer, or
/// a copy of bytes in hand), and where that buffer goes back to when the
/// last holder is gone: the node's shelf of copy destinations, so that the
/// next copy fetch of the same length writes warm memory instead of fresh
/// pages. Every object reaching the memory (the `Shard`, a buffer export,
/// a NumPy array, a DLPack capsule) holds this value through `keep`
/// (`mem` module docs), so it is dropped, and the buffer handed back,
/// only when nothing in Python reaches the bytes any more.
pub(crate) struct PrivateBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    cap: usize,
    /// `None` only once dropped.
    home: Option<CopyHome>,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; writes
// happen only through pointers lent to Python, which synchronises them the
// way it does for any NumPy array. `home` is a weak reference to the
// node's shelf, which is `Send + Sync` itself.
unsafe impl Send for PrivateBuf {}
// SAFETY: as above.
unsafe impl Sync for PrivateBuf {}

impl PrivateBuf {
    /// Bytes that belong nowhere: freed when dropped.
    pub(super) fn new(v: Vec<u8>) -> PrivateBuf {
        PrivateBuf::from_copy(CopyBuf::detached(v))
    }

    /// A host copy: its buffer goes back where it came from (the node's
    /// shelf) when dropped.
    pub(super) fn from_copy(c: CopyBuf) -> PrivateBuf {
        let (mut v, home) = c.into_parts();
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        std::mem::forget(v);
        PrivateBuf {
            ptr,
            len,
            cap,
            home: Some(home),
        }
    }
}

impl Drop for PrivateBuf {
    fn drop(&mut self) {
        // SAFETY: the parts came from a forgotten Vec<u8> in `from_copy`,
        // rebuilt once (here). Nothing in Python reaches the bytes any
        // more (every export holds this value), so the shelf may hand them
        // out again as another copy's destination.
        let v = unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) };
        match self.home.take() {
            Some(home) => home.take_back(v),
            None => drop(v),
        }
    }
}
