//! What kind of CUDA allocation an address belongs to, and the virtual
//! memory management (VMM) calls that share the kinds legacy IPC cannot.
//!
//! # Allocation kinds
//! [`Driver::alloc_kind`] asks the driver (`cuPointerGetAttribute`):
//! - legacy-IPC capable (`cuMemAlloc`/`cudaMalloc`, PyTorch's default
//!   caching allocator): shared through `cuIpcGetMemHandle` (the parent
//!   module);
//! - VMM memory whose allocation allows POSIX file-descriptor handles
//!   (`cuMemCreate` with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`; PyTorch's
//!   `expandable_segments:True` maps its segments this way, 20 MiB chunks
//!   seen on an H200): each physical chunk under the shard is exported as a
//!   file descriptor ([`Driver::vmm_export`]), passed to the consumer over a
//!   Unix socket (`fdpass`), imported and mapped contiguously there
//!   ([`Driver::vmm_import`]);
//! - stream-ordered pool memory (`cudaMallocAsync`), managed memory, and VMM
//!   memory without a shareable handle type: no cross-process path exists
//!   for them; the caller stages such a shard into a `cuMemAlloc` buffer or
//!   refuses it naming the allocator (plugin config `unshareable`).

use std::{
    ffi::c_void,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use shardport_cuda::sys::{
    self, CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUpointer_attribute,
};

use super::{check, CudaError, DeviceBuffer, Driver, Gpu};

/// Most physical chunks one shard may span (one file descriptor each).
pub(crate) const MAX_CHUNKS: usize = 4096;

/// What kind of allocation a device address belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AllocKind {
    /// `cuMemAlloc`/`cudaMalloc` memory: legacy IPC handles work.
    Legacy,
    /// VMM memory exportable as POSIX file descriptors.
    VmmFd,
    /// Stream-ordered pool memory (`cudaMallocAsync`).
    Pool,
    /// Managed (unified) memory.
    Managed,
    /// VMM memory created without a shareable handle type.
    VmmPrivate,
}

impl AllocKind {
    /// The allocator, as an error message names it.
    pub(crate) fn allocator(self) -> &'static str {
        match self {
            AllocKind::Legacy => "cudaMalloc/cuMemAlloc",
            AllocKind::VmmFd => "VMM (cuMemCreate with POSIX file-descriptor handles)",
            AllocKind::Pool => {
                "a stream-ordered memory pool (cudaMallocAsync, PyTorch backend:cudaMallocAsync)"
            }
            AllocKind::Managed => "managed memory (cudaMallocManaged)",
            AllocKind::VmmPrivate => {
                "VMM (cuMemCreate) without a shareable handle type (requestedHandleTypes = none)"
            }
        }
    }
}

/// The physical chunks under one exported shard, as file descriptors.
#[derive(Debug)]
pub(crate) struct VmmExport {
    /// One per chunk, in address order: its size and its exported handle.
    pub chunks: Vec<(u64, OwnedFd)>,
    /// The shard's offset from the first chunk's base.
    pub offset: u64,
}

/// A consumer's mapping of a peer's VMM chunks: one reserved address range,
/// each chunk mapped in order, readable and writable by one device.
/// Unmapped and its range freed on drop.
#[derive(Debug)]
pub(crate) struct VmmMapping {
    va: CUdeviceptr,
    len: usize,
    mapped: usize,
    gpu: Gpu,
}

impl VmmMapping {
    /// The first chunk's address here.
    pub(crate) fn base(&self) -> u64 {
        self.va
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        let r = (|| {
            self.gpu.bind()?;
            if self.mapped > 0 {
                // SAFETY: `[va, va + mapped)` is exactly what `vmm_import`
                // mapped; no view of it is left (the cache closes a mapping
                // only without references).
                check("cuMemUnmap", unsafe {
                    sys::cuMemUnmap(self.va, self.mapped)
                })?;
            }
            // SAFETY: the range `cuMemAddressReserve` returned, freed once.
            check("cuMemAddressFree", unsafe {
                sys::cuMemAddressFree(self.va, self.len)
            })
        })();
        if let Err(e) = r {
            tracing::warn!(target: "cuda_ipc", va = self.va, error = %e, "unmapping a peer's VMM memory failed");
        }
    }
}

/// A retained generic allocation handle, released on drop.
struct Retained(CUmemGenericAllocationHandle);

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: one retain (or import) of this handle, released once.
        let r = unsafe { sys::cuMemRelease(self.0) };
        if let Err(e) = check("cuMemRelease", r) {
            tracing::warn!(target: "cuda_ipc", error = %e, "releasing an allocation handle failed");
        }
    }
}

