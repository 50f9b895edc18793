//! `Handle`: a shard's small, serializable address.

use pyo3::{
    prelude::*,
    types::{PyBytes, PyDict, PyTuple},
};
use shardport_host::Handle;

use crate::{
    convert::dtype_name,
    errors::{py_err, Kind},
};

/// A handle to a shard: id, dtype, shape, owner and the transports that
/// export it. Small and serializable: send it to consumers through your own
/// RPC (`to_bytes()`), or pickle it (multiprocessing queues, Ray,
/// `torch.distributed` object lists).
#[pyclass(module = "shardport._core", name = "Handle", frozen, eq, hash)]
#[derive(Clone, PartialEq)]
pub struct PyHandle {
    pub(crate) inner: Handle,
}

impl std::hash::Hash for PyHandle {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.inner.id.as_u128().hash(state);
        self.inner.owner.epoch.hash(state);
    }
}

impl PyHandle {
    pub(crate) fn shape_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.meta.shape.iter().copied())
    }
}

#[pymethods]
impl PyHandle {
    /// The compact binary form (what `from_bytes` reads).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    /// Reads a handle from `to_bytes()` output, checking every field (it
    /// comes from another process). Raises `BadHandleError` naming what is
    /// wrong.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<PyHandle> {
        let inner = Handle::from_bytes(data).map_err(|e| py_err(Kind::BadHandle, e.to_string()))?;
        inner
            .validate()
            .map_err(|e| py_err(Kind::BadHandle, format!("invalid handle: {e}")))?;
        Ok(PyHandle { inner })
    }

    /// `to_bytes()` as URL-safe base64 text (with padding): a handle that
    /// fits where only strings go (the AReaL adapter's shard ids).
    fn to_base64url(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE.encode(self.inner.to_bytes())
    }

    /// Reads a handle from `to_base64url()` text (validated as
    /// `from_bytes`); `BadHandleError` for text that is not such base64.
    #[staticmethod]
    fn from_base64url(text: &str) -> PyResult<PyHandle> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::URL_SAFE
            .decode(text)
            .map_err(|e| {
                py_err(
                    Kind::BadHandle,
                    format!("invalid handle: not URL-safe base64: {e}"),
                )
            })?;
        Self::from_bytes(&data)
    }

    /// The JSON form (readable; larger than `to_bytes()`).
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Reads a handle from `to_json()` output (validated).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<PyHandle> {
        let inner = Handle::from_json(text).map_err(|e| py_err(Kind::BadHandle, e.to_string()))?;
        Ok(PyHandle { inner })
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let ctor = slf.get_type().getattr("from_bytes")?;
        Ok((ctor, (slf.get().to_bytes(py),)))
    }

    /// Shard id (32 hex digits).
    #[getter]
    fn id(&self) -> String {
        self.inner.id.to_string()
    }

    /// Element type, NumPy's name (`float32`, `bfloat16`, `float8_e4m3fn`).
    #[getter]
    fn dtype(&self) -> String {
        dtype_name(self.inner.meta.dtype)
    }

    /// Shape as a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.shape_tuple(py)
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.meta.byte_len
    }

    /// Device of the owner's bytes (`cpu`, `cuda:0`).
    #[getter]
    fn device(&self) -> String {
        self.inner.meta.device.to_string()
    }

    /// The owner's advertised address (`host:port`).
    #[getter]
    fn owner(&self) -> String {
        self.inner.owner.addr.clone()
    }

    /// Transports that export the shard, in the owner's preference order.
    #[getter]
    fn transports(&self) -> Vec<String> {
        self.inner
            .exports
            .iter()
            .map(|e| e.transport.to_string())
            .collect()
    }

    /// Routing tags given at put.
    #[getter]
    fn tags<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.inner.tags {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let shape: Vec<String> = self.inner.meta.shape.iter().map(u64::to_string).collect();
        let shape = if shape.len() == 1 {
            format!("({},)", shape[0])
        } else {
            format!("({})", shape.join(", "))
        };
        format!(
            "Handle(id={}, dtype={}, shape={shape}, nbytes={}, device={}, owner={}, transports=[{}])",
            self.inner.id,
            dtype_name(self.inner.meta.dtype),
            self.inner.meta.byte_len,
            self.inner.meta.device,
            self.inner.owner.addr,
            self.transports().join(", ")
        )
    }
}
