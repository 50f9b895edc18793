//! The `Transport` trait object: what a plugin implements.
//!
//! A transport has two sides. On the **owner** it `export`s shards (and may
//! offer an allocator so the host writes bytes straight into transport-owned
//! memory). On the **consumer** it `import`s a descriptor produced by its
//! owner-side twin in another process, either copying into a host buffer or
//! returning a zero-copy [`Region`] that stays valid until `release`.
//!
//! # Memory contracts (read these before implementing)
//! - [`ExportRequest::data`] points at bytes the host keeps alive and unmodified
//!   until `unexport` for that shard id returns.
//! - An [`Allocation`] returned by `allocate` must be writable for `len` bytes
//!   and not used by anything else until `free_allocation`, or until the shard
//!   it was exported as is unexported.
//! - A [`Region`] returned by `import_view` must stay readable and unmodified
//!   until `release(token)`. Nothing else returned across the boundary may
//!   borrow plugin memory after the call.
//! - Descriptors come from other processes: validate every byte before use.
//!
//! # Device memory (shards whose `meta.device` is `cuda:N`)
//! - [`ExportRequest::data`] of a CUDA shard is a **device address** (made by
//!   [`SharedBytes::device`]), never dereferenced by the host; the transport
//!   reads it with its driver. A transport may also accept host bytes for a
//!   CUDA shard (it tells them apart with its driver) and stage them.
//! - A [`Region`] returned by `import_view` for a CUDA shard carries a device
//!   address in `ptr`: the host never turns it into a slice (it exposes the
//!   address only, see the host's `DeviceView`). The lease rules are the same.
//! - [`Allocation::ptr`] is always host-writable memory: the host writes into
//!   it from the CPU, so a device-memory transport does not offer `ALLOCATOR`.
//! - [`Transport::import_into_device`] copies device to device into a
//!   destination the caller owns; the destination is a device address too.

use abi_stable::{
    sabi_trait,
    std_types::{RBox, RResult, RSlice, RSliceMut, RStr, RString, RVec},
    StableAbi,
};

use crate::{error::AbiError, meta::ShardId, meta::ShardMeta};

/// Capability flags a transport reports in [`TransportInfo`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// Can move shards whose bytes live in host memory.
    pub const CPU: Capabilities = Capabilities(1 << 0);
    /// Can move shards whose bytes live in CUDA device memory.
    pub const CUDA: Capabilities = Capabilities(1 << 1);
    /// Only reaches owners on the same machine (shared memory, CUDA IPC).
    pub const SAME_NODE_ONLY: Capabilities = Capabilities(1 << 2);
    /// `import_view` returns zero-copy regions.
    pub const ZERO_COPY: Capabilities = Capabilities(1 << 3);
    /// `allocate` hands out transport-owned memory for the storage policy `pool`.
    pub const ALLOCATOR: Capabilities = Capabilities(1 << 4);

    /// No capability.
    pub const fn empty() -> Self {
        Capabilities(0)
    }

    /// True when every flag of `other` is set.
    pub const fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub const fn with(self, other: Capabilities) -> Self {
        Capabilities(self.0 | other.0)
    }

    /// Lowercase names of the set flags.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [(Capabilities, &str); 5] = [
            (Capabilities::CPU, "cpu"),
            (Capabilities::CUDA, "cuda"),
            (Capabilities::SAME_NODE_ONLY, "same-node-only"),
            (Capabilities::ZERO_COPY, "zero-copy"),
            (Capabilities::ALLOCATOR, "allocator"),
        ];
        NAMES
            .iter()
            .filter(|(c, _)| self.contains(*c))
            .map(|(_, n)| *n)
            .collect()
    }
}

impl std::fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// Parts of a node's locality identity a same-node transport needs to agree
/// between owner and consumer before it is a candidate.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct IdentityParts(pub u32);

impl IdentityParts {
    /// Kernel boot id (`/proc/sys/kernel/random/boot_id`).
    pub const BOOT_ID: IdentityParts = IdentityParts(1 << 0);
    /// Device id of the filesystem behind `/dev/shm`.
    pub const SHM_DEVICE: IdentityParts = IdentityParts(1 << 1);
    /// IPC namespace id.
    pub const IPC_NS: IdentityParts = IdentityParts(1 << 2);
    /// PID namespace id.
    pub const PID_NS: IdentityParts = IdentityParts(1 << 3);
    /// GPU UUID of the shard's device.
    pub const GPU_UUID: IdentityParts = IdentityParts(1 << 4);

