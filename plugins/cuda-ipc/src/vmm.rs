//! The consumer's side of VMM exports: where an export's chunks come from
//! ([`VmmSource`], the cache's handle for them) and the [`Opener`] that asks
//! the owner for their file descriptors (`fdpass`) and maps them here
//! (`sys::Driver::vmm_import`).
//!
//! A VMM mapping holds the owner's physical memory by reference (the driver
//! counts imports), so a consumer's mapping stays valid whatever the owner
//! does, and keeps that memory allocated until it is closed. Mappings of
//! exports their owner withdrew are therefore closed as soon as they are
//! idle (`CudaIpc::close`, and every new open retires idle ones whose slot
//! is gone), not kept for a later fetch like legacy mappings.

use std::collections::HashMap;

use crate::{
    cache::Opener,
    fdpass::{self, FetchError},
    sys::{Driver, Gpu, VmmMapping},
};

/// Where one VMM export's chunks are asked for: the owner's board (its
/// socket is named after it), the owner's pid (the socket's peer must be
/// it), the export's lease slot and generation, and the chunk sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmmSource {
    pub board: String,
    pub owner_pid: u32,
    pub slot: u32,
    pub slot_generation: u64,
    pub chunks: Vec<u64>,
}

/// Opens VMM exports on one device of this process.
#[derive(Debug)]
pub(crate) struct VmmOpener {
    pub driver: Driver,
    pub gpu: Gpu,
    /// Open mappings by base address.
    pub maps: HashMap<u64, VmmMapping>,
}

impl Opener for VmmOpener {
    type Handle = VmmSource;
    type Error = String;

    fn open(&mut self, h: &VmmSource) -> Result<u64, String> {
        let fds = fdpass::fetch(
            &fdpass::socket_name(&h.board),
            h.owner_pid,
            h.slot,
            h.slot_generation,
            h.chunks.len(),
        )
        .map_err(|e| match e {
            FetchError::NotExported => format!(
                "the owner (pid {}) no longer exports slot {} generation {}",
                h.owner_pid, h.slot, h.slot_generation
            ),
            FetchError::Failed(why) => why,
        })?;
        let chunks = h.chunks.iter().copied().zip(fds).collect();
        let mapping = self
            .driver
            .vmm_import(&self.gpu, chunks)
            .map_err(|e| format!("mapping the owner's VMM chunks: {e}"))?;
        let base = mapping.base();
        self.maps.insert(base, mapping);
        Ok(base)
    }

    fn close(&mut self, base: u64) -> Result<(), String> {
        // Dropping the mapping unmaps it and frees its range.
        self.maps
            .remove(&base)
            .map(drop)
            .ok_or_else(|| format!("no VMM mapping at {base:#x}"))
    }
}
