//! A node: the owner store and the consumer fetch path of one host instance.
//!
//! There are no process globals: several nodes in one process each have their
//! own plugin instances, store, cache, identity tag and metrics.
//!
//! # Locking
//! `shards` (owned shards) and `cache` (fetched shards) are separate mutexes,
//! never held together, and never held across a plugin call except for
//! `remove`, which takes the entry out of the map first and unexports after.
//!
//! # Failure modes
//! A plugin that fails to load is reported and skipped unless `required`. A
//! transport that fails an export is skipped (the handle lists fewer exports);
//! a transport that fails an import is followed by the next candidate, and the
//! fetch reports the downgrade.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use serde::Serialize;
use shardport_abi::{
    AbiError, AllocationGuard, Capabilities, Checksum, ChecksumAlgo, DType, Device, ErrorKind,
    ExportRequest, ImportItem, LeasedView, ROption, RResult, RSlice, RSliceMut, RVec, ShardId,
    ShardMeta, SharedBytes, StatKind,
};

use crate::{
    cache::{Cache, CacheStats},
    config::{ChecksumPolicy, Config, FetchMode, OnDowngrade, Storage, TransportName},
    error::HostError,
    experiment::ExperimentState,
    handle::{Export, Handle, Owner},
    identity::{new_node_tag, NodeIdentity},
    loader::{load_all, LoadError, LoadedPlugin, NodeContext},
    locality::Locality,
    metrics::{ArmInfo, ExperimentInfo, Metrics},
    select::{Attempt, Plan, PluginFacts},
    services::{Clock, SystemClock},
    snapshot::{Gauge, Snapshot},
};

mod device;
pub use device::{DevicePtr, DeviceView};

/// Shape, dtype and device of a shard being put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<u64>,
    /// Device of the bytes.
    pub device: Device,
}

impl TensorSpec {
    /// A 1-D `u8` CPU tensor of `len` bytes.
    pub fn bytes(len: u64) -> Self {
        TensorSpec {
            dtype: DType::U8,
            shape: vec![len],
            device: Device::CPU,
        }
    }

    fn meta(&self) -> Result<ShardMeta, HostError> {
        let mut meta = ShardMeta {
            dtype: self.dtype,
            shape: RVec::from(self.shape.clone()),
            device: self.device,
            byte_len: 0,
            checksum: ROption::RNone,
        };
        meta.byte_len = meta.implied_byte_len().ok_or_else(|| {
            HostError::InvalidShard(format!(
                "dtype {} with shape {:?} has no byte length",
                self.dtype, self.shape
            ))
        })?;
        Ok(meta)
    }
}

enum Stored {
    Heap(Box<[u8]>),
    Pool(AllocationGuard),
}

impl Stored {
    fn bytes(&self) -> &[u8] {
        match self {
            Stored::Heap(b) => b,
            Stored::Pool(g) => g.as_slice(),
        }
    }
}

struct OwnedShard {
    handle: Handle,
    stored: Stored,
    /// Plugin indices that exported it; the storage transport (if any) is last.
    exported_by: Vec<usize>,
}

pub use crate::vocab::ShardBytes;

/// Which transport served a fetch and why. Every fetch carries one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// Transport that delivered the bytes (`cache` for a cache hit).
    pub transport: String,
    /// Why it was chosen.
    pub reason: String,
    /// A faster candidate failed or was unavailable, or a view was requested
    /// and a copy was served.
    pub downgraded: bool,
    /// Mode actually served.
    pub mode: FetchMode,
    /// `(transport, error)` of candidates that failed first.
    pub failures: Vec<(String, String)>,
}

/// A fetched shard.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Shard id.
    pub id: ShardId,
    /// Metadata from the handle.
    pub meta: ShardMeta,
    /// The bytes (shared with the consumer cache when it keeps them).
    pub data: Arc<ShardBytes>,
    /// Which transport and why.
    pub selection: Selection,
    /// Time from the call to readable bytes (checksum verification included).
    pub elapsed: Duration,
}

/// One plugin in [`NodeStats`].
#[derive(Debug, Clone, Serialize)]
pub struct PluginStats {
    /// Transport name.
    pub name: String,
    /// Library path.
    pub path: String,
    /// Plugin version.
    pub version: String,
    /// ABI version it was built against.
    pub abi_version: String,
    /// Capability names.
    pub capabilities: Vec<&'static str>,
    /// Health line.
    pub healthy: bool,
    /// Health message.
    pub health: String,
    /// The plugin's own counters and gauges.
    pub stats: BTreeMap<String, u64>,
}

/// A snapshot of a node's state.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStats {
    /// Node name.
    pub node: String,
    /// Node tag.
    pub tag: String,
    /// Shards owned.
    pub shards_owned: usize,
    /// Bytes owned.
    pub bytes_owned: u64,
    /// Consumer cache entries.
    pub cache_entries: usize,
    /// Consumer cache bytes.
    pub cache_bytes: u64,
    /// Consumer cache details (oldest age, held entries, evictions, hits).
    pub cache: CacheStats,
    /// Loaded plugins.
    pub plugins: Vec<PluginStats>,
    /// Plugins that failed to load (one line each).
    pub load_failures: Vec<String>,
    /// Per-transport fetch metrics.
    pub transports: BTreeMap<String, crate::metrics::TransportSnapshot>,
    /// Downgrades.
    pub downgrades: u64,
    /// Fetches no loaded transport could serve.
    pub no_candidate: u64,
    /// Owned bytes leaked because a transport failed to unexport them.
    pub leaked_bytes: u64,
}

struct Inner {
    config: Config,
    /// Plugin index whose allocator holds owned bytes (`storage = "pool"`).
    storage_plugin: Option<usize>,
    tag: String,
    identity: NodeIdentity,
    locality: Locality,
    epoch: u64,
    plugins: Vec<LoadedPlugin>,
    facts: Vec<PluginFacts>,
    load_failures: Vec<String>,
    id_prefix: u64,
    next_id: AtomicU64,
    shards: Mutex<HashMap<ShardId, OwnedShard>>,
    cache: Mutex<Cache>,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    /// Live state per `config.experiments` entry.
    experiments: Vec<ExperimentState>,
    /// Fetches planned so far (per-fetch experiment draws).
    fetch_seq: AtomicU64,
    /// Monotonic clock reading at start.
    started_ns: u64,
}

