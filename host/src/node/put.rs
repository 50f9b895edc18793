//! put: storage and exports of the shards this node owns (their checksums
//! are computed by `checksum`).
//!
//! Host shards (`put`, `put_with`) and device shards (`put_device`, in
//! [`super::device`]) share the steps here: a fresh id, the size and tag
//! bounds, one export per transport with its descriptor checked against
//! what a handle can carry, and keeping the shard once its handle is valid.

use std::{collections::BTreeMap, sync::Arc};

use shardport_abi::{
    AbiError, AllocationGuard, Capabilities, Checksum, Device, ErrorKind, ExportRequest, ROption,
    ShardId, ShardMeta, SharedBytes,
};

use super::{
    checksum::{checksum, copy_and_checksum},
    lock, zeroed, Generation, Node, OwnedShard, Stored, TensorSpec,
};
use crate::{
    error::HostError,
    handle::{Export, Handle},
    loader::LoadedPlugin,
    vocab::{ChecksumPolicy, TransportName, MAX_DESCRIPTOR, MAX_TAGS, MAX_TAG_LEN},
};

/// A node pinned to one config generation ([`Node::pinned`]); may be
/// shared by threads.
pub struct Pinned<'a> {
    node: &'a Node,
    g: Arc<Generation>,
}

impl Pinned<'_> {
    /// [`Node::put_with`] under the pinned generation.
    pub fn put_with(
        &self,
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Handle, HostError> {
        self.node
            .put_inner(&self.g, spec.meta()?, tags, |dst, policy| {
                fill(dst);
                checksum(policy, dst)
            })
    }

    /// The number of the pinned generation (as [`Node::generation`]).
    pub fn generation(&self) -> u64 {
        self.g.number
    }
}

/// What the exports of one put produced.
pub(super) struct Exported {
    /// One per transport that exported the shard, in export order.
    pub exports: Vec<Export>,
    /// Plugin instances that exported it (the order `remove` unexports in).
    pub exported_by: Vec<Arc<LoadedPlugin>>,
    /// `(transport, error)` per transport that refused.
    pub failures: Vec<(TransportName, AbiError)>,
}

impl Node {
    /// Puts a shard by copying `bytes` once into its storage.
    pub fn put(
        &self,
        bytes: &[u8],
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
    ) -> Result<Handle, HostError> {
        let meta = meta_of(bytes, spec)?;
        self.put_inner(&self.inner.live(), meta, tags, |dst, policy| {
            copy_and_checksum(bytes, dst, policy)
        })
    }

    /// Puts many shards in one call under one config generation: one
    /// result per item, in order (a failed item does not stop the others).
    /// Each item is copied once, its checksum computed in the same pass.
    pub fn put_many(
        &self,
        items: &[(&[u8], TensorSpec, BTreeMap<String, String>)],
    ) -> Vec<Result<Handle, HostError>> {
        let g = self.inner.live();
        items
            .iter()
            .map(|(bytes, spec, tags)| {
                let meta = meta_of(bytes, spec)?;
                self.put_inner(&g, meta, tags.clone(), |dst, policy| {
                    copy_and_checksum(bytes, dst, policy)
                })
            })
            .collect()
    }

    /// Puts a shard whose bytes `fill` writes straight into storage (the
    /// transport's pool under `storage = "pool"`: written once, no copy).
    pub fn put_with(
        &self,
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Handle, HostError> {
        self.pinned().put_with(spec, tags, fill)
    }

    /// The node under its config generation of now: puts through the
    /// result use that config and those transport instances, even if a
    /// reload applies meanwhile (what a batch of puts that belong together,
    /// such as the buckets of one weights version, needs).
    pub fn pinned(&self) -> Pinned<'_> {
        Pinned {
            node: self,
            g: self.inner.live(),
        }
    }

