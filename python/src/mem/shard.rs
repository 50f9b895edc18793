//! `Shard`: a fetched CPU shard lent to Python (buffer protocol, DLPack,
//! `numpy()`, `torch()`).

#[allow(clippy::wildcard_imports)]
use super::*;

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
                // Python owns the bytes from here; they go back to the
                // node's shelf of copy destinations when the last Python
                // object reaching them is gone (`PrivateBuf`).
                let p = PrivateBuf::from_copy(v);
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
        let layout = if flags & ffi::PyBUF_FORMAT != 0 {
            let Some(f) = buffer_format(me.dtype) else {
                // TypeError, not BufferError: NumPy then falls back to `__array__`.
                return Err(PyTypeError::new_err(format!(
                    "{} has no buffer-protocol format; use np.asarray(shard) or shard.numpy() (ml_dtypes), or torch.from_dlpack(shard)",
                    dtype_name(me.dtype)
                )));
            };
            BufferLayout {
                format: f.as_ptr().cast_mut(),
                itemsize: me.item() as isize,
                ndim: me.buf_shape.len() as c_int,
                shape: me.buf_shape.as_ptr().cast_mut(),
                strides: me.buf_strides.as_ptr().cast_mut(),
            }
        } else {
            // Unformatted: plain bytes, one dimension.
            BufferLayout::bytes(ptr::null_mut(), &me.flat)
        };
        let (ptr, len, writable) = (me.ptr, me.len, me.writable);
        // SAFETY: see above; `view` is valid for writes per the protocol.
        unsafe { fill_buffer(view, slf.into_any(), ptr, len, writable, layout, flags) };
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