impl Driver {
    /// One pointer attribute, read as a 64-bit word (every attribute asked
    /// here is at most 8 bytes; the rest of the word stays zero).
    fn attribute(&self, attr: CUpointer_attribute, addr: u64) -> Result<u64, CudaError> {
        let mut v: u64 = 0;
        // SAFETY: out-pointer to a live 8-byte local, large enough for the
        // attributes asked (bool, unsigned int, unsigned long long, pointer).
        check("cuPointerGetAttribute", unsafe {
            sys::cuPointerGetAttribute((&mut v as *mut u64).cast::<c_void>(), attr, addr)
        })?;
        Ok(v)
    }

    /// The kind of allocation device address `addr` belongs to (a context
    /// is bound by the caller).
    pub(crate) fn alloc_kind(&self, addr: u64) -> Result<AllocKind, CudaError> {
        use CUpointer_attribute::*;
        if self.attribute(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, addr)? != 0 {
            return Ok(AllocKind::Legacy);
        }
        if self.attribute(CU_POINTER_ATTRIBUTE_IS_MANAGED, addr)? != 0 {
            return Ok(AllocKind::Managed);
        }
        if self.attribute(CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, addr)? != 0 {
            return Ok(AllocKind::Pool);
        }
        let fd = u64::from(CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0);
        if self.attribute(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, addr)? & fd != 0 {
            return Ok(AllocKind::VmmFd);
        }
        Ok(AllocKind::VmmPrivate)
    }

