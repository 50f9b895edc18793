//! Reading what Python passes in: the buffers of `put` inputs (any layout,
//! gathered in one pass) and the destination of `fetch_into`.

#[allow(clippy::wildcard_imports)]
use super::*;

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

/// A writable buffer of any non-negative strided layout obtained from a
/// Python object (a destination of a weights update: a NumPy view of a
/// parameter), released on drop.
pub(crate) struct StridedOut {
    inner: InBuffer,
}

impl StridedOut {
    /// Asks `obj` for a writable, strided, formatted buffer.
    pub(crate) fn get(obj: &Bound<'_, PyAny>) -> PyResult<StridedOut> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // SAFETY: as in `InBuffer::get`.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(StridedOut {
            inner: InBuffer { view },
        })
    }

    /// Shape, element strides (`None` when C-contiguous) and the memory
    /// from the first element to past the last; an error for a layout a
    /// destination cannot have (negative or unaligned strides).
    pub(crate) fn layout(&mut self) -> Result<Layout, String> {
        let item = self.inner.itemsize().max(1);
        let src = self.inner.source();
        let shape: Vec<u64> = src.shape.iter().map(|&d| d.max(0) as u64).collect();
        let mut elems = Vec::with_capacity(shape.len());
        let mut extent = 0usize;
        let empty = shape.contains(&0);
        if let Some(strides) = &src.strides {
            for (&d, &s) in src.shape.iter().zip(strides) {
                if s < 0 || s as usize % item != 0 {
                    return Err(format!(
                        "a stride of {s} bytes (elements of {item} bytes): negative or unaligned"
                    ));
                }
                elems.push(s as u64 / item as u64);
                extent += (d.max(1) as usize - 1) * s as usize;
            }
        }
        let len = if empty {
            0
        } else if src.strides.is_some() {
            extent + item
        } else {
            src.packed_len()
        };
        let strides = (src.strides.is_some() && !src.c_contiguous()).then_some(elems);
        // A strided export's extent lies inside its buffer (PEP 3118);
        // never claim more than the exporter's `len` for a packed one.
        let len = if strides.is_none() {
            len.min(src.len)
        } else {
            len
        };
        Ok(Layout {
            shape,
            strides,
            dest: Dest {
                ptr: self.inner.view.buf.cast(),
                len,
            },
        })
    }

    /// The PEP 3118 format and item size.
    pub(crate) fn format(&self) -> (String, usize) {
        (self.inner.format(), self.inner.itemsize())
    }
}

/// What [`StridedOut::layout`] found.
pub(crate) struct Layout {
    /// Dimensions.
    pub(crate) shape: Vec<u64>,
    /// Element strides, `None` when C-contiguous.
    pub(crate) strides: Option<Vec<u64>>,
    /// The memory.
    pub(crate) dest: Dest,
}

/// The writable memory of an [`OutBuffer`].
pub(crate) struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: used only while its `OutBuffer` (or `StridedOut`) holds the
// exporter's buffer.
unsafe impl Send for Dest {}
// SAFETY: as above; a `&Dest` gives no access to the bytes.
unsafe impl Sync for Dest {}

impl Dest {
    /// The bytes. Python code may race on them (as with any NumPy array
    /// written from a thread); Rust holds no other reference.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: a writable buffer whose elements lie in the `len` bytes
        // from `ptr` (C-contiguous, or strided with non-negative strides:
        // `StridedOut::layout`), held by its `OutBuffer` or `StridedOut`
        // for the duration of the borrow.
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

    /// The bytes, when the elements are already packed in C order (what a
    /// weights publish reads in place).
    pub(crate) fn contiguous(&self) -> Option<&[u8]> {
        if !self.c_contiguous() {
            return None;
        }
        let len = self.packed_len();
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: packed in C order, the exporter's buffer holds `len`
        // readable bytes from `ptr`, valid while the `InBuffer` is held
        // (which outlives `self`'s use by its contract).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, len) })
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
pub(super) unsafe fn gather(
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