    /// True when every part of `other` is set.
    pub const fn contains(self, other: IdentityParts) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    #[must_use]
    pub const fn with(self, other: IdentityParts) -> Self {
        IdentityParts(self.0 | other.0)
    }
}

/// What a transport is and can do, reported as data.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct TransportInfo {
    /// Transport name (`posix-shm`), the key descriptors are filed under.
    pub name: RString,
    /// The plugin's own version.
    pub version: RString,
    /// Capability flags.
    pub capabilities: Capabilities,
    /// For same-node transports: the identity parts that must agree.
    pub needs_identity: IdentityParts,
}

/// Bytes the host lends to `export`. The host keeps them alive and unmodified
/// until `unexport` of that shard returns.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct SharedBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: `SharedBytes` is a read-only view whose target the host keeps alive
// and unmodified for the documented lifetime; sharing the address is harmless.
unsafe impl Send for SharedBytes {}
// SAFETY: as above; it is never written through.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    /// Lends `bytes`. The caller (the host) keeps them alive and unmodified
    /// until the matching `unexport` returns.
    pub fn lend(bytes: &[u8]) -> Self {
        SharedBytes {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// Lends `len` bytes of CUDA device memory at device address `addr`.
    ///
    /// Safe to construct: the host never dereferences it. The caller keeps
    /// the device memory alive and unmodified until the matching `unexport`
    /// returns, as for [`lend`](Self::lend); the transport reads it with its
    /// driver only when `meta.device` is `cuda:N`, and never through
    /// [`as_slice`](Self::as_slice).
    pub fn device(addr: u64, len: usize) -> Self {
        SharedBytes {
            ptr: addr as usize as *const u8,
            len,
        }
    }

    /// The address as an integer (a device address for CUDA shards).
    pub fn addr(&self) -> u64 {
        self.ptr as usize as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The lent bytes.
    ///
    /// # Safety
    /// Only between the `export` call that received this value and the
    /// `unexport` of the same shard; the host guarantees validity in that
    /// window and no longer.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the host lent `len` readable bytes at `ptr`, valid for the
        // window the caller promised to respect.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What `export` is asked to publish.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct ExportRequest {
    /// Shard id, unique per owner node.
    pub id: ShardId,
    /// Metadata; `meta.byte_len == data.len()`.
    pub meta: ShardMeta,
    /// The bytes (host memory, or this or another transport's allocation).
    pub data: SharedBytes,
    /// Non-zero when `data` is this transport's own [`Allocation`] with that
    /// token: export it in place (no copy) and free it at `unexport`.
    pub allocation: u64,
}

/// Transport-owned writable memory handed out by `allocate`.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct Allocation {
    /// Start of the writable bytes.
    pub ptr: *mut u8,
    /// Length in bytes (exactly the requested length).
    pub len: usize,
    /// Non-zero token naming this allocation in `export` / `free_allocation`.
    pub token: u64,
}

/// A zero-copy view returned by `import_view`.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct Region {
    /// First byte.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
    /// Token for `release`; the region is valid until then.
    pub token: u64,
}

/// One shard of an [`import_many`](Transport::import_many) batch.
#[repr(C)]
#[derive(StableAbi, Debug)]
pub struct ImportItem<'a> {
    /// The shard's descriptor.
    pub desc: RSlice<'a, u8>,
    /// Its metadata; `dst.len() == meta.byte_len`.
    pub meta: &'a ShardMeta,
    /// Where its bytes go.
    pub dst: RSliceMut<'a, u8>,
}

/// Who a handle says owns its shard, as the host read it from the handle:
/// what a transport whose descriptors name owner resources (segments,
/// files) checks those names against, so that a handle cannot point at
/// another owner's resource. Unknown parts are empty or 0.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerClaim<'a> {
    /// The owner's advertised address.
    pub addr: RStr<'a>,
    /// The owner node's epoch (Unix ns at its start; unique per node run).
    pub epoch: u64,
    /// The owner's kernel boot id (as in `/proc/sys/kernel/random/boot_id`).
    pub boot_id: RStr<'a>,
    /// The owner's PID namespace inode.
    pub pid_ns: u64,
    /// The owner's IPC namespace inode.
    pub ipc_ns: u64,
}

