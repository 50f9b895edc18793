//! Host-side safe owners of the raw memory a plugin hands back.
//!
//! The [`Transport`](crate::Transport) contract says a [`Region`] stays
//! readable and unmodified until `release`, and an [`Allocation`] stays
//! writable and exclusive until it is exported or freed. These types turn
//! that contract into ownership: a [`LeasedView`] releases its lease on drop,
//! an [`AllocationGuard`] frees an allocation that was never exported. This is
//! the one place outside a plugin's `sys` module that turns plugin pointers
//! into slices, so the host crate itself needs no `unsafe`.

use std::{fmt, ops::Deref, sync::Arc};

use abi_stable::std_types::{RResult, RSlice};

use crate::{
    error::AbiError,
    meta::{ShardId, ShardMeta},
    transport::{Allocation, Region, SharedTransport},
};

/// A zero-copy view of an imported shard; holds a lease until dropped.
///
/// A view from [`import`](Self::import) is read-only memory of the owner's.
/// One from [`import_private`](Self::import_private) is a private
/// copy-on-write mapping: whoever it is lent to may write it (writes stay in
/// this view); this type itself only ever reads it.
pub struct LeasedView {
    transport: SharedTransport,
    region: Region,
    private: bool,
}

// SAFETY: the region is read-only memory the plugin keeps valid until
// `release`; the transport object is `Send + Sync` by trait bound.
unsafe impl Send for LeasedView {}
// SAFETY: as above; the bytes are never written through this type.
unsafe impl Sync for LeasedView {}

impl LeasedView {
    /// Imports `desc` as a zero-copy view through `transport`.
    ///
    /// Fails with the plugin's error, or `INTERNAL` when the plugin returned a
    /// region whose length differs from `meta.byte_len` (the lease is released).
    pub fn import(
        transport: &SharedTransport,
        desc: &[u8],
        meta: &ShardMeta,
    ) -> Result<LeasedView, AbiError> {
        let region = transport
            .import_view(RSlice::from_slice(desc), meta)
            .into_result()?;
        Self::checked(transport, region, meta, false)
    }

    /// Imports `desc` as a private, copy-on-write view through `transport`
    /// ([`Transport::import_view_private`](crate::Transport::import_view_private)):
    /// memory the holder may write without reaching the owner. Fails as
    /// [`import`](Self::import) does, or `UNSUPPORTED` from a transport
    /// without private views.
    pub fn import_private(
        transport: &SharedTransport,
        desc: &[u8],
        meta: &ShardMeta,
    ) -> Result<LeasedView, AbiError> {
        let region = transport
            .import_view_private(RSlice::from_slice(desc), meta)
            .into_result()?;
        Self::checked(transport, region, meta, true)
    }

    /// Whether this is a private, writable (copy-on-write) view.
    pub fn is_private(&self) -> bool {
        self.private
    }

    fn checked(
        transport: &SharedTransport,
        region: Region,
        meta: &ShardMeta,
        private: bool,
    ) -> Result<LeasedView, AbiError> {
        let view = LeasedView {
            transport: Arc::clone(transport),
            region,
            private,
        };
        if view.region.len as u64 != meta.byte_len
            || (view.region.ptr.is_null() && view.region.len > 0)
        {
            return Err(AbiError::internal(format!(
                "transport returned a region of {} bytes for a shard of {} bytes",
                view.region.len, meta.byte_len
            )));
        }
        Ok(view)
    }

    /// The lease token (for logs and stats).
    pub fn token(&self) -> u64 {
        self.region.token
    }
}

impl Deref for LeasedView {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        if self.region.len == 0 {
            return &[];
        }
        // SAFETY: per the `Transport::import_view` contract the plugin keeps
        // `len` bytes at `ptr` readable and unmodified until `release`, which
        // happens only in `Drop`, after every borrow of `self` has ended.
        unsafe { std::slice::from_raw_parts(self.region.ptr, self.region.len) }
    }
}

impl Drop for LeasedView {
    fn drop(&mut self) {
        if let RResult::RErr(e) = self.transport.release(self.region.token) {
            tracing::warn!(target: "lease", token = self.region.token, error = %e, "release failed");
        }
    }
}

