//! Memory exchange with Python: reading the bytes of objects passed to
//! `put` (the buffer protocol), and lending fetched bytes out (the buffer
//! protocol and DLPack). This is the crate's only module with `unsafe`: both
//! protocols are C ABIs of raw pointers whose lifetimes Python manages.
//!
//! # Lifetimes
//! A fetched [`Shard`] owns its bytes through `keep` (an `Arc` of the host's
//! `ShardBytes`, whose zero-copy variant holds the transport lease, or of a
//! private copy). Every object that can reach the memory holds `keep`:
//! a buffer export holds a reference to the `Shard` (`Py_buffer.obj`), a
//! DLPack capsule holds a clone of `keep` in its manager context and drops
//! it in the deleter (which consumers may call from any thread, without the
//! GIL: it only drops Rust values). So the lease ends when the last NumPy
//! array, torch tensor, memoryview or `Shard` reaching it goes away.

use std::{
    alloc::Layout,
    any::Any,
    ffi::{c_char, c_int, c_void, CStr},
    ptr::{self, NonNull},
    sync::Arc,
};

use pyo3::{
    exceptions::{PyBufferError, PyTypeError},
    ffi,
    prelude::*,
    types::{PyBytes, PyDict, PyTuple},
};
use shardport_abi::{DType, ShardId};
use shardport_host::{
    node::HUGE_PAGES_FROM, DeviceView, FetchMode, Fetched, Selection, ShardBytes,
};

use crate::{
    convert::{buffer_format, dlpack_dtype, dtype_name, itemsize},
    errors::{py_err, Kind},
};

// ---------------------------------------------------------------------------
// Reading `put` inputs

/// A buffer obtained from a Python object with `PyObject_GetBuffer`,
/// released on drop.
pub(crate) struct InBuffer {
    view: Box<ffi::Py_buffer>,
}

impl InBuffer {
    /// Asks `obj` for a strided, formatted, read-only buffer.
    pub(crate) fn get(obj: &Bound<'_, PyAny>) -> PyResult<InBuffer> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // SAFETY: `obj` is a live object (borrowed with the GIL held) and
        // `view` a writable, properly aligned Py_buffer that outlives the call.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(InBuffer { view })
    }

    /// The PEP 3118 format (`B` when the exporter gave none).
    pub(crate) fn format(&self) -> String {
        if self.view.format.is_null() {
            return "B".to_owned();
        }
        // SAFETY: a non-null format is a NUL-terminated string owned by the
        // exporter, valid until the buffer is released (after `self`).
        unsafe { CStr::from_ptr(self.view.format) }
            .to_string_lossy()
            .into_owned()
    }

    /// Bytes per item.
    pub(crate) fn itemsize(&self) -> usize {
        self.view.itemsize.max(0) as usize
    }

    fn dims(&self) -> Vec<isize> {
        let nd = self.view.ndim.max(0) as usize;
        if nd == 0 {
            return Vec::new();
        }
        if self.view.shape.is_null() {
            return vec![self.view.len / self.view.itemsize.max(1)];
        }
        // SAFETY: with PyBUF_ND requested, a non-null `shape` has `ndim`
        // entries valid until release.
        unsafe { std::slice::from_raw_parts(self.view.shape, nd) }.to_vec()
    }

    /// The shape in elements.
    pub(crate) fn shape(&self) -> Vec<u64> {
        self.dims().iter().map(|&d| d.max(0) as u64).collect()
    }

    /// What a copy needs, as a value that may cross into a thread without
    /// the GIL (the buffer itself stays held by `self`).
    pub(crate) fn source(&self) -> Source {
        let shape = self.dims();
        let strides = if self.view.strides.is_null() {
            None
        } else {
            // SAFETY: PyBUF_STRIDES was requested: `ndim` strides, valid until release.
            Some(unsafe { std::slice::from_raw_parts(self.view.strides, shape.len()) }.to_vec())
        };
        Source {
            ptr: self.view.buf as *const u8,
            len: self.view.len.max(0) as usize,
            item: self.itemsize(),
            shape,
            strides,
        }
    }
}

