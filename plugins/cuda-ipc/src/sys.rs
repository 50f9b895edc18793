//! The only module with `unsafe`: the CUDA driver API (through cudarc's raw
//! `driver::sys` bindings, loaded at run time) and the lease board's shared
//! memory mapping.
//!
//! # Overview
//! [`probe`] decides whether a driver exists at all: cudarc panics on the
//! first call into a missing library, so nothing else here is called until
//! `probe` succeeded (the [`Driver`] value is the proof). Every driver call
//! returns its `CUresult`; [`check`] turns a failure into a [`CudaError`]
//! naming the call and the driver's own error name.
//!
//! # Contexts
//! Every entry point makes the device's **primary context** current on the
//! calling thread first ([`Driver::bind`]): the host calls plugins from any
//! thread, and a primary context is what frameworks (PyTorch) share, so IPC
//! handles opened here are valid in their kernels too. A primary context is
//! retained at most once per device per process (a process-wide registry,
//! [`Driver::gpu`]) and released when the last value using it (a [`Gpu`]
//! held by a transport, a staged buffer, an event, an opened mapping) is
//! dropped; what else in the process retained it (the CUDA runtime,
//! PyTorch) keeps it alive independently.
//!
//! # Streams
//! Every operation here is issued on the **legacy default stream** (the
//! NULL stream) of the primary context. It waits for prior work of every
//! *blocking* stream of that context (including a per-thread default
//! stream), but NOT for streams created non-blocking (`cudaStreamNonBlocking`,
//! which is what PyTorch's side streams are): a producer that wrote its
//! tensor on such a stream must synchronize it (or make the default stream
//! wait on it) before `put_device`.
//!
//! # Failure modes
//! A driver error never panics. cudarc panics on the first call of a
//! symbol the loaded library lacks, so [`probe`] looks every symbol this
//! module calls up front ([`REQUIRED_SYMBOLS`]) and reports a driver that
//! lacks one as unavailable: after a successful probe no call can panic.

use std::{
    collections::BTreeMap,
    ffi::{c_void, CStr},
    fmt,
    os::raw::c_uint,
    ptr::NonNull,
    sync::{atomic::AtomicU64, Arc, Mutex, PoisonError, Weak},
};

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdeviceptr, CUevent, CUevent_flags, CUipcEventHandle,
    CUipcMemHandle, CUipcMem_flags, CUmemorytype, CUpointer_attribute, CUresult,
};
use rustix::{
    fd::OwnedFd,
    fs::{self, Mode},
    io::Errno,
    shm,
};

mod vmm;

pub(crate) use vmm::{AllocKind, VmmMapping, MAX_CHUNKS};

/// Bytes in a CUDA IPC memory or event handle.
pub(crate) const IPC_HANDLE_LEN: usize = 64;

/// A failed driver call: which call, and the driver's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CudaError {
    /// The driver call (`cuIpcOpenMemHandle`).
    pub call: &'static str,
    /// The `CUresult` code.
    pub code: u32,
    /// The driver's name for it (`CUDA_ERROR_INVALID_VALUE`).
    pub name: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl CudaError {
    /// True for `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn is_invalid_value(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_INVALID_VALUE as u32
    }
}

/// Turns a `CUresult` into `Ok` or a [`CudaError`] naming `call`.
fn check(call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::os::raw::c_char = std::ptr::null();
    // SAFETY: only reached after `probe` loaded the library (every caller
    // holds a `Driver` or is `probe` itself after `is_culib_present`);
    // `cuGetErrorName` writes a pointer to a static NUL-terminated string or
    // leaves it untouched on an unknown code.
    let known = unsafe { sys::cuGetErrorName(r, &mut name) } == CUresult::CUDA_SUCCESS;
    let name = if known && !name.is_null() {
        // SAFETY: the driver returned a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    };
    Err(CudaError {
        call,
        code: r as u32,
        name,
    })
}

/// Proof that the driver library is loaded and initialised; the only way to
/// reach the driver calls below.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Driver {
    /// `cuDriverGetVersion`, e.g. 12080.
    pub version: i32,
    /// `cuDeviceGetCount`.
    pub devices: u32,
}

