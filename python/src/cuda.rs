//! Which GPU a device address is on in this process, asked of the CUDA
//! driver (`cuPointerGetAttribute`). A CUDA shard's handle names the
//! owner's device index, and the two processes may number the GPUs
//! differently (`CUDA_VISIBLE_DEVICES`: a trainer seeing 8 GPUs, an
//! inference worker seeing one of them as `cuda:0`); cuda-ipc maps the
//! shard on the consumer's own device, found by GPU UUID. A DLPack export
//! must name that device, so `fetch_cuda` asks the driver where the mapped
//! address lives. libcuda is opened at the first call, never at import (a
//! machine without a driver imports shardport as before).

use std::{
    ffi::{c_int, c_uint, c_void},
    sync::OnceLock,
};

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const DEVICE_ORDINAL: c_int = 9;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuPointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

/// The driver's pointer query, initialised, or why it could not be.
struct Driver {
    /// Kept loaded: the function pointer below points into it.
    _lib: libloading::Library,
    pointer_attribute: CuPointerGetAttribute,
}

fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: loading libcuda runs its initialisers, which expect
            // nothing from us; the symbols are read with the driver API's
            // documented C signatures, and `cuInit` takes flags 0.
            unsafe {
                let lib = libloading::Library::new("libcuda.so.1")
                    .map_err(|e| format!("cannot load the CUDA driver (libcuda.so.1): {e}"))?;
                let init = *lib
                    .get::<CuInit>(b"cuInit\0")
                    .map_err(|e| format!("libcuda has no cuInit: {e}"))?;
                let pointer_attribute = *lib
                    .get::<CuPointerGetAttribute>(b"cuPointerGetAttribute\0")
                    .map_err(|e| format!("libcuda has no cuPointerGetAttribute: {e}"))?;
                // Once per process (cuda-ipc has done it already whenever a
                // view exists), not per fetch.
                let rc = init(0);
                if rc != 0 {
                    return Err(format!("cuInit failed (CUresult {rc})"));
                }
                Ok(Driver {
                    _lib: lib,
                    pointer_attribute,
                })
            }
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The ordinal, in this process, of the GPU that device address `addr`
/// belongs to.
pub(crate) fn device_of(addr: u64) -> Result<i32, String> {
    let d = driver()?;
    let mut ordinal: c_int = -1;
    // SAFETY: `cuPointerGetAttribute` writes one `int` for DEVICE_ORDINAL
    // into `ordinal`, which outlives the call; the driver is initialised.
    let rc =
        unsafe { (d.pointer_attribute)((&mut ordinal as *mut c_int).cast(), DEVICE_ORDINAL, addr) };
    if rc != 0 || ordinal < 0 {
        return Err(format!(
            "the CUDA driver cannot tell which GPU address {addr:#x} is on (CUresult {rc})"
        ));
    }
    Ok(ordinal)
}
