//! `shardport.weights`' core: the publisher, the receiver and the manifest
//! of [`shardport_weights`], over a `Node`.
//!
//! Python hands over NumPy views of the tensors (the package's
//! `shardport/weights.py` makes them from torch tensors once); this module
//! takes their buffers, releases the GIL and runs the whole publish or
//! update in Rust: no Python runs per tensor while bytes move.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use pyo3::{
    prelude::*,
    types::{PyBytes, PyDict, PyType},
};
use shardport_abi::DType;
use shardport_weights::{
    Manifest, PublishOptions, Publisher, ReceiveOptions, Receiver, Split, Target, Tensor, Update,
    Verify, WeightsError,
};

use crate::{
    convert::{dtype_name, dtype_of_format, itemsize, parse_dtype},
    errors::{host_kind, py_err, Kind},
    logs::unlocked,
    mem::{Layout, StridedOut},
    node::{buffer_spec, PyNode},
};

/// A weights error as the matching exception.
fn weights_err(e: WeightsError) -> PyErr {
    let kind = match &e {
        WeightsError::Manifest { .. } => Kind::BadManifest,
        WeightsError::Stale { .. } => Kind::StaleVersion,
        WeightsError::Corrupt { .. } => Kind::Integrity,
        WeightsError::Closed => Kind::Closed,
        WeightsError::Fetch { source, .. } | WeightsError::Put { source, .. } => host_kind(source),
        _ => Kind::InvalidInput,
    };
    py_err(kind, e.to_string())
}

/// One version of a state dict: what a receiver needs to update, as a
/// small value to send through your own RPC (`to_bytes`, or pickle).
#[pyclass(module = "shardport._core", name = "Manifest", frozen)]
pub struct PyManifest {
    pub(crate) inner: Arc<Manifest>,
}

#[pymethods]
impl PyManifest {
    /// Decodes a manifest, checking it whole (raises `BadManifestError`
    /// naming what is wrong and where).
    #[classmethod]
    fn from_bytes(_cls: &Bound<'_, PyType>, data: &[u8]) -> PyResult<PyManifest> {
        Manifest::from_bytes(data)
            .map(|m| PyManifest { inner: Arc::new(m) })
            .map_err(weights_err)
    }

    /// The binary form (a few dozen bytes per tensor beyond its name).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    /// The version.
    #[getter]
    fn version(&self) -> u64 {
        self.inner.version
    }

    /// Bytes the update moves.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.inner.total_bytes()
    }

    /// Number of buckets.
    #[getter]
    fn num_buckets(&self) -> usize {
        self.inner.buckets.len()
    }

    /// `(name, dtype, shape)` of every tensor, in publish order.
    #[getter]
    fn tensors(&self) -> Vec<(String, String, Vec<u64>)> {
        self.inner
            .tensors
            .iter()
            .map(|e| (e.name.clone(), dtype_name(e.dtype), e.shape.clone()))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.inner.tensors.len()
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let from = slf.get_type().getattr("from_bytes")?;
        Ok((from, (PyBytes::new(py, &slf.get().inner.to_bytes()),)))
    }

    fn __repr__(&self) -> String {
        format!(
            "Manifest(version={}, tensors={}, buckets={}, nbytes={})",
            self.inner.version,
            self.inner.tensors.len(),
            self.inner.buckets.len(),
            self.inner.total_bytes()
        )
    }
}

/// The core of `shardport.weights.Publisher`.
#[pyclass(module = "shardport._core", name = "_Publisher", frozen)]
pub struct PyPublisher {
    inner: Arc<Publisher>,
}

#[pymethods]
impl PyPublisher {
    #[new]
    #[pyo3(signature = (node, bucket_size, tags, keep_versions, grace, threads))]
    fn new(
        node: PyRef<'_, PyNode>,
        bucket_size: u64,
        tags: Option<&Bound<'_, PyDict>>,
        keep_versions: usize,
        grace: f64,
        threads: Option<usize>,
    ) -> PyResult<PyPublisher> {
        let node = node.node()?;
        let defaults = PublishOptions::default();
        let grace = Duration::try_from_secs_f64(grace)
            .map_err(|e| py_err(Kind::InvalidInput, format!("grace: {e}")))?;
        let opts = PublishOptions {
            bucket_size,
            tags: crate::convert::tags(tags)?,
            keep_versions: keep_versions.max(1),
            grace,
            threads: threads.unwrap_or(defaults.threads),
        };
        Ok(PyPublisher {
            inner: Arc::new(Publisher::new(&node, opts)),
        })
    }