    /// The put steps for a shard described by `meta` (from its spec);
    /// `fill` writes the bytes and returns their checksum under the policy
    /// it is given.
    fn put_inner(
        &self,
        g: &Generation,
        mut meta: ShardMeta,
        tags: BTreeMap<String, String>,
        fill: impl FnOnce(&mut [u8], ChecksumPolicy) -> ROption<Checksum>,
    ) -> Result<Handle, HostError> {
        if meta.device != Device::CPU {
            return Err(HostError::InvalidShard(format!(
                "put of {} memory is not supported by this host; put CPU bytes",
                meta.device
            )));
        }
        check_tags(&tags)?;
        let id = self.next_id();
        let _span =
            tracing::debug_span!(target: "store", "put", shard = %id, bytes = meta.byte_len)
                .entered();
        check_put_size(g, meta.byte_len)?;

        // 1. Storage: the pool transport's allocator, or the heap; the
        // bytes and their checksum in one pass.
        let mut stored = allocate(g, id, meta.byte_len)?;
        let policy = g.config.put.checksum;
        meta.checksum = match &mut stored {
            Stored::Heap(b) => fill(b, policy),
            Stored::Pool(a) => fill(a.as_mut_slice(), policy),
        };

        // 2. Exports: the storage transport first (it exports in place), then
        // every other selected transport lending the stored bytes.
        let mut done = export_stored(g, id, &meta, &mut stored);
        if done.exports.is_empty() {
            // Nothing to undo: the storage transport exports first and a
            // failure there stops the loop; the allocation guard frees its space.
            return Err(HostError::NoExport {
                id,
                failures: done.failures,
            });
        }
        // Storage transport unexports last (its memory backs the others).
        done.exported_by
            .rotate_left(usize::from(g.storage_plugin.is_some()));
        self.keep(id, meta, tags, done, stored)
    }

