//! Which GPU a device address is on in this process, asked of the CUDA
//! driver. A CUDA shard's handle names the owner's device index, and the
//! two processes may number the GPUs differently (`CUDA_VISIBLE_DEVICES`: a
//! trainer seeing 8 GPUs, an inference worker seeing one of them as
//! `cuda:0`); cuda-ipc maps the shard on the consumer's own device, found
//! by GPU UUID. A DLPack export must name that device, so `fetch_cuda` asks
//! the driver where the mapped address lives. The driver is loaded at the
//! first call, never at import (a machine without one imports shardport as
//! before), through `shardport_cuda`, the crate every GPU user of the
//! project shares.
//!
//! It also allocates the device memory of a CUDA shard fetched by copy
//! ([`DeviceAlloc`]): a shard no transport here can map (its owner is on
//! another machine) arrives through http into memory this process owns.

use shardport_cuda::{ContextGuard, DeviceBuffer};

fn driver() -> Result<shardport_cuda::Driver, String> {
    shardport_cuda::probe()
}

/// The ordinal, in this process, of the GPU that device address `addr`
/// belongs to (one driver query on a cached fetch's path). The calling
/// thread's context is left as it was.
pub(crate) fn device_of(addr: u64) -> Result<i32, String> {
    let d = driver()?;
    let ordinal = d.device_of(addr).map_err(|e| {
        format!("the CUDA driver cannot tell which GPU address {addr:#x} is on: {e}")
    })?;
    i32::try_from(ordinal).map_err(|_| format!("device ordinal {ordinal} out of range"))
}

/// Device memory this process allocated for a fetched copy: `cuMemAlloc`
/// in the primary context of its device (retained while it lives), freed
/// on drop.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    memory: DeviceBuffer,
    /// Its device's ordinal in this process, as DLPack names it.
    ordinal: i32,
}

impl DeviceAlloc {
    /// `len` bytes on the device of the calling thread's current CUDA
    /// context (what `torch.cuda.set_device` chose), or on device 0 when no
    /// context is current. The thread's context is left as it was.
    pub(crate) fn new(len: u64) -> Result<DeviceAlloc, String> {
        let d = driver()?;
        let _restore = ContextGuard::save();
        let on = d.current_device().map_err(|e| e.to_string())?.unwrap_or(0);
        let gpu = d.gpu(on).map_err(|e| e.to_string())?;
        let memory = d.alloc(&gpu, len).map_err(|e| e.to_string())?;
        // The ordinal DLPack names, asked of the driver for the address (not
        // assumed from the device chosen).
        let ordinal = d.device_of(memory.addr()).map_err(|e| e.to_string())?;
        let ordinal =
            i32::try_from(ordinal).map_err(|_| format!("device ordinal {ordinal} out of range"))?;
        Ok(DeviceAlloc { memory, ordinal })
    }

    pub(crate) fn addr(&self) -> u64 {
        self.memory.addr()
    }

    pub(crate) fn ordinal(&self) -> i32 {
        self.ordinal
    }
}
