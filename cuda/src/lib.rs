//! The CUDA driver API for shardport's crates (the cuda-ipc and http
//! transports, the CLI's GPU benchmark cells, the Python binding), through
//! cudarc's raw `driver::sys` bindings loaded at run time.
//!
//! # Overview
//! [`probe`] decides, once per process (per library that links this crate),
//! whether a driver exists at all: cudarc panics on the first call into a
//! missing library or symbol, so nothing else here is called until `probe`
//! succeeded, and the [`Driver`] value it returns is the proof. A user that
//! calls driver functions of its own (IPC handles, VMM) lists them to
//! [`Driver::require`] first. Every driver call returns its `CUresult`;
//! [`check`] turns a failure into a [`CudaError`] naming the call and the
//! driver's own error name.
//!
//! # Contexts
//! Entry points make a device's **primary context** current on the calling
//! thread ([`Gpu::bind`]): callers reach the driver from any thread, and a
//! primary context is what frameworks (PyTorch) share, so memory and handles
//! made here are valid in their kernels too. A primary context is retained at
//! most once per device at a time by this library (a process-wide registry,
//! [`Driver::gpu`]) and released when the last value using it (a [`Gpu`], a
//! [`DeviceBuffer`], a [`PinnedBuffer`]) is dropped; what else in the process
//! retained it (the CUDA runtime, PyTorch) keeps it alive independently. A
//! caller on a thread it does not own (a Python caller's) puts the thread's
//! context back with a [`ContextGuard`].
//!
//! # Streams
//! Every operation here is issued on the **legacy default stream** (the NULL
//! stream) of the primary context and waited for. It waits for prior work of
//! every *blocking* stream of that context, but NOT for streams created
//! non-blocking (PyTorch's side streams): a producer that wrote on such a
//! stream synchronizes it first.
//!
//! # Failure modes
//! A driver error never panics, and a machine without a driver gets
//! `Err` from [`probe`] with the reason, phrased for an operator. The
//! probe's answer is kept for the life of the process (of the library that
//! links this crate): a transient `cuInit` failure is not retried.
//!
//! One hole is cudarc's, not ours: its `CUresult` is a Rust enum bound to
//! CUDA 12.8's codes, so a newer driver returning a code 12.8 lacks gives an
//! invalid enum value. No such code has been seen from the calls made here
//! (H100/H200, driver 580); binding the returns as integers would close it.

use std::{
    collections::BTreeMap,
    ffi::{c_void, CStr},
    fmt,
    os::raw::c_uint,
    ptr::NonNull,
    sync::{Arc, Mutex, OnceLock, PoisonError, Weak},
};

pub use cudarc::driver::sys;
use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUmemorytype, CUpointer_attribute, CUresult,
};

/// A failed driver call: which call, and the driver's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The driver call (`cuIpcOpenMemHandle`).
    pub call: &'static str,
    /// The `CUresult` code (0 for a check of this crate's own, whose
    /// reason is in `name`).
    pub code: u32,
    /// The driver's name for it (`CUDA_ERROR_INVALID_VALUE`), or the reason.
    pub name: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl std::error::Error for CudaError {}

impl CudaError {
    /// True for `CUDA_ERROR_INVALID_VALUE`.
    pub fn is_invalid_value(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_INVALID_VALUE as u32
    }
}

/// Turns a `CUresult` into `Ok` or a [`CudaError`] naming `call`. The
/// driver names the error when [`probe`] has loaded it (the only way to
/// have a `CUresult` to check); otherwise the code's debug name is used.
pub fn check(call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::os::raw::c_char = std::ptr::null();
    let loaded = matches!(PROBED.get(), Some(Ok(_)));
    // SAFETY: called only when the probe loaded the library and found
    // `cuGetErrorName`; it writes a pointer to a static NUL-terminated
    // string or leaves it untouched on an unknown code.
    let known = loaded && unsafe { sys::cuGetErrorName(r, &mut name) } == CUresult::CUDA_SUCCESS;
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

/// Proof that the driver library is loaded and initialised and that it has
/// every symbol this crate calls; the way to reach the calls below.
#[derive(Debug, Clone, Copy)]
pub struct Driver {
    /// `cuDriverGetVersion`, e.g. 12080.
    pub version: i32,
    /// `cuDeviceGetCount`.
    pub devices: u32,
}

/// Every driver symbol this crate calls (cudarc's names: the `_v2` entry
/// points where the API has them). `probe` fails unless all are present.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemsetD8_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuStreamSynchronize",
];