/// How an import was carried out, for the host's fetch report.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default)]
pub struct ImportInfo {
    /// Free-form note on how the bytes came (segment name, connection
    /// reuse, a relay...): the host appends it, in parentheses, to the
    /// fetch's selection reason. Keep it short; empty adds nothing.
    pub note: RString,
}

/// Kind of a statistic.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Debug)]
pub struct StatKind(pub u8);

impl StatKind {
    /// Monotonic counter.
    pub const COUNTER: StatKind = StatKind(0);
    /// Point-in-time value.
    pub const GAUGE: StatKind = StatKind(1);
}

/// One named statistic (`pool_bytes_used`, `leases_held`...).
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct Stat {
    /// snake_case name, unique per transport.
    pub name: RString,
    /// Counter or gauge.
    pub kind: StatKind,
    /// Value.
    pub value: u64,
}

impl Stat {
    /// A counter.
    pub fn counter(name: &str, value: u64) -> Self {
        Stat {
            name: name.into(),
            kind: StatKind::COUNTER,
            value,
        }
    }

    /// A gauge.
    pub fn gauge(name: &str, value: u64) -> Self {
        Stat {
            name: name.into(),
            kind: StatKind::GAUGE,
            value,
        }
    }
}

/// Health of a transport instance.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct Health {
    /// True when the transport can serve requests.
    pub ok: bool,
    /// Why not, or a short status line.
    pub message: RString,
}

/// A transport: the plugin's trait object.
///
/// Every method must be panic-safe: wrap its body in
/// [`PluginContext::guard`](crate::PluginContext::guard) so a panic becomes an
/// [`ErrorKind::PANIC`](crate::ErrorKind::PANIC) error. Methods appended after
/// the last prefix method in later interface versions have default bodies that
/// return `unsupported`, so older plugins keep loading.
#[sabi_trait]
pub trait Transport: Send + Sync {
    /// Name, version and capabilities.
    fn describe(&self) -> TransportInfo;

    /// Owner side: publishes a shard and returns its descriptor.
    fn export(&self, req: ExportRequest) -> RResult<RVec<u8>, AbiError>;

    /// Owner side: withdraws a shard. Storage it holds is reclaimed as soon as
    /// no consumer lease covers it. Unknown ids are `NOT_FOUND`.
    fn unexport(&self, id: ShardId) -> RResult<(), AbiError>;

    /// Consumer side: copies the shard described by `desc` into `dst`
    /// (`dst.len() == meta.byte_len`).
    fn import_into(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        dst: RSliceMut<'_, u8>,
    ) -> RResult<ImportInfo, AbiError>;

