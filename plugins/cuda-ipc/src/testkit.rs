//! Device buffers for GPU tests, examples and benchmarks: the host crate
//! forbids `unsafe` and has no driver, so the programs that need device
//! memory of their own (the two-process GPU test's peers, the benchmark)
//! get it here. Not part of the transport.

use crate::sys::{self, DeviceBuffer, Driver, Gpu, VmmMapping};

/// Which allocator a [`DeviceScratch`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// `cuMemAlloc` (what `cudaMalloc` and PyTorch's default allocator use).
    Plain,
    /// VMM chunks of this many bytes (`cuMemCreate` with POSIX
    /// file-descriptor handles, mapped contiguously: PyTorch's expandable
    /// segments).
    Vmm {
        /// Bytes per physical chunk (rounded up to the granularity).
        chunk: u64,
    },
    /// The device's default stream-ordered pool (`cudaMallocAsync`).
    Pool,
    /// Managed memory (`cudaMallocManaged`).
    Managed,
}

impl std::str::FromStr for Allocator {
    type Err = String;

    /// `plain`, `vmm` (2 MiB chunks), `vmm:<bytes>`, `pool`, `managed`.
    fn from_str(s: &str) -> Result<Allocator, String> {
        Ok(match s {
            "plain" => Allocator::Plain,
            "vmm" => Allocator::Vmm { chunk: 2 << 20 },
            "pool" => Allocator::Pool,
            "managed" => Allocator::Managed,
            other => match other.strip_prefix("vmm:") {
                Some(n) => Allocator::Vmm {
                    chunk: n.parse().map_err(|e| format!("vmm chunk {n:?}: {e}"))?,
                },
                None => return Err(format!("unknown allocator {other:?}")),
            },
        })
    }
}

#[derive(Debug)]
enum Memory {
    Buffer(DeviceBuffer),
    Vmm(VmmMapping),
}

/// Why CUDA cannot be used here (`None` when it can): the reason GPU tests
/// print when they skip.
pub fn unavailable_reason() -> Option<String> {
    crate::forced_unavailable().or_else(|| {
        std::panic::catch_unwind(sys::probe)
            .map_err(|_| "CUDA driver probe panicked".to_owned())
            .and_then(|r| r)
            .err()
    })
}

/// A `cuMemAlloc` buffer on one device, freed on drop.
#[derive(Debug)]
pub struct DeviceScratch {
    driver: Driver,
    gpu: Gpu,
    mem: Memory,
    len: u64,
}

impl DeviceScratch {
    /// Allocates `len` bytes on device `ordinal` (`cuMemAlloc`).
    pub fn new(ordinal: u32, len: u64) -> Result<DeviceScratch, String> {
        DeviceScratch::with(ordinal, len, Allocator::Plain)
    }

    /// Allocates `len` bytes on device `ordinal` from `allocator`.
    pub fn with(ordinal: u32, len: u64, allocator: Allocator) -> Result<DeviceScratch, String> {
        let driver = std::panic::catch_unwind(sys::probe)
            .map_err(|_| "CUDA driver probe panicked".to_owned())??;
        let gpu = driver.gpu(ordinal).map_err(|e| e.to_string())?;
        let mem = match allocator {
            Allocator::Plain => driver.alloc(&gpu, len).map(Memory::Buffer),
            Allocator::Vmm { chunk } => driver.alloc_vmm(&gpu, len, chunk).map(Memory::Vmm),
            Allocator::Pool => driver.alloc_other(&gpu, len, false).map(Memory::Buffer),
            Allocator::Managed => driver.alloc_other(&gpu, len, true).map(Memory::Buffer),
        }
        .map_err(|e| e.to_string())?;
        Ok(DeviceScratch {
            driver,
            gpu,
            mem,
            len,
        })
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        match &self.mem {
            Memory::Buffer(b) => b.addr(),
            Memory::Vmm(m) => m.base(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `bytes` to the start of the buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<(), String> {
        self.upload_at(0, bytes)
    }

    /// Copies `bytes` to `offset` in the buffer.
    pub fn upload_at(&self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        match offset.checked_add(bytes.len() as u64) {
            Some(end) if end <= self.len() => {}
            _ => {
                return Err(format!(
                    "{} bytes at offset {offset} do not fit in {}",
                    bytes.len(),
                    self.len()
                ))
            }
        }
        self.driver.bind(&self.gpu).map_err(|e| e.to_string())?;
        self.driver
            .copy_htod(self.addr() + offset, bytes)
            .map_err(|e| e.to_string())
    }

    /// Reads the first `len` bytes back.
    pub fn download(&self, len: u64) -> Result<Vec<u8>, String> {
        if len > self.len() {
            return Err(format!("{len} bytes exceed the buffer's {}", self.len()));
        }
        self.driver.bind(&self.gpu).map_err(|e| e.to_string())?;
        let mut v = vec![0u8; len as usize];
        self.driver
            .copy_dtoh(&mut v, self.addr())
            .map_err(|e| e.to_string())?;
        Ok(v)
    }

    /// Fills the buffer with `byte`.
    pub fn fill(&self, byte: u8) -> Result<(), String> {
        self.driver.bind(&self.gpu).map_err(|e| e.to_string())?;
        self.driver
            .memset(self.addr(), byte, self.len())
            .map_err(|e| e.to_string())
    }

    /// Bandwidth, GB/s, of `iters` copies of the whole buffer to pinned host
    /// memory and of `iters` back (device-to-host, host-to-device): the
    /// limits of a GPU shard staged through host memory, measured in the
    /// same run.
    pub fn pinned_copy_gbs(&self, iters: u32) -> Result<(f64, f64), String> {
        self.driver.bind(&self.gpu).map_err(|e| e.to_string())?;
        let (d2h, h2d) = self
            .driver
            .pinned_copy_seconds(self.addr(), self.len as usize, iters)
            .map_err(|e| e.to_string())?;
        let bytes = self.len as f64 * f64::from(iters);
        Ok((bytes / d2h / 1e9, bytes / h2d / 1e9))
    }

    /// `cuMemcpyDtoD` of `len` bytes from `src` into this buffer, waited for
    /// (the benchmark's baseline).
    pub fn copy_from_device(&self, src: u64, len: u64) -> Result<(), String> {
        if len > self.len() {
            return Err(format!("{len} bytes exceed the buffer's {}", self.len()));
        }
        self.driver.bind(&self.gpu).map_err(|e| e.to_string())?;
        self.driver
            .copy_dtod(self.addr(), src, len)
            .map_err(|e| e.to_string())
    }
}