static PROBED: OnceLock<Result<Driver, String>> = OnceLock::new();

/// Loads the driver library if present and initialises it, once per process;
/// later calls return the first answer. `Err` is the reason the driver
/// cannot be used, phrased for an operator.
pub fn probe() -> Result<Driver, String> {
    PROBED
        .get_or_init(|| {
            std::panic::catch_unwind(load)
                .unwrap_or_else(|_| Err("the CUDA driver probe panicked".to_owned()))
        })
        .clone()
}

fn load() -> Result<Driver, String> {
    // SAFETY: `is_culib_present` only tries to dlopen the library names.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "no CUDA driver: libcuda.so could not be loaded (no NVIDIA driver on this \
             machine, or it is not on the library path)"
                .to_owned(),
        );
    }
    missing_symbols(REQUIRED_SYMBOLS)?;
    let failed = |e: CudaError| {
        let stub = if e.name.contains("STUB_LIBRARY") {
            " (the CUDA toolkit's stub libcuda was loaded: put the NVIDIA driver's \
             libcuda.so.1 first on the library path, or remove the toolkit's \
             `stubs` directory from LD_LIBRARY_PATH)"
        } else {
            ""
        };
        format!("CUDA driver present but {e}{stub}")
    };
    // SAFETY: cuInit takes flags 0; the library is loaded and has the symbol.
    check("cuInit", unsafe { sys::cuInit(0) }).map_err(failed)?;
    let mut version = 0;
    // SAFETY: out-pointer to a live local.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })
    .map_err(failed)?;
    let mut count = 0;
    // SAFETY: out-pointer to a live local; cuInit succeeded.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })
    .map_err(failed)?;
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

/// `Err` naming the symbols of `names` the loaded library lacks. cudarc
/// resolves each symbol on its first call and panics when it is missing:
/// looking them all up first means no later call can panic.
fn missing_symbols(names: &[&str]) -> Result<(), String> {
    // SAFETY: `culib` loads the library `is_culib_present` found (callers
    // checked); the symbols are looked up, never called or read here.
    let lib = unsafe { sys::culib() };
    let missing: Vec<&str> = names
        .iter()
        .copied()
        // SAFETY: a lookup only; the pointer is never called or read.
        .filter(|name| unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_err())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the CUDA driver library lacks {} (a driver older than CUDA 12?)",
            missing.join(", ")
        ))
    }
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
        // Releasing the last retain resets the context but leaves it current
        // on this thread: unbind it first, so no later call here (a query
        // that finds "a current context") runs in a destroyed one.
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; the driver is loaded (a
        // `PrimaryCtx` exists only after a successful probe).
        let r = unsafe { sys::cuCtxGetCurrent(&mut current) };
        if r == CUresult::CUDA_SUCCESS && current == self.ctx {
            // SAFETY: null unbinds; always valid.
            let _ = unsafe { sys::cuCtxSetCurrent(std::ptr::null_mut()) };
        }
        // SAFETY: this value holds exactly one retain of `dev`'s primary
        // context (taken in `Driver::gpu`), released once, here; every
        // buffer made in it holds a `Gpu` (an `Arc` of this value), so none
        // is left.
        let r = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
        if let Err(e) = check("cuDevicePrimaryCtxRelease", r) {
            tracing::warn!(target: "shardport_cuda", error = %e, "releasing a primary context failed");
        }
    }
}

/// Primary contexts this process retained, by ordinal: at most one retain
/// per device at a time, shared by every user of this library.
static PRIMARY: Mutex<BTreeMap<u32, Weak<PrimaryCtx>>> = Mutex::new(BTreeMap::new());