/// Every driver symbol this module calls (cudarc's names: the `_v2` entry
/// points where the API has them). `probe` fails unless all are present.
pub(crate) const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2",
    "cuStreamSynchronize",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuIpcGetEventHandle",
    "cuIpcOpenEventHandle",
    // VMM (vmm.rs): present in every driver since CUDA 10.2.
    "cuMemRetainAllocationHandle",
    "cuMemRelease",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    // Tests and benchmarks only (testkit: other allocators' memory).
    "cuMemCreate",
    "cuMemGetAllocationGranularity",
    "cuMemAllocAsync",
    "cuMemAllocManaged",
    "cuMemHostAlloc",
    "cuMemFreeHost",
];

/// Loads the driver library if present and initialises it. `Err` is the
/// reason the transport is unavailable, phrased for an operator.
pub(crate) fn probe() -> Result<Driver, String> {
    // SAFETY: `is_culib_present` only tries to dlopen the library names.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver on this \
                    machine, or it is not on the library path)"
                .to_owned(),
        );
    }
    // cudarc resolves each symbol on its first call and panics when it is
    // missing: look them all up now, so that no later call can panic.
    // SAFETY: `culib` loads the library `is_culib_present` just found (it
    // only panics when none loads); the symbols are looked up, not called.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = REQUIRED_SYMBOLS
        .iter()
        .copied()
        // SAFETY: a lookup only; the pointer is never called or read.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "the CUDA driver library lacks {} (driver too old for CUDA 12 IPC?)",
            missing.join(", ")
        ));
    }
    // SAFETY: cuInit takes flags 0; the library is loaded.
    check("cuInit", unsafe { sys::cuInit(0) })
        .map_err(|e| format!("CUDA driver present but {e}"))?;
    let mut version = 0;
    // SAFETY: out-pointer to a live local.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })
    .map_err(|e| e.to_string())?;
    let mut count = 0;
    // SAFETY: out-pointer to a live local; cuInit succeeded.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })
    .map_err(|e| e.to_string())?;
    if count <= 0 {
        return Err(format!(
            "CUDA driver {version} loaded but it sees no GPU (CUDA_VISIBLE_DEVICES?)"
        ));
    }
    Ok(Driver {
        version,
        devices: count as u32,
    })
}

/// One retain of a device's primary context, released on drop (when the
/// last [`Gpu`] sharing it is gone).
#[derive(Debug)]
struct PrimaryCtx {
    dev: CUdevice,
    ctx: CUcontext,
}

// SAFETY: a CUcontext is a driver handle usable from any thread once made
// current there (`bind`); the value holds no thread-local state.
unsafe impl Send for PrimaryCtx {}
// SAFETY: as above; it is only passed to the driver.
unsafe impl Sync for PrimaryCtx {}

impl Drop for PrimaryCtx {
    fn drop(&mut self) {
        // SAFETY: this value holds exactly one retain of `dev`'s primary
        // context (taken in `Driver::gpu`), released once, here; every
        // buffer, event and mapping made in it holds a `Gpu` (an `Arc` of
        // this value), so none is left.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        if let Err(e) = check("cuDevicePrimaryCtxRelease", r) {
            tracing::warn!(target: "cuda_ipc", error = %e, "releasing a primary context failed");
        }
    }
}

/// Primary contexts this process retained, by ordinal: at most one retain
/// per device at a time, shared by every transport instance.
static PRIMARY: Mutex<BTreeMap<u32, Weak<PrimaryCtx>>> = Mutex::new(BTreeMap::new());

/// One device with its retained primary context (shared; released when the
/// last clone is dropped).
#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    pub ordinal: u32,
    pub uuid: [u8; 16],
    ctx: Arc<PrimaryCtx>,
}

