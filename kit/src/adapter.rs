//! A transport written in plain Rust types, made into the ABI's trait
//! object by [`Guarded`].
//!
//! Every method of [`Transport`] takes ABI types (`RSlice`, `RResult`...)
//! and must run inside [`PluginContext::guard`]; every transport used to
//! repeat that wrapping, method by method. Implement [`PlainTransport`]
//! instead (slices, `PluginResult`, `Vec`), with defaults for what a
//! transport may lack (views, an allocator, batching, sweeping), and box
//! it with [`into_transport_box`]: [`Guarded`] implements [`Transport`],
//! running each method under the guard (a panic becomes an
//! [`ErrorKind::PANIC`](shardport_abi::ErrorKind::PANIC) error naming the method,
//! or the fallback for methods without an error) with log forwarding on.
//!
//! ```
//! use shardport_kit::{self as kit, PlainTransport};
//! use shardport_abi::{
//!     Capabilities, ExportRequest, Health, IdentityParts, ImportInfo, PluginContext,
//!     PluginResult, ShardId, ShardMeta, Stat, TransportBox, TransportInfo, AbiError,
//! };
//!
//! struct Null { ctx: PluginContext }
//!
//! impl PlainTransport for Null {
//!     const NAME: &'static str = "null";
//!     fn context(&self) -> &PluginContext { &self.ctx }
//!     fn describe(&self) -> TransportInfo {
//!         TransportInfo {
//!             name: Self::NAME.into(),
//!             version: env!("CARGO_PKG_VERSION").into(),
//!             capabilities: Capabilities::CPU,
//!             needs_identity: IdentityParts::default(),
//!         }
//!     }
//!     fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
//!         Err(AbiError::unsupported(format!("null exports nothing (shard {})", req.id)))
//!     }
//!     fn unexport(&self, id: ShardId) -> PluginResult<()> {
//!         Err(AbiError::not_found(format!("shard {id}")))
//!     }
//!     fn import_into(&self, _d: &[u8], _m: &ShardMeta, _dst: &mut [u8]) -> PluginResult<ImportInfo> {
//!         Err(AbiError::invalid_descriptor("null has no descriptors"))
//!     }
//!     fn stats(&self) -> Vec<Stat> { Vec::new() }
//!     fn health(&self) -> Health { kit::guard::ok("ok") }
//! }
//!
//! fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
//!     Ok(kit::into_transport_box(Null { ctx }))
//! }
//! ```

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RResult, RSlice, RSliceMut, RVec},
};

use crate::{guard, unsupported};
use shardport_abi::{
    error::{AbiError, PluginResult},
    meta::{ShardId, ShardMeta},
    plugin::PluginContext,
    transport::{
        Allocation, Capabilities, ExportRequest, Health, IdentityParts, ImportInfo, ImportItem,
        OwnerClaim, Region, Stat, Transport, TransportBox, TransportInfo,
    },
};

/// A transport in plain Rust types; see the [module docs](self). Each
/// method has the meaning of the [`Transport`] method of the same name.
pub trait PlainTransport: Send + Sync + 'static {
    /// The transport name, used in the stock `UNSUPPORTED` errors and in
    /// `describe`'s fallback after a panic.
    const NAME: &'static str;

    /// The instance's context (its guard forwards logs and catches panics).
    fn context(&self) -> &PluginContext;

    /// Name, version and capabilities.
    fn describe(&self) -> TransportInfo;

    /// Owner side: publishes a shard and returns its descriptor.
    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>>;

    /// Owner side: withdraws a shard (`NOT_FOUND` when unknown).
    fn unexport(&self, id: ShardId) -> PluginResult<()>;

    /// Consumer side: copies the shard into `dst` (`dst.len() == meta.byte_len`).
    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo>;

    /// Consumer side: a zero-copy view. Default: `UNSUPPORTED`.
    fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        let _ = (desc, meta);
        Err(unsupported::no_views(Self::NAME))
    }

    /// Consumer side: ends a view's lease. Default: `UNSUPPORTED`.
    fn release(&self, token: u64) -> PluginResult<()> {
        Err(unsupported::no_leases(Self::NAME, token))
    }

    /// Owner side: transport-owned memory. Default: `UNSUPPORTED`.
    fn allocate(&self, id: ShardId, len: u64) -> PluginResult<Allocation> {
        let _ = len;
        Err(unsupported::no_allocator(Self::NAME, id))
    }

    /// Owner side: returns an unexported allocation. Default: `UNSUPPORTED`.
    fn free_allocation(&self, token: u64) -> PluginResult<()> {
        Err(unsupported::no_allocations(Self::NAME, token))
    }

    /// Named counters and gauges.
    fn stats(&self) -> Vec<Stat>;

    /// Whether the transport can serve requests.
    fn health(&self) -> Health;

    /// Consumer side: one result per item, in order. Default: the items
    /// one by one through [`import_into`](Self::import_into), each under
    /// its own guard (a panic fails that item only).
    fn import_many(&self, items: &mut [ImportItem<'_>]) -> Vec<PluginResult<ImportInfo>> {
        items
            .iter_mut()
            .map(|item| {
                self.context()
                    .guard("import_into", || {
                        self.import_into(item.desc.as_slice(), item.meta, item.dst.as_mut_slice())
                    })
                    .into_result()
            })
            .collect()
    }

    /// Maintenance. Default: `UNSUPPORTED` (nothing to sweep).
    fn sweep(&self) -> PluginResult<Vec<Stat>> {
        Err(AbiError::unsupported("this transport has nothing to sweep"))
    }

    /// Whether `desc` could be imported here at all. Default: yes.
    fn can_import(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<()> {
        let _ = (desc, meta);
        Ok(())
    }

    /// Planning check knowing the handle's owner claim. Default:
    /// [`can_import`](Self::can_import).
    fn can_import_from(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        owner: &OwnerClaim<'_>,
    ) -> PluginResult<()> {
        let _ = owner;
        self.can_import(desc, meta)
    }

    /// Device-to-device import. Default: `UNSUPPORTED`.
    fn import_into_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        let _ = (desc, meta, dst_addr, dst_len);
        Err(AbiError::unsupported(
            "this transport has no device-to-device import",
        ))
    }

    /// A private, copy-on-write view the caller may write (see
    /// [`Transport::import_view_private`]). Default: `UNSUPPORTED`.
    fn import_view_private(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        let _ = (desc, meta);
        Err(AbiError::unsupported(
            "this transport has no private (copy-on-write) views",
        ))
    }
}