/// One device with its retained primary context (shared; released when the
/// last clone is dropped).
#[derive(Debug, Clone)]
pub struct Gpu {
    /// The device's ordinal in this process.
    pub ordinal: u32,
    /// The device's UUID (the same in every process, whatever the ordinal).
    pub uuid: [u8; 16],
    ctx: Arc<PrimaryCtx>,
}

impl Gpu {
    /// Makes this device's primary context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is a retained primary context (see `Driver::gpu`),
        // retained while `self` lives.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.ctx.ctx)
        })
    }
}

/// What kind of memory an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    /// Device memory of device `ordinal`.
    Device {
        /// Its ordinal in this process.
        ordinal: u32,
    },
    /// Not device memory the driver knows (host memory).
    Host,
}

impl Driver {
    /// Checks that the loaded library has `symbols` too (what a user of
    /// this crate calls through [`sys`] itself): after `Ok`, calling them
    /// cannot panic.
    pub fn require(&self, symbols: &[&str]) -> Result<(), String> {
        missing_symbols(symbols)
    }

    /// Device `ordinal` with its primary context retained: the process's
    /// existing retain when one is alive, else a new one (so a device is
    /// retained at most once at a time, whatever the threads and users).
    pub fn gpu(&self, ordinal: u32) -> Result<Gpu, CudaError> {
        let (dev, uuid) = self.device(ordinal)?;
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
    pub fn bind(&self, gpu: &Gpu) -> Result<(), CudaError> {
        gpu.bind()
    }

    /// The ordinal of the device of the calling thread's current context
    /// (what `torch.cuda.set_device` chose), or `None` when no context is
    /// current.
    pub fn current_device(&self) -> Result<Option<u32>, CudaError> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current.is_null() {
            return Ok(None);
        }
        let mut dev: CUdevice = 0;
        // SAFETY: out-pointer to a live local; a context is current.
        check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
        // A device handle is its ordinal in the driver API (cuDeviceGet(i)
        // returns i); ask rather than assume.
        for ordinal in 0..self.devices {
            if self.device(ordinal)?.0 == dev {
                return Ok(Some(ordinal));
            }
        }
        Err(CudaError {
            call: "cuCtxGetDevice",
            code: 0,
            name: format!(
                "the current context's device {dev} is none of the {} visible",
                self.devices
            ),
        })
    }

    /// Classifies `addr` (`cuPointerGetAttribute(MEMORY_TYPE)`, then
    /// `DEVICE_ORDINAL` for device memory), in a context as
    /// [`in_a_context`](Self::in_a_context) provides.
    pub fn mem_kind(&self, addr: u64) -> Result<MemKind, CudaError> {
        self.in_a_context(|| self.mem_kind_here(addr))
    }

    fn mem_kind_here(&self, addr: u64) -> Result<MemKind, CudaError> {
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
        Ok(MemKind::Device {
            ordinal: ordinal_attribute(addr)?.max(0) as u32,
        })
    }

    /// The ordinal, in this process, of the GPU device address `addr` is
    /// on (`cuPointerGetAttribute(DEVICE_ORDINAL)`, one call); `Err` for an
    /// address that is not device memory here. In a context as
    /// [`in_a_context`](Self::in_a_context) provides.
    pub fn device_of(&self, addr: u64) -> Result<u32, CudaError> {
        self.in_a_context(|| self.device_of_here(addr))
    }

    /// Runs `query` in the calling thread's current context, or, when it
    /// has none, in device 0's primary context bound for the query (and
    /// retained while it runs), leaving the thread without a context again.
    fn in_a_context<T>(
        &self,
        query: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if !current.is_null() {
            return query();
        }
        let gpu = self.gpu(0)?;
        let restore = ContextGuard::none();
        gpu.bind()?;
        let r = query();
        drop(restore); // before `gpu` may release the context
        r
    }

