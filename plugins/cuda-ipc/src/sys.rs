//! The only module with `unsafe`: the CUDA driver calls of this plugin
//! alone (IPC memory and event handles here, VMM export and import in
//! `vmm`, through cudarc's raw `driver::sys` bindings loaded at run time)
//! and the lease board's shared memory mapping. The driver calls every
//! GPU user shares (the probe, primary contexts, allocations, copies,
//! pointer queries, errors naming the call) are `shardport_cuda`'s; its
//! crate documentation says how contexts and streams are used, and this
//! plugin follows it: every entry point binds the device's primary context,
//! every operation is on the legacy default stream.
//!
//! # Failure modes
//! A driver error never panics. cudarc panics on the first call of a
//! symbol the loaded library lacks, so [`probe`] looks every symbol this
//! plugin calls up front ([`IPC_SYMBOLS`], beside the shared crate's own)
//! and reports a driver that lacks one as unavailable: after a successful
//! probe no call can panic.

use std::{ffi::c_void, fmt, os::raw::c_uint, ptr::NonNull, sync::atomic::AtomicU64};

use rustix::{
    fd::OwnedFd,
    fs::{self, Mode},
    io::Errno,
    shm,
};
use shardport_cuda::sys::{
    self, CUdeviceptr, CUevent, CUevent_flags, CUipcEventHandle, CUipcMemHandle, CUipcMem_flags,
};
pub(crate) use shardport_cuda::{check, CudaError, DeviceBuffer, Gpu, MemKind};

mod vmm;

pub(crate) use vmm::{AllocKind, VmmMapping, MAX_CHUNKS};

/// Bytes in a CUDA IPC memory or event handle.
pub(crate) const IPC_HANDLE_LEN: usize = 64;

/// The driver, with the symbols this plugin calls itself checked too (the
/// IPC and VMM calls below, [`IPC_SYMBOLS`]): the only way to reach them.
/// The calls every user of the driver shares (contexts, allocations,
/// copies, pointer queries) are `shardport_cuda`'s, reached through `Deref`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Driver(pub(crate) shardport_cuda::Driver);

impl std::ops::Deref for Driver {
    type Target = shardport_cuda::Driver;

    fn deref(&self) -> &shardport_cuda::Driver {
        &self.0
    }
}

/// The driver symbols this plugin calls itself, beyond
/// [`shardport_cuda::REQUIRED_SYMBOLS`] (cudarc's names: the `_v2` entry
/// points where the API has them). `probe` fails unless all are present.
pub(crate) const IPC_SYMBOLS: &[&str] = &[
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
];

/// Loads the driver library if present and initialises it (once per
/// process, `shardport_cuda::probe`), and checks [`IPC_SYMBOLS`]. `Err` is
/// the reason the transport is unavailable, phrased for an operator.
pub(crate) fn probe() -> Result<Driver, String> {
    let d = shardport_cuda::probe()?;
    d.require(IPC_SYMBOLS)
        .map_err(|e| format!("{e}: cuda-ipc needs CUDA 12 IPC and VMM calls"))?;
    Ok(Driver(d))
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
            self.gpu.bind()?;
            // SAFETY: the event was created or opened by this value and is
            // destroyed once, here. A `Driver` existed to make it.
            check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(self.ev) })
        })();
        if let Err(e) = r {
            tracing::warn!(target: "cuda_ipc", error = %e, "event destroy failed");
        }
    }
}

impl Driver {
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
        self.copy_dtod(buf.addr(), src, len)?;
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
        self.copy_htod(buf.addr(), bytes)?;
        Ok(buf)
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