impl fmt::Debug for LeasedView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedView")
            .field("len", &self.region.len)
            .field("token", &self.region.token)
            .field("private", &self.private)
            .finish()
    }
}

/// A zero-copy view of an imported **CUDA** shard: the region's address is
/// device memory, so unlike [`LeasedView`] this never becomes a slice; it
/// exposes the device address and length only. Holds a lease until dropped.
pub struct LeasedDeviceView {
    transport: SharedTransport,
    region: Region,
}

// SAFETY: the type only carries an address and a token; it never reads
// through the address. The transport object is `Send + Sync` by trait bound.
unsafe impl Send for LeasedDeviceView {}
// SAFETY: as above.
unsafe impl Sync for LeasedDeviceView {}

impl LeasedDeviceView {
    /// Imports `desc` as a zero-copy device view through `transport`.
    ///
    /// Fails with the plugin's error, or `INTERNAL` when the plugin returned
    /// a region whose length differs from `meta.byte_len` or a null address
    /// for a non-empty shard (the lease is released).
    pub fn import(
        transport: &SharedTransport,
        desc: &[u8],
        meta: &ShardMeta,
    ) -> Result<LeasedDeviceView, AbiError> {
        let region = transport
            .import_view(RSlice::from_slice(desc), meta)
            .into_result()?;
        let view = LeasedDeviceView {
            transport: Arc::clone(transport),
            region,
        };
        if view.region.len as u64 != meta.byte_len
            || (view.region.ptr.is_null() && view.region.len > 0)
        {
            return Err(AbiError::internal(format!(
                "transport returned a device region of {} bytes for a shard of {} bytes",
                view.region.len, meta.byte_len
            )));
        }
        Ok(view)
    }

    /// The device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.region.ptr as usize as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// The lease token (for logs and stats).
    pub fn token(&self) -> u64 {
        self.region.token
    }
}

impl Drop for LeasedDeviceView {
    fn drop(&mut self) {
        if let RResult::RErr(e) = self.transport.release(self.region.token) {
            tracing::warn!(target: "lease", token = self.region.token, error = %e, "release failed");
        }
    }
}

impl fmt::Debug for LeasedDeviceView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedDeviceView")
            .field("addr", &format_args!("{:#x}", self.device_addr()))
            .field("len", &self.region.len)
            .field("token", &self.region.token)
            .finish()
    }
}

/// Transport-owned writable memory for one shard. Frees the allocation on
/// drop unless it was [marked exported](Self::mark_exported).
pub struct AllocationGuard {
    transport: SharedTransport,
    alloc: Allocation,
    exported: bool,
}

// SAFETY: the allocation is exclusively ours until exported or freed; the
// transport object is `Send + Sync` by trait bound.
unsafe impl Send for AllocationGuard {}
// SAFETY: shared access only reads (`as_slice`); writing needs `&mut self`.
unsafe impl Sync for AllocationGuard {}

impl AllocationGuard {
    /// Asks `transport` for `len` writable bytes for shard `id`.
    pub fn allocate(transport: &SharedTransport, id: ShardId, len: u64) -> Result<Self, AbiError> {
        let alloc = transport.allocate(id, len).into_result()?;
        let guard = AllocationGuard {
            transport: Arc::clone(transport),
            alloc,
            exported: false,
        };
        if guard.alloc.len as u64 != len
            || (guard.alloc.ptr.is_null() && len > 0)
            || guard.alloc.token == 0
        {
            return Err(AbiError::internal(format!(
                "transport returned an allocation of {} bytes (token {}) for {len} requested",
                guard.alloc.len, guard.alloc.token
            )));
        }
        Ok(guard)
    }

