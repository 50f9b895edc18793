//! # shardport-posix-shm: the POSIX shared-memory transport
//!
//! An *implementation crate* of shardport's plugin system: a transport that
//! moves CPU shards between processes on the same machine through
//! `/dev/shm`, without copying on the owner side and, for views, without
//! copying at all. It is built as a `cdylib` the host loads by config (and as
//! an `rlib` so its tests run in-process).
//!
//! ```toml
//! [[plugin]]
//! name = "shm"
//! path = "libshardport_posix_shm.so"
//! [plugin.config]
//! allocation = "pool"      # or "segment-per-shard"
//! pool-size = "4GiB"
//! on-full = "spill"        # or "error"
//! create-pool = "lazy"     # on the first put (default), or "eager"
//! ```
//!
//! The owner writes shards straight into a pool segment (`allocate`) or has
//! them copied there (`export`); the descriptor names the segment, the lease
//! board and the shard's place. A consumer validates every descriptor field,
//! takes a lease through the board, and copies (`import_into`) or maps
//! (`import_view`). Leased bytes are never reclaimed or overwritten.
//!
//! Crash safety: segment names and lease slots record the process that made
//! them, so the leases of consumers that died are reclaimed by their owner,
//! the segments of owners that died are swept (`Transport::sweep`, and at
//! construction), and a consumer refuses shards of a dead owner. Death is
//! always proved, never guessed (`liveness`).
//!
//! ## Where to start reading
//! `owner` (allocation and reclaim), `consumer` (validation and leases),
//! `board` (the cross-process lease protocol), `liveness` (when a process is
//! provably dead), `sweep` (the dead-owner sweep), `descriptor` (the wire
//! format), `alloc` (the bump allocator), and `sys`, the only module with
//! `unsafe`. The README has the operator's view: config keys, failure modes.

#![deny(unsafe_code)]

mod alloc;
mod board;
mod config;
mod consumer;
mod descriptor;
mod errors;
/// Entry points for the fuzz targets in `fuzz/` (not a stable API).
#[doc(hidden)]
pub mod fuzzing;
mod liveness;
mod names;
mod owner;
mod stats;
mod sweep;
#[allow(unsafe_code)]
mod sys;

#[cfg(test)]
mod crash_tests;
#[cfg(test)]
mod tests;

use shardport_abi::{
    AbiError, Allocation, Capabilities, ExportRequest, Health, IdentityParts, ImportInfo,
    ImportItem, PluginContext, PluginResult, Region, ShardId, ShardMeta, Stat, TransportBox,
    TransportInfo,
};
use shardport_kit::{self as kit, IoContext, PlainTransport, StatList};

use crate::{
    config::Config, consumer::Consumer, liveness::Here, owner::Owner, stats::Counters, sweep::Swept,
};

/// The transport's name, the key its descriptors are filed under.
pub const TRANSPORT_NAME: &str = "posix-shm";

/// Locks a mutex, recovering from poisoning: every critical section leaves
/// the books consistent before anything in it can panic (a panic is a bug
/// caught by the guard; the next call still sees valid state).
pub(crate) use shardport_kit::lock;

/// One posix-shm transport instance: an owner side and a consumer side.
struct ShmTransport {
    ctx: PluginContext,
    owner: Owner,
    consumer: Consumer,
    counters: Counters,
    /// The configured `segment-prefix`: the only names the sweep considers.
    prefix: String,
    here: Here,
}

impl std::fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmTransport")
            .field("instance", &self.ctx.instance())
            .finish_non_exhaustive()
    }
}

/// Builds a transport instance from the host context: parses and validates
/// the config table (unknown keys are errors) and sweeps dead owners'
/// segments (`sweep-on-start`). The pool is created on the first put (or
/// here with `create-pool = "eager"`), so a process that only fetches
/// creates no segment. This is the constructor the plugin exports.
pub fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
    create_as(ctx, Here::current())
}

/// [`create`] for the process identity `here` (tests fabricate one to play a
/// process whose pid was reused).
pub(crate) fn create_as(ctx: PluginContext, here: Here) -> PluginResult<TransportBox> {
    let cfg = Config::parse(ctx.instance(), ctx.config())?;
    names::validate_node_tag(ctx.node_tag()).map_err(|why| {
        AbiError::internal(format!(
            "the host passed an unusable node tag for segment names: {why}"
        ))
    })?;
    check_tag_names_us(ctx.node_tag(), &here)?;
    let counters = Counters::default();
    if cfg.sweep_on_start {
        // Before our own pool is created, so the space it frees is there for it.
        match sweep_segments(&cfg.segment_prefix, &here, &counters) {
            Ok(s) if s.segments > 0 => tracing::info!(
                target: "posix_shm",
                segments = s.segments,
                bytes = s.bytes,
                "start-up sweep removed segments of dead owners"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                target: "posix_shm",
                error = %e,
                "start-up sweep skipped: cannot list {}",
                sweep::SHM_DIR
            ),
        }
    }
    let prefix = cfg.segment_prefix.clone();
    let consumer = Consumer::new(&prefix, here, cfg.owner_check_interval);
    let owner = Owner::new(cfg, ctx.node_tag(), here);
    Ok(kit::into_transport_box(ShmTransport {
        ctx,
        owner,
        consumer,
        counters,
        prefix,
        here,
    }))
}

/// Refuses a node tag of the host's shape that names another process: our
/// segments would carry it, and be swept as orphans once that process is
/// gone. A tag of another shape names nobody (its segments are never swept).
fn check_tag_names_us(tag: &str, here: &Here) -> PluginResult<()> {
    let Some((pid, start)) = names::parse_node_tag(tag) else {
        return Ok(());
    };
    let me = here.process;
    let known = start != 0 && me.start_ticks != 0;
    if pid == me.pid && (!known || start == me.start_ticks) {
        return Ok(());
    }
    Err(AbiError::internal(format!(
        "the host's node tag {tag} names process {pid} (started at tick {start}), but this is \
         process {} (started at tick {}): segments named by it would be swept as orphans \
         once that process exits",
        me.pid, me.start_ticks
    )))
}