/// The [`Transport`] trait object of a [`PlainTransport`]: every method
/// runs under the instance's guard.
#[derive(Debug)]
pub struct Guarded<T>(pub T);

/// Boxes `t` as the trait object a plugin constructor returns.
pub fn into_transport_box<T: PlainTransport>(t: T) -> TransportBox {
    TransportBox::from_value(Guarded(t), TD_Opaque)
}

impl<T: PlainTransport> Transport for Guarded<T> {
    fn describe(&self) -> TransportInfo {
        let fallback = TransportInfo {
            name: T::NAME.into(),
            version: "unknown".into(),
            capabilities: Capabilities::empty(),
            needs_identity: IdentityParts::default(),
        };
        self.0
            .context()
            .guard_infallible("describe", fallback, || self.0.describe())
    }

    fn export(&self, req: ExportRequest) -> RResult<RVec<u8>, AbiError> {
        self.0
            .context()
            .guard("export", || self.0.export(&req).map(RVec::from))
    }

    fn unexport(&self, id: ShardId) -> RResult<(), AbiError> {
        self.0.context().guard("unexport", || self.0.unexport(id))
    }

    fn import_into(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        mut dst: RSliceMut<'_, u8>,
    ) -> RResult<ImportInfo, AbiError> {
        self.0.context().guard("import_into", || {
            self.0
                .import_into(desc.as_slice(), meta, dst.as_mut_slice())
        })
    }