/// An owned event created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`,
/// or opened from a peer's IPC handle, in `gpu`'s context. Destroyed on drop.
#[derive(Debug)]
pub(crate) struct Event {
    ev: CUevent,
    gpu: Gpu,
}

// SAFETY: event handles are process-wide driver objects.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        let r = (|| {
            // SAFETY: the context is retained while `self.gpu` lives.
            check("cuCtxSetCurrent", unsafe {
                sys::cuCtxSetCurrent(self.gpu.ctx.ctx)
            })?;
            // SAFETY: the event was created or opened by this value and is
            // destroyed once, here. A `Driver` existed to make it.
            check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(self.ev) })
        })();
        if let Err(e) = r {
            tracing::warn!(target: "cuda_ipc", error = %e, "event destroy failed");
        }
    }
}

/// What kind of memory an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// Device memory of device `ordinal`.
    Device { ordinal: u32 },
    /// Not device memory the driver knows (host memory).
    Host,
}

impl Driver {
    /// Device `ordinal` with its primary context retained: the process's
    /// existing retain when one is alive, else a new one (so a device is
    /// retained at most once at a time, whatever the threads and instances).
    pub(crate) fn gpu(&self, ordinal: u32) -> Result<Gpu, CudaError> {
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a live local; the driver is initialised.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal as i32)
        })?;
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: out-pointer to a live local of the right type.
        check("cuDeviceGetUuid", unsafe {
            sys::cuDeviceGetUuid_v2(&mut uuid, dev)
        })?;
        let uuid = uuid.bytes.map(|b| b as u8);
        let mut registry = PRIMARY.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(ctx) = registry.get(&ordinal).and_then(Weak::upgrade) {
            return Ok(Gpu { ordinal, uuid, ctx });
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local. Released by `PrimaryCtx`'s
        // drop, once, when the last `Gpu` using it is gone.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let ctx = Arc::new(PrimaryCtx { dev, ctx });
        registry.insert(ordinal, Arc::downgrade(&ctx));
        Ok(Gpu { ordinal, uuid, ctx })
    }

    /// Makes `gpu`'s primary context current on this thread.
    pub(crate) fn bind(&self, gpu: &Gpu) -> Result<(), CudaError> {
        // SAFETY: `ctx` is a retained primary context (see `gpu`).
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(gpu.ctx.ctx)
        })
    }

    /// Classifies `addr` (`cuPointerGetAttribute(MEMORY_TYPE)`); the caller
    /// has bound a context.
    pub(crate) fn mem_kind(&self, addr: u64) -> Result<MemKind, CudaError> {
        let mut ty: c_uint = 0;
        // SAFETY: the attribute is a `CUmemorytype` (unsigned int) written to
        // a live local; any address may be queried.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ty as *mut c_uint).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        match check("cuPointerGetAttribute(MEMORY_TYPE)", r) {
            Ok(()) => {}
            // Plain (unregistered) host memory is unknown to the driver.
            Err(e) if e.is_invalid_value() => return Ok(MemKind::Host),
            Err(e) => return Err(e),
        }
        if ty != CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint {
            return Ok(MemKind::Host);
        }
        let mut ordinal: i32 = -1;
        // SAFETY: the attribute is an int written to a live local.
        check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        })?;
        Ok(MemKind::Device {
            ordinal: ordinal.max(0) as u32,
        })
    }

    /// The process-unique buffer id of the allocation containing `addr`
    /// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): never reused within a process, so
    /// it is the allocation generation a consumer's cache compares.
    pub(crate) fn buffer_id(&self, addr: u64) -> Result<u64, CudaError> {
        let mut id: u64 = 0;
        // SAFETY: the attribute is an unsigned long long written to a local.
        check("cuPointerGetAttribute(BUFFER_ID)", unsafe {
            sys::cuPointerGetAttribute(
                (&mut id as *mut u64).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                addr,
            )
        })?;
        Ok(id)
    }

    /// Base and size of the allocation containing `addr`.
    pub(crate) fn address_range(&self, addr: u64) -> Result<(u64, u64), CudaError> {
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        // SAFETY: out-pointers to live locals.
        check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr)
        })?;
        Ok((base, size as u64))
    }

    /// `cuMemAlloc` on `gpu` (legacy, IPC-exportable; never the
    /// stream-ordered pool). Binds `gpu`'s context.
    pub(crate) fn alloc(&self, gpu: &Gpu, len: u64) -> Result<DeviceBuffer, CudaError> {
        self.bind(gpu)?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: out-pointer to a live local; a context is bound.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut p, len.max(1) as usize)
        })?;
        Ok(DeviceBuffer {
            addr: p,
            gpu: gpu.clone(),
        })
    }

    /// Benchmarks: `iters` synchronous copies of `len` bytes at device
    /// address `dev` to pinned host memory, then `iters` back; the seconds
    /// each direction took. A context is bound by the caller.
    pub(crate) fn pinned_copy_seconds(
        &self,
        dev: u64,
        len: usize,
        iters: u32,
    ) -> Result<(f64, f64), CudaError> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; freed below.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut host, len.max(1), 0)
        })?;
        let timed = |to_host: bool| -> Result<f64, CudaError> {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                if to_host {
                    // SAFETY: `host` holds `len` pinned bytes; the device
                    // range is validated by the driver.
                    check("cuMemcpyDtoH", unsafe {
                        sys::cuMemcpyDtoH_v2(host, dev, len)
                    })?;
                } else {
                    // SAFETY: as above, the other way.
                    check("cuMemcpyHtoD", unsafe {
                        sys::cuMemcpyHtoD_v2(dev, host, len)
                    })?;
                }
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let r = timed(true).and_then(|d2h| Ok((d2h, timed(false)?)));
        // SAFETY: allocated above, freed once; every copy was synchronous.
        let freed = check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(host) });
        let r = r?;
        freed?;
        Ok(r)
    }

    /// Copies `len` bytes of device memory at `src` into a new `cuMemAlloc`
    /// buffer on `gpu` (memory no process can map, staged to share it).
    pub(crate) fn stage_device(
        &self,
        gpu: &Gpu,
        src: u64,
        len: u64,
    ) -> Result<DeviceBuffer, CudaError> {
        let buf = self.alloc(gpu, len)?;
        self.copy_dtod(buf.addr, src, len)?;
        Ok(buf)
    }

    /// Copies the host bytes an `export` request lends into a new device
    /// buffer on `gpu` (storage policy `device` for host bytes).
    pub(crate) fn stage_host(
        &self,
        gpu: &Gpu,
        data: &shardport_abi::SharedBytes,
    ) -> Result<DeviceBuffer, CudaError> {
        let buf = self.alloc(gpu, data.len() as u64)?;
        // SAFETY: called from `export` only, between the host lending the
        // bytes and the matching `unexport` (the `ExportRequest::data`
        // contract), and only after the driver said `data` is not device
        // memory, so it is host memory the host lent.
        let bytes = unsafe { data.as_slice() };
        self.copy_htod(buf.addr, bytes)?;
        Ok(buf)
    }

    /// Visible devices' ordinals and UUIDs (no context needed).
    pub(crate) fn device_uuids(&self) -> Result<Vec<(u32, [u8; 16])>, CudaError> {
        let mut out = Vec::new();
        for ordinal in 0..self.devices {
            let mut dev: CUdevice = 0;
            // SAFETY: out-pointer to a live local; the driver is initialised.
            check("cuDeviceGet", unsafe {
                sys::cuDeviceGet(&mut dev, ordinal as i32)
            })?;
            let mut uuid = sys::CUuuid { bytes: [0; 16] };
            // SAFETY: out-pointer to a live local of the right type.
            check("cuDeviceGetUuid", unsafe {
                sys::cuDeviceGetUuid_v2(&mut uuid, dev)
            })?;
            out.push((ordinal, uuid.bytes.map(|b| b as u8)));
        }
        Ok(out)
    }

    /// Copies host bytes to device memory (synchronous). Host memory safety
    /// rests on `src` being a live slice; a device address that is not
    /// mapped makes the driver fail the call (it is never dereferenced by
    /// the CPU). Callers pass only ranges they checked against an allocation.
    pub(crate) fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: `src` is a live slice of `src.len()` readable bytes; `dst`
        // is a device address the driver validates.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len())
        })
    }

    /// Copies device memory to host bytes (synchronous). `dst` is a live
    /// exclusive slice, so the host side is sound; the device range is
    /// validated by the driver (see `copy_htod`).
    pub(crate) fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is a live exclusive slice of `dst.len()` writable
        // bytes; `src` is a device address the driver validates.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len())
        })
    }

    /// Copies device to device and waits for the copy to finish. Touches no
    /// host memory; device addresses are validated by the driver. The
    /// destination belongs to the caller (the `import_into_device` contract).
    pub(crate) fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: no host memory is involved; the driver validates both
        // device ranges.
        check("cuMemcpyDtoD", unsafe {
            sys::cuMemcpyDtoD_v2(dst, src, len as usize)
        })?;
        // cuMemcpyDtoD is issued on the legacy default stream and may return
        // before the copy ends: wait for that stream (not the whole context,
        // which would also wait for unrelated non-blocking streams), so the
        // lease that covers `src` can end when this returns.
        // SAFETY: a context is bound; the NULL stream is its legacy stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }

    /// Fills `len` bytes of device memory with `byte` (tests and benchmarks).
    pub(crate) fn memset(&self, dst: u64, byte: u8, len: u64) -> Result<(), CudaError> {
        // SAFETY: no host memory is involved; the driver validates the range.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(dst, byte, len as usize)
        })?;
        // SAFETY: a context is bound; the NULL stream is its legacy stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }

    /// The IPC handle of the allocation whose **base** is `base`.
    pub(crate) fn ipc_mem_handle(&self, base: u64) -> Result<[u8; IPC_HANDLE_LEN], CudaError> {
        let mut h = CUipcMemHandle {
            reserved: [0; IPC_HANDLE_LEN],
        };
        // SAFETY: out-pointer to a live local; `base` is queried, not read.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut h, base)
        })?;
        Ok(h.reserved.map(|b| b as u8))
    }

    /// Opens a peer's allocation; returns its base address in this process.
    /// Opened once per process per allocation (the cache guarantees it).
    pub(crate) fn ipc_open_mem(&self, handle: &[u8; IPC_HANDLE_LEN]) -> Result<u64, CudaError> {
        let h = CUipcMemHandle {
            reserved: handle.map(|b| b as std::os::raw::c_char),
        };
        let mut p: CUdeviceptr = 0;
        // SAFETY: the handle is passed by value; the driver validates it and
        // fails on garbage. Out-pointer to a live local.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint,
            )
        })?;
        Ok(p)
    }

    /// Creates an interprocess event in `gpu`'s primary context (bound by
    /// the caller) and records it on the legacy default stream, which orders
    /// it after the work of every *blocking* stream of that context: the
    /// producer's writes, when they were made on the default stream or a
    /// blocking stream. Work on non-blocking streams (PyTorch side streams)
    /// is not covered: the caller synchronizes those before exporting.
    pub(crate) fn record_ipc_event(
        &self,
        gpu: &Gpu,
    ) -> Result<(Event, [u8; IPC_HANDLE_LEN]), CudaError> {
        let mut ev: CUevent = std::ptr::null_mut();
        // Both flags: an interprocess event must not record timing.
        let flags = CUevent_flags::CU_EVENT_INTERPROCESS as c_uint
            | CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        // SAFETY: out-pointer to a live local; a context is bound.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut ev, flags)
        })?;
        let ev = Event {
            ev,
            gpu: gpu.clone(),
        };
        // SAFETY: a live event; the null stream is the legacy default stream.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(ev.ev, std::ptr::null_mut())
        })?;
        let mut h = CUipcEventHandle {
            reserved: [0; IPC_HANDLE_LEN],
        };
        // SAFETY: out-pointer to a live local; the event is interprocess.
        check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(&mut h, ev.ev)
        })?;
        Ok((ev, h.reserved.map(|b| b as u8)))
    }

    /// Opens a peer's event in `gpu`'s context (bound by the caller) and
    /// waits, host side, until it has completed: the producer's writes are
    /// then finished, so every later read here (a copy on any stream, a
    /// kernel the caller launches on the view) comes after them. A host wait
    /// rather than `cuStreamWaitEvent` because a view's reads are launched
    /// by the caller, on streams this plugin does not know.
    pub(crate) fn wait_ipc_event(
        &self,
        gpu: &Gpu,
        handle: &[u8; IPC_HANDLE_LEN],
    ) -> Result<(), CudaError> {
        let h = CUipcEventHandle {
            reserved: handle.map(|b| b as std::os::raw::c_char),
        };
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: handle by value (the driver validates it); out-pointer to a local.
        check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut ev, h)
        })?;
        let ev = Event {
            ev,
            gpu: gpu.clone(),
        };
        // SAFETY: a live event opened above.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(ev.ev)
        })
    }
}