/// Sweeps dead owners' segments with `prefix` into `counters`.
fn sweep_segments(prefix: &str, here: &Here, counters: &Counters) -> std::io::Result<Swept> {
    let s = sweep::sweep_dead_owners(prefix, here)?;
    counters.segments_swept.add(s.segments);
    counters.bytes_swept.add(s.bytes);
    Ok(s)
}

/// Plain types; `kit::Guarded` runs each method under the context's guard.
impl PlainTransport for ShmTransport {
    const NAME: &'static str = TRANSPORT_NAME;

    fn context(&self) -> &PluginContext {
        &self.ctx
    }

    fn describe(&self) -> TransportInfo {
        TransportInfo {
            name: TRANSPORT_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Capabilities::CPU
                .with(Capabilities::SAME_NODE_ONLY)
                .with(Capabilities::ZERO_COPY)
                .with(Capabilities::ALLOCATOR),
            needs_identity: IdentityParts::BOOT_ID.with(IdentityParts::SHM_DEVICE),
        }
    }

    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        self.owner.export(req, &self.counters)
    }

    fn unexport(&self, id: ShardId) -> PluginResult<()> {
        self.owner.unexport(id, &self.counters)
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        self.consumer.import_into(desc, meta, dst, &self.counters)
    }

    /// A handle is bound to its owner's segments: names of another owner
    /// are refused before anything is opened.
    fn can_import_from(
        &self,
        desc: &[u8],
        _meta: &ShardMeta,
        owner: &shardport_abi::OwnerClaim<'_>,
    ) -> PluginResult<()> {
        self.consumer.check_claim(desc, owner)
    }

    fn import_many(&self, items: &mut [ImportItem<'_>]) -> Vec<PluginResult<ImportInfo>> {
        self.consumer.import_many(items, &self.counters)
    }

    fn import_view(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        self.consumer.import_view(desc, meta, &self.counters)
    }

    fn import_view_private(&self, desc: &[u8], meta: &ShardMeta) -> PluginResult<Region> {
        self.consumer
            .import_view_private(desc, meta, &self.counters)
    }

    fn release(&self, token: u64) -> PluginResult<()> {
        self.consumer.release(token)
    }

    fn allocate(&self, id: ShardId, len: u64) -> PluginResult<Allocation> {
        self.owner.allocate(id, len, &self.counters)
    }

    fn free_allocation(&self, token: u64) -> PluginResult<()> {
        self.owner.free_allocation(token, &self.counters)
    }

    fn stats(&self) -> Vec<Stat> {
        let o = self.owner.stats(&self.counters);
        let c = self.consumer.stats();
        let k = &self.counters;
        StatList::new()
            .gauge_value("pool_bytes_total", o.pool_bytes_total)
            .gauge_value("pool_bytes_used", o.pool_bytes_used)
            .gauge_value("pool_largest_free_bytes", o.pool_largest_free)
            .gauge_value("shards_live", o.shards_live)
            .gauge_value("shards_retired_leased", o.shards_retired_leased)
            .gauge_value("allocations_pending", o.allocations_pending)
            .gauge_value("leases_held_on_owner", o.leases_held_on_owner)
            .counter("leases_granted", &k.leases_granted)
            .gauge_value("leases_active", c.leases_active)
            .gauge_value("segments_owned", o.segments_owned)
            .gauge_value("segments_mapped", c.segments_mapped)
            .counter("bytes_exported", &k.bytes_exported)
            .counter("imports_copy", &k.imports_copy)
            .counter("imports_view", &k.imports_view)
            .counter("imports_view_private", &k.imports_view_private)
            .counter("spills", &k.spills)
            .counter("leases_reclaimed", &k.leases_reclaimed)
            .counter("segments_swept", &k.segments_swept)
            .counter("bytes_swept", &k.bytes_swept)
            .finish()
    }

    fn health(&self) -> Health {
        match self.owner.pool_error() {
            Some(e) => kit::guard::failing(format!(
                "pool unavailable (imports still work): {}",
                e.message
            )),
            None if self.owner.pool_pending() => kit::guard::ok(format!(
                "ok, segments {}* (no pool yet: created on the first put)",
                self.owner.name_base()
            )),
            None => kit::guard::ok(format!("ok, segments {}*", self.owner.name_base())),
        }
    }

    /// Reclaims the lease slots of dead consumers on this owner's board (and
    /// the pool space they kept), drops cached mappings of dead owners'
    /// pools, and unlinks the segments of dead owners with our prefix.
    /// Returns what this call reclaimed; `stats` reports running totals
    /// under the same names.
    fn sweep(&self) -> PluginResult<Vec<Stat>> {
        let leases = self.owner.sweep_leases(&self.counters);
        self.consumer.sweep();
        let swept = sweep_segments(&self.prefix, &self.here, &self.counters)
            .context(format_args!("cannot list {}", sweep::SHM_DIR))?;
        Ok(StatList::new()
            .counter_value("segments_swept", swept.segments)
            .counter_value("bytes_swept", swept.bytes)
            .counter_value("leases_reclaimed", leases)
            .finish())
    }
}

#[allow(unsafe_code)] // the macro emits the library header static and `export_name`
mod plugin_export {
    shardport_abi::export_plugin! {
        name: super::TRANSPORT_NAME,
        version: env!("CARGO_PKG_VERSION"),
        new: super::create,
    }
}
