//! `CudaShard`: a CUDA shard on this process's GPU (a view of the owner's
//! memory, or a copy this process owns), lent through DLPack.

#[allow(clippy::wildcard_imports)]
use super::*;

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
