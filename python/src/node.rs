//! `Node`: one shardport node (owner store + consumer fetch path) in this
//! process. Every call clones the host `Node` (an `Arc`) out of the lock and
//! runs with the GIL released.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use pyo3::{prelude::*, types::PyDict};
use shardport_abi::{Device, ShardId};
use shardport_host::{
    config::EngineOverrides, metrics::prometheus, vocab::OnDowngrade, Config, DevicePtr, FetchMode,
    Handle, HostError, Node, Selection, TensorSpec,
};

use crate::{
    config::{load_config, warn_exposed, Adjust},
    convert::{dtype_of_format, itemsize, json_to_py, parse_dtype},
    errors::{host_err, py_err, Kind},
    handle::PyHandle,
    logs::{self, unlocked, Category},
    mem::{CudaShard, InBuffer, OutBuffer, Shard, ViewOrigin},
};

/// How long `close()` waits for calls in flight on other threads.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// A shardport node: puts shards (this process owns them until removed) and
/// fetches shards by handle through the fastest transport that reaches them.
#[pyclass(module = "shardport._core", name = "Node", subclass)]
pub struct PyNode {
    node: Mutex<Option<Node>>,
    name: String,
    /// Where relative plugin paths of this node's configs also resolve
    /// (kept for `reload`).
    plugin_dir: Option<PathBuf>,
    /// The control endpoint `serve_control` started (stopped by `close`).
    control: Mutex<Option<shardport_control::ControlServer>>,
}

fn parse_mode(mode: Option<&str>) -> PyResult<Option<FetchMode>> {
    match mode {
        None => Ok(None),
        Some("view") => Ok(Some(FetchMode::View)),
        Some("copy") => Ok(Some(FetchMode::Copy)),
        Some(other) => Err(py_err(
            Kind::InvalidInput,
            format!("mode must be \"view\" or \"copy\", not {other:?}"),
        )),
    }
}

impl PyNode {
    pub(crate) fn node(&self) -> PyResult<Node> {
        self.node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| py_err(Kind::Closed, format!("node `{}` is closed", self.name)))
    }
}

/// `handle` as a Handle, or an error naming `what` took it.
fn one_handle<'a, 'py>(
    handle: &'a Bound<'py, PyAny>,
    what: &str,
) -> PyResult<&'a Bound<'py, PyHandle>> {
    handle.downcast::<PyHandle>().map_err(|_| {
        py_err(
            Kind::InvalidInput,
            format!(
                "{what} takes a Handle, not {}",
                handle
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ),
        )
    })
}