    /// Publishes C-contiguous buffers (`dtypes[i]` overrides a buffer's
    /// element type, as for `Node.put`) as `version`; the tensors named in
    /// `split` (name to dimension) in `parts` parts.
    #[pyo3(signature = (version, names, arrays, dtypes, split=None, parts=0))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python call
    fn publish(
        &self,
        py: Python<'_>,
        version: u64,
        names: Vec<String>,
        arrays: Vec<Bound<'_, PyAny>>,
        dtypes: Vec<Option<String>>,
        split: Option<std::collections::HashMap<String, usize>>,
        parts: u32,
    ) -> PyResult<PyManifest> {
        if names.len() != arrays.len() || names.len() != dtypes.len() {
            return Err(py_err(
                Kind::InvalidInput,
                format!(
                    "{} names, {} arrays and {} dtypes",
                    names.len(),
                    arrays.len(),
                    dtypes.len()
                ),
            ));
        }
        let mut bufs = Vec::with_capacity(arrays.len());
        for (name, (a, d)) in names.iter().zip(arrays.iter().zip(&dtypes)) {
            let (buf, spec) = buffer_spec(a, d.as_deref())
                .map_err(|e| py_err(Kind::InvalidInput, format!("tensor {name:?}: {e}")))?;
            bufs.push((buf, spec));
        }
        let sources: Vec<_> = bufs.iter().map(|(b, _)| b.source()).collect();
        let mut tensors = Vec::with_capacity(names.len());
        for ((name, (_, spec)), src) in names.iter().zip(&bufs).zip(&sources) {
            let bytes = src.contiguous().ok_or_else(|| {
                py_err(
                    Kind::InvalidInput,
                    format!("tensor {name:?} is not C-contiguous"),
                )
            })?;
            tensors.push(Tensor {
                name,
                dtype: spec.dtype,
                shape: &spec.shape,
                bytes,
            });
        }
        let publisher = &self.inner;
        let split = Split {
            parts,
            dims: split.unwrap_or_default(),
        };
        let res = unlocked(py, || publisher.publish_split(version, &tensors, &split));
        drop(tensors);
        drop(sources);
        drop(bufs);
        res.map(|m| PyManifest { inner: Arc::new(m) })
            .map_err(weights_err)
    }

    fn expect(&self, receivers: Vec<String>) {
        self.inner.expect(receivers);
    }

    fn forget(&self, py: Python<'_>, receiver: &str) -> Vec<u64> {
        unlocked(py, || self.inner.forget(receiver))
    }

    fn committed(&self, py: Python<'_>, receiver: &str, version: u64) -> Vec<u64> {
        unlocked(py, || self.inner.committed(receiver, version))
    }

    fn sweep(&self, py: Python<'_>) -> Vec<u64> {
        unlocked(py, || self.inner.sweep())
    }

    fn retire_all(&self, py: Python<'_>) -> Vec<u64> {
        unlocked(py, || self.inner.retire_all())
    }

    #[getter]
    fn versions(&self) -> Vec<u64> {
        self.inner.versions()
    }
}

/// The core of `shardport.weights.Receiver`: the destinations are bound
/// once (NumPy views of the receiver's tensors), each update takes their
/// buffers again in Rust and runs without the GIL.
#[pyclass(module = "shardport._core", name = "_Receiver", frozen)]
pub struct PyReceiver {
    inner: Arc<Receiver>,
}