    /// The writable bytes.
    ///
    /// # Panics
    /// After [`mark_exported`](Self::mark_exported): exported bytes may be
    /// leased by consumers and must never change.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        assert!(
            !self.exported,
            "allocation {} is exported; its bytes may be leased and must not change",
            self.alloc.token
        );
        if self.alloc.len == 0 {
            return &mut [];
        }
        // SAFETY: per the `Transport::allocate` contract the allocation is
        // `len` writable bytes used by nothing else until exported or freed;
        // `&mut self` makes this the only live borrow.
        unsafe { std::slice::from_raw_parts_mut(self.alloc.ptr, self.alloc.len) }
    }

    /// The bytes as written so far.
    pub fn as_slice(&self) -> &[u8] {
        if self.alloc.len == 0 {
            return &[];
        }
        // SAFETY: as in `as_mut_slice`; shared borrow of `self`, no writer.
        unsafe { std::slice::from_raw_parts(self.alloc.ptr, self.alloc.len) }
    }

    /// The allocation token to pass in `ExportRequest::allocation`.
    pub fn token(&self) -> u64 {
        self.alloc.token
    }

    /// Marks the allocation as exported; call it only after `export`
    /// succeeded (a failed export leaves the allocation to this guard, which
    /// frees it on drop). From then on it is freed by the transport's
    /// `unexport`, not by this guard. Keep the guard alive
    /// (it still reads the bytes) until that `unexport` has returned.
    pub fn mark_exported(&mut self) -> u64 {
        self.exported = true;
        self.alloc.token
    }
}

impl Drop for AllocationGuard {
    fn drop(&mut self) {
        if !self.exported {
            if let RResult::RErr(e) = self.transport.free_allocation(self.alloc.token) {
                tracing::warn!(target: "store", token = self.alloc.token, error = %e, "free_allocation failed");
            }
        }
    }
}