    fn device_of_here(&self, addr: u64) -> Result<u32, CudaError> {
        let ordinal = ordinal_attribute(addr).map_err(|e| CudaError {
            name: format!(
                "{} (address {addr:#x} is not device memory of this process?)",
                e.name
            ),
            ..e
        })?;
        u32::try_from(ordinal).map_err(|_| CudaError {
            call: "cuPointerGetAttribute(DEVICE_ORDINAL)",
            code: 0,
            name: format!("address {addr:#x} is not device memory of this process"),
        })
    }

    /// The process-unique buffer id of the allocation containing `addr`
    /// (`CU_POINTER_ATTRIBUTE_BUFFER_ID`): never reused within a process, so
    /// it tells one allocation from a later one at the same address.
    pub fn buffer_id(&self, addr: u64) -> Result<u64, CudaError> {
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

    /// Base and size of the allocation (or VMM mapping) containing `addr`.
    pub fn address_range(&self, addr: u64) -> Result<(u64, u64), CudaError> {
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
    pub fn alloc(&self, gpu: &Gpu, len: u64) -> Result<DeviceBuffer, CudaError> {
        gpu.bind()?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: out-pointer to a live local; a context is bound.
        check("cuMemAlloc", unsafe {
            sys::cuMemAlloc_v2(&mut p, len.max(1) as usize)
        })?;
        Ok(DeviceBuffer {
            addr: p,
            len,
            gpu: gpu.clone(),
        })
    }

    /// `len` bytes of pinned host memory made in `gpu`'s context (bound
    /// here), portable: pinned for every context.
    pub fn alloc_pinned(&self, gpu: &Gpu, len: usize) -> Result<PinnedBuffer, CudaError> {
        gpu.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer to a live local; CU_MEMHOSTALLOC_PORTABLE (1).
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, len.max(1), 1)
        })?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| CudaError {
            call: "cuMemHostAlloc",
            code: 0,
            name: "the driver returned null".to_owned(),
        })?;
        // The driver does not promise zeroed pages: initialise them, so the
        // buffer's bytes may be read as a slice before anything wrote them.
        // SAFETY: `len.max(1)` writable bytes were just allocated at `ptr`.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len.max(1)) };
        Ok(PinnedBuffer {
            ptr,
            len,
            gpu: gpu.clone(),
        })
    }

    /// Visible devices' ordinals and UUIDs (no context needed).
    pub fn device_uuids(&self) -> Result<Vec<(u32, [u8; 16])>, CudaError> {
        (0..self.devices)
            .map(|ordinal| Ok((ordinal, self.device(ordinal)?.1)))
            .collect()
    }

    /// Device `ordinal`'s driver handle and UUID (no context needed).
    fn device(&self, ordinal: u32) -> Result<(CUdevice, [u8; 16]), CudaError> {
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
        Ok((dev, uuid.bytes.map(|b| b as u8)))
    }

    /// Copies host bytes to device memory (synchronous). Host memory safety
    /// rests on `src` being a live slice; a device address that is not
    /// mapped makes the driver fail the call (it is never dereferenced by
    /// the CPU). A context is bound by the caller.
    pub fn copy_htod(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
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
    pub fn copy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), CudaError> {
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
    /// host memory; device addresses are validated by the driver.
    pub fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> Result<(), CudaError> {
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
        // which would also wait for unrelated non-blocking streams).
        self.sync_legacy_stream()
    }

    /// Fills `len` bytes of device memory with `byte`, waited for.
    pub fn memset(&self, dst: u64, byte: u8, len: u64) -> Result<(), CudaError> {
        // SAFETY: no host memory is involved; the driver validates the range.
        check("cuMemsetD8", unsafe {
            sys::cuMemsetD8_v2(dst, byte, len as usize)
        })?;
        self.sync_legacy_stream()
    }

    /// Waits for the legacy default stream of the bound context.
    pub fn sync_legacy_stream(&self) -> Result<(), CudaError> {
        // SAFETY: a context is bound; the NULL stream is its legacy stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }
}

/// `cuPointerGetAttribute(DEVICE_ORDINAL)` of `addr`, in the thread's
/// current context (the caller made sure there is one).
fn ordinal_attribute(addr: u64) -> Result<i32, CudaError> {
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute is an int written to a live local; any address
    // may be queried; only reached through a `Driver` (the library loaded).
    check("cuPointerGetAttribute(DEVICE_ORDINAL)", unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast::<c_void>(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    })?;
    Ok(ordinal)
}

/// Device memory allocated with `cuMemAlloc` (or adopted with
/// [`DeviceBuffer::adopt`]), freed in its context on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    addr: u64,
    len: u64,
    gpu: Gpu,
}

