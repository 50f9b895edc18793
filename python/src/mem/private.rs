//! Private, writable copies of shards (copy mode) that Python writes to
//! through the pointers it is lent.

// ---------------------------------------------------------------------------
// Lending fetched bytes

/// A private, writable copy of a shard (copy mode): Python may write to it
/// through the pointers it is lent, so Rust never forms a reference to its
/// contents after construction (except to fill it, before lending it).
/// It holds the parts of a forgotten `Vec<u8>` (the host's copy buffer, or
/// a copy of bytes in hand).
pub(crate) struct PrivateBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    cap: usize,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; writes
// happen only through pointers lent to Python, which synchronises them the
// way it does for any NumPy array.
unsafe impl Send for PrivateBuf {}
// SAFETY: as above.
unsafe impl Sync for PrivateBuf {}

impl PrivateBuf {
    pub(super) fn new(mut v: Vec<u8>) -> PrivateBuf {
        let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
        std::mem::forget(v);
        PrivateBuf { ptr, len, cap }
    }
}

impl Drop for PrivateBuf {
    fn drop(&mut self) {
        // SAFETY: the parts came from a forgotten Vec<u8> in `new`.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
    }
}
