//! Device memory for the GPU cells of `shardport bench` and the worker's
//! device requests: a buffer on device 0 that holds the bench's byte
//! pattern, and the copies the GPU limits are made of. Through
//! `shardport_cuda` (the CUDA driver, loaded at run time): on a machine
//! without one, [`available`] says why and nothing here runs.

use std::time::{Duration, Instant};

use shardport_abi::{DType, Device};
use shardport_cuda::{ContextGuard, DeviceBuffer, Driver, Gpu, PinnedBuffer};
use shardport_host::node::TensorSpec;

use crate::pattern::{check_pattern, fill_pattern};

/// The driver, or why this process cannot use a GPU.
pub fn available() -> Result<Driver, String> {
    shardport_cuda::probe()
}

/// A 1-D `u8` tensor of `len` bytes on `cuda:0` (what the bench puts).
pub fn spec(len: u64) -> TensorSpec {
    TensorSpec {
        dtype: DType::U8,
        shape: vec![len],
        device: Device::cuda(0),
    }
}

/// `len` bytes of device memory on device 0.
#[derive(Debug)]
pub struct DeviceMem {
    driver: Driver,
    buf: DeviceBuffer,
}

impl DeviceMem {
    /// Allocates `len` bytes (`cuMemAlloc`) on device 0; the calling
    /// thread's context is left as it was.
    pub fn new(len: u64) -> Result<DeviceMem, String> {
        let driver = available()?;
        let _restore = ContextGuard::save();
        let gpu = driver.gpu(0).map_err(|e| e.to_string())?;
        let buf = driver.alloc(&gpu, len).map_err(|e| e.to_string())?;
        Ok(DeviceMem { driver, buf })
    }

    /// Device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.buf.addr()
    }

    /// Bytes allocated.
    pub fn len(&self) -> u64 {
        self.buf.len()
    }

    /// True when no bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn gpu(&self) -> &Gpu {
        self.buf.gpu()
    }

    /// Writes the pattern for `seed` over the whole buffer.
    pub fn fill(&self, seed: u64) -> Result<(), String> {
        let mut host = vec![0u8; self.len() as usize];
        fill_pattern(&mut host, seed);
        self.write(&host)
    }

    /// Copies `bytes` to the start of the buffer.
    pub fn write(&self, bytes: &[u8]) -> Result<(), String> {
        let _restore = ContextGuard::save();
        self.gpu().bind().map_err(|e| e.to_string())?;
        self.driver
            .copy_htod(self.addr(), bytes)
            .map_err(|e| e.to_string())
    }
}

/// True when the `len` bytes of device memory at `addr` (of this process,
/// on device 0) hold the pattern for `seed` (read back to the host).
pub fn holds_pattern(addr: u64, len: u64, seed: u64) -> Result<bool, String> {
    let driver = available()?;
    let _restore = ContextGuard::save();
    let gpu = driver.gpu(0).map_err(|e| e.to_string())?;
    gpu.bind().map_err(|e| e.to_string())?;
    let mut host = vec![0u8; len as usize];
    driver
        .copy_dtoh(&mut host, addr)
        .map_err(|e| e.to_string())?;
    Ok(check_pattern(&host, seed))
}

/// The copies a GPU cell is compared with, on device 0 of this process:
/// device to device between two buffers, and device to host and back
/// through pinned memory, each as long as the largest size.
#[derive(Debug)]
pub struct GpuLimits {
    src: DeviceMem,
    dst: DeviceMem,
    pinned: PinnedBuffer,
}

impl GpuLimits {
    /// Buffers for shards of up to `largest` bytes.
    pub fn new(largest: u64) -> Result<GpuLimits, String> {
        let src = DeviceMem::new(largest)?;
        src.fill(1)?;
        let dst = DeviceMem::new(largest)?;
        let _restore = ContextGuard::save();
        let pinned = src
            .driver
            .alloc_pinned(src.gpu(), largest as usize)
            .map_err(|e| e.to_string())?;
        Ok(GpuLimits { src, dst, pinned })
    }

    fn timed(
        &mut self,
        copy: impl FnOnce(&Driver, &DeviceMem, &DeviceMem, &mut [u8]) -> Result<(), String>,
    ) -> Result<Duration, String> {
        let _restore = ContextGuard::save();
        self.src.gpu().bind().map_err(|e| e.to_string())?;
        let driver = self.src.driver;
        let t = Instant::now();
        copy(&driver, &self.src, &self.dst, self.pinned.as_mut_slice())?;
        Ok(t.elapsed())
    }

    /// One `cuMemcpyDtoD` of `n` bytes, waited for.
    pub fn device_copy(&mut self, n: u64) -> Result<Duration, String> {
        self.timed(|d, src, dst, _| {
            d.copy_dtod(dst.addr(), src.addr(), n)
                .map_err(|e| e.to_string())
        })
    }

    /// One synchronous copy of `n` bytes from the device to pinned memory.
    pub fn to_host(&mut self, n: u64) -> Result<Duration, String> {
        self.timed(|d, src, _, pinned| {
            d.copy_dtoh(&mut pinned[..n as usize], src.addr())
                .map_err(|e| e.to_string())
        })
    }

    /// One synchronous copy of `n` bytes from pinned memory to the device.
    pub fn to_device(&mut self, n: u64) -> Result<Duration, String> {
        self.timed(|d, _, dst, pinned| {
            d.copy_htod(dst.addr(), &pinned[..n as usize])
                .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_every_entry_point_says_why() {
        let Err(why) = available() else {
            eprintln!("skipped without_a_driver_every_entry_point_says_why: a CUDA driver is present (the GPU case is the next test)");
            return;
        };
        assert!(why.contains("CUDA"), "{why}");
        assert_eq!(DeviceMem::new(16).unwrap_err(), why);
        assert_eq!(GpuLimits::new(16).unwrap_err(), why);
        assert_eq!(holds_pattern(0, 16, 1).unwrap_err(), why);
    }

    #[test]
    fn gpu_device_memory_holds_the_pattern_and_the_limits_copy() {
        if let Err(why) = available() {
            eprintln!("skipped gpu_device_memory_holds_the_pattern_and_the_limits_copy: {why}");
            return;
        }
        let n = 1 << 20;
        let m = DeviceMem::new(n).unwrap();
        m.fill(7).unwrap();
        assert!(holds_pattern(m.addr(), n, 7).unwrap());
        assert!(!holds_pattern(m.addr(), n, 8).unwrap());
        let mut l = GpuLimits::new(n).unwrap();
        l.device_copy(n).unwrap();
        assert!(
            holds_pattern(l.dst.addr(), n, 1).unwrap(),
            "the copy moved the bytes"
        );
        l.to_host(n).unwrap();
        l.to_device(n).unwrap();
    }
}