impl DeviceBuffer {
    /// Takes ownership of device memory at `addr` allocated in `gpu`'s
    /// context by an allocator whose memory `cuMemFree` releases
    /// (`cuMemAlloc`, `cuMemAllocManaged`, `cuMemAllocAsync` after its
    /// stream was synchronized).
    ///
    /// # Safety
    /// `addr` is such an allocation of at least `len` bytes, owned by no one
    /// else: it is freed once, when the value drops.
    pub unsafe fn adopt(addr: u64, len: u64, gpu: &Gpu) -> DeviceBuffer {
        DeviceBuffer {
            addr,
            len,
            gpu: gpu.clone(),
        }
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes allocated.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a buffer of no bytes (one byte is allocated nonetheless).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it is on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let guard = ContextGuard::save();
        let r = self.gpu.bind().and_then(|()| {
            // SAFETY: `addr` came from cuMemAlloc in `Driver::alloc` (or was
            // adopted under `adopt`'s contract) and is freed once, here; no
            // copy is pending (copies here are synchronous; owners drop
            // buffers only when no lease is held).
            check("cuMemFree", unsafe { sys::cuMemFree_v2(self.addr) })
        });
        drop(guard);
        if let Err(e) = r {
            tracing::warn!(target: "shardport_cuda", addr = self.addr, error = %e, "freeing a device buffer failed");
        }
    }
}

/// Pinned host memory (`cuMemHostAlloc`, portable), freed in its context
/// on drop. Reads and writes as a byte slice.
#[derive(Debug)]
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    gpu: Gpu,
}

// SAFETY: the buffer is plain host memory owned by this value; access goes
// through `&self`/`&mut self` slices.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access is read-only (`as_slice`).
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated by cuMemHostAlloc, live until drop,
        // zeroed at allocation (`alloc_pinned`), so initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let guard = ContextGuard::save();
        let r = self.gpu.bind().and_then(|()| {
            // SAFETY: allocated by cuMemHostAlloc in `alloc_pinned`, freed
            // once, here; every copy using it was synchronous.
            check("cuMemFreeHost", unsafe {
                sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>())
            })
        });
        drop(guard);
        if let Err(e) = r {
            tracing::warn!(target: "shardport_cuda", error = %e, "freeing pinned memory failed");
        }
    }
}

/// The calling thread's current CUDA context, put back when dropped: the
/// calls here bind primary contexts on threads that may belong to a caller
/// (a Python thread), and a framework there (PyTorch) follows the current
/// context.
#[derive(Debug)]
pub struct ContextGuard(Option<usize>, std::marker::PhantomData<*const ()>);

impl ContextGuard {
    /// Remembers the current context (nothing when no driver is loaded).
    pub fn save() -> ContextGuard {
        let current = probe().ok().and_then(|_| {
            let mut c: CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to a live local; the driver is loaded.
            let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
            (r == CUresult::CUDA_SUCCESS).then_some(c as usize)
        });
        ContextGuard(current, std::marker::PhantomData)
    }