/// Device memory this plugin allocated (`cuMemAlloc`), freed on drop.
/// The owner drops it only once no consumer lease covers it (the board).
#[derive(Debug)]
pub(crate) struct DeviceBuffer {
    addr: u64,
    gpu: Gpu,
}

impl DeviceBuffer {
    /// Device address of the first byte.
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let r = (|| {
            // SAFETY: the primary context is retained while `self.gpu` lives.
            check("cuCtxSetCurrent", unsafe {
                sys::cuCtxSetCurrent(self.gpu.ctx.ctx)
            })?;
            // SAFETY: `addr` came from cuMemAlloc in `Driver::alloc` and is
            // freed once, here; no copy is pending (copies are synchronous)
            // and the owner drops buffers only when no lease is held.
            check("cuMemFree", unsafe { sys::cuMemFree_v2(self.addr) })
        })();
        if let Err(e) = r {
            tracing::warn!(target: "cuda_ipc", addr = self.addr, error = %e, "freeing a staged device buffer failed");
        }
    }
}

/// What the consumer's cache opens mappings with (its `Opener`, implemented
/// in `consumer`, so that this module needs nothing of the cache):
/// `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle` in one device's context.
#[derive(Debug)]
pub(crate) struct IpcOpener {
    pub driver: Driver,
    pub gpu: Gpu,
}

