//! # shardport-abi: the stable plugin interface of shardport
//!
//! This is the *interface crate* of shardport's plugin system (abi_stable's
//! interface / implementation / user split): the `host` (user) and every
//! transport plugin (implementation) depend on it, and a third-party
//! transport depends on nothing else.
//!
//! ## Glossary
//! - **shard**: contiguous bytes plus [`ShardMeta`] (dtype, shape, device,
//!   byte length, optional checksum).
//! - **owner** / **consumer**: the process that put a shard / one that fetches it.
//! - **descriptor**: a transport's opaque bytes telling its consumer-side twin
//!   how to reach a shard. Produced by [`Transport::export`], consumed by
//!   [`Transport::import_into`] / [`Transport::import_view`]. It comes from
//!   another process: validate it before use.
//! - **lease**: a consumer's claim on zero-copy memory ([`Region`]); leased
//!   memory is never reclaimed or overwritten until released.
//! - **allocation**: transport-owned memory the host writes a shard into once
//!   ([`Capabilities::ALLOCATOR`]), so the same-node path needs no extra copy.
//!
//! ## Writing a transport
//! ```no_run
//! use shardport_abi::{
//!     export_plugin, AbiError, Allocation, Capabilities, ExportRequest, Health,
//!     IdentityParts, ImportInfo, PluginContext, PluginResult, RResult, RSlice,
//!     RSliceMut, RVec, Region, ShardId, ShardMeta, Stat, Transport, TransportBox,
//!     TransportInfo, TD_Opaque,
//! };
//!
//! struct Null { ctx: PluginContext }
//!
//! impl Transport for Null {
//!     fn describe(&self) -> TransportInfo {
//!         TransportInfo {
//!             name: "null".into(),
//!             version: env!("CARGO_PKG_VERSION").into(),
//!             capabilities: Capabilities::CPU,
//!             needs_identity: IdentityParts::default(),
//!         }
//!     }
//!     fn export(&self, _req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
//!         self.ctx.guard("export", || Err(AbiError::unsupported("null exports nothing")))
//!     }
//!     fn unexport(&self, id: ShardId) -> RResult<(), AbiError> {
//!         self.ctx.guard("unexport", || Err(AbiError::not_found(format!("shard {id}"))))
//!     }
//!     fn import_into(&self, _d: RSlice<'_, u8>, _m: &ShardMeta, _dst: RSliceMut<'_, u8>)
//!         -> RResult<ImportInfo, AbiError> {
//!         self.ctx.guard("import_into", || Err(AbiError::invalid_descriptor("null has no descriptors")))
//!     }
//!     fn import_view(&self, _d: RSlice<'_, u8>, _m: &ShardMeta) -> RResult<Region, AbiError> {
//!         self.ctx.guard("import_view", || Err(AbiError::unsupported("no zero-copy")))
//!     }
//!     fn release(&self, t: u64) -> RResult<(), AbiError> {
//!         self.ctx.guard("release", || Err(AbiError::invalid_argument(format!("token {t}"))))
//!     }
//!     fn allocate(&self, _id: ShardId, _len: u64) -> RResult<Allocation, AbiError> {
//!         self.ctx.guard("allocate", || Err(AbiError::unsupported("no allocator")))
//!     }
//!     fn free_allocation(&self, t: u64) -> RResult<(), AbiError> {
//!         self.ctx.guard("free_allocation", || Err(AbiError::invalid_argument(format!("token {t}"))))
//!     }
//!     fn stats(&self) -> RVec<Stat> { RVec::new() }
//!     fn health(&self) -> Health { Health { ok: true, message: "ok".into() } }
//! }
//!
//! fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
//!     // `ctx.config()` is this plugin's TOML table as text: validate it here.
//!     Ok(TransportBox::from_value(Null { ctx }, TD_Opaque))
//! }
//!
//! export_plugin! { name: "null", version: env!("CARGO_PKG_VERSION"), new: create }
//! ```
//! Build it as `crate-type = ["cdylib", "rlib"]`, keep `panic = "unwind"`,
//! and run the conformance suite of the `shardport-kit` crate against it
//! (its feature `conformance`). What every transport repeats (counters,
//! descriptor codecs, error mapping, options, safe views of mapped memory)
//! is in `shardport-kit`, a crate of its own with its own version: a change
//! there never changes what crosses the boundary, so it never refuses a
//! plugin (see [`module`] for what bumps [`ABI_VERSION`]).
//! `docs/plugins.md` in the repository walks through an out-of-tree plugin.
//!
//! ## Where to start reading
//! [`Transport`] (the trait and its memory contracts), then [`module`] (the
//! root module and the evolution rules), then [`plugin`] (panic safety and
//! logging).

pub mod error;
pub mod host;
pub mod meta;
pub mod module;
pub mod plugin;
pub mod transport;
pub mod view;

// The deliberate export list: everything a plugin author or the host needs.
// Errors.
pub use error::{AbiError, ErrorKind, PluginResult};
// What the host hands a plugin.
pub use host::{HostContext, HostServices, HostServicesBox, HostServices_TO, LogLevel, LogRecord};
// Shard identity and metadata.
pub use meta::{Checksum, ChecksumAlgo, DType, Device, DeviceKind, ShardId, ShardMeta};
// The root module.
pub use module::{PluginModule, PluginModuleRef, ABI_VERSION};
// Plugin-side helpers.
pub use plugin::PluginContext;
// The transport trait object and what crosses it.
pub use transport::{
    Allocation, Capabilities, ExportRequest, Health, IdentityParts, ImportInfo, ImportItem,
    OwnerClaim, Region, SharedBytes, SharedTransport, Stat, StatKind, Transport, TransportBox,
    TransportInfo, Transport_TO,
};
// Host-side owners of plugin memory.
pub use view::{AllocationGuard, LeasedDeviceView, LeasedView};
// abi_stable types that appear in the trait's signatures.
pub use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RBox, ROption, RResult, RSlice, RSliceMut, RStr, RString, RVec},
};

/// The `tracing` crate, re-exported so a plugin logs with the same version
/// the forwarding dispatcher uses (`shardport_abi::tracing::debug!(...)`).
pub use tracing;

/// Re-exports used by [`export_plugin!`]; not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use abi_stable::library::{
        __call_root_module_loader as call_root_module_loader, CheckTypeLayout, LibHeader,
        RootModuleResult,
    };
    pub use abi_stable::std_types::RResult;
    pub use abi_stable::{self, library::RootModule};
}