    /// Consumer side: maps the shard without copying; valid until `release`.
    /// Transports without [`Capabilities::ZERO_COPY`] return `UNSUPPORTED`.
    fn import_view(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<Region, AbiError>;

    /// Consumer side: ends a zero-copy lease. Unknown tokens are
    /// `INVALID_ARGUMENT`; a transport without [`Capabilities::ZERO_COPY`]
    /// returns `UNSUPPORTED`.
    fn release(&self, token: u64) -> RResult<(), AbiError>;

    /// Owner side, with [`Capabilities::ALLOCATOR`]: reserves `len` writable
    /// bytes for a shard about to be exported.
    fn allocate(&self, id: ShardId, len: u64) -> RResult<Allocation, AbiError>;

    /// Owner side: returns an allocation that was never exported (a failed
    /// put). An `export` that fails leaves its allocation with the host, which
    /// frees it here. Unknown tokens are `INVALID_ARGUMENT`; a transport
    /// without [`Capabilities::ALLOCATOR`] returns `UNSUPPORTED`.
    fn free_allocation(&self, token: u64) -> RResult<(), AbiError>;

    /// Named counters and gauges.
    fn stats(&self) -> RVec<Stat>;

    /// Whether the transport can serve requests.
    #[sabi(last_prefix_field)]
    fn health(&self) -> Health;

    /// Returns `x` unchanged; used to measure dispatch overhead. Appended
    /// after the last prefix method (see the evolution rules in
    /// [`module`](crate::module)): a plugin whose vtable lacks it gets this body.
    fn echo(&self, x: u64) -> u64 {
        x
    }

    /// Consumer side: copies several shards, each into its own destination,
    /// ideally in one round trip per owner (a network transport batches
    /// them). Returns one result per item, in order; one item failing does
    /// not fail the others. Appended after the last prefix method: the
    /// default imports the items one by one with `import_into`.
    fn import_many(
        &self,
        items: RSliceMut<'_, ImportItem<'_>>,
    ) -> RVec<RResult<ImportInfo, AbiError>> {
        let mut out = RVec::with_capacity(items.len());
        for item in items.into_mut_slice() {
            let dst = RSliceMut::from_mut_slice(item.dst.as_mut_slice());
            out.push(self.import_into(item.desc, item.meta, dst));
        }
        out
    }

    /// Maintenance: reclaims what dead processes left behind (segments of
    /// owners that died, leases held by consumers that died) and returns
    /// counters of what was reclaimed. Never touches a live process's
    /// resources. Called by `shardport gc` and periodically by the host.
    /// Appended after the last prefix method: the default reports
    /// `UNSUPPORTED` (nothing to sweep).
    fn sweep(&self) -> RResult<RVec<Stat>, AbiError> {
        RResult::RErr(AbiError::unsupported("this transport has nothing to sweep"))
    }

    /// Consumer side: a cheap check, made while planning a fetch, of whether
    /// this transport could import `desc` here at all (for CUDA IPC: the
    /// descriptor's GPU is visible to this process and its owner runs on
    /// this boot). `Err` means "not a candidate": the host skips the export
    /// and reports the message as the reason. It must not do the import's
    /// work, take leases or block. A transport that could serve such a
    /// descriptor but is broken here (no driver) should return `Ok` and let
    /// the import fail, so the fetch reports a downgrade. Appended after the
    /// last prefix method: the default is `Ok` (every export is a candidate).
    fn can_import(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<(), AbiError> {
        let _ = (desc, meta);
        RResult::ROk(())
    }

    /// Consumer side, for CUDA shards: copies the shard described by `desc`
    /// device-to-device into `dst_len` bytes at device address `dst_addr`
    /// (`dst_len == meta.byte_len`), after the owner's writes have finished.
    /// The caller owns the destination and keeps it alive for the call.
    /// Appended after the last prefix method: the default is `UNSUPPORTED`.
    fn import_into_device(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> RResult<ImportInfo, AbiError> {
        let _ = (desc, meta, dst_addr, dst_len);
        RResult::RErr(AbiError::unsupported(
            "this transport has no device-to-device import",
        ))
    }

    /// Consumer side: [`can_import`](Self::can_import), knowing who the
    /// handle says owns the shard. A transport whose descriptors name the
    /// owner's resources (posix-shm segment names carry the owner's
    /// identity and node epoch) refuses, with `INVALID_DESCRIPTOR` naming
    /// both owners, a descriptor that names another owner's resource than
    /// `owner` claims: a handle is bound to its owner's memory. The host
    /// calls this instead of `can_import`. Appended after the last prefix
    /// method: the default is `can_import(desc, meta)`.
    fn can_import_from(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        owner: &OwnerClaim<'_>,
    ) -> RResult<(), AbiError> {
        let _ = owner;
        self.can_import(desc, meta)
    }

    /// Consumer side: a zero-copy view the caller may **write**: the
    /// shard's bytes mapped into this process privately, copy-on-write.
    /// Reading costs what reading a view costs; a write copies the pages it
    /// touches into memory private to this one view, so it never reaches
    /// the owner, other processes, or other views (of this process too).
    /// Valid, like any region, until `release(token)`; the lease keeps the
    /// owner from reusing the bytes meanwhile. What a consumer gives to a
    /// library that ignores read-only flags (torch's DLPack import).
    /// Transports that cannot (memory that is not a mappable file, device
    /// memory) return `UNSUPPORTED`, the default. Appended after the last
    /// prefix method (ABI 0.3.0).
    fn import_view_private(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
    ) -> RResult<Region, AbiError> {
        let _ = (desc, meta);
        RResult::RErr(AbiError::unsupported(
            "this transport has no private (copy-on-write) views",
        ))
    }
}

/// The trait object a plugin's constructor returns.
pub type TransportBox = Transport_TO<'static, RBox<()>>;

/// How the host shares one transport instance (views and allocations keep it alive).
pub type SharedTransport = std::sync::Arc<TransportBox>;