impl IpcOpener {
    /// Opens `handle` in this device's context; the base address.
    pub(crate) fn open_handle(&mut self, handle: &[u8; IPC_HANDLE_LEN]) -> Result<u64, CudaError> {
        self.driver.bind(&self.gpu)?;
        self.driver.ipc_open_mem(handle)
    }

    /// Closes a mapping `open_handle` returned. The caller (the cache)
    /// calls it once per base it opened, and only when no view (reference)
    /// of the mapping is left.
    pub(crate) fn close_base(&mut self, base: u64) -> Result<(), CudaError> {
        self.driver.bind(&self.gpu)?;
        // SAFETY: as documented above: once per opened base, with no view
        // of it left.
        check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(base)
        })
    }
}

/// A read-write `MAP_SHARED` mapping of a lease board: an array of `u64`
/// words every process touches only atomically. Unmapped on drop; unlinks
/// the name on drop when it owns it.
pub(crate) struct BoardMap {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    owns_name: bool,
    /// The shared map (unmapped when dropped); `None` until mapped. Raw:
    /// other processes write the words, reached only as atomics.
    map: Option<memmap2::MmapRaw>,
}

// SAFETY: an address range owned by this value, accessed only through
// atomics; nothing in it is thread-affine.
unsafe impl Send for BoardMap {}
// SAFETY: as above.
unsafe impl Sync for BoardMap {}

