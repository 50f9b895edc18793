//! # shardport._core: the Python binding of shardport
//!
//! A thin PyO3 layer over [`shardport_host`]: `Node` (put / fetch / remove /
//! stats), `Handle` (a shard's serializable address) and `Shard` (a fetched
//! shard lent to NumPy and torch through DLPack and the buffer protocol).
//! The Python package (`python/python/shardport`) adds input normalisation
//! (NumPy dtypes, torch tensors), the exception classes and the AReaL adapter.
//!
//! Where to start reading: [`node`], then [`mem`] (the only module with
//! `unsafe`: the buffer protocol and DLPack are raw-pointer C ABIs, which is
//! why this crate cannot `forbid(unsafe_code)` as `host` does). [`cuda`]
//! asks the CUDA driver which GPU an address is on and allocates the device
//! memory of copies fetched from other machines, through `shardport_cuda`.
#![deny(unsafe_code)]

mod config;
mod control;
mod convert;
mod cuda;
mod errors;
mod handle;
mod logs;
#[allow(unsafe_code)]
mod mem;
mod node;
mod weights;

use pyo3::prelude::*;

/// Native module of the `shardport` package.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    m.add_function(wrap_pyfunction!(logs::flush_logs, m)?)?;
    m.add_function(wrap_pyfunction!(config::engine_config, m)?)?;
    m.add_function(wrap_pyfunction!(control::remove_remote, m)?)?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<handle::PyHandle>()?;
    m.add_class::<mem::Shard>()?;
    m.add_class::<mem::CudaShard>()?;
    m.add_class::<weights::PyManifest>()?;
    m.add_class::<weights::PyPublisher>()?;
    m.add_class::<weights::PyReceiver>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The Python default is the library config (no fixed name or port), not
    // the demo's.
    m.add("DEFAULT_CONFIG", shardport_host::config::LIBRARY_CONFIG)?;
    Ok(())
}