    fn import_view(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<Region, AbiError> {
        self.0
            .context()
            .guard("import_view", || self.0.import_view(desc.as_slice(), meta))
    }

    fn release(&self, token: u64) -> RResult<(), AbiError> {
        self.0.context().guard("release", || self.0.release(token))
    }

    fn allocate(&self, id: ShardId, len: u64) -> RResult<Allocation, AbiError> {
        self.0
            .context()
            .guard("allocate", || self.0.allocate(id, len))
    }

    fn free_allocation(&self, token: u64) -> RResult<(), AbiError> {
        self.0
            .context()
            .guard("free_allocation", || self.0.free_allocation(token))
    }

    fn stats(&self) -> RVec<Stat> {
        guard::stats(self.0.context(), || self.0.stats())
    }

    fn health(&self) -> Health {
        guard::health(self.0.context(), || self.0.health())
    }

    fn import_many(
        &self,
        items: RSliceMut<'_, ImportItem<'_>>,
    ) -> RVec<RResult<ImportInfo, AbiError>> {
        guard::import_many(self.0.context(), items, |items| self.0.import_many(items))
    }

    fn sweep(&self) -> RResult<RVec<Stat>, AbiError> {
        self.0
            .context()
            .guard("sweep", || self.0.sweep().map(RVec::from))
    }

    fn can_import(&self, desc: RSlice<'_, u8>, meta: &ShardMeta) -> RResult<(), AbiError> {
        self.0
            .context()
            .guard("can_import", || self.0.can_import(desc.as_slice(), meta))
    }

    fn can_import_from(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        owner: &OwnerClaim<'_>,
    ) -> RResult<(), AbiError> {
        self.0.context().guard("can_import_from", || {
            self.0.can_import_from(desc.as_slice(), meta, owner)
        })
    }

    fn import_into_device(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> RResult<ImportInfo, AbiError> {
        self.0.context().guard("import_into_device", || {
            self.0
                .import_into_device(desc.as_slice(), meta, dst_addr, dst_len)
        })
    }

    fn import_view_private(
        &self,
        desc: RSlice<'_, u8>,
        meta: &ShardMeta,
    ) -> RResult<Region, AbiError> {
        self.0.context().guard("import_view_private", || {
            self.0.import_view_private(desc.as_slice(), meta)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::testing;
    use shardport_abi::{error::ErrorKind, transport::SharedBytes};

    /// Copies shards in memory; panics on request, to show the guard.
    struct Mem {
        ctx: PluginContext,
        shards: Mutex<Vec<(ShardId, Vec<u8>)>>,
    }

    impl PlainTransport for Mem {
        const NAME: &'static str = "mem";
        fn context(&self) -> &PluginContext {
            &self.ctx
        }
        fn describe(&self) -> TransportInfo {
            TransportInfo {
                name: "mem".into(),
                version: "1".into(),
                capabilities: Capabilities::CPU,
                needs_identity: IdentityParts::default(),
            }
        }
        fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
            // SAFETY: inside `export`, with the request the caller lent.
            let bytes = unsafe { crate::Lent::from_export(req) }?;
            if bytes.as_slice() == b"panic" {
                panic!("told to");
            }
            self.shards.lock().unwrap().push((req.id, bytes.to_vec()));
            Ok(req.id.as_u128().to_le_bytes().to_vec())
        }
        fn unexport(&self, id: ShardId) -> PluginResult<()> {
            self.shards.lock().unwrap().retain(|(i, _)| *i != id);
            Ok(())
        }
        fn import_into(
            &self,
            desc: &[u8],
            _m: &ShardMeta,
            dst: &mut [u8],
        ) -> PluginResult<ImportInfo> {
            let mut r = crate::Reader::new("mem descriptor", desc);
            let id = ShardId::from_u128(r.u128("id")?);
            r.end("id")?;
            let shards = self.shards.lock().unwrap();
            let (_, b) = shards
                .iter()
                .find(|(i, _)| *i == id)
                .ok_or_else(|| AbiError::not_found(format!("shard {id}")))?;
            if b.len() == 1 && b[0] == b'!' {
                panic!("told to in import");
            }
            dst.copy_from_slice(b);
            Ok(ImportInfo::default())
        }
        fn stats(&self) -> Vec<Stat> {
            vec![Stat::gauge(
                "shards",
                self.shards.lock().unwrap().len() as u64,
            )]
        }
        fn health(&self) -> Health {
            panic!("health told to panic")
        }
    }

    #[test]
    fn methods_run_guarded_with_defaults() {
        let t = into_transport_box(Mem {
            ctx: PluginContext::new(testing::context("mem", "")),
            shards: Mutex::default(),
        });
        let lend = |id: u128, b: &'static [u8]| ExportRequest {
            id: ShardId::from_u128(id),
            meta: ShardMeta::bytes(b.len() as u64),
            data: SharedBytes::lend(b),
            allocation: 0,
        };
        let d1 = t.export(lend(1, b"abc")).unwrap();
        let d2 = t.export(lend(2, b"!")).unwrap();
        let e = t.export(lend(3, b"panic")).into_result().unwrap_err();
        assert_eq!(e.kind, ErrorKind::PANIC);
        assert_eq!(
            e.message.as_str(),
            "plugin `mem` panicked in export: told to"
        );
        assert!(!t.health().ok, "a panicking health is not ok");
        assert_eq!(t.stats().len(), 1);
        for (e, kind) in [
            (
                t.import_view(RSlice::from_slice(&d1), &ShardMeta::bytes(3))
                    .map(|_| ()),
                ErrorKind::UNSUPPORTED,
            ),
            (t.release(1), ErrorKind::UNSUPPORTED),
            (
                t.allocate(ShardId::from_u128(1), 1).map(|_| ()),
                ErrorKind::UNSUPPORTED,
            ),
            (t.free_allocation(1), ErrorKind::UNSUPPORTED),
            (t.sweep().map(|_| ()), ErrorKind::UNSUPPORTED),
        ] {
            let e = e.into_result().unwrap_err();
            assert_eq!(e.kind, kind, "{e}");
        }
        assert!(t
            .can_import(RSlice::from_slice(&d1), &ShardMeta::bytes(3))
            .is_ok());
        // The default batch runs each item under its own guard.
        let (mut a, mut b) = ([0u8; 3], [0u8; 1]);
        let (m1, m2) = (ShardMeta::bytes(3), ShardMeta::bytes(1));
        let mut items = [
            ImportItem {
                desc: RSlice::from_slice(&d1),
                meta: &m1,
                dst: RSliceMut::from_mut_slice(&mut a),
            },
            ImportItem {
                desc: RSlice::from_slice(&d2),
                meta: &m2,
                dst: RSliceMut::from_mut_slice(&mut b),
            },
        ];
        let r = t.import_many(RSliceMut::from_mut_slice(&mut items));
        assert!(r[0].is_ok());
        assert_eq!(r[1].as_ref().unwrap_err().kind, ErrorKind::PANIC);
        assert_eq!(&a, b"abc");
        assert_eq!(t.describe().name.as_str(), "mem");
    }
}