    /// A guard that leaves the thread without a current context when
    /// dropped (the thread had none).
    fn none() -> ContextGuard {
        ContextGuard(Some(0), std::marker::PhantomData)
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            // SAFETY: the context that was current (or null, for none); the
            // driver is loaded (a saved value exists only then).
            let _ = unsafe { sys::cuCtxSetCurrent(c as CUcontext) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests that need a GPU say why they skip.
    fn gpu_or_skip(test: &str) -> Option<Driver> {
        match probe() {
            Ok(d) => Some(d),
            Err(why) => {
                eprintln!("skipped {test}: {why}");
                None
            }
        }
    }

    #[test]
    fn the_probe_answers_the_same_every_time_and_names_a_reason() {
        let first = probe();
        let second = probe();
        match (&first, &second) {
            (Ok(a), Ok(b)) => {
                assert_eq!((a.version, a.devices), (b.version, b.devices));
                assert!(a.devices > 0);
            }
            (Err(a), Err(b)) => {
                assert_eq!(a, b);
                assert!(a.contains("CUDA"), "the reason names CUDA: {a}");
            }
            _ => panic!("the probe changed its answer: {first:?} then {second:?}"),
        }
    }

    #[test]
    fn a_failed_call_is_named_with_its_code() {
        let e = check("cuMemAlloc", CUresult::CUDA_ERROR_INVALID_VALUE).unwrap_err();
        assert_eq!(e.call, "cuMemAlloc");
        assert!(e.is_invalid_value());
        let text = e.to_string();
        assert!(text.starts_with("cuMemAlloc failed: "), "{text}");
        assert!(text.contains("INVALID_VALUE"), "{text}");
        assert!(check("cuInit", CUresult::CUDA_SUCCESS).is_ok());
    }

    #[test]
    fn a_missing_symbol_is_named() {
        let Some(d) = gpu_or_skip("a_missing_symbol_is_named") else {
            return;
        };
        let e = d.require(&["cuInit", "cuNoSuchCall"]).unwrap_err();
        assert!(e.contains("cuNoSuchCall") && !e.contains("cuInit"), "{e}");
        assert!(d.require(REQUIRED_SYMBOLS).is_ok());
    }

    #[test]
    fn gpu_bytes_go_through_device_and_pinned_memory_and_back() {
        let Some(d) = gpu_or_skip("gpu_bytes_go_through_device_and_pinned_memory_and_back") else {
            return;
        };
        let _guard = ContextGuard::save();
        let gpu = d.gpu(0).unwrap();
        let n = 3 << 20;
        let a = d.alloc(&gpu, n as u64).unwrap();
        let b = d.alloc(&gpu, n as u64).unwrap();
        assert_eq!(d.device_of(a.addr()).unwrap(), 0);
        assert_eq!(
            d.mem_kind(a.addr()).unwrap(),
            MemKind::Device { ordinal: 0 }
        );
        let host: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(d.mem_kind(host.as_ptr() as u64).unwrap(), MemKind::Host);
        gpu.bind().unwrap();
        d.copy_htod(a.addr(), &host).unwrap();
        d.copy_dtod(b.addr(), a.addr(), n as u64).unwrap();
        let mut pinned = d.alloc_pinned(&gpu, n).unwrap();
        gpu.bind().unwrap();
        d.copy_dtoh(pinned.as_mut_slice(), b.addr()).unwrap();
        assert!(
            pinned.as_slice() == host.as_slice(),
            "bytes differ after the round trip"
        );
        d.memset(b.addr(), 0xA5, n as u64).unwrap();
        d.copy_dtoh(pinned.as_mut_slice(), b.addr()).unwrap();
        assert!(pinned.as_slice().iter().all(|&x| x == 0xA5));
        let (base, size) = d.address_range(a.addr() + 100).unwrap();
        assert_eq!((base, size), (a.addr(), n as u64));
        assert_ne!(
            d.buffer_id(a.addr()).unwrap(),
            d.buffer_id(b.addr()).unwrap()
        );
        assert_eq!(d.current_device().unwrap(), Some(0));
    }

    #[test]
    fn gpu_a_context_guard_puts_the_thread_s_context_back() {
        let Some(d) = gpu_or_skip("gpu_a_context_guard_puts_the_thread_s_context_back") else {
            return;
        };
        std::thread::spawn(move || {
            assert_eq!(
                d.current_device().unwrap(),
                None,
                "a new thread has no context"
            );
            {
                let _guard = ContextGuard::save();
                d.gpu(0).unwrap().bind().unwrap();
                assert_eq!(d.current_device().unwrap(), Some(0));
            }
            assert_eq!(d.current_device().unwrap(), None, "the guard restores none");
        })
        .join()
        .unwrap();
    }
}