impl Drop for InBuffer {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: `view` was filled by a successful PyObject_GetBuffer
            // and is released exactly once, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// A writable, C-contiguous buffer obtained from a Python object (the
/// destination of `fetch_into`), released on drop.
pub(crate) struct OutBuffer {
    inner: InBuffer,
}

impl OutBuffer {
    /// Asks `obj` for a writable, C-contiguous buffer.
    pub(crate) fn get(obj: &Bound<'_, PyAny>) -> PyResult<OutBuffer> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // SAFETY: as in `InBuffer::get`.
        let rc = unsafe {
            ffi::PyObject_GetBuffer(
                obj.as_ptr(),
                &mut *view,
                ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_WRITABLE,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(OutBuffer {
            inner: InBuffer { view },
        })
    }

    /// The destination bytes, as a value that may cross into a thread
    /// without the GIL.
    pub(crate) fn dest(&mut self) -> Dest {
        Dest {
            ptr: self.inner.view.buf.cast(),
            len: self.inner.view.len.max(0) as usize,
        }
    }
}

/// The writable memory of an [`OutBuffer`].
pub(crate) struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: used only while its `OutBuffer` holds the exporter's buffer.
unsafe impl Send for Dest {}

impl Dest {
    /// The bytes. Python code may race on them (as with any NumPy array
    /// written from a thread); Rust holds no other reference.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: a writable, C-contiguous buffer of `len` bytes, held by
        // the `OutBuffer` for the duration of the borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// The readable memory of an [`InBuffer`]: pointer, item size, shape and
/// byte strides.
pub(crate) struct Source {
    ptr: *const u8,
    len: usize,
    item: usize,
    shape: Vec<isize>,
    strides: Option<Vec<isize>>,
}

// SAFETY: `Source` is only used while the `InBuffer` it came from is alive
// (the exporter keeps the memory valid until release); it only reads.
unsafe impl Send for Source {}
// SAFETY: as above; nothing is written through it.
unsafe impl Sync for Source {}

impl Source {
    /// Bytes the copy produces: every element once, in C order.
    pub(crate) fn packed_len(&self) -> usize {
        self.shape
            .iter()
            .map(|&d| d.max(0) as usize)
            .product::<usize>()
            * self.item
    }

    /// True when the elements are already packed in C order.
    fn c_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else {
            return true;
        };
        let mut expect = self.item as isize;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d > 1 && s != expect {
                return false;
            }
            expect *= d.max(1);
        }
        true
    }

    /// Copies the elements, in C order, into `dst` (`packed_len()` bytes):
    /// one pass, strided inputs gathered directly (no intermediate copy).
    pub(crate) fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.packed_len(), "destination size");
        if dst.is_empty() {
            return;
        }
        if self.c_contiguous() {
            // SAFETY: the exporter's buffer holds `len >= dst.len()` readable
            // bytes from `ptr`; `dst` is a distinct Rust allocation.
            unsafe { ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), dst.len()) };
            return;
        }
        let strides = self.strides.as_deref().unwrap_or(&[]);
        // The innermost run of dimensions stored contiguously is copied as one block.
        let mut block = self.item;
        let mut outer = self.shape.len();
        while outer > 0 && strides[outer - 1] == block as isize {
            block *= self.shape[outer - 1] as usize;
            outer -= 1;
        }
        let mut pos = 0;
        // SAFETY: every offset visited is `sum(i_k * stride_k)` for in-range
        // indices, i.e. an element of the exporter's buffer (PEP 3118).
        unsafe {
            gather(
                self.ptr,
                &self.shape[..outer],
                &strides[..outer],
                block,
                dst,
                &mut pos,
            )
        };
        debug_assert_eq!(pos, dst.len());
        let _ = self.len;
    }
}