/// A running host node. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.inner.config.node.name)
            .field("tag", &self.inner.tag)
            .field("plugins", &self.inner.facts)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave these maps half-updated
    // (every update is a single insert/remove), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one transport's sweep reclaimed (counter name -> value), or why it failed.
pub type SweepResult = Result<BTreeMap<String, u64>, String>;

/// A non-owning reference to a [`Node`] (for servers that must not keep a
/// node alive after its owner shut it down).
#[derive(Clone, Debug)]
pub struct WeakNode(std::sync::Weak<Inner>);

impl WeakNode {
    /// The node, unless it has been dropped.
    pub fn upgrade(&self) -> Option<Node> {
        self.0.upgrade().map(|inner| Node { inner })
    }
}

impl Node {
    /// A reference that does not keep the node alive.
    pub fn downgrade(&self) -> WeakNode {
        WeakNode(Arc::downgrade(&self.inner))
    }

    /// Removes every shard, waits up to `grace` for other holders of this
    /// node (in-flight control requests) to let go, then drops it, which
    /// unloads nothing but drops every transport instance (their segments,
    /// servers and runtimes go with them). Returns false when other holders
    /// were still alive after `grace` (the node then lives until they end).
    pub fn shutdown(self, grace: Duration) -> bool {
        self.clear();
        let deadline = Instant::now() + grace;
        while Arc::strong_count(&self.inner) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let alone = Arc::strong_count(&self.inner) == 1;
        drop(self);
        alone
    }

    /// Starts a node: loads the configured plugins (all failures collected;
    /// fails only when a `required` plugin did not load).
    pub fn start(config: Config) -> Result<Node, HostError> {
        Self::start_with_clock(config, Arc::new(SystemClock::default()))
    }

    /// Like [`start`](Self::start) with an injected clock.
    pub fn start_with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Node, HostError> {
        for w in &config.warnings {
            tracing::warn!(target: "config", "{w}");
        }
        let tag = new_node_tag();
        let ctx = NodeContext {
            node_name: config.node.name.clone(),
            node_tag: tag.clone(),
            clock: Arc::clone(&clock),
        };
        let report = load_all(&config.plugins, &ctx);
        let (required, optional): (Vec<_>, Vec<_>) =
            report.failures.into_iter().partition(|(_, req)| *req);
        if !required.is_empty() {
            let mut errs: Vec<LoadError> = required.into_iter().map(|(e, _)| e).collect();
            errs.extend(optional.into_iter().map(|(e, _)| e));
            return Err(HostError::RequiredPlugins(errs));
        }
        let load_failures = optional.iter().map(|(e, _)| e.to_string()).collect();
        let facts = report
            .loaded
            .iter()
            .map(|p| PluginFacts {
                name: p.name.clone(),
                capabilities: p.capabilities(),
                needs_identity: p.needs_identity(),
            })
            .collect();
        let mut rnd = [0u8; 8];
        let _ = getrandom::fill(&mut rnd);
        let epoch = clock.now_unix_nanos();
        let arm_counts: Vec<usize> = config.experiments.iter().map(|e| e.arms.len()).collect();
        let metrics = Metrics::new(
            report.loaded.iter().map(|p| p.name.to_string()),
            &arm_counts,
        );
        let experiments = config
            .experiments
            .iter()
            .map(ExperimentState::new)
            .collect();
        let storage_plugin = match &config.put.storage {
            Storage::Heap => None,
            Storage::Pool(t) => {
                let found = report.loaded.iter().position(|p| {
                    &p.name == t && p.capabilities().contains(Capabilities::ALLOCATOR)
                });
                if found.is_none() {
                    tracing::warn!(target: "store", transport = %t, "put.pool-transport is not loaded or has no allocator; shards will be stored on the heap");
                }
                found
            }
        };
        tracing::info!(target: "node", node = %config.node.name, tag = %tag, plugins = report.loaded.len(), "node started");
        Ok(Node {
            inner: Arc::new(Inner {
                storage_plugin,
                tag,
                identity: NodeIdentity::current(),
                locality: Locality::new(),
                epoch,
                facts,
                load_failures,
                plugins: report.loaded,
                id_prefix: u64::from_le_bytes(rnd) ^ epoch,
                next_id: AtomicU64::new(1),
                shards: Mutex::default(),
                cache: Mutex::new(Cache::new(config.cache)),
                started_ns: clock.monotonic_nanos(),
                clock: Arc::clone(&clock),
                metrics,
                experiments,
                fetch_seq: AtomicU64::new(0),
                config,
            }),
        })
    }

    /// This node as the owner written into its handles.
    fn owner(&self) -> Owner {
        Owner {
            addr: self.inner.config.node.advertise.clone(),
            identity: self.inner.identity.clone(),
            epoch: self.inner.epoch,
        }
    }

    /// The node's config.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The node's unique tag.
    pub fn tag(&self) -> &str {
        &self.inner.tag
    }

    /// The node's locality identity.
    pub fn identity(&self) -> &NodeIdentity {
        &self.inner.identity
    }

