//! Buffer protocol exports: filling a `Py_buffer` for a consumer's flags
//! (`BufferLayout`, `fill_buffer`), and `_RawBytes`, a shard's bytes as a
//! flat buffer.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The bytes of a shard as a flat `B` buffer, whatever the dtype: what
/// `Shard.__array__` reinterprets as bfloat16/float8 (the buffer protocol
/// has no format for them). Holds the shard's bytes like the shard does.
#[pyclass(module = "shardport._core", name = "_RawBytes", frozen)]
pub(super) struct RawBytes {
    pub(super) _keep: Keep,
    pub(super) ptr: usize,
    pub(super) len: usize,
    pub(super) writable: bool,
    pub(super) flat: Box<[isize; 2]>,
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
        let format = if flags & ffi::PyBUF_FORMAT != 0 {
            c"B".as_ptr().cast_mut()
        } else {
            ptr::null_mut()
        };
        let layout = BufferLayout::bytes(format, &me.flat);
        let (ptr, len, writable) = (me.ptr, me.len, me.writable);
        // SAFETY: `view` is valid for writes per the protocol.
        unsafe { fill_buffer(view, slf.into_any(), ptr, len, writable, layout, flags) };
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// The shape of what a buffer export shows: `format` (null: unformatted),
/// item size, and `ndim` dimensions with their shape and byte strides.
pub(super) struct BufferLayout {
    pub(super) format: *mut c_char,
    pub(super) itemsize: isize,
    pub(super) ndim: c_int,
    pub(super) shape: *mut isize,
    pub(super) strides: *mut isize,
}

impl BufferLayout {
    /// Plain bytes, one dimension: `flat` is `[len, 1]` (the shape, then
    /// the stride).
    pub(super) fn bytes(format: *mut c_char, flat: &[isize; 2]) -> BufferLayout {
        BufferLayout {
            format,
            itemsize: 1,
            ndim: 1,
            shape: flat.as_ptr().cast_mut(),
            strides: flat[1..].as_ptr().cast_mut(),
        }
    }
}

/// Fills a `Py_buffer` with `len` bytes at `ptr` laid out as `layout`,
/// honouring the consumer's `flags`: without `PyBUF_ND` it sees one
/// dimension of `len / itemsize` items and no shape, without
/// `PyBUF_STRIDES` no strides. `view.obj` takes a reference to `obj`.
///
/// # Safety
/// `view` is valid for writes, and every pointer in `layout`, like `ptr`,
/// lives in `obj` (which the reference keeps until the buffer is released).
pub(super) unsafe fn fill_buffer(
    view: *mut ffi::Py_buffer,
    obj: Bound<'_, PyAny>,
    ptr: usize,
    len: usize,
    writable: bool,
    layout: BufferLayout,
    flags: c_int,
) {
    let nd = flags & ffi::PyBUF_ND != 0;
    let strided = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
    // SAFETY: the caller's contract.
    unsafe {
        (*view).buf = ptr as *mut c_void;
        (*view).len = len as isize;
        (*view).readonly = c_int::from(!writable);
        (*view).itemsize = layout.itemsize;
        (*view).format = layout.format;
        (*view).ndim = if nd { layout.ndim } else { 1 };
        (*view).shape = if nd { layout.shape } else { ptr::null_mut() };
        (*view).strides = if strided {
            layout.strides
        } else {
            ptr::null_mut()
        };
        (*view).suboffsets = ptr::null_mut();
        (*view).internal = ptr::null_mut();
        (*view).obj = obj.into_ptr();
    }
}