/// # Safety
/// `src` plus every in-range strided offset over `shape` must point at
/// `block` readable bytes.
unsafe fn gather(
    src: *const u8,
    shape: &[isize],
    strides: &[isize],
    block: usize,
    dst: &mut [u8],
    pos: &mut usize,
) {
    match shape.split_first() {
        None => {
            // SAFETY: the caller guarantees `block` readable bytes at `src`;
            // `dst[pos..pos + block]` is in bounds (sizes were checked).
            unsafe { ptr::copy_nonoverlapping(src, dst[*pos..*pos + block].as_mut_ptr(), block) };
            *pos += block;
        }
        Some((&n, rest)) => {
            for i in 0..n {
                // SAFETY: `i < n` keeps the offset inside the exporter's buffer.
                unsafe {
                    gather(
                        src.offset(i * strides[0]),
                        rest,
                        &strides[1..],
                        block,
                        dst,
                        pos,
                    )
                };
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Lending fetched bytes

/// A private, writable copy of a shard (copy mode): Python may write to it
/// through the pointers it is lent, so Rust never forms a reference to its
/// contents after construction (except to fill it, before lending it).
pub(crate) struct PrivateBuf {
    ptr: *mut u8,
    len: usize,
    alloc: Alloc,
}

enum Alloc {
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
const COPY_ALIGN: usize = 16;

impl PrivateBuf {
    fn new(mut v: Vec<u8>) -> PrivateBuf {
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
            shardport_abi::kit::advise_huge_pages(buf.as_mut_slice());
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

type Keep = Arc<dyn Any + Send + Sync>;

/// The node and handle a read-only view came from. The node is held weakly:
/// a view must not keep its node alive (nor make `close()` wait for it).
pub(crate) struct ViewOrigin {
    pub(crate) node: shardport_host::node::WeakNode,
    pub(crate) handle: Py<crate::handle::PyHandle>,
}

/// A fetched shard: a zero-copy view of the owner's memory (mode "view",
/// read-only) or a private copy (mode "copy", writable). Implements DLPack
/// (`np.from_dlpack`, `torch.from_dlpack`) and the buffer protocol
/// (`np.asarray`, `memoryview`) without copying; `numpy()` also handles
/// bfloat16 and float8 (ml_dtypes). The zero-copy lease lasts as long as the
/// last object reaching the memory.
#[pyclass(module = "shardport._core", name = "Shard", frozen)]
pub struct Shard {
    keep: Keep,
    ptr: usize,
    len: usize,
    writable: bool,
    /// For a read-only view: where to fetch a private view of the same
    /// shard from, for DLPack exports (see `writable_memory`).
    origin: Option<ViewOrigin>,
    id: ShardId,
    dtype: DType,
    shape: Vec<u64>,
    selection: Selection,
    /// Shape and C-order byte strides as `Py_ssize_t`, for buffer exports.
    buf_shape: Box<[isize]>,
    buf_strides: Box<[isize]>,
    flat: Box<[isize; 2]>,
}

impl Shard {
    /// Wraps a fetch result. A copy nobody else holds becomes private and
    /// writable; anything shared (a view, or a copy the consumer cache keeps)
    /// is read-only.
    pub(crate) fn from_fetched(f: Fetched) -> Shard {
        let Fetched {
            id,
            meta,
            data,
            selection,
            ..
        } = f;
        let (keep, ptr, len, writable): (Keep, usize, usize, bool) = match Arc::try_unwrap(data) {
            Ok(ShardBytes::Owned(v)) => {
                let p = PrivateBuf::new(v);
                let (ptr, len) = (p.ptr as usize, p.len);
                (Arc::new(p), ptr, len, true)
            }
            Ok(view) => {
                // A private (copy-on-write) view may be written: its pages
                // are this process's own once touched.
                let writable = matches!(&view, ShardBytes::View(v) if v.is_private());
                let a = Arc::new(view);
                let (ptr, len) = (a.as_ptr() as usize, a.len());
                (a, ptr, len, writable)
            }
            Err(shared) => {
                let (ptr, len) = (shared.as_ptr() as usize, shared.len());
                (shared, ptr, len, false)
            }
        };
        let shape: Vec<u64> = meta.shape.iter().copied().collect();
        let item = itemsize(meta.dtype);
        let buf_shape: Box<[isize]> = shape.iter().map(|&d| d as isize).collect();
        let strides: Box<[isize]> = c_order_strides(&shape)
            .iter()
            .map(|&s| s.wrapping_mul(item as i64) as isize)
            .collect();
        Shard {
            keep,
            ptr: if len == 0 {
                NonNull::<u64>::dangling().as_ptr() as usize
            } else {
                ptr
            },
            len,
            writable,
            origin: None,
            id,
            dtype: meta.dtype,
            buf_shape,
            buf_strides: strides,
            flat: Box::new([len as isize, 1]),
            shape,
            selection,
        }
    }

    /// A copy fetched with `fetch_into` into `buf` (see `Node.fetch`).
    pub(crate) fn from_copy(
        handle: &shardport_host::Handle,
        selection: Selection,
        buf: PrivateBuf,
    ) -> Shard {
        let data = Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data: Arc::new(ShardBytes::Owned(Vec::new())),
            selection,
            elapsed: std::time::Duration::ZERO,
        };
        let mut shard = Shard::from_fetched(data);
        shard.ptr = if buf.len == 0 {
            shard.ptr
        } else {
            buf.ptr as usize
        };
        shard.len = buf.len;
        shard.flat = Box::new([buf.len as isize, 1]);
        shard.writable = true;
        shard.keep = Arc::new(buf);
        shard
    }

    fn item(&self) -> usize {
        itemsize(self.dtype)
    }

    /// Which transport served it, why, and how.
    pub(crate) fn selection(&self) -> &Selection {
        &self.selection
    }

    /// The bytes as a slice (reading only; a private copy may be written
    /// by Python meanwhile, as with any NumPy array shared between threads).
    fn bytes(&self) -> &[u8] {
        // SAFETY: `keep` keeps `len` bytes at `ptr` alive for as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// Marks a read-only view with the node and handle it came from, so
    /// that DLPack exports can fetch a private view of the same shard.
    pub(crate) fn with_origin(mut self, origin: impl FnOnce() -> ViewOrigin) -> Shard {
        // A read-only view (not a copy the consumer cache shares, nor a
        // private view): what `keep` holds says which.
        let read_only_view = self
            .keep
            .downcast_ref::<ShardBytes>()
            .is_some_and(|b| matches!(b, ShardBytes::View(v) if !v.is_private()));
        if read_only_view {
            self.origin = Some(origin());
        }
        self
    }

    /// A private copy of the bytes: `(keep, address)`.
    fn private_copy(&self) -> (Keep, usize) {
        let p = PrivateBuf::new(self.bytes().to_vec());
        let ptr = if p.len == 0 { self.ptr } else { p.ptr as usize };
        (Arc::new(p), ptr)
    }

    /// Memory with these bytes that its borrower may write: the shard's own
    /// when it is writable (a copy, a private view); for a read-only view, a
    /// private copy-on-write view of the same shard (`Node::fetch_private`:
    /// zero-copy until written, its own lease, writes never reach the
    /// owner or this view); a private copy of the bytes in hand otherwise:
    /// a copy the cache shares, a view whose node was closed, or one whose
    /// private fetch failed (the owner removed the shard or died meanwhile:
    /// this view's lease still holds the bytes). `(keep, address, copied)`.
    fn writable_memory(&self, py: Python<'_>) -> (Keep, usize, bool) {
        if self.writable {
            return (Arc::clone(&self.keep), self.ptr, false);
        }
        let node = self.origin.as_ref().and_then(|o| o.node.upgrade());
        if let (Some(node), Some(o)) = (node, &self.origin) {
            let handle = o.handle.bind(py).get();
            match crate::logs::unlocked(py, || node.fetch_private(&handle.inner)) {
                Ok(private) => {
                    let copied = !matches!(&*private.data, ShardBytes::View(_));
                    let shard = Shard::from_fetched(private);
                    debug_assert!(shard.writable, "a private fetch is writable");
                    return (shard.keep, shard.ptr, copied);
                }
                Err(e) => tracing::debug!(
                    target: "python",
                    shard = %self.id,
                    error = %e,
                    "no private view for a DLPack export; copying the bytes in hand"
                ),
            }
        }
        let (keep, ptr) = self.private_copy();
        (keep, ptr, true)
    }

    /// `versioned`: the consumer's DLPack minor version (of major 1), or
    /// `None` for a legacy capsule. Every export is memory the consumer may
    /// write ([`writable_memory`](Self::writable_memory)): torch ignores
    /// DLPack's read-only flag, and a write into the owner's read-only
    /// mapping would kill the process.
    ///
    /// `copy` is the consumer's request (DLPack: `True` always copies,
    /// `False` never: a `BufferError` where only a copy can be had).
    fn dlpack<'py>(
        &self,
        py: Python<'py>,
        versioned: Option<u32>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dtype = dl_type(
            self.dtype,
            versioned,
            "; use shard.numpy() (ml_dtypes) or shard.torch()",
        )?;
        let (keep, ptr, copied) = if copy == Some(true) {
            let (keep, ptr) = self.private_copy();
            (keep, ptr, true)
        } else {
            self.writable_memory(py)
        };
        if copied && copy == Some(false) {
            return Err(PyBufferError::new_err(
                "copy=False, but this read-only shard can only be lent to DLPack as a copy \
                 (no private view of it: its node is closed, or its owner removed it)",
            ));
        }
        capsule(
            py,
            Export {
                keep,
                ptr,
                device: DLDevice {
                    device_type: 1,
                    device_id: 0,
                },
                dtype,
                shape: &self.shape,
                strides: c_order_strides(&self.shape),
                writable: true,
                copied,
            },
            versioned,
        )
    }
}

/// A CUDA shard viewed in place (`Node.fetch_cuda`): the owner's GPU
/// memory mapped into this process by cuda-ipc, no byte copied. DLPack
/// only (`torch.from_dlpack`, CuPy, JAX): there is no host access. The
/// memory is the owner's: read it, do not write it (the capsule is marked
/// read-only). The lease lasts as long as the last object reaching it.
#[pyclass(module = "shardport._core", name = "CudaShard", frozen)]
pub struct CudaShard {
    keep: Keep,
    /// A copy this process owns (fetched without a view): writable.
    owned: bool,
    ptr: usize,
    nbytes: u64,
    device_id: i32,
    id: ShardId,
    dtype: DType,
    shape: Vec<u64>,
    selection: Selection,
}

impl CudaShard {
    /// Wraps a device view (its lease moves into `keep`), on the GPU the
    /// driver says its address is on here (see [`crate::cuda`]).
    pub(crate) fn new(view: DeviceView) -> PyResult<CudaShard> {
        // `Node::fetch_device` gives views of CUDA shards only.
        let meta = view.meta();
        // The owner's index is not necessarily ours (another
        // CUDA_VISIBLE_DEVICES): ask where the mapping is. An empty shard
        // has no address (maybe 0, and DLPack wants non-null); it stays
        // on the owner's index.
        let (ptr, device_id) = if view.is_empty() {
            (
                NonNull::<u64>::dangling().as_ptr() as usize,
                meta.device.index as i32,
            )
        } else {
            let device = crate::cuda::device_of(view.addr().0)
                .map_err(|why| py_err(Kind::TransportUnavailable, why))?;
            (view.addr().0 as usize, device)
        };
        Ok(CudaShard {
            ptr,
            nbytes: view.len(),
            device_id,
            id: view.id(),
            dtype: meta.dtype,
            shape: meta.shape.iter().copied().collect(),
            selection: view.selection().clone(),
            keep: Arc::new(view),
            owned: false,
        })
    }

    /// A copy of `handle`'s shard in device memory this process owns
    /// (`memory`, filled by the fetch that gave `selection`).
    pub(crate) fn copied(
        memory: crate::cuda::DeviceAlloc,
        handle: &shardport_host::Handle,
        selection: Selection,
    ) -> CudaShard {
        let meta = &handle.meta;
        CudaShard {
            ptr: if meta.byte_len == 0 {
                NonNull::<u64>::dangling().as_ptr() as usize
            } else {
                memory.addr() as usize
            },
            nbytes: meta.byte_len,
            device_id: memory.ordinal(),
            id: handle.id,
            dtype: meta.dtype,
            shape: meta.shape.iter().copied().collect(),
            selection,
            keep: Arc::new(memory),
            owned: true,
        }
    }
}

#[pymethods]
impl CudaShard {
    /// DLPack export of the device memory, zero-copy. `stream` is accepted
    /// and needs nothing: the import already waited for the event the
    /// owner recorded when it put the tensor, so the bytes are ready for
    /// any stream. `dl_device` must be this GPU;
    /// `copy=True` is refused (clone the tensor you get instead). Needs a
    /// consumer of DLPack >= 1.0 (`max_version`): a read-only export.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let here = (KDL_CUDA, self.device_id);
        if let Some(dev) = dl_device {
            if dev != here {
                return Err(PyBufferError::new_err(format!(
                    "the shard is on CUDA device {} {here:?}; device {dev:?} was asked for",
                    self.device_id
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a CUDA shard is exported without copying; copy the tensor you get (e.g. .clone())",
            ));
        }
        let minor = consumer_version(max_version);
        if minor.is_none() && !self.owned {
            return Err(PyBufferError::new_err(
                "the shard is the owner's memory, read-only, and DLPack before 1.0 cannot \
                 say so: the consumer must pass max_version=(1, 0) or later (torch >= 2.5 does)",
            ));
        }
        let dtype = dl_type(self.dtype, minor, "")?;
        capsule(
            py,
            Export {
                keep: Arc::clone(&self.keep),
                ptr: self.ptr,
                device: DLDevice {
                    device_type: KDL_CUDA,
                    device_id: self.device_id,
                },
                dtype,
                shape: &self.shape,
                strides: c_order_strides(&self.shape),
                writable: self.owned,
                copied: false,
            },
            minor,
        )
    }

    /// `(kDLCUDA, device index)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.device_id)
    }

    /// A torch CUDA tensor over the shard's memory (needs torch):
    /// `torch.from_dlpack(self)`. Do not write to it.
    fn torch<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("torch")?.call_method1("from_dlpack", (slf,))
    }

    /// Shard id (32 hex digits).
    #[getter]
    fn id(&self) -> String {
        self.id.to_string()
    }

    /// Element type, NumPy's name.
    #[getter]
    fn dtype(&self) -> String {
        dtype_name(self.dtype)
    }

    /// Shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter().copied())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// The CUDA device index the memory is on.
    #[getter]
    fn device(&self) -> i32 {
        self.device_id
    }

    /// The transport that served it (`cuda-ipc` for a view, `http` for a
    /// copy from another machine).
    #[getter]
    fn transport(&self) -> &str {
        &self.selection.transport
    }

    /// True for a copy in memory this process owns (writable, freed with
    /// the last reference); false for a view of the owner's memory.
    #[getter]
    fn owned(&self) -> bool {
        self.owned
    }

    /// Why that transport was chosen.
    #[getter]
    fn reason(&self) -> &str {
        &self.selection.reason
    }

    fn __repr__(&self) -> String {
        format!(
            "CudaShard(id={}, dtype={}, shape={}, device=cuda:{}, transport={})",
            self.id,
            dtype_name(self.dtype),
            shape_text(&self.shape),
            self.device_id,
            self.selection.transport,
        )
    }
}

/// A shape as Python writes the tuple: `(3, 4)`, `(5,)`, `()`.
fn shape_text(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let comma = if dims.len() == 1 { "," } else { "" };
    format!("({}{comma})", dims.join(", "))
}

/// The consumer's DLPack minor version (of major 1; a later major is
/// served 1.1) from `__dlpack__`'s `max_version`, or `None` for a legacy
/// consumer (no `max_version`, or major 0).
fn consumer_version(max_version: Option<(u32, u32)>) -> Option<u32> {
    match max_version {
        Some((major, minor)) if major >= 1 => Some(if major > 1 { 1 } else { minor }),
        _ => None,
    }
}

/// The DLPack type of `dtype` for a consumer of version `versioned` (see
/// [`consumer_version`]): float8 codes exist from DLPack 1.1 on. `hint`
/// ends the error for a consumer that cannot take it.
fn dl_type(dtype: DType, versioned: Option<u32>, hint: &str) -> PyResult<DLDataType> {
    let Some((code, bits)) = dlpack_dtype(dtype) else {
        return Err(PyBufferError::new_err(format!(
            "{} has no DLPack type",
            dtype_name(dtype)
        )));
    };
    if (7..=14).contains(&code) && versioned.is_none_or(|minor| minor < 1) {
        return Err(PyBufferError::new_err(format!(
            "{} needs DLPack >= 1.1 (the consumer asked for less){hint}",
            dtype_name(dtype)
        )));
    }
    Ok(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// DLPack's device type of CUDA memory.
const KDL_CUDA: i32 = 2;

/// Element strides of a C-contiguous array of `shape`.
fn c_order_strides(shape: &[u64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        // Wrapping: a zero dimension allows others whose product
        // overflows, and then no stride is ever used to address a byte.
        strides[i] = strides[i + 1].wrapping_mul(shape[i + 1].max(1) as i64);
    }
    strides
}

/// What a DLPack capsule lends: `ptr` (host or device memory, per
/// `device`), kept alive by `keep` until the consumer's deleter runs.
struct Export<'a> {
    keep: Keep,
    ptr: usize,
    device: DLDevice,
    dtype: DLDataType,
    shape: &'a [u64],
    /// In elements.
    strides: Vec<i64>,
    writable: bool,
    copied: bool,
}

/// A DLPack capsule lending `e`: `dltensor_versioned` when `versioned` is
/// the consumer's minor version (of major 1), else a legacy `dltensor`.
fn capsule<'py>(
    py: Python<'py>,
    e: Export<'_>,
    versioned: Option<u32>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut holder = Box::new(Holder {
        legacy: DLManagedTensor {
            dl_tensor: empty_tensor(),
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        versioned: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: 1,
                minor: versioned.unwrap_or(0).min(1),
            },
            manager_ctx: ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags: (if e.writable { 0 } else { DLPACK_FLAG_READ_ONLY })
                | (if e.copied { DLPACK_FLAG_IS_COPIED } else { 0 }),
            dl_tensor: empty_tensor(),
        },
        _keep: e.keep,
        shape: e.shape.iter().map(|&d| d as i64).collect(),
        strides: e.strides,
    });
    let t = DLTensor {
        data: e.ptr as *mut c_void,
        device: e.device,
        ndim: e.shape.len() as i32,
        dtype: e.dtype,
        shape: holder.shape.as_mut_ptr(),
        strides: holder.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    holder.legacy.dl_tensor = t;
    holder.versioned.dl_tensor = t;
    let holder = Box::into_raw(holder);
    // SAFETY: `holder` is a fresh, leaked Box; the capsule owns it until
    // a consumer takes it (and calls the deleter) or the capsule dies
    // unconsumed (and its destructor calls the deleter).
    unsafe {
        let (p, name, dtor): (*mut c_void, &CStr, ffi::PyCapsule_Destructor) =
            if versioned.is_some() {
                (*holder).versioned.manager_ctx = holder.cast();
                (
                    ptr::addr_of_mut!((*holder).versioned).cast(),
                    c"dltensor_versioned",
                    capsule_versioned,
                )
            } else {
                (*holder).legacy.manager_ctx = holder.cast();
                (
                    ptr::addr_of_mut!((*holder).legacy).cast(),
                    c"dltensor",
                    capsule_legacy,
                )
            };
        let cap = ffi::PyCapsule_New(p, name.as_ptr(), Some(dtor));
        if cap.is_null() {
            drop(Box::from_raw(holder));
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, cap))
    }
}

#[pymethods]
impl Shard {
    /// DLPack export (the Python array API standard): zero-copy on the CPU.
    /// `stream` must be None (CPU); `copy=True` exports a private copy.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(s) = stream {
            if !s.is_none() {
                return Err(PyBufferError::new_err("stream must be None for CPU memory"));
            }
        }
        if let Some(dev) = dl_device {
            if dev != (1, 0) {
                return Err(PyBufferError::new_err(format!(
                    "the shard is on the CPU (1, 0); device {dev:?} was asked for: fetch gives CPU memory"
                )));
            }
        }
        let versioned = consumer_version(max_version);
        self.dlpack(py, versioned, copy)
    }

    /// `(kDLCPU, 0)`: fetched shards are host memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }

    // SAFETY (both buffer methods): `view` is the Py_buffer CPython passes
    // in; every pointer stored in it (data, shape, strides, format) lives in
    // `self`, whose reference `view.obj` holds until the buffer is released.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if flags & ffi::PyBUF_WRITABLE != 0 && !me.writable {
            return Err(PyBufferError::new_err(
                "the shard is read-only (a zero-copy view of the owner's memory); fetch with mode=\"copy\" for a writable copy",
            ));
        }
        let multi_dim = me.shape.iter().filter(|&&d| d > 1).count() > 1;
        if flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS && multi_dim {
            return Err(PyBufferError::new_err(
                "the shard is C-contiguous; a Fortran-contiguous buffer was asked for",
            ));
        }
        let formatted = flags & ffi::PyBUF_FORMAT != 0;
        let (format, item, shape, strides, ndim): (
            *mut c_char,
            isize,
            *mut isize,
            *mut isize,
            c_int,
        ) = if formatted {
            let Some(f) = buffer_format(me.dtype) else {
                // TypeError, not BufferError: NumPy then falls back to `__array__`.
                return Err(PyTypeError::new_err(format!(
                    "{} has no buffer-protocol format; use np.asarray(shard) or shard.numpy() (ml_dtypes), or torch.from_dlpack(shard)",
                    dtype_name(me.dtype)
                )));
            };
            (
                f.as_ptr().cast_mut(),
                me.item() as isize,
                me.buf_shape.as_ptr().cast_mut(),
                me.buf_strides.as_ptr().cast_mut(),
                me.buf_shape.len() as c_int,
            )
        } else {
            // Unformatted: plain bytes, one dimension.
            (
                ptr::null_mut(),
                1,
                me.flat.as_ptr().cast_mut(),
                me.flat[1..].as_ptr().cast_mut(),
                1,
            )
        };
        // SAFETY: see above; `view` is valid for writes per the protocol.
        unsafe {
            (*view).buf = me.ptr as *mut c_void;
            (*view).len = me.len as isize;
            (*view).readonly = c_int::from(!me.writable);
            (*view).itemsize = item;
            (*view).format = format;
            // Without PyBUF_ND the consumer sees one dimension of `len / itemsize` items.
            (*view).ndim = if flags & ffi::PyBUF_ND != 0 { ndim } else { 1 };
            (*view).shape = if flags & ffi::PyBUF_ND != 0 {
                shape
            } else {
                ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                strides
            } else {
                ptr::null_mut()
            };
            (*view).suboffsets = ptr::null_mut();
            (*view).internal = ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}

    /// The shard as a NumPy array of its dtype and shape, without copying
    /// (bfloat16 and float8 through ml_dtypes). Read-only in view mode.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        dtype: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import("numpy")?;
        let me = slf.get();
        let name = dtype_name(me.dtype);
        let np_dtype = match np.getattr(name.as_str()) {
            Ok(d) if !name.starts_with("float8") && name != "bfloat16" => d,
            _ => py.import("ml_dtypes")?.getattr(name.as_str())?,
        };
        let kwargs = PyDict::new(py);
        kwargs.set_item("dtype", np.getattr("uint8")?)?;
        let bytes = Bound::new(
            py,
            RawBytes {
                _keep: Arc::clone(&me.keep),
                ptr: me.ptr,
                len: me.len,
                writable: me.writable,
                flat: Box::new([me.len as isize, 1]),
            },
        )?;
        let raw = np.call_method("frombuffer", (bytes,), Some(&kwargs))?;
        let shape = PyTuple::new(py, me.shape.iter().copied())?;
        let mut arr = raw
            .call_method1("view", (np_dtype,))?
            .call_method1("reshape", (shape,))?;
        if let Some(d) = dtype {
            if !d.is_none() {
                arr = arr.call_method1("astype", (d,))?;
            }
        }
        if copy == Some(true) {
            arr = arr.call_method0("copy")?;
        }
        Ok(arr)
    }

    /// Same as `np.asarray(shard)`: a zero-copy NumPy array of the shard's
    /// dtype and shape (bfloat16 and float8 via ml_dtypes).
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::__array__(slf, None, None)
    }

    /// A torch tensor (needs torch): `torch.from_dlpack`, or a
    /// reinterpreting view for float8. Zero-copy: over the shard's own
    /// memory when it is writable (a copy), over a private copy-on-write
    /// view of the owner's bytes for a view (torch has no read-only
    /// tensors; a write copies the touched pages into this tensor's memory
    /// alone). The lease lasts as long as the tensor.
    fn torch<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let torch = py.import("torch")?;
        let me = slf.get();
        let name = dtype_name(me.dtype);
        if name.starts_with("float8") {
            let mut bytes = Self::__array__(slf, None, None)?
                .call_method1("view", (py.import("numpy")?.getattr("uint8")?,))?;
            if !me.writable {
                bytes = bytes.call_method0("copy")?;
            }
            let t = torch.call_method1("from_numpy", (bytes,))?;
            return t.call_method1("view", (torch.getattr(name.as_str())?,));
        }
        // A legacy capsule, which every torch reads (private memory either
        // way, see above).
        let cap = me.dlpack(py, None, None)?;
        torch.call_method1("from_dlpack", (cap,))
    }

    /// The bytes, copied into a `bytes` object.
    fn tobytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.bytes())
    }

    /// Shard id (32 hex digits).
    #[getter]
    fn id(&self) -> String {
        self.id.to_string()
    }

    /// Element type, NumPy's name.
    #[getter]
    fn dtype(&self) -> String {
        dtype_name(self.dtype)
    }

    /// Shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.shape.iter().copied())
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// The transport that served the fetch (`posix-shm`, `http`, `cache`).
    #[getter]
    fn transport(&self) -> &str {
        &self.selection.transport
    }

    /// Why that transport was chosen (and what failed before it, if anything).
    #[getter]
    fn reason(&self) -> &str {
        &self.selection.reason
    }

    /// True when a faster candidate failed or was unavailable.
    #[getter]
    fn downgraded(&self) -> bool {
        self.selection.downgraded
    }

    /// The mode served: "view" (zero-copy, holds a lease) or "copy".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.selection.mode {
            FetchMode::View => "view",
            _ => "copy",
        }
    }

    /// True for memory that must not be written (every view).
    #[getter]
    fn readonly(&self) -> bool {
        !self.writable
    }

    fn __len__(&self) -> PyResult<usize> {
        self.shape
            .first()
            .map(|&d| d as usize)
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d shard"))
    }

    fn __repr__(&self) -> String {
        format!(
            "Shard(id={}, dtype={}, shape={}, mode={}, transport={}, readonly={})",
            self.id,
            dtype_name(self.dtype),
            shape_text(&self.shape),
            self.mode(),
            self.selection.transport,
            if self.writable { "False" } else { "True" },
        )
    }
}