    /// Loaded plugins.
    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.inner.plugins
    }

    /// One line per plugin that failed to load (optional plugins only; a
    /// required one stops the node).
    pub fn load_failures(&self) -> &[String] {
        &self.inner.load_failures
    }

    /// Puts a shard by copying `bytes` once into its storage.
    pub fn put(
        &self,
        bytes: &[u8],
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
    ) -> Result<Handle, HostError> {
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
        self.put_with(spec, tags, |dst| dst.copy_from_slice(bytes))
    }

    /// Puts a shard whose bytes `fill` writes straight into storage (the
    /// transport's pool under `storage = "pool"`: written once, no copy).
    pub fn put_with(
        &self,
        spec: &TensorSpec,
        tags: BTreeMap<String, String>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Handle, HostError> {
        let mut meta = spec.meta()?;
        if meta.device != Device::CPU {
            return Err(HostError::InvalidShard(format!(
                "put of {} memory is not supported by this host; put CPU bytes",
                meta.device
            )));
        }
        device::check_tags(&tags)?;
        let id = ShardId {
            hi: self.inner.id_prefix,
            lo: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
        };
        let _span =
            tracing::debug_span!(target: "store", "put", shard = %id, bytes = meta.byte_len)
                .entered();

        if meta.byte_len > self.inner.config.node.max_shard_size {
            return Err(HostError::InvalidShard(format!(
                "{} bytes exceeds node.max-shard-size = {}",
                meta.byte_len, self.inner.config.node.max_shard_size
            )));
        }

        // 1. Storage: the pool transport's allocator, or the heap.
        let storage_plugin = self.inner.storage_plugin;
        let mut stored = match storage_plugin {
            Some(pi) => {
                let p = &self.inner.plugins[pi];
                Stored::Pool(
                    AllocationGuard::allocate(&p.transport, id, meta.byte_len).map_err(
                        |error| HostError::Storage {
                            transport: p.name.clone(),
                            error,
                        },
                    )?,
                )
            }
            None => Stored::Heap(zeroed(meta.byte_len)?.into_boxed_slice()),
        };
        match &mut stored {
            Stored::Heap(b) => fill(b),
            Stored::Pool(g) => fill(g.as_mut_slice()),
        }
        meta.checksum = checksum(self.inner.config.put.checksum, stored.bytes());

        // 2. Exports: the storage transport first (it exports in place), then
        // every other selected transport lending the stored bytes.
        let mut order: Vec<usize> = Vec::new();
        order.extend(storage_plugin);
        for (pi, p) in self.inner.plugins.iter().enumerate() {
            let selected = match &self.inner.config.put.export_to {
                Some(list) => list.contains(&p.name),
                None => true,
            };
            // CPU bytes go only to transports that move CPU shards (not cuda-ipc).
            let selected = selected && p.capabilities().contains(Capabilities::CPU);
            if selected && Some(pi) != storage_plugin {
                order.push(pi);
            }
        }
        let mut exports = Vec::new();
        let mut exported_by = Vec::new();
        let mut failures = Vec::new();
        for pi in order {
            let p = &self.inner.plugins[pi];
            let allocation = match (&mut stored, Some(pi) == storage_plugin) {
                (Stored::Pool(g), true) => g.token(),
                _ => 0,
            };
            let req = ExportRequest {
                id,
                meta: meta.clone(),
                data: SharedBytes::lend(stored.bytes()),
                allocation,
            };
            let exported = p.transport.export(req).into_result().and_then(|desc| {
                if desc.is_empty() || desc.len() > crate::handle::MAX_DESCRIPTOR {
                    // Unusable in a handle: withdraw it and count a failed export.
                    let _ = p.transport.unexport(id);
                    Err(AbiError::internal(format!(
                        "descriptor of {} bytes (handles carry 1..={})",
                        desc.len(),
                        crate::handle::MAX_DESCRIPTOR
                    )))
                } else {
                    Ok(desc)
                }
            });
            match exported {
                Ok(desc) => {
                    if let (Stored::Pool(g), true) = (&mut stored, allocation != 0) {
                        g.mark_exported();
                    }
                    exports.push(Export {
                        transport: p.name.clone(),
                        descriptor: desc.into_vec(),
                    });
                    exported_by.push(pi);
                }
                Err(e) => {
                    tracing::warn!(target: "store", transport = %p.name, error = %e, "export failed");
                    failures.push((p.name.clone(), e));
                    if allocation != 0 {
                        // The bytes live in this transport's allocation and it
                        // refused to export them: nothing else may lend them.
                        break;
                    }
                }
            }
        }
        if exports.is_empty() {
            // Nothing to undo: the storage transport exports first and a
            // failure there stops the loop; the allocation guard frees its space.
            return Err(HostError::NoExport { id, failures });
        }
        // Storage transport unexports last (its memory backs the others).
        exported_by.rotate_left(usize::from(storage_plugin.is_some()));
        let handle = Handle {
            id,
            meta,
            tags,
            owner: self.owner(),
            exports,
        };
        let shard = OwnedShard {
            handle: handle.clone(),
            stored,
            exported_by,
        };
        if let Err(why) = handle.validate() {
            self.inner.unexport_all(id, shard);
            return Err(HostError::InvalidShard(format!(
                "the handle would be invalid: {why}"
            )));
        }
        lock(&self.inner.shards).insert(id, shard);
        Ok(handle)
    }

    /// Removes owned shards: unexports from every transport (the storage
    /// transport last; it reclaims space once no lease covers it). Returns
    /// the ids that were not owned.
    pub fn remove(&self, ids: &[ShardId]) -> Vec<ShardId> {
        let mut missing = Vec::new();
        for id in ids {
            let Some(shard) = lock(&self.inner.shards).remove(id) else {
                missing.push(*id);
                continue;
            };
            self.inner.unexport_all(*id, shard);
        }
        missing
    }

    /// Removes every owned shard.
    pub fn clear(&self) {
        let all: Vec<(ShardId, OwnedShard)> = lock(&self.inner.shards).drain().collect();
        for (id, shard) in all {
            self.inner.unexport_all(id, shard);
        }
        // Leases end outside the lock (release is a plugin call).
        let cached = lock(&self.inner.cache).clear();
        drop(cached);
    }

    /// The handle of an owned shard.
    pub fn handle(&self, id: ShardId) -> Option<Handle> {
        lock(&self.inner.shards).get(&id).map(|s| s.handle.clone())
    }

    /// Drops cached fetched shards (their leases end when no caller holds them).
    /// Returns how many entries were dropped.
    pub fn drain(&self, ids: &[ShardId]) -> usize {
        let removed = lock(&self.inner.cache).drain(ids);
        // Leases end here, outside the lock (release is a plugin call).
        removed.len()
    }

    /// Fetches with the configured default mode.
    pub fn fetch(&self, handle: &Handle) -> Result<Fetched, HostError> {
        self.fetch_mode(handle, self.inner.config.fetch.mode)
    }

    /// Fetches a shard as a zero-copy view or a copy.
    pub fn fetch_mode(&self, handle: &Handle, mode: FetchMode) -> Result<Fetched, HostError> {
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch", shard = %handle.id, %mode).entered();
        if let Some(hit) = self.cached(handle, mode, start) {
            return Ok(hit);
        }
        let target = match mode {
            FetchMode::View => Target::View,
            FetchMode::Copy => Target::Alloc,
        };
        let (data, selection) = self.fetch_inner(handle, mode, target, start)?;
        let data = Arc::new(data.expect("view and alloc targets return bytes"));
        self.remember(handle, &data);
        Ok(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data,
            selection,
            elapsed: start.elapsed(),
        })
    }

    /// Fetches a shard by copying it into `dst` (`dst.len()` must equal the
    /// shard's byte length). The fastest copy path: the caller reuses a warm
    /// buffer, so no page is faulted in per fetch. Bypasses the cache.
    pub fn fetch_into(&self, handle: &Handle, dst: &mut [u8]) -> Result<Selection, HostError> {
        if dst.len() as u64 != handle.meta.byte_len {
            return Err(HostError::InvalidShard(format!(
                "destination is {} bytes, shard {} is {}",
                dst.len(),
                handle.id,
                handle.meta.byte_len
            )));
        }
        let start = Instant::now();
        let _span =
            tracing::debug_span!(target: "fetch", "fetch_into", shard = %handle.id).entered();
        self.fetch_inner(handle, FetchMode::Copy, Target::Into(dst), start)
            .map(|(_, sel)| sel)
    }

    fn fetch_inner(
        &self,
        handle: &Handle,
        mode: FetchMode,
        mut target: Target<'_>,
        start: Instant,
    ) -> Result<(Option<ShardBytes>, Selection), HostError> {
        self.check_claimed_size(handle)?;
        let plan = self.plan(handle, mode);
        if plan.attempts.is_empty() {
            self.inner.metrics.fetch_error(None);
            return Err(HostError::NoCandidate {
                id: handle.id,
                skipped: plan.skipped,
            });
        }
        let len = handle.meta.byte_len;
        let mut failures: Vec<(TransportName, AbiError)> = Vec::new();
        let mut corrupt: Option<HostError> = None;
        for attempt in &plan.attempts {
            let p = &self.inner.plugins[attempt.plugin];
            let desc = &handle.exports[attempt.export].descriptor;
            let result = match &mut target {
                Target::View if attempt.zero_copy => {
                    LeasedView::import(&p.transport, desc, &handle.meta)
                        .map(|v| Some(ShardBytes::View(v)))
                }
                Target::View | Target::Alloc => {
                    let mut buf = zeroed(handle.meta.byte_len)?;
                    import_into(p, desc, &handle.meta, &mut buf)
                        .map(|()| Some(ShardBytes::Owned(buf)))
                }
                Target::Into(dst) => import_into(p, desc, &handle.meta, dst).map(|()| None),
            };
            let data = match result {
                Ok(data) => data,
                Err(e) => {
                    tracing::debug!(target: "select", transport = %attempt.transport, error = %e, "attempt failed");
                    self.inner
                        .metrics
                        .fetch_error(Some(attempt.transport.as_str()));
                    failures.push((attempt.transport.clone(), e));
                    continue;
                }
            };
            let bytes: &[u8] = match (&data, &target) {
                (Some(d), _) => d,
                (None, Target::Into(dst)) => dst,
                (None, _) => &[],
            };
            if let Err(e) = self.verify(handle, &attempt.transport, bytes) {
                // Wrong bytes from this transport: the next one may do better.
                tracing::warn!(target: "select", transport = %attempt.transport, error = %e, "fetched bytes failed verification");
                failures.push((attempt.transport.clone(), AbiError::internal(e.to_string())));
                corrupt.get_or_insert(e);
                continue;
            }
            let latency = start.elapsed();
            self.record_arm(&plan, Some(&attempt.transport), len, latency);
            let selection = self.report(handle, attempt, failures)?;
            self.inner
                .metrics
                .fetch_ok(attempt.transport.as_str(), len, latency);
            return Ok((data, selection));
        }
        self.record_arm(&plan, None, len, start.elapsed());
        Err(corrupt.unwrap_or(HostError::FetchFailed {
            id: handle.id,
            failures,
        }))
    }

    /// Refuses a handle claiming more than `node.max-shard-size`, before
    /// anything is allocated for it.
    fn check_claimed_size(&self, handle: &Handle) -> Result<(), HostError> {
        let max = self.inner.config.node.max_shard_size;
        if handle.meta.byte_len > max {
            return Err(HostError::InvalidShard(format!(
                "shard {} claims {} bytes, over node.max-shard-size = {max}",
                handle.id, handle.meta.byte_len
            )));
        }
        Ok(())
    }

    /// The selection plan for `handle` on this node (each call counts as
    /// one fetch for per-fetch experiments). Exports a transport refuses in
    /// `can_import` are skipped with its reason; host fetches of CUDA shards
    /// are copies (see `node::device`).
    pub fn plan(&self, handle: &Handle, mode: FetchMode) -> Plan {
        self.plan_for(handle, mode, device::Memory::Host)
    }

    /// Records the outcome of a fetch for its experiment arm, if it has one,
    /// and applies the arm's guardrail. `served`: the transport that served
    /// the fetch (`None`: every attempt failed).
    fn record_arm(
        &self,
        plan: &Plan,
        served: Option<&TransportName>,
        bytes: u64,
        latency: Duration,
    ) {
        let Some(choice) = &plan.arm else { return };
        let exp = &self.inner.config.experiments[choice.experiment];
        let arm = &exp.arms[choice.arm];
        let m = &self.inner.metrics;
        m.arm_assigned(choice.experiment, choice.arm, choice.redirected_from);
        let ok = served == Some(&arm.transport);
        if ok {
            m.arm_ok(choice.experiment, choice.arm, bytes, latency);
        } else {
            m.arm_error(choice.experiment, choice.arm, served.is_some());
        }
        let latency_ns = latency.as_nanos().min(u128::from(u64::MAX)) as u64;
        let now = self.inner.clock.monotonic_nanos();
        if let Some(why) =
            self.inner.experiments[choice.experiment].record(exp, choice.arm, ok, latency_ns, now)
        {
            tracing::warn!(
                target: "experiment",
                experiment = %exp.name,
                arm = %arm.name,
                transport = %arm.transport,
                "guardrail disabled arm `{}`: {why}; its traffic goes to the control arm `{}` until `shardport ab reset` (POST /v1/experiments/reset) or a restart",
                arm.name,
                exp.arms[0].name
            );
        }
    }

    /// Re-enables the arms the guardrail disabled in experiment `name`
    /// (every experiment when `None`). Returns `(experiment, arm)` names
    /// re-enabled; an unknown name is an error naming the known ones.
    pub fn reset_experiments(&self, name: Option<&str>) -> Result<Vec<(String, String)>, String> {
        let exps = &self.inner.config.experiments;
        if let Some(n) = name {
            if !exps.iter().any(|e| e.name == n) {
                let known: Vec<&str> = exps.iter().map(|e| e.name.as_str()).collect();
                return Err(format!(
                    "no experiment `{n}` (configured: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
        let mut out = Vec::new();
        for (e, st) in exps.iter().zip(&self.inner.experiments) {
            if name.is_none_or(|n| n == e.name) {
                for a in st.reset() {
                    tracing::info!(target: "experiment", experiment = %e.name, arm = %e.arms[a].name, "arm re-enabled");
                    out.push((e.name.clone(), e.arms[a].name.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Shards this node owns and their bytes.
    fn owned_totals(&self) -> (usize, u64) {
        let shards = lock(&self.inner.shards);
        (
            shards.len(),
            shards.values().map(|s| s.stored.bytes().len() as u64).sum(),
        )
    }

    /// The node's metrics as a snapshot (the JSON of `/v1/metrics.json`;
    /// [`crate::metrics::prometheus`] renders it for `/metrics`).
    pub fn metrics_snapshot(&self) -> Snapshot {
        let experiments: Vec<ExperimentInfo> = self
            .inner
            .config
            .experiments
            .iter()
            .zip(&self.inner.experiments)
            .map(|(e, st)| ExperimentInfo {
                name: e.name.clone(),
                unit: e.unit.to_string(),
                arms: e
                    .arms
                    .iter()
                    .enumerate()
                    .map(|(i, a)| ArmInfo {
                        name: a.name.clone(),
                        transport: a.transport.to_string(),
                        weight: a.weight,
                        disabled: st.disabled_reason(i),
                        trips: st.trips(i),
                    })
                    .collect(),
            })
            .collect();
        let cache = self.cache_stats();
        let (shards_owned, bytes_owned) = self.owned_totals();
        let g = |name: &str, labels: Vec<(String, String)>, value: f64| Gauge {
            name: name.to_owned(),
            labels,
            value,
        };
        let mut gauges = vec![
            g("cache_entries", vec![], cache.entries as f64),
            g("cache_bytes", vec![], cache.bytes as f64),
            g("cache_held_entries", vec![], cache.held as f64),
            g("cache_evicted_total", vec![], cache.evicted as f64),
            g("cache_hits_total", vec![], cache.hits as f64),
            g("shards_owned", vec![], shards_owned as f64),
            g("bytes_owned", vec![], bytes_owned as f64),
        ];
        for p in &self.inner.plugins {
            for st in p.transport.stats() {
                let name = if st.kind == StatKind::COUNTER {
                    "plugin_events_total"
                } else {
                    "plugin_gauge"
                };
                gauges.push(g(
                    name,
                    vec![
                        ("transport".to_owned(), p.name.to_string()),
                        ("stat".to_owned(), st.name.to_string()),
                    ],
                    st.value as f64,
                ));
            }
        }
        let window_ns = self
            .inner
            .clock
            .monotonic_nanos()
            .saturating_sub(self.inner.started_ns);
        self.inner.metrics.snapshot(
            &self.inner.config.node.name,
            self.inner.clock.now_unix_nanos() / 1_000_000,
            window_ns as f64 / 1e9,
            &experiments,
            gauges,
        )
    }

    /// Builds the selection report of a successful attempt, applying the
    /// downgrade policy.
    fn report(
        &self,
        handle: &Handle,
        attempt: &Attempt,
        failures: Vec<(TransportName, AbiError)>,
    ) -> Result<Selection, HostError> {
        // A view served as a copy is not by itself a downgrade: the plan puts
        // zero-copy candidates first, so if one existed and failed it is in
        // `failures`; if none existed (a remote owner) a copy is the best there is.
        let downgraded = !failures.is_empty();
        let mut reason = attempt.reason.clone();
        if !failures.is_empty() {
            let names: Vec<&str> = failures.iter().map(|(t, _)| t.as_str()).collect();
            reason.push_str(&format!("; after {} failed", names.join(", ")));
        }
        if downgraded {
            self.inner.metrics.downgrade(attempt.transport.as_str());
            let list: Vec<String> = failures.iter().map(|(t, e)| format!("{t}: {e}")).collect();
            let why = format!(
                "served by `{}` after {}",
                attempt.transport,
                list.join("; ")
            );
            match self.inner.config.fetch.on_downgrade {
                OnDowngrade::Fail => return Err(HostError::Downgrade { id: handle.id, why }),
                OnDowngrade::Warn => {
                    tracing::warn!(target: "select", shard = %handle.id, "downgrade: {why}")
                }
                OnDowngrade::Allow => {
                    tracing::debug!(target: "select", shard = %handle.id, "downgrade: {why}")
                }
            }
        }
        tracing::debug!(target: "select", transport = %attempt.transport, %reason, downgraded, "fetched");
        Ok(Selection {
            transport: attempt.transport.to_string(),
            reason,
            downgraded,
            mode: if attempt.zero_copy {
                FetchMode::View
            } else {
                FetchMode::Copy
            },
            failures: failures
                .iter()
                .map(|(t, e)| (t.to_string(), e.to_string()))
                .collect(),
        })
    }

    fn verify(
        &self,
        handle: &Handle,
        transport: &TransportName,
        data: &[u8],
    ) -> Result<(), HostError> {
        if !self.inner.config.fetch.verify_checksum {
            return Ok(());
        }
        let ROption::RSome(expected) = handle.meta.checksum else {
            return Ok(());
        };
        let found = compute(expected.algo, data);
        if found != Some(expected.value) {
            self.inner.metrics.fetch_error(Some(transport.as_str()));
            return Err(HostError::ChecksumMismatch {
                id: handle.id,
                transport: transport.clone(),
                expected: expected.value,
                found: found.unwrap_or(0),
            });
        }
        Ok(())
    }

    /// Fetches many shards; results come back in input order, one per handle.
    ///
    /// Copies are batched: shards are grouped by (owner, transport) and each
    /// group goes to the transport's `import_many` in one call (one round trip
    /// per owner for a network transport); groups run in parallel (at most
    /// [`MAX_FETCH_THREADS`]). When a transport fails some shards of a group,
    /// only those move on to their next candidate, in the next round, so a
    /// failover fetches only what is still missing. Views are per shard
    /// (each holds its own lease), grouped by owner and run in parallel.
    pub fn fetch_many(
        &self,
        handles: &[Handle],
        mode: FetchMode,
    ) -> Result<Vec<Result<Fetched, HostError>>, HostError> {
        let max = self.inner.config.fetch.max_batch;
        if handles.len() > max {
            return Err(HostError::BatchTooLarge {
                n: handles.len(),
                max,
            });
        }
        match mode {
            FetchMode::View => Ok(self.fetch_each(handles, mode)),
            FetchMode::Copy => Ok(self.fetch_batched(handles)),
        }
    }

    fn fetch_each(&self, handles: &[Handle], mode: FetchMode) -> Vec<Result<Fetched, HostError>> {
        let mut groups: BTreeMap<(&str, u64), Vec<usize>> = BTreeMap::new();
        for (i, h) in handles.iter().enumerate() {
            groups
                .entry((h.owner.addr.as_str(), h.owner.epoch))
                .or_default()
                .push(i);
        }
        let groups: Vec<Vec<usize>> = groups.into_values().collect();
        let done = run_parallel(&groups, |group| {
            group
                .iter()
                .map(|&i| (i, self.fetch_mode(&handles[i], mode)))
                .collect()
        });
        in_order(handles.len(), done)
    }

    fn fetch_batched(&self, handles: &[Handle]) -> Vec<Result<Fetched, HostError>> {
        let start = Instant::now();
        let mut out: Vec<Option<Result<Fetched, HostError>>> =
            (0..handles.len()).map(|_| None).collect();
        let mut plans: Vec<Plan> = Vec::with_capacity(handles.len());
        let mut cursor = vec![0usize; handles.len()];
        let mut failures: Vec<Vec<(TransportName, AbiError)>> = vec![Vec::new(); handles.len()];
        let mut corrupt: Vec<Option<HostError>> = (0..handles.len()).map(|_| None).collect();
        let mut pending = Vec::new();
        for (i, h) in handles.iter().enumerate() {
            let plan = self.plan(h, FetchMode::Copy);
            if let Err(e) = self.check_claimed_size(h) {
                out[i] = Some(Err(e));
            } else if plan.attempts.is_empty() {
                self.inner.metrics.fetch_error(None);
                out[i] = Some(Err(HostError::NoCandidate {
                    id: h.id,
                    skipped: plan.skipped.clone(),
                }));
            } else if let Some(hit) = self.cached(h, FetchMode::Copy, start) {
                out[i] = Some(Ok(hit));
            } else {
                pending.push(i);
            }
            plans.push(plan);
        }
        while !pending.is_empty() {
            // Group what is still missing by (owner, next transport to try).
            let mut groups: BTreeMap<(&str, u64, usize), Vec<usize>> = BTreeMap::new();
            for &i in &pending {
                let a = &plans[i].attempts[cursor[i]];
                groups
                    .entry((
                        handles[i].owner.addr.as_str(),
                        handles[i].owner.epoch,
                        a.plugin,
                    ))
                    .or_default()
                    .push(i);
            }
            let groups: Vec<(usize, Vec<usize>)> =
                groups.into_iter().map(|((_, _, p), v)| (p, v)).collect();
            let results = run_parallel(&groups, |(pi, members)| {
                self.import_group(*pi, members, handles, &plans, &cursor)
            });
            pending.clear();
            for (i, r) in results {
                let attempt = &plans[i].attempts[cursor[i]];
                let failed = match r {
                    Ok(buf) => match self.verify(&handles[i], &attempt.transport, &buf) {
                        Ok(()) => {
                            let f = std::mem::take(&mut failures[i]);
                            let len = handles[i].meta.byte_len;
                            self.record_arm(
                                &plans[i],
                                Some(&attempt.transport),
                                len,
                                start.elapsed(),
                            );
                            let res = self.report(&handles[i], attempt, f).map(|selection| {
                                self.inner.metrics.fetch_ok(
                                    attempt.transport.as_str(),
                                    len,
                                    start.elapsed(),
                                );
                                let data = Arc::new(ShardBytes::Owned(buf));
                                self.remember(&handles[i], &data);
                                Fetched {
                                    id: handles[i].id,
                                    meta: handles[i].meta.clone(),
                                    data,
                                    selection,
                                    elapsed: start.elapsed(),
                                }
                            });
                            out[i] = Some(res);
                            continue;
                        }
                        Err(e) => {
                            let err = AbiError::internal(e.to_string());
                            corrupt[i].get_or_insert(e);
                            err
                        }
                    },
                    Err(e) => e,
                };
                self.inner
                    .metrics
                    .fetch_error(Some(attempt.transport.as_str()));
                tracing::debug!(target: "select", shard = %handles[i].id, transport = %attempt.transport, error = %failed, "batch attempt failed");
                failures[i].push((attempt.transport.clone(), failed));
                cursor[i] += 1;
                if cursor[i] < plans[i].attempts.len() {
                    pending.push(i);
                } else {
                    self.record_arm(&plans[i], None, handles[i].meta.byte_len, start.elapsed());
                    out[i] = Some(Err(corrupt[i].take().unwrap_or_else(|| {
                        HostError::FetchFailed {
                            id: handles[i].id,
                            failures: std::mem::take(&mut failures[i]),
                        }
                    })));
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every shard resolved"))
            .collect()
    }

    /// Imports one (owner, transport) group with a single `import_many`.
    fn import_group(
        &self,
        pi: usize,
        members: &[usize],
        handles: &[Handle],
        plans: &[Plan],
        cursor: &[usize],
    ) -> Vec<(usize, Result<Vec<u8>, AbiError>)> {
        let p = &self.inner.plugins[pi];
        let mut bufs: Vec<(usize, Result<Vec<u8>, AbiError>)> = members
            .iter()
            .map(|&i| {
                let buf = zeroed(handles[i].meta.byte_len)
                    .map_err(|e| AbiError::new(ErrorKind::RESOURCE_EXHAUSTED, e.to_string()));
                (i, buf)
            })
            .collect();
        let mut slots: Vec<usize> = Vec::new();
        let mut items: Vec<ImportItem<'_>> = Vec::new();
        for (k, (i, buf)) in bufs.iter_mut().enumerate() {
            if let Ok(buf) = buf {
                let export = plans[*i].attempts[cursor[*i]].export;
                items.push(ImportItem {
                    desc: RSlice::from_slice(&handles[*i].exports[export].descriptor),
                    meta: &handles[*i].meta,
                    dst: RSliceMut::from_mut_slice(buf.as_mut_slice()),
                });
                slots.push(k);
            }
        }
        let n = items.len();
        let results = p
            .transport
            .import_many(RSliceMut::from_mut_slice(&mut items));
        drop(items);
        let mut results = results.into_iter();
        for (j, k) in slots.into_iter().enumerate() {
            let r = results.next().map(RResult::into_result).unwrap_or_else(|| {
                Err(AbiError::internal(format!(
                    "`{}` import_many returned {j} results for {n} shards",
                    p.name
                )))
            });
            if let Err(e) = r {
                bufs[k].1 = Err(e);
            }
        }
        bufs
    }

    /// A cache hit for `handle` in `mode`, if the policy keeps results.
    fn cached(&self, handle: &Handle, mode: FetchMode, start: Instant) -> Option<Fetched> {
        let now = self.inner.clock.monotonic_nanos();
        let data =
            lock(&self.inner.cache).get(handle.id, &handle.meta, mode == FetchMode::View, now)?;
        Some(Fetched {
            id: handle.id,
            meta: handle.meta.clone(),
            data,
            selection: Selection {
                transport: "cache".to_owned(),
                reason: "consumer cache hit".to_owned(),
                downgraded: false,
                mode,
                failures: Vec::new(),
            },
            elapsed: start.elapsed(),
        })
    }

    /// Keeps a fetched shard when the cache policy says so, and applies the
    /// policy's eviction.
    fn remember(&self, handle: &Handle, data: &Arc<ShardBytes>) {
        let now = self.inner.clock.monotonic_nanos();
        let removed = lock(&self.inner.cache).insert(handle.id, handle.meta.clone(), data, now);
        // Evicted leases end here, outside the lock (release is a plugin call).
        if !removed.is_empty() {
            tracing::debug!(target: "cache", evicted = removed.len(), "cache eviction");
        }
        drop(removed);
    }

    /// Applies the cache policy now (TTL expiry happens here and at each
    /// insert); returns how many entries left.
    pub fn evict_expired(&self) -> usize {
        let now = self.inner.clock.monotonic_nanos();
        let removed = lock(&self.inner.cache).evict(now);
        removed.len()
    }

    /// Cache counters and gauges.
    pub fn cache_stats(&self) -> CacheStats {
        lock(&self.inner.cache).stats(self.inner.clock.monotonic_nanos())
    }

    /// Runs every transport's `sweep` (reclaiming what dead processes left
    /// behind) and the cache's expiry. Returns, per transport, its reclaim
    /// counters, or why it could not sweep; transports with nothing to sweep
    /// are left out.
    pub fn sweep(&self) -> Vec<(String, SweepResult)> {
        self.evict_expired();
        let mut out = Vec::new();
        for p in &self.inner.plugins {
            match p.transport.sweep().into_result() {
                Ok(stats) => {
                    let stats: BTreeMap<String, u64> = stats
                        .into_iter()
                        .map(|s| (s.name.to_string(), s.value))
                        .collect();
                    if stats.values().any(|&v| v > 0) {
                        tracing::info!(target: "cleanup", transport = %p.name, ?stats, "swept");
                    }
                    out.push((p.name.to_string(), Ok(stats)));
                }
                Err(e) if e.kind == ErrorKind::UNSUPPORTED => {}
                Err(e) => {
                    tracing::warn!(target: "cleanup", transport = %p.name, error = %e, "sweep failed");
                    out.push((p.name.to_string(), Err(e.to_string())));
                }
            }
        }
        out
    }

    /// [`sweep`](Self::sweep) as JSON: transport -> its counters, or `{"error": ...}`.
    pub fn sweep_json(&self) -> serde_json::Value {
        let report: serde_json::Map<String, serde_json::Value> = self
            .sweep()
            .into_iter()
            .map(|(t, r)| {
                let v = match r {
                    Ok(stats) => serde_json::json!(stats),
                    Err(e) => serde_json::json!({ "error": e }),
                };
                (t, v)
            })
            .collect();
        serde_json::Value::Object(report)
    }

    /// Drops every cached fetched shard; returns how many.
    pub fn drain_all(&self) -> usize {
        let removed = lock(&self.inner.cache).clear();
        removed.len()
    }

    /// A snapshot of the node's state and its plugins' stats.
    pub fn stats(&self) -> NodeStats {
        let (shards_owned, bytes_owned) = self.owned_totals();
        let cache = self.cache_stats();
        let plugins = self
            .inner
            .plugins
            .iter()
            .map(|p| {
                let health = p.transport.health();
                PluginStats {
                    name: p.name.to_string(),
                    path: p.path.display().to_string(),
                    version: p.plugin_version.clone(),
                    abi_version: p.abi_version.clone(),
                    capabilities: p.capabilities().names(),
                    healthy: health.ok,
                    health: health.message.to_string(),
                    stats: p
                        .transport
                        .stats()
                        .into_iter()
                        .map(|s| {
                            let suffix = if s.kind == StatKind::COUNTER {
                                "_total"
                            } else {
                                ""
                            };
                            let name = s.name.to_string();
                            let name = if name.ends_with(suffix) {
                                name
                            } else {
                                format!("{name}{suffix}")
                            };
                            (name, s.value)
                        })
                        .collect(),
                }
            })
            .collect();
        NodeStats {
            node: self.inner.config.node.name.clone(),
            tag: self.inner.tag.clone(),
            shards_owned,
            bytes_owned,
            cache_entries: cache.entries,
            cache_bytes: cache.bytes,
            cache,
            plugins,
            load_failures: self.inner.load_failures.clone(),
            transports: self.inner.metrics.transport_totals(),
            downgrades: self.inner.metrics.downgrades(),
            no_candidate: self.inner.metrics.no_candidate(),
            leaked_bytes: self.inner.metrics.leaked_bytes(),
        }
    }

    /// Calls every loaded transport's `describe` and `health` (used by `shardport plugins`).
    pub fn plugin_report(&self) -> Vec<(String, bool, String)> {
        self.inner
            .plugins
            .iter()
            .map(|p| {
                let h = p.transport.health();
                (p.name.to_string(), h.ok, h.message.to_string())
            })
            .collect()
    }
}

enum Target<'a> {
    View,
    Alloc,
    Into(&'a mut [u8]),
}

fn import_into(
    p: &LoadedPlugin,
    desc: &[u8],
    meta: &ShardMeta,
    dst: &mut [u8],
) -> Result<(), AbiError> {
    p.transport
        .import_into(
            RSlice::from_slice(desc),
            meta,
            RSliceMut::from_mut_slice(dst),
        )
        .into_result()
        .map(|_| ())
}

/// Runs `work` over `groups` on at most [`MAX_FETCH_THREADS`] threads and
/// collects every `(index, result)` it returns.
fn run_parallel<G: Sync, R: Send>(
    groups: &[G],
    work: impl Fn(&G) -> Vec<(usize, R)> + Sync,
) -> Vec<(usize, R)> {
    if groups.len() <= 1 {
        return groups.iter().flat_map(&work).collect();
    }
    let threads = groups.len().min(MAX_FETCH_THREADS);
    let next = AtomicU64::new(0);
    let collected = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let g = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(group) = groups.get(g) else { break };
                let local = work(group);
                lock(&collected).extend(local);
            });
        }
    });
    collected.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Orders `(index, result)` pairs by index; every index below `n` must appear once.
fn in_order<R>(n: usize, pairs: Vec<(usize, R)>) -> Vec<R> {
    let mut slots: Vec<Option<R>> = (0..n).map(|_| None).collect();
    for (i, r) in pairs {
        slots[i] = Some(r);
    }
    slots
        .into_iter()
        .map(|r| r.expect("every index produced"))
        .collect()
}

/// Most threads one `fetch_many` call uses (one per owner group).
pub const MAX_FETCH_THREADS: usize = 8;

fn compute(algo: ChecksumAlgo, data: &[u8]) -> Option<u64> {
    match algo {
        ChecksumAlgo::CRC32C => Some(u64::from(crc32c::crc32c(data))),
        ChecksumAlgo::XXH3 => Some(xxhash_rust::xxh3::xxh3_64(data)),
        _ => None,
    }
}

fn checksum(policy: ChecksumPolicy, data: &[u8]) -> ROption<Checksum> {
    let algo = match policy {
        ChecksumPolicy::None => return ROption::RNone,
        ChecksumPolicy::Crc32c => ChecksumAlgo::CRC32C,
        ChecksumPolicy::Xxh3 => ChecksumAlgo::XXH3,
    };
    compute(algo, data).map_or(ROption::RNone, |value| {
        ROption::RSome(Checksum { algo, value })
    })
}

impl Inner {
    /// Unexports a shard from every transport that exported it, the storage
    /// transport last, then frees its bytes. When a transport fails to
    /// unexport (other than "not found"), it may still serve from the bytes,
    /// so they are leaked, loudly, rather than freed under it.
    fn unexport_all(&self, id: ShardId, shard: OwnedShard) {
        let mut still_lent = false;
        for &pi in &shard.exported_by {
            let p = &self.plugins[pi];
            if let Err(e) = p.transport.unexport(id).into_result() {
                tracing::warn!(target: "store", shard = %id, transport = %p.name, error = %e, "unexport failed");
                still_lent |= e.kind != ErrorKind::NOT_FOUND;
            }
        }
        if still_lent {
            tracing::error!(target: "store", shard = %id, bytes = shard.handle.meta.byte_len, "a transport may still use this shard's bytes; leaking them instead of freeing");
            self.metrics.leaked_storage(shard.handle.meta.byte_len);
            std::mem::forget(shard.stored);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Unexport everything before the plugin instances go away, so
        // transports release their segments in order.
        let shards: Vec<(ShardId, OwnedShard)> = lock(&self.shards).drain().collect();
        for (id, shard) in shards {
            self.unexport_all(id, shard);
        }
        let cached = lock(&self.cache).clear();
        drop(cached);
    }
}

/// A zero-filled buffer of `len` bytes, or an error instead of an abort when
/// the allocation cannot be made.
fn zeroed(len: u64) -> Result<Vec<u8>, HostError> {
    let n = usize::try_from(len)
        .map_err(|_| HostError::InvalidShard(format!("{len} bytes do not fit in memory here")))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|e| HostError::InvalidShard(format!("cannot allocate {len} bytes: {e}")))?;
    v.resize(n, 0);
    Ok(v)
}