#[pymethods]
impl PyReceiver {
    #[new]
    #[pyo3(signature = (node, verify, partial, threads, fetches, part=None))]
    fn new(
        node: PyRef<'_, PyNode>,
        verify: &str,
        partial: bool,
        threads: Option<usize>,
        fetches: Option<usize>,
        part: Option<(u32, u32)>,
    ) -> PyResult<PyReceiver> {
        if let Some((i, n)) = part {
            if n == 0 || i >= n {
                return Err(py_err(
                    Kind::InvalidInput,
                    format!("part ({i}, {n}): an index below a count of at least 1"),
                ));
            }
        }
        let node = node.node()?;
        let verify = match verify {
            "fetched" => Verify::Fetched,
            "always" => Verify::Always,
            other => {
                return Err(py_err(
                    Kind::InvalidInput,
                    format!("verify must be \"fetched\" or \"always\", not {other:?}"),
                ))
            }
        };
        let defaults = ReceiveOptions::default();
        let opts = ReceiveOptions {
            fetches: fetches.unwrap_or(defaults.fetches).max(1),
            threads: threads.unwrap_or(defaults.threads).max(1),
            verify,
            partial,
            part,
        };
        Ok(PyReceiver {
            inner: Arc::new(Receiver::new(&node, opts)),
        })
    }

    /// Takes `manifest` into `dests`: `(name, dtype or None, array)` with
    /// each array a writable buffer (any non-negative strides). All or
    /// nothing; returns the update's report.
    fn update<'py>(
        &self,
        py: Python<'py>,
        manifest: PyRef<'_, PyManifest>,
        dests: Vec<(String, Option<String>, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut bufs = Vec::with_capacity(dests.len());
        let mut layouts: Vec<(String, DType, Layout)> = Vec::with_capacity(dests.len());
        for (name, dtype, obj) in &dests {
            let mut out = StridedOut::get(obj).map_err(|e| {
                py_err(
                    Kind::InvalidInput,
                    format!("tensor {name:?}: not a writable buffer: {e}"),
                )
            })?;
            let (format, item) = out.format();
            // The override the package gives (bfloat16 and float8 travel as
            // integers of their size), else the buffer's own format.
            let dtype = match dtype {
                Some(d) => parse_dtype(d)?,
                None => {
                    dtype_of_format(&format, item).map_err(|e| py_err(Kind::InvalidInput, e))?
                }
            };
            if itemsize(dtype) != item {
                return Err(py_err(
                    Kind::InvalidInput,
                    format!(
                        "tensor {name:?}: dtype {} has {} bytes per element, the buffer {item}",
                        dtype_name(dtype),
                        itemsize(dtype)
                    ),
                ));
            }
            let layout = out
                .layout()
                .map_err(|e| py_err(Kind::InvalidInput, format!("tensor {name:?}: {e}")))?;
            layouts.push((name.clone(), dtype, layout));
            bufs.push(out);
        }
        let m = Arc::clone(&manifest.inner);
        let receiver = &self.inner;
        let res = unlocked(py, move || {
            let mut targets: Vec<Target<'_>> = layouts
                .iter_mut()
                .map(|(name, dtype, l)| Target {
                    name: std::mem::take(name),
                    dtype: *dtype,
                    shape: std::mem::take(&mut l.shape),
                    strides: l.strides.take(),
                    bytes: l.dest.as_mut_slice(),
                })
                .collect();
            receiver.update(&m, &mut targets)
        });
        drop(bufs);
        report(py, &res.map_err(weights_err)?)
    }

    /// The version committed last (`None` before the first update).
    #[getter]
    fn version(&self) -> Option<u64> {
        self.inner.version()
    }
}

fn report<'py>(py: Python<'py>, u: &Update) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", u.version)?;
    d.set_item("changed", u.changed)?;
    d.set_item("buckets", u.buckets)?;
    d.set_item("bytes", u.bytes)?;
    d.set_item("verified", u.verified)?;
    d.set_item("tensors", u.tensors)?;
    let t: BTreeMap<&str, usize> = u.transports.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    d.set_item("transports", t)?;
    d.set_item("fetch_s", u.fetch.as_secs_f64())?;
    d.set_item("commit_s", u.commit.as_secs_f64())?;
    Ok(d)
}