/// The bytes of a shard as a flat `B` buffer, whatever the dtype: what
/// `Shard.__array__` reinterprets as bfloat16/float8 (the buffer protocol
/// has no format for them). Holds the shard's bytes like the shard does.
#[pyclass(module = "shardport._core", name = "_RawBytes", frozen)]
struct RawBytes {
    _keep: Keep,
    ptr: usize,
    len: usize,
    writable: bool,
    flat: Box<[isize; 2]>,
}

#[pymethods]
impl RawBytes {
    // SAFETY: as for `Shard`'s buffer: every pointer lives in `self`, which
    // `view.obj` keeps alive until the buffer is released.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if flags & ffi::PyBUF_WRITABLE != 0 && !me.writable {
            return Err(PyBufferError::new_err("the shard is read-only"));
        }
        // SAFETY: `view` is valid for writes per the protocol.
        unsafe {
            (*view).buf = me.ptr as *mut c_void;
            (*view).len = me.len as isize;
            (*view).readonly = c_int::from(!me.writable);
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                c"B".as_ptr().cast_mut()
            } else {
                ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND != 0 {
                me.flat.as_ptr().cast_mut()
            } else {
                ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                me.flat[1..].as_ptr().cast_mut()
            } else {
                ptr::null_mut()
            };
            (*view).suboffsets = ptr::null_mut();
            (*view).internal = ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

// ---------------------------------------------------------------------------
// DLPack ABI (dlpack.h, v1.1)

const DLPACK_FLAG_READ_ONLY: u64 = 1;
const DLPACK_FLAG_IS_COPIED: u64 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// Everything one export needs: both managed-tensor forms (one is used),
/// the shape and strides they point at, and the bytes' owner.
struct Holder {
    legacy: DLManagedTensor,
    versioned: DLManagedTensorVersioned,
    _keep: Keep,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

fn empty_tensor() -> DLTensor {
    DLTensor {
        data: ptr::null_mut(),
        device: DLDevice {
            device_type: 1,
            device_id: 0,
        },
        ndim: 0,
        dtype: DLDataType {
            code: 0,
            bits: 0,
            lanes: 0,
        },
        shape: ptr::null_mut(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    }
}

/// # Safety
/// `m` is a `DLManagedTensor` produced by [`Shard::dlpack`], deleted once.
unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `manager_ctx` is the leaked `Holder` that contains `*m`.
        drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Holder>()) });
    }
}

/// # Safety
/// As [`delete_legacy`], for the versioned form.
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as in `delete_legacy`.
        drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Holder>()) });
    }
}

/// Capsule destructor: deletes the tensor if no consumer took it (a
/// consumer renames the capsule `used_dltensor` and owns the deleter call).
unsafe extern "C" fn capsule_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the dying capsule, GIL held.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, c"dltensor".as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, c"dltensor".as_ptr()).cast::<DLManagedTensor>();
            delete_legacy(m);
        }
    }
}

/// Capsule destructor of the versioned form (`used_dltensor_versioned` once taken).
unsafe extern "C" fn capsule_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, c"dltensor_versioned".as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, c"dltensor_versioned".as_ptr())
                .cast::<DLManagedTensorVersioned>();
            delete_versioned(m);
        }
    }
}
