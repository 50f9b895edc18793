//! DLPack: the C ABI (dlpack.h, v1.1), capsules and their deleters, and
//! the version, dtype and stride rules every export follows.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A shape as Python writes the tuple: `(3, 4)`, `(5,)`, `()`.
pub(super) fn shape_text(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let comma = if dims.len() == 1 { "," } else { "" };
    format!("({}{comma})", dims.join(", "))
}

/// The consumer's DLPack minor version (of major 1; a later major is
/// served 1.1) from `__dlpack__`'s `max_version`, or `None` for a legacy
/// consumer (no `max_version`, or major 0).
pub(super) fn consumer_version(max_version: Option<(u32, u32)>) -> Option<u32> {
    match max_version {
        Some((major, minor)) if major >= 1 => Some(if major > 1 { 1 } else { minor }),
        _ => None,
    }
}

/// The DLPack type of `dtype` for a consumer of version `versioned` (see
/// [`consumer_version`]): float8 codes exist from DLPack 1.1 on. `hint`
/// ends the error for a consumer that cannot take it.
pub(super) fn dl_type(dtype: DType, versioned: Option<u32>, hint: &str) -> PyResult<DLDataType> {
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
pub(super) const KDL_CUDA: i32 = 2;

/// Element strides of a C-contiguous array of `shape`.
pub(super) fn c_order_strides(shape: &[u64]) -> Vec<i64> {
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
pub(super) struct Export<'a> {
    pub(super) keep: Keep,
    pub(super) ptr: usize,
    pub(super) device: DLDevice,
    pub(super) dtype: DLDataType,
    pub(super) shape: &'a [u64],
    /// In elements.
    pub(super) strides: Vec<i64>,
    pub(super) writable: bool,
    pub(super) copied: bool,
}

/// A DLPack capsule lending `e`: `dltensor_versioned` when `versioned` is
/// the consumer's minor version (of major 1), else a legacy `dltensor`.
pub(super) fn capsule<'py>(
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

// ---------------------------------------------------------------------------
// DLPack ABI (dlpack.h, v1.1)

pub(super) const DLPACK_FLAG_READ_ONLY: u64 = 1;
pub(super) const DLPACK_FLAG_IS_COPIED: u64 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DLDevice {
    pub(super) device_type: i32,
    pub(super) device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DLDataType {
    pub(super) code: u8,
    pub(super) bits: u8,
    pub(super) lanes: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct DLTensor {
    pub(super) data: *mut c_void,
    pub(super) device: DLDevice,
    pub(super) ndim: i32,
    pub(super) dtype: DLDataType,
    pub(super) shape: *mut i64,
    pub(super) strides: *mut i64,
    pub(super) byte_offset: u64,
}

#[repr(C)]
pub(super) struct DLManagedTensor {
    pub(super) dl_tensor: DLTensor,
    pub(super) manager_ctx: *mut c_void,
    pub(super) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub(super) struct DLPackVersion {
    pub(super) major: u32,
    pub(super) minor: u32,
}

#[repr(C)]
pub(super) struct DLManagedTensorVersioned {
    pub(super) version: DLPackVersion,
    pub(super) manager_ctx: *mut c_void,
    pub(super) deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub(super) flags: u64,
    pub(super) dl_tensor: DLTensor,
}

/// Everything one export needs: both managed-tensor forms (one is used),
/// the shape and strides they point at, and the bytes' owner.
pub(super) struct Holder {
    pub(super) legacy: DLManagedTensor,
    pub(super) versioned: DLManagedTensorVersioned,
    pub(super) _keep: Keep,
    pub(super) shape: Vec<i64>,
    pub(super) strides: Vec<i64>,
}

pub(super) fn empty_tensor() -> DLTensor {
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
pub(super) unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `manager_ctx` is the leaked `Holder` that contains `*m`.
        drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Holder>()) });
    }
}

/// # Safety
/// As [`delete_legacy`], for the versioned form.
pub(super) unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as in `delete_legacy`.
        drop(unsafe { Box::from_raw((*m).manager_ctx.cast::<Holder>()) });
    }
}

/// Capsule destructor: deletes the tensor if no consumer took it (a
/// consumer renames the capsule `used_dltensor` and owns the deleter call).
pub(super) unsafe extern "C" fn capsule_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the dying capsule, GIL held.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, c"dltensor".as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, c"dltensor".as_ptr()).cast::<DLManagedTensor>();
            delete_legacy(m);
        }
    }
}

/// Capsule destructor of the versioned form (`used_dltensor_versioned` once taken).
pub(super) unsafe extern "C" fn capsule_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, c"dltensor_versioned".as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, c"dltensor_versioned".as_ptr())
                .cast::<DLManagedTensorVersioned>();
            delete_versioned(m);
        }
    }
}