    /// A fresh shard id: this node's prefix and the next sequence number.
    pub(super) fn next_id(&self) -> ShardId {
        ShardId {
            hi: self.inner.id_prefix,
            lo: self
                .inner
                .next_id
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Keeps an exported shard and returns its handle, or withdraws every
    /// export when the handle would not be valid.
    pub(super) fn keep(
        &self,
        id: ShardId,
        meta: ShardMeta,
        tags: BTreeMap<String, String>,
        done: Exported,
        stored: Stored,
    ) -> Result<Handle, HostError> {
        let handle = Handle {
            id,
            meta,
            tags,
            owner: self.owner(),
            exports: done.exports,
        };
        let panicked = done
            .failures
            .into_iter()
            .find(|(_, e)| e.kind == ErrorKind::PANIC);
        let shard = OwnedShard {
            handle: handle.clone(),
            stored,
            exported_by: done.exported_by,
        };
        if let Some((transport, error)) = panicked {
            // A contained panic still fails the put: the other exports are
            // withdrawn and the storage freed, as if the put never happened.
            self.inner.unexport_all(id, shard);
            return Err(HostError::ExportPanicked {
                id,
                transport,
                error,
            });
        }
        if let Err(why) = handle.validate() {
            self.inner.unexport_all(id, shard);
            return Err(HostError::InvalidShard(format!(
                "the handle would be invalid: {why}"
            )));
        }
        lock(&self.inner.shards).insert(id, shard);
        Ok(handle)
    }
}

/// Refuses a shard over `node.max-shard-size`.
pub(super) fn check_put_size(g: &Generation, byte_len: u64) -> Result<(), HostError> {
    let max = g.config.node.max_shard_size;
    if byte_len > max {
        return Err(HostError::InvalidShard(format!(
            "{byte_len} bytes exceeds node.max-shard-size = {max}"
        )));
    }
    Ok(())
}

/// True when `put.export-to` selects `p` (no list: every transport).
pub(super) fn exports_to(g: &Generation, p: &LoadedPlugin) -> bool {
    match &g.config.put.export_to {
        Some(list) => list.contains(&p.name),
        None => true,
    }
}

/// Space for `len` bytes: in the storage transport's pool, or the heap.
fn allocate(g: &Generation, id: ShardId, len: u64) -> Result<Stored, HostError> {
    let Some(pi) = g.storage_plugin else {
        return Ok(Stored::Heap(zeroed(len)?.into_boxed_slice()));
    };
    let p = &g.plugins[pi];
    AllocationGuard::allocate(&p.transport, id, len)
        .map(Stored::Pool)
        .map_err(|error| HostError::Storage {
            transport: p.name.clone(),
            error,
        })
}

/// Exports stored CPU bytes: the storage transport first, then every
/// other selected transport with the `cpu` capability. A refusal by the
/// storage transport stops there (nothing else may lend its memory).
fn export_stored(g: &Generation, id: ShardId, meta: &ShardMeta, stored: &mut Stored) -> Exported {
    let storage_plugin = g.storage_plugin;
    // CPU bytes go only to transports that move CPU shards (not cuda-ipc).
    let others = (0..g.plugins.len()).filter(|&pi| {
        let p = &g.plugins[pi];
        Some(pi) != storage_plugin
            && exports_to(g, p)
            && p.capabilities().contains(Capabilities::CPU)
    });
    let mut done = Exported {
        exports: Vec::with_capacity(g.plugins.len()),
        exported_by: Vec::with_capacity(g.plugins.len()),
        failures: Vec::new(),
    };
    for pi in storage_plugin.into_iter().chain(others) {
        let allocation = match (&mut *stored, Some(pi) == storage_plugin) {
            (Stored::Pool(g), true) => g.token(),
            _ => 0,
        };
        let req = ExportRequest {
            id,
            meta: meta.clone(),
            data: SharedBytes::lend(stored.bytes()),
            allocation,
        };
        let ok = done.export(&g.plugins[pi], id, req, "export failed");
        if ok && allocation != 0 {
            if let Stored::Pool(g) = stored {
                g.mark_exported();
            }
        }
        if !ok && allocation != 0 {
            // The bytes live in this transport's allocation and it
            // refused to export them: nothing else may lend them.
            break;
        }
    }
    done
}

impl Exported {
    /// Asks plugin `p` to export `req`; records the export or the failure
    /// (logged as `what`). A descriptor a handle cannot carry is withdrawn
    /// and counts as a failure. Returns whether it exported.
    pub(super) fn export(
        &mut self,
        p: &Arc<LoadedPlugin>,
        id: ShardId,
        req: ExportRequest,
        what: &str,
    ) -> bool {
        let exported = p.transport.export(req).into_result().and_then(|desc| {
            if desc.is_empty() || desc.len() > MAX_DESCRIPTOR {
                // Unusable in a handle: withdraw it and count a failed export.
                let _ = p.transport.unexport(id);
                Err(AbiError::internal(format!(
                    "descriptor of {} bytes (handles carry 1..={MAX_DESCRIPTOR})",
                    desc.len()
                )))
            } else {
                Ok(desc)
            }
        });
        match exported {
            Ok(desc) => {
                self.exports.push(Export {
                    transport: p.name.clone(),
                    descriptor: desc.into_vec(),
                });
                self.exported_by.push(Arc::clone(p));
                true
            }
            Err(e) => {
                tracing::warn!(target: "store", transport = %p.name, error = %e, "{what}");
                self.failures.push((p.name.clone(), e));
                false
            }
        }
    }
}

/// The metadata `spec` describes, once `bytes` is found to have the length
/// its dtype and shape imply.
fn meta_of(bytes: &[u8], spec: &TensorSpec) -> Result<ShardMeta, HostError> {
    let meta = spec.meta()?;
    if meta.byte_len != bytes.len() as u64 {
        return Err(HostError::InvalidShard(format!(
            "{} bytes given, dtype {} with shape {:?} needs {}",
            bytes.len(),
            spec.dtype,
            spec.shape,
            meta.byte_len
        )));
    }
    Ok(meta)
}

/// Bounds on a put's tags (shared by `put_with` and `put_device`).
pub(super) fn check_tags(tags: &BTreeMap<String, String>) -> Result<(), HostError> {
    if tags.len() > MAX_TAGS
        || tags
            .iter()
            .any(|(k, v)| k.is_empty() || k.len() > MAX_TAG_LEN || v.len() > MAX_TAG_LEN)
    {
        return Err(HostError::InvalidShard(format!(
            "at most {MAX_TAGS} tags, keys non-empty, keys and values at most {MAX_TAG_LEN} bytes"
        )));
    }
    Ok(())
}