impl fmt::Debug for BoardMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoardMap")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

/// Maps `len` bytes of `fd` shared and read-write: a fresh, kernel-chosen
/// range that aliases nothing; the fd is a shared-memory object of at least
/// `len` bytes (sized or fstat'ed).
fn map_shared(fd: &OwnedFd, len: usize) -> Result<(NonNull<u8>, memmap2::MmapRaw), String> {
    let map = memmap2::MmapOptions::new()
        .len(len)
        .map_raw(std::os::fd::AsRawFd::as_raw_fd(fd))
        .map_err(|e| format!("mmap: {e}"))?;
    let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| "mmap returned null".to_owned())?;
    Ok((ptr, map))
}

impl BoardMap {
    /// Creates `name` exclusively (mode 0600) with `words` zeroed words.
    pub(crate) fn create(name: &str, words: usize) -> Result<BoardMap, String> {
        let len = words
            .checked_mul(8)
            .filter(|&l| l > 0)
            .ok_or("empty board")?;
        let fd = shm::open(
            name,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| format!("shm_open {name}: {e}"))?;
        let mut board = BoardMap {
            name: name.to_owned(),
            ptr: NonNull::dangling(),
            len: 0,
            owns_name: true,
            map: None,
        };
        fs::ftruncate(&fd, len as u64).map_err(|e| format!("ftruncate {name}: {e}"))?;
        let (ptr, map) = map_shared(&fd, len).map_err(|e| format!("{name}: {e}"))?;
        board.ptr = ptr;
        board.map = Some(map);
        board.len = len;
        Ok(board)
    }