impl fmt::Debug for AllocationGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AllocationGuard")
            .field("len", &self.alloc.len)
            .field("token", &self.alloc.token)
            .field("exported", &self.exported)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    //! The views over a transport that keeps its memory on the heap: what
    //! `scripts/miri.sh` runs the unsafe slices of this module through.

    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    use abi_stable::{
        sabi_trait::TD_Opaque,
        std_types::{RSliceMut, RVec},
    };

    use super::*;
    use crate::{
        transport::{ExportRequest, Health, ImportInfo, Stat, Transport, TransportInfo},
        DType, Device, ShardMeta,
    };

    /// Views and allocations as heap buffers, by token; `short` makes
    /// `import_view` return one byte less than asked. Shared with the test
    /// (`Arc<Heap>` is the transport) so it can read the books.
    #[derive(Default)]
    struct Heap {
        // `Vec`, not `Box<[u8]>`: moving a box into the map would retag it
        // as unique and invalidate the pointer already handed out (Miri's
        // Stacked Borrows says so); a vector's buffer is not retagged.
        views: Mutex<HashMap<u64, Vec<u8>>>,
        allocs: Mutex<HashMap<u64, Vec<u8>>>,
        next: Mutex<u64>,
        short: bool,
    }

    impl Heap {
        fn token(&self) -> u64 {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        }
    }

    impl Transport for Arc<Heap> {
        fn describe(&self) -> TransportInfo {
            TransportInfo {
                name: "heap".into(),
                version: "0".into(),
                capabilities: crate::Capabilities::CPU,
                needs_identity: Default::default(),
            }
        }
        fn export(&self, _req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
            RResult::RErr(AbiError::unsupported("heap exports nothing"))
        }
        fn unexport(&self, _id: ShardId) -> RResult<(), AbiError> {
            RResult::ROk(())
        }
        fn import_into(
            &self,
            _desc: RSlice<'_, u8>,
            _meta: &ShardMeta,
            _dst: RSliceMut<'_, u8>,
        ) -> RResult<ImportInfo, AbiError> {
            RResult::RErr(AbiError::unsupported("views only"))
        }
        fn import_view(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<Region, AbiError> {
            let len = meta.byte_len as usize - usize::from(self.short);
            let bytes: Vec<u8> = (0..len).map(|i| desc[0].wrapping_add(i as u8)).collect();
            let token = self.token();
            let ptr = bytes.as_ptr();
            self.views.lock().unwrap().insert(token, bytes);
            RResult::ROk(Region { ptr, len, token })
        }
        fn release(&self, token: u64) -> RResult<(), AbiError> {
            match self.views.lock().unwrap().remove(&token) {
                Some(_) => RResult::ROk(()),
                None => RResult::RErr(AbiError::invalid_argument(format!("token {token}"))),
            }
        }
        fn allocate(&self, _id: ShardId, len: u64) -> RResult<Allocation, AbiError> {
            let mut bytes = vec![0u8; len as usize];
            let token = self.token();
            let ptr = bytes.as_mut_ptr();
            self.allocs.lock().unwrap().insert(token, bytes);
            RResult::ROk(Allocation {
                ptr,
                len: len as usize,
                token,
            })
        }
        fn free_allocation(&self, token: u64) -> RResult<(), AbiError> {
            match self.allocs.lock().unwrap().remove(&token) {
                Some(_) => RResult::ROk(()),
                None => RResult::RErr(AbiError::invalid_argument(format!("token {token}"))),
            }
        }
        fn stats(&self) -> RVec<Stat> {
            RVec::new()
        }
        fn health(&self) -> Health {
            Health {
                ok: true,
                message: "ok".into(),
            }
        }
    }

    fn meta(len: u64) -> ShardMeta {
        ShardMeta {
            dtype: DType::U8,
            shape: vec![len].into(),
            device: Device::CPU,
            byte_len: len,
            checksum: abi_stable::std_types::ROption::RNone,
        }
    }

    fn shared(heap: Heap) -> (SharedTransport, Arc<Heap>) {
        // The test keeps its own handle on the books through a second Arc.
        let heap = Arc::new(heap);
        let t: SharedTransport = Arc::new(crate::TransportBox::from_value(
            Arc::clone(&heap),
            TD_Opaque,
        ));
        (t, heap)
    }

    #[test]
    fn a_view_reads_the_lent_bytes_and_releases_its_lease_on_drop() {
        let (t, heap) = shared(Heap::default());
        let v = LeasedView::import(&t, &[10], &meta(300)).unwrap();
        assert_eq!(v.len(), 300);
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &b)| b == 10u8.wrapping_add(i as u8)));
        let w = LeasedView::import(&t, &[0], &meta(0)).unwrap();
        assert!(w.is_empty());
        assert_eq!(heap.views.lock().unwrap().len(), 2);
        drop(v);
        drop(w);
        assert!(
            heap.views.lock().unwrap().is_empty(),
            "both leases released"
        );
    }

    #[test]
    fn a_region_of_the_wrong_length_is_refused_and_its_lease_released() {
        let (t, heap) = shared(Heap {
            short: true,
            ..Heap::default()
        });
        let e = LeasedView::import(&t, &[1], &meta(64)).unwrap_err();
        assert!(e.message.contains("63 bytes for a shard of 64"), "{e}");
        assert!(heap.views.lock().unwrap().is_empty());
    }

    #[test]
    fn an_allocation_is_written_and_freed_unless_exported() {
        let (t, heap) = shared(Heap::default());
        let id = ShardId { hi: 1, lo: 2 };
        let mut g = AllocationGuard::allocate(&t, id, 4096).unwrap();
        g.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        assert!(g.as_slice().iter().enumerate().all(|(i, &b)| b == i as u8));
        drop(g);
        assert!(heap.allocs.lock().unwrap().is_empty(), "freed on drop");
        let mut g = AllocationGuard::allocate(&t, id, 16).unwrap();
        let token = g.mark_exported();
        assert_eq!(g.as_slice().len(), 16, "still readable after export");
        drop(g);
        assert!(
            heap.allocs.lock().unwrap().contains_key(&token),
            "the transport frees it"
        );
        let empty = AllocationGuard::allocate(&t, id, 0).unwrap();
        assert!(empty.as_slice().is_empty());
    }

    #[test]
    #[should_panic(expected = "is exported")]
    fn exported_bytes_cannot_be_written() {
        let (t, _) = shared(Heap::default());
        let mut g = AllocationGuard::allocate(&t, ShardId { hi: 0, lo: 1 }, 8).unwrap();
        g.mark_exported();
        g.as_mut_slice()[0] = 1;
    }
}
