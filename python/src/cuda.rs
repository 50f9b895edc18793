//! Which GPU a device address is on in this process, asked of the CUDA
//! driver (`cuPointerGetAttribute`). A CUDA shard's handle names the
//! owner's device index, and the two processes may number the GPUs
//! differently (`CUDA_VISIBLE_DEVICES`: a trainer seeing 8 GPUs, an
//! inference worker seeing one of them as `cuda:0`); cuda-ipc maps the
//! shard on the consumer's own device, found by GPU UUID. A DLPack export
//! must name that device, so `fetch_cuda` asks the driver where the mapped
//! address lives. libcuda is opened at the first call, never at import (a
//! machine without a driver imports shardport as before).
//!
//! It also allocates the device memory of a CUDA shard fetched by copy
//! ([`DeviceAlloc`]): a shard no transport here can map (its owner is on
//! another machine) arrives through http into memory this process owns.

use std::{
    ffi::{c_int, c_uint, c_void},
    sync::OnceLock,
};

/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const DEVICE_ORDINAL: c_int = 9;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuPointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;
type CuCtxGetCurrent = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type CuCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> c_int;
type CuCtxGetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDevicePrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type CuDevicePrimaryCtxRelease = unsafe extern "C" fn(c_int) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type CuMemFree = unsafe extern "C" fn(u64) -> c_int;

/// The driver calls used here, initialised, or why they could not be.
struct Driver {
    /// Kept loaded: the function pointers below point into it.
    _lib: libloading::Library,
    pointer_attribute: CuPointerGetAttribute,
    ctx_get_current: CuCtxGetCurrent,
    ctx_set_current: CuCtxSetCurrent,
    ctx_get_device: CuCtxGetDevice,
    device_get: CuDeviceGet,
    primary_retain: CuDevicePrimaryCtxRetain,
    primary_release: CuDevicePrimaryCtxRelease,
    mem_alloc: CuMemAlloc,
    mem_free: CuMemFree,
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
                macro_rules! sym {
                    ($t:ty, $name:literal) => {
                        *lib.get::<$t>(concat!($name, "\0").as_bytes())
                            .map_err(|e| format!("libcuda has no {}: {e}", $name))?
                    };
                }
                let ctx_get_current = sym!(CuCtxGetCurrent, "cuCtxGetCurrent");
                let ctx_set_current = sym!(CuCtxSetCurrent, "cuCtxSetCurrent");
                let ctx_get_device = sym!(CuCtxGetDevice, "cuCtxGetDevice");
                let device_get = sym!(CuDeviceGet, "cuDeviceGet");
                let primary_retain = sym!(CuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
                let primary_release =
                    sym!(CuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
                let mem_alloc = sym!(CuMemAlloc, "cuMemAlloc_v2");
                let mem_free = sym!(CuMemFree, "cuMemFree_v2");
                // Once per process (cuda-ipc has done it already whenever a
                // view exists), not per fetch.
                let rc = init(0);
                if rc != 0 {
                    return Err(format!("cuInit failed (CUresult {rc})"));
                }
                Ok(Driver {
                    _lib: lib,
                    pointer_attribute,
                    ctx_get_current,
                    ctx_set_current,
                    ctx_get_device,
                    device_get,
                    primary_retain,
                    primary_release,
                    mem_alloc,
                    mem_free,
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

/// Device memory this process allocated for a fetched copy: `cuMemAlloc`
/// in the primary context of its device (retained while it lives), freed
/// on drop.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    addr: u64,
    /// The `CUdevice` whose primary context is retained.
    device: c_int,
    /// Its ordinal in this process.
    ordinal: i32,
    ctx: usize,
}

impl DeviceAlloc {
    /// `len` bytes on the device of the calling thread's current CUDA
    /// context (what `torch.cuda.set_device` chose), or on device 0 when no
    /// context is current.
    pub(crate) fn new(len: u64) -> Result<DeviceAlloc, String> {
        let d = driver()?;
        let call = |what: &str, rc: c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(format!("{what} failed (CUresult {rc})"))
            }
        };
        let mut current: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        call("cuCtxGetCurrent", unsafe {
            (d.ctx_get_current)(&mut current)
        })?;
        // The device handle (`CUdevice`) of the current context's device,
        // or of device 0.
        let mut device: c_int = 0;
        if current.is_null() {
            // SAFETY: out-pointer to a live local; the driver is initialised.
            call("cuDeviceGet", unsafe { (d.device_get)(&mut device, 0) })?;
        } else {
            // SAFETY: out-pointer to a live local; a context is current.
            call("cuCtxGetDevice", unsafe { (d.ctx_get_device)(&mut device) })?;
        }
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; released in drop.
        call("cuDevicePrimaryCtxRetain", unsafe {
            (d.primary_retain)(&mut ctx, device)
        })?;
        let mut out = DeviceAlloc {
            addr: 0,
            device,
            ordinal: 0,
            ctx: ctx as usize,
        };
        // SAFETY: a retained primary context; the caller's context is
        // restored below.
        call("cuCtxSetCurrent", unsafe { (d.ctx_set_current)(ctx) })?;
        let mut addr: u64 = 0;
        // SAFETY: out-pointer to a live local; a context is current.
        let rc = unsafe { (d.mem_alloc)(&mut addr, len.max(1) as usize) };
        // SAFETY: the context that was current (or none) before.
        unsafe { (d.ctx_set_current)(current) };
        call("cuMemAlloc", rc)?;
        out.addr = addr;
        // The ordinal DLPack names, asked of the driver (not assumed equal
        // to the device handle).
        out.ordinal = device_of(addr)?;
        Ok(out)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    pub(crate) fn ordinal(&self) -> i32 {
        self.ordinal
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let Ok(d) = driver() else { return };
        // SAFETY: the context was retained in `new` and is released once,
        // here, after the memory allocated in it is freed (once); no copy
        // into it is pending (fetches wait for their copies).
        unsafe {
            if self.addr != 0 {
                let mut current: *mut c_void = std::ptr::null_mut();
                (d.ctx_get_current)(&mut current);
                (d.ctx_set_current)(self.ctx as *mut c_void);
                (d.mem_free)(self.addr);
                (d.ctx_set_current)(current);
            }
            (d.primary_release)(self.device);
        }
    }
}