    /// Opens a peer's board and maps all of it.
    pub(crate) fn open(name: &str) -> Result<BoardMap, Errno> {
        let fd = shm::open(name, shm::OFlags::RDWR, Mode::empty())?;
        let st = fs::fstat(&fd)?;
        let len = usize::try_from(st.st_size).map_err(|_| Errno::INVAL)?;
        if len < 8 || len % 8 != 0 {
            return Err(Errno::INVAL);
        }
        let (ptr, map) = map_shared(&fd, len).map_err(|_| Errno::NOMEM)?;
        Ok(BoardMap {
            name: name.to_owned(),
            ptr,
            len,
            owns_name: false,
            map: Some(map),
        })
    }
}

impl AsRef<[AtomicU64]> for BoardMap {
    /// The board's words.
    fn as_ref(&self) -> &[AtomicU64] {
        if self.len == 0 {
            // Not mapped yet (a failed `create`): the pointer is dangling.
            return &[];
        }
        // SAFETY: the mapping is `len` bytes (a multiple of 8, checked at
        // create/open), 8-byte aligned (page-aligned base), lives as long as
        // the borrow of `self`, and every process accesses board words only
        // atomically, so shared `AtomicU64`s are a sound view of it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<AtomicU64>(), self.len / 8) }
    }
}

impl Drop for BoardMap {
    fn drop(&mut self) {
        // Words handed out borrow `self` and so are dead by now: unmap.
        drop(self.map.take());
        if self.owns_name {
            if let Err(e) = shm::unlink(self.name.as_str()) {
                if e != Errno::NOENT {
                    tracing::warn!(target: "cuda_ipc", board = %self.name, error = %e, "shm_unlink failed");
                }
            }
        }
    }
}

/// A Unix socket peer's credentials (`SO_PEERCRED`): its pid as this
/// process's PID namespace sees it (0 when it cannot see it) and its uid.
pub(crate) fn peer_credentials(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live locals of the sizes passed; the
    // kernel writes at most `len` bytes of a `struct ucred`; any values it
    // writes are valid for these plain integer fields.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid))
}
