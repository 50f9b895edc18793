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
//! array, torch tensor, memoryview or `Shard` reaching it goes away, and
//! only then does a private copy's buffer go back to the node's shelf of
//! copy destinations ([`PrivateBuf`]), to be handed out again.

use std::{
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
use shardport_host::{DeviceView, FetchMode, Fetched, Selection, ShardBytes};

use crate::{
    convert::{buffer_format, dlpack_dtype, dtype_name, itemsize},
    errors::{py_err, Kind},
};

mod buffer;
mod cuda_shard;
mod dlpack;
mod input;
mod private;
mod shard;

#[allow(clippy::wildcard_imports)]
use self::{buffer::*, dlpack::*};

pub(crate) use cuda_shard::CudaShard;
pub(crate) use input::{InBuffer, Layout, OutBuffer, Source, StridedOut};
pub(crate) use private::PrivateBuf;
pub(crate) use shard::{Shard, ViewOrigin};

type Keep = Arc<dyn Any + Send + Sync>;