    /// Exports the physical chunks under `[addr, addr + len)` (VMM memory,
    /// [`AllocKind::VmmFd`]) as POSIX file descriptors: walks the mappings
    /// with `cuMemGetAddressRange`, retains each chunk's handle and exports
    /// it. A context is bound by the caller.
    pub(crate) fn vmm_export(&self, addr: u64, len: u64) -> Result<VmmExport, CudaError> {
        let end = addr.saturating_add(len.max(1));
        let mut chunks = Vec::new();
        let mut first = None;
        let mut at = addr;
        while at < end {
            if chunks.len() == MAX_CHUNKS {
                return Err(CudaError {
                    call: "cuMemGetAddressRange",
                    code: 0,
                    name: format!("the shard spans more than {MAX_CHUNKS} VMM chunks"),
                });
            }
            let (base, size) = self.address_range(at)?;
            if size == 0 || base + size <= at {
                return Err(CudaError {
                    call: "cuMemGetAddressRange",
                    code: 0,
                    name: format!("an empty mapping at {at:#x}"),
                });
            }
            first.get_or_insert(base);
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer to a live local; `base` is queried, not read.
            check("cuMemRetainAllocationHandle", unsafe {
                sys::cuMemRetainAllocationHandle(&mut handle, base as *mut c_void)
            })?;
            let handle = Retained(handle);
            let mut fd: i32 = -1;
            // SAFETY: for POSIX_FILE_DESCRIPTOR the driver writes an `int`
            // into the out-pointer, a live local of that type.
            check("cuMemExportToShareableHandle", unsafe {
                sys::cuMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast::<c_void>(),
                    handle.0,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            })?;
            if fd < 0 {
                return Err(CudaError {
                    call: "cuMemExportToShareableHandle",
                    code: 0,
                    name: format!("returned file descriptor {fd}"),
                });
            }
            // SAFETY: the driver created this descriptor for us; we own it
            // from here (closed when the export ends).
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // Not inherited by processes this one spawns (each would keep
            // the GPU memory alive).
            rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).map_err(|e| CudaError {
                call: "fcntl(FD_CLOEXEC)",
                code: 0,
                name: e.to_string(),
            })?;
            chunks.push((size, fd));
            at = base + size;
        }
        let base = first.unwrap_or(addr);
        let offset = addr.checked_sub(base).ok_or_else(|| CudaError {
            call: "cuMemGetAddressRange",
            code: 0,
            name: format!("the mapping's base {base:#x} lies above the shard's address {addr:#x}"),
        })?;
        Ok(VmmExport { chunks, offset })
    }

    /// Maps a peer's exported chunks, in order, into one new address range
    /// on `gpu`, readable and writable by it. The descriptors are closed
    /// here (the mapping keeps the memory).
    pub(crate) fn vmm_import(
        &self,
        gpu: &Gpu,
        chunks: Vec<(u64, OwnedFd)>,
    ) -> Result<VmmMapping, CudaError> {
        self.bind(gpu)?;
        let total: u64 = chunks.iter().map(|(s, _)| *s).sum();
        let len = usize::try_from(total).map_err(|_| CudaError {
            call: "cuMemAddressReserve",
            code: 0,
            name: format!("{total} bytes do not fit this address space"),
        })?;
        let mut va: CUdeviceptr = 0;
        // SAFETY: out-pointer to a live local; no fixed address asked.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut va, len, 0, 0, 0)
        })?;
        // From here the range is freed (and what was mapped unmapped) on any
        // error, by the mapping's drop.
        let mut mapping = VmmMapping {
            va,
            len,
            mapped: 0,
            gpu: gpu.clone(),
        };
        for (size, fd) in chunks {
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: for POSIX_FILE_DESCRIPTOR the OS handle is the fd
            // number passed as a pointer-sized value; the driver dups what it
            // needs, and `fd` is closed when it drops at the end of this
            // iteration.
            check("cuMemImportFromShareableHandle", unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as usize as *mut c_void,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            })?;
            let handle = Retained(handle);
            // SAFETY: `[va + mapped, + size)` lies inside the reserved range
            // (the sizes sum to its length) and nothing is mapped there yet.
            check("cuMemMap", unsafe {
                sys::cuMemMap(va + mapping.mapped as u64, size as usize, 0, handle.0, 0)
            })?;
            mapping.mapped += size as usize;
        }
        self.grant(gpu, va, len)?;
        Ok(mapping)
    }

    /// Maps `gpu`'s access descriptor over `[va, va + len)`.
    fn grant(&self, gpu: &Gpu, va: CUdeviceptr, len: usize) -> Result<(), CudaError> {
        let access = CUmemAccessDesc {
            location: device_location(gpu),
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the caller mapped the whole range; one access descriptor.
        check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(va, len, &access, 1)
        })
    }

    /// Tests and benchmarks: `len` bytes of VMM memory on `gpu` made of
    /// physical chunks of `chunk` bytes (rounded up to the granularity),
    /// exportable as POSIX file descriptors and mapped contiguously, as
    /// PyTorch's expandable segments allocate.
    pub(crate) fn alloc_vmm(
        &self,
        gpu: &Gpu,
        len: u64,
        chunk: u64,
    ) -> Result<VmmMapping, CudaError> {
        self.bind(gpu)?;
        let prop = CUmemAllocationProp {
            type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes:
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: device_location(gpu),
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        };
        let mut gran: usize = 0;
        // SAFETY: out-pointer to a live local; `prop` is a valid description.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut gran,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        let gran = gran.max(1) as u64;
        let chunk = chunk.max(1).div_ceil(gran) * gran;
        let total = len.max(1).div_ceil(chunk) * chunk;
        let mut va: CUdeviceptr = 0;
        // SAFETY: out-pointer to a live local; no fixed address asked.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut va, total as usize, 0, 0, 0)
        })?;
        let mut mapping = VmmMapping {
            va,
            len: total as usize,
            mapped: 0,
            gpu: gpu.clone(),
        };
        while (mapping.mapped as u64) < total {
            let mut handle: CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer to a live local; `prop` outlives the call.
            check("cuMemCreate", unsafe {
                sys::cuMemCreate(&mut handle, chunk as usize, &prop, 0)
            })?;
            let handle = Retained(handle);
            // SAFETY: inside the reserved range, nothing mapped there yet.
            check("cuMemMap", unsafe {
                sys::cuMemMap(va + mapping.mapped as u64, chunk as usize, 0, handle.0, 0)
            })?;
            mapping.mapped += chunk as usize;
        }
        self.grant(gpu, va, total as usize)?;
        Ok(mapping)
    }

    /// Tests and benchmarks: `len` bytes from the device's default
    /// stream-ordered pool (`cuMemAllocAsync`, what `cudaMallocAsync` uses),
    /// or managed memory (`cuMemAllocManaged`). Freed with `cuMemFree`.
    pub(crate) fn alloc_other(
        &self,
        gpu: &Gpu,
        len: u64,
        managed: bool,
    ) -> Result<DeviceBuffer, CudaError> {
        self.bind(gpu)?;
        let mut p: CUdeviceptr = 0;
        if managed {
            // SAFETY: out-pointer to a live local; CU_MEM_ATTACH_GLOBAL.
            check("cuMemAllocManaged", unsafe {
                sys::cuMemAllocManaged(&mut p, len.max(1) as usize, 1)
            })?;
        } else {
            // SAFETY: out-pointer to a live local; the legacy stream.
            check("cuMemAllocAsync", unsafe {
                sys::cuMemAllocAsync(&mut p, len.max(1) as usize, std::ptr::null_mut())
            })?;
            // SAFETY: a context is bound; the NULL stream is its legacy stream.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(std::ptr::null_mut())
            })?;
        }
        // SAFETY: `p` was just allocated in `gpu`'s context by an allocator
        // `cuMemFree` releases (managed memory, or pool memory whose
        // allocation the stream synchronization above completed), `len`
        // bytes, owned by nothing else.
        Ok(unsafe { DeviceBuffer::adopt(p, len, gpu) })
    }
}

fn device_location(gpu: &Gpu) -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: gpu.ordinal as i32,
    }
}