/// Handles from one handle or an iterable of them.
fn handle_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<PyHandle>> {
    if let Ok(h) = obj.downcast::<PyHandle>() {
        return Ok(vec![h.get().clone()]);
    }
    let mut out = Vec::new();
    let iter = obj.try_iter().map_err(|_| {
        py_err(
            Kind::InvalidInput,
            format!(
                "expected a Handle or an iterable of Handles, got {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ),
        )
    })?;
    for (i, item) in iter.enumerate() {
        let item = item?;
        let h = item.downcast::<PyHandle>().map_err(|_| {
            py_err(
                Kind::InvalidInput,
                format!(
                    "item {i} is a {}, not a Handle",
                    item.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ),
            )
        })?;
        out.push(h.get().clone());
    }
    Ok(out)
}

fn ids(hs: &[PyHandle]) -> Vec<ShardId> {
    hs.iter().map(|h| h.inner.id).collect()
}

#[pymethods]
impl PyNode {
    #[new]
    #[pyo3(signature = (config=None, plugin_dir=None, engine=None))]
    fn new(
        py: Python<'_>,
        config: Option<&Bound<'_, PyAny>>,
        plugin_dir: Option<PathBuf>,
        engine: Option<(Option<String>, String)>,
    ) -> PyResult<Self> {
        let mut cfg = load_config(config, plugin_dir.as_deref())?;
        let adjust = Adjust {
            plugin_dir: plugin_dir.clone(),
            engine: engine.map(|(name, host)| EngineOverrides { name, host }),
        };
        let exposed = adjust
            .apply(&mut cfg)
            .map_err(|e| py_err(Kind::Config, e.to_string()))?;
        warn_exposed(py, &exposed)?;
        let warnings = cfg.warnings.clone();
        logs::sync_level(py);
        let node = unlocked(py, || Node::start(cfg)).map_err(host_err)?;
        node.set_reload_hook(Arc::new(move |c: &mut Config| {
            adjust.apply(c).map(drop).map_err(|e| e.to_string())
        }));
        for w in &warnings {
            logs::warn(py, Category::Config, w)?;
        }
        let name = node.config().node.name.clone();
        Ok(PyNode {
            node: Mutex::new(Some(node)),
            name,
            plugin_dir,
            control: Mutex::new(None),
        })
    }

    /// Applies a new config to the running node without a restart (the
    /// same forms as the constructor: a path, TOML text or a dict; `None`
    /// reads the node's config file again). Experiments, routes, cache and
    /// fetch policies and plugins change atomically: fetches in flight
    /// finish under the old config. Owned shards stay. Returns what changed
    /// (`generation`, `changes`, `evicted`, `draining`, `warnings`); a
    /// config that is wrong, or that would strand owned shards, raises
    /// `ConfigError` and the running config stays.
    #[pyo3(signature = (config=None))]
    fn reload(&self, py: Python<'_>, config: Option<&Bound<'_, PyAny>>) -> PyResult<PyObject> {
        let node = self.node()?;
        // The config's own warnings come before it is applied, so a filter
        // that makes them errors stops the reload (the node's file, read by
        // the host, can only be warned about afterwards).
        let mut warned = Vec::new();
        let report = match config.filter(|c| !c.is_none()) {
            None => unlocked(py, || node.reload_file(None)),
            Some(c) => {
                let cfg = load_config(Some(c), self.plugin_dir.as_deref())?;
                for w in &cfg.warnings {
                    logs::warn(py, Category::Config, w)?;
                }
                warned.clone_from(&cfg.warnings);
                unlocked(py, || node.reload(cfg))
            }
        }
        .map_err(host_err)?;
        for w in report.warnings.iter().filter(|w| !warned.contains(w)) {
            logs::warn(py, Category::Config, w)?;
        }
        let v = serde_json::to_value(&report).map_err(|e| py_err(Kind::Base, e.to_string()))?;
        json_to_py(py, &v)
    }

    /// Removes every shard this node owns and stops its transports. Shards
    /// already fetched from it stay readable. Idempotent.
    fn close(&self, py: Python<'_>) {
        let control = self
            .control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        unlocked(py, || drop(control));
        let node = self.node.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(node) = node {
            unlocked(py, || node.shutdown(CLOSE_GRACE));
        }
    }

    /// Serves this node's control endpoint (the one `shardport serve` runs:
    /// stats, metrics, remove, drain, reload...) on `bind` (default: the
    /// config's `control.bind`; the library config's is an ephemeral port on
    /// loopback) with the bearer `token` (default: the config's
    /// `control.auth-token` / `auth-token-env`) and the config's TLS files.
    /// Returns the address it listens on; a second call returns the same.
    /// Other processes remove this node's shards with
    /// `shardport.remove_remote(address, ids, token)`. Stopped by `close()`.
    #[pyo3(signature = (bind=None, token=None))]
    fn serve_control(
        &self,
        py: Python<'_>,
        bind: Option<&str>,
        token: Option<String>,
    ) -> PyResult<String> {
        let node = self.node()?;
        if let Some(addr) = self.control_address() {
            return Ok(addr);
        }
        // Started without the lock (the GIL is released meanwhile); of two
        // calls racing here the first to finish stays.
        let cfg = node.config().control.clone();
        let server = unlocked(py, || crate::control::serve(&node, &cfg, bind, token))?;
        let mut control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let kept = control.get_or_insert(server);
        Ok(kept.addr().to_string())
    }

    /// The address `serve_control` listens on, or None.
    #[getter]
    fn control_address(&self) -> Option<String> {
        self.control
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|s| s.addr().to_string())
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// Puts an object exporting the buffer protocol: its bytes are copied
    /// once, straight into the node's storage (strided input is gathered in
    /// the same pass). `dtype` overrides the buffer's element type (same item
    /// size); it is how bfloat16/float8 data arrive (see `Node.put`).
    #[pyo3(signature = (obj, dtype=None, tags=None))]
    fn _put_buffer(
        &self,
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        dtype: Option<&str>,
        tags: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyHandle> {
        let node = self.node()?;
        let tags = crate::convert::tags(tags)?;
        let (buf, spec) = buffer_spec(obj, dtype)?;
        let src = buf.source();
        let res = unlocked(py, || put_source(&node, &spec, tags, &src));
        drop(buf);
        res.map(|inner| PyHandle { inner }).map_err(host_err)
    }

    /// Puts many buffer-protocol objects in one call (`dtypes[i]` as in
    /// `_put_buffer`), the GIL released once for all of them. One handle
    /// per object, in order; the first failure raises (the shards put
    /// before it stay, and are listed in the error).
    #[pyo3(signature = (objs, dtypes, tags=None))]
    fn _put_buffers(
        &self,
        py: Python<'_>,
        objs: Vec<Bound<'_, PyAny>>,
        dtypes: Vec<Option<String>>,
        tags: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<PyHandle>> {
        if objs.len() != dtypes.len() {
            return Err(py_err(
                Kind::InvalidInput,
                format!("{} objects but {} dtypes", objs.len(), dtypes.len()),
            ));
        }
        let node = self.node()?;
        let tags = crate::convert::tags(tags)?;
        let (bufs, specs): (Vec<InBuffer>, Vec<TensorSpec>) = objs
            .iter()
            .zip(&dtypes)
            .map(|(o, d)| buffer_spec(o, d.as_deref()))
            .collect::<PyResult<Vec<_>>>()?
            .into_iter()
            .unzip();
        let sources: Vec<_> = bufs.iter().map(InBuffer::source).collect();
        let res: Vec<Result<Handle, HostError>> = unlocked(py, || {
            let mut out = Vec::with_capacity(sources.len());
            for (spec, src) in specs.iter().zip(&sources) {
                let r = put_source(&node, spec, tags.clone(), src);
                let failed = r.is_err();
                out.push(r);
                if failed {
                    break;
                }
            }
            out
        });
        drop(sources);
        drop(bufs);
        let mut handles = Vec::with_capacity(res.len());
        for (i, r) in res.into_iter().enumerate() {
            match r {
                Ok(inner) => handles.push(PyHandle { inner }),
                Err(e) => {
                    let done: Vec<String> =
                        handles.iter().map(|h| h.inner.id.to_string()).collect();
                    let err = host_err(e);
                    let msg = format!(
                        "put_many: object {i} failed: {}; objects 0..{i} were put (ids: {})",
                        err.value(py),
                        if done.is_empty() {
                            "none".to_owned()
                        } else {
                            done.join(", ")
                        }
                    );
                    return Err(PyErr::from_type(err.get_type(py), msg));
                }
            }
        }
        Ok(handles)
    }

    /// Puts GPU memory without copying it, through the cuda-ipc transport
    /// (`Node.put` calls this for CUDA torch tensors). The memory must stay
    /// allocated until the shard is removed.
    #[pyo3(signature = (ptr, nbytes, dtype, shape, device_index, tags=None))]
    #[allow(clippy::too_many_arguments)] // mirrors the Python signature
    fn _put_device(
        &self,
        py: Python<'_>,
        ptr: u64,
        nbytes: u64,
        dtype: &str,
        shape: Vec<u64>,
        device_index: u32,
        tags: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyHandle> {
        let node = self.node()?;
        let tags = crate::convert::tags(tags)?;
        let spec = TensorSpec {
            dtype: parse_dtype(dtype)?,
            shape,
            device: Device::cuda(device_index),
        };
        unlocked(py, || node.put_device(DevicePtr(ptr), nbytes, &spec, tags))
            .map(|inner| PyHandle { inner })
            .map_err(host_err)
    }

    /// Fetches a shard. `mode="view"`: zero-copy where a same-node transport
    /// reaches the owner (read-only; holds a lease until the last object
    /// reaching the memory is gone); `"copy"`: a private, writable copy.
    /// `None` takes the config's `fetch.mode`. The result says which
    /// transport served it and why (`.transport`, `.reason`).
    #[pyo3(signature = (handle, mode=None))]
    fn fetch(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        mode: Option<&str>,
    ) -> PyResult<Shard> {
        let node = self.node()?;
        let mode = parse_mode(mode)?.unwrap_or(node.config().fetch.mode);
        let bound = one_handle(handle, "fetch")?;
        let h = &bound.get().inner;
        // A copy comes from the host's copy path (one pass over the bytes,
        // into a buffer from the node's shelf of copy destinations when one
        // of the same length is there, else fresh zero pages), lent to
        // Python without another copy, and handed back to the shelf when
        // the last Python object reaching it is gone; the host checks the
        // claimed size against `node.max-shard-size` first.
        let shard = unlocked(py, || node.fetch_mode(h, mode).map(Shard::from_fetched))
            .map_err(host_err)?
            .with_origin(|| ViewOrigin {
                node: node.downgrade(),
                handle: bound.clone().unbind(),
            });
        note(py, &node, shard.selection(), mode)?;
        Ok(shard)
    }

    /// A CUDA shard on this process's GPU, for `torch.from_dlpack` (or
    /// `.torch()`). Viewed in place when a transport here can map the
    /// owner's memory (cuda-ipc on the same machine; no byte is copied; the
    /// memory is the owner's: read it, do not write it). Otherwise (the
    /// owner is on another machine) copied into device memory this process
    /// owns, through http staging, on the device of the current CUDA
    /// context (`torch.cuda.set_device`; device 0 when none): writable,
    /// freed with the last reference (`CudaShard.owned` says which).
    /// Fails naming why when the shard is not on a GPU or neither works
    /// (no CUDA driver, no transport); `fetch` copies a CUDA shard to the
    /// host instead.
    fn fetch_cuda(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<CudaShard> {
        let node = self.node()?;
        let h = &one_handle(handle, "fetch_cuda")?.get().inner;
        let view = match unlocked(py, || node.fetch_device(h)) {
            Ok(v) => return CudaShard::new(v),
            Err(e @ HostError::NoCandidate { .. }) => e,
            Err(e) => return Err(host_err(e)),
        };
        // No view is possible here: copy into memory of our own.
        tracing::info!(target: "fetch", shard = %h.id, why = %view, "no device view here; copying the GPU shard into memory of this process");
        let copied = unlocked(py, || -> Result<CudaShard, PyErr> {
            let mem = crate::cuda::DeviceAlloc::new(h.meta.byte_len)
                .map_err(|why| py_err(Kind::TransportUnavailable, why))?;
            let sel = node
                .fetch_device_into(h, DevicePtr(mem.addr()), h.meta.byte_len)
                .map_err(host_err)?;
            Ok(CudaShard::copied(mem, h, sel))
        });
        copied.map_err(|e| {
            py_err(
                Kind::TransportUnavailable,
                format!("{view}; and copying it failed: {e}"),
            )
        })
    }

    /// Fetches a shard by copying it into `out`, a writable C-contiguous
    /// buffer of exactly the shard's size (a NumPy array you reuse): the
    /// fastest copy, no allocation and no page faulted in per fetch. Returns
    /// the transport that served it.
    fn fetch_into(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<String> {
        let node = self.node()?;
        let h = one_handle(handle, "fetch_into")?;
        let mut buf = OutBuffer::get(out).map_err(|e| {
            py_err(
                Kind::InvalidInput,
                format!("out must be a writable, C-contiguous buffer: {e}"),
            )
        })?;
        let mut dest = buf.dest();
        let h = &h.get().inner;
        let res = unlocked(py, || node.fetch_into(h, dest.as_mut_slice()));
        drop(buf);
        let sel = res.map_err(host_err)?;
        note(py, &node, &sel, FetchMode::Copy)?;
        Ok(sel.transport)
    }

    /// Benchmark support: `iters` fetches of `handle` through the Rust API
    /// alone (no Python per call), each timed; nanoseconds per fetch.
    fn _bench_fetch(
        &self,
        py: Python<'_>,
        handle: PyRef<'_, PyHandle>,
        mode: &str,
        iters: usize,
    ) -> PyResult<Vec<u64>> {
        let node = self.node()?;
        let mode = parse_mode(Some(mode))?.unwrap_or(FetchMode::View);
        let h = &handle.inner;
        unlocked(py, || {
            let mut out = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = std::time::Instant::now();
                let f = node.fetch_mode(h, mode)?;
                drop(f);
                out.push(t.elapsed().as_nanos() as u64);
            }
            Ok(out)
        })
        .map_err(host_err)
    }

    /// Fetches many shards at once (grouped by owner and transport, groups
    /// in parallel); results in input order. Raises the first failure.
    #[pyo3(signature = (handles, mode=None))]
    fn fetch_many(
        &self,
        py: Python<'_>,
        handles: &Bound<'_, PyAny>,
        mode: Option<&str>,
    ) -> PyResult<Vec<Shard>> {
        let node = self.node()?;
        let mode = parse_mode(mode)?.unwrap_or(node.config().fetch.mode);
        let hs: Vec<_> = handle_list(handles)?.into_iter().map(|h| h.inner).collect();
        let results = unlocked(py, || node.fetch_many(&hs, mode)).map_err(host_err)?;
        let mut out = Vec::with_capacity(results.len());
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(f) => {
                    note(py, &node, &f.selection, mode)?;
                    let handle = &hs[i];
                    out.push(Shard::from_fetched(f).with_origin(|| {
                        ViewOrigin {
                            node: node.downgrade(),
                            handle: Py::new(
                                py,
                                PyHandle {
                                    inner: handle.clone(),
                                },
                            )
                            .expect("a Handle object can be made"),
                        }
                    }));
                }
                Err(e) => {
                    let err = host_err(e);
                    let msg = format!("handle {i}: {}", err.value(py));
                    return Err(PyErr::from_type(err.get_type(py), msg));
                }
            }
        }
        Ok(out)
    }

    /// Removes owned shards (a Handle or an iterable of them): unexported at
    /// once, memory reclaimed when no consumer lease holds it. Returns how
    /// many were owned here; others are ignored.
    fn remove(&self, py: Python<'_>, handles: &Bound<'_, PyAny>) -> PyResult<usize> {
        let node = self.node()?;
        let hs = handle_list(handles)?;
        let ids = ids(&hs);
        let missing = unlocked(py, || node.remove(&ids));
        Ok(ids.len() - missing.len())
    }

    /// Removes every owned shard and drops every cached fetched shard.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let node = self.node()?;
        unlocked(py, || node.clear());
        Ok(())
    }

    /// Drops fetched shards from the consumer cache (all when `handles` is
    /// None); their leases end once no Python object holds them. Returns how
    /// many entries were dropped.
    #[pyo3(signature = (handles=None))]
    fn drain(&self, py: Python<'_>, handles: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let node = self.node()?;
        match handles {
            None => Ok(unlocked(py, || node.drain_all())),
            Some(h) => {
                let ids = ids(&handle_list(h)?);
                Ok(unlocked(py, || node.drain(&ids)))
            }
        }
    }

    /// A snapshot of the node as a dict: owned shards and bytes, cache,
    /// per-plugin stats and health, per-transport fetch totals, downgrades.
    /// `leases_active` sums the zero-copy leases this node holds.
    fn stats(&self, py: Python<'_>) -> PyResult<PyObject> {
        let node = self.node()?;
        let s = unlocked(py, || node.stats());
        let leases: u64 = s
            .plugins
            .iter()
            .flat_map(|p| p.stats.iter())
            .filter(|(k, _)| k.as_str() == "leases_active")
            .map(|(_, v)| *v)
            .sum();
        let mut v = serde_json::to_value(&s).map_err(|e| py_err(Kind::Base, e.to_string()))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("leases_active".to_owned(), leases.into());
        }
        json_to_py(py, &v)
    }

    /// Reclaims what dead processes left behind: segments of owners that
    /// died, leases of consumers that died (never a live process's). A
    /// library node does not sweep by itself (`shardport serve` does, every
    /// `node.sweep-interval`); call this from a supervisor after a worker
    /// was killed. Returns, per transport, what was reclaimed (or
    /// `{"error": ...}`).
    fn sweep(&self, py: Python<'_>) -> PyResult<PyObject> {
        let node = self.node()?;
        let v = unlocked(py, || node.sweep_json());
        json_to_py(py, &v)
    }

    /// The node's metrics in the Prometheus text format.
    fn metrics(&self, py: Python<'_>) -> PyResult<String> {
        let node = self.node()?;
        Ok(unlocked(py, || prometheus(&node.metrics_snapshot())))
    }

    /// Names of the loaded transports.
    #[getter]
    fn transports(&self) -> PyResult<Vec<String>> {
        Ok(self
            .node()?
            .plugins()
            .iter()
            .map(|p| p.name.to_string())
            .collect())
    }

    /// One line per optional plugin that failed to load.
    #[getter]
    fn load_failures(&self) -> PyResult<Vec<String>> {
        Ok(self.node()?.load_failures().to_vec())
    }

    /// The node's name (`node.name` in the config).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The address written into this node's handles.
    #[getter]
    fn address(&self) -> PyResult<String> {
        Ok(self.node()?.config().node.advertise.clone())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.node() {
            Ok(n) => {
                let ts: Vec<String> = n.plugins().iter().map(|p| p.name.to_string()).collect();
                let _ = py;
                format!(
                    "Node(name={:?}, address={}, transports=[{}])",
                    self.name,
                    n.config().node.advertise,
                    ts.join(", ")
                )
            }
            Err(_) => format!("Node(name={:?}, closed)", self.name),
        }
    }
}

/// Warns (`DowngradeWarning`) about a fetch not served the way it was
/// asked: a faster transport failed first, or a view was asked and a copy
/// served. Silent under `fetch.on-downgrade = "allow"` (and `"fail"` made
/// the first case an error already). The text names transports and
/// reasons, never a shard, so Python's filters show it once per cause and
/// place, not once per shard.
fn note(py: Python<'_>, node: &Node, sel: &Selection, asked: FetchMode) -> PyResult<()> {
    if node.config().fetch.on_downgrade != OnDowngrade::Warn {
        return Ok(());
    }
    if sel.downgraded {
        let failed: Vec<&str> = sel.failures.iter().map(|(t, _)| t.as_str()).collect();
        logs::warn(
            py,
            Category::Downgrade,
            &format!(
                "fetch downgraded: `{}` served it after {} failed (each error is in the \
                 `shardport.select` log; fetch.on-downgrade = \"allow\" silences this)",
                sel.transport,
                failed.join(", ")
            ),
        )
    } else if asked == FetchMode::View && sel.mode == FetchMode::Copy {
        logs::warn(
            py,
            Category::Downgrade,
            &format!(
                "a view was asked and `{}` served a copy ({}); ask mode=\"copy\" where a copy \
                 is what you expect",
                sel.transport, sel.reason
            ),
        )
    } else {
        Ok(())
    }
}

/// The buffer of `obj` and the tensor it describes (`dtype` overrides the
/// buffer's element type, same item size).
pub(crate) fn buffer_spec(
    obj: &Bound<'_, PyAny>,
    dtype: Option<&str>,
) -> PyResult<(InBuffer, TensorSpec)> {
    let buf = InBuffer::get(obj).map_err(|e| {
        let ty = obj
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default();
        py_err(
            Kind::Unsupported,
            format!("cannot put a {ty}: it has neither __dlpack__ nor the buffer protocol ({e})"),
        )
    })?;
    let dt = match dtype {
        Some(name) => {
            let d = parse_dtype(name)?;
            if itemsize(d) != buf.itemsize() {
                return Err(py_err(
                    Kind::InvalidInput,
                    format!(
                        "dtype {name} has {} bytes per element, the buffer has {}",
                        itemsize(d),
                        buf.itemsize()
                    ),
                ));
            }
            d
        }
        None => dtype_of_format(&buf.format(), buf.itemsize())
            .map_err(|e| py_err(Kind::InvalidInput, e))?,
    };
    let spec = TensorSpec {
        dtype: dt,
        shape: buf.shape(),
        device: Device::CPU,
    };
    Ok((buf, spec))
}

/// Puts the bytes of `src` as `spec` (runs without the GIL).
fn put_source(
    node: &Node,
    spec: &TensorSpec,
    tags: BTreeMap<String, String>,
    src: &crate::mem::Source,
) -> Result<Handle, HostError> {
    if spec.byte_len() != Some(src.packed_len() as u64) {
        return Err(HostError::InvalidShard(format!(
            "the buffer has {} bytes, dtype and shape need {:?}",
            src.packed_len(),
            spec.byte_len()
        )));
    }
    node.put_with(spec, tags, |dst| src.copy_to(dst))
}
