//! A node: the owner store and the consumer fetch path of one host instance.
//!
//! There are no process globals: several nodes in one process each have their
//! own plugin instances, store, cache, identity tag and metrics.
//!
//! # Generations
//! What a config reload replaces (the config, the plugin instances it lists,
//! experiment states, the storage transport) is one immutable
//! `Generation`, swapped atomically. Every operation reads the live
//! generation once at its start and uses only it, so a fetch in flight
//! finishes under the config it started with and a new one sees only the
//! new config. What outlives reloads (owned shards, the cache, metrics,
//! identity) sits beside it in `Inner`.
//!
//! # Locking
//! `shards` (owned shards) and `cache` (fetched shards) are separate mutexes,
//! never held together, and never held across a plugin call except for
//! `remove`, which takes the entry out of the map first and unexports after.
//! `live` is held only to clone or swap an `Arc`; `reload` serializes reloads.
//!
//! # Failure modes
//! A plugin that fails to load is reported and skipped unless `required`. A
//! transport that fails an export is skipped (the handle lists fewer exports);
//! a transport that fails an import is followed by the next candidate, and the
//! fetch reports the downgrade.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{atomic::AtomicU64, Arc, Mutex, MutexGuard, RwLock},
    time::{Duration, Instant},
};

use serde::Serialize;
use shardport_abi::{
    AllocationGuard, Capabilities, DType, Device, ErrorKind, ROption, RVec, ShardId, ShardMeta,
};
use shardport_kit::hash::IdHashMap;

use crate::error::LoadError;
use crate::{
    buffers::{CopyBuffers, ShelfStats},
    cache::{Cache, CacheStats},
    config::Config,
    error::HostError,
    experiment::ExperimentState,
    handle::{Handle, Owner},
    identity::{new_node_tag, unique_node_name, NodeIdentity},
    loader::{config_refusal, load_all, LoadedPlugin, NodeContext},
    locality::Locality,
    metrics::{ArmCounters, Metrics},
    select::PluginFacts,
    services::{Clock, SystemClock},
    vocab::{CopyBuf, FetchMode, Storage},
};

mod admin;
mod batch;
mod checksum;
mod device;
mod fetch;
mod plan;
mod put;
mod reload;

pub use batch::MAX_FETCH_THREADS;
pub use device::{DevicePtr, DeviceView};
pub use put::Pinned;
pub use reload::{ConfigHook, ReloadReport};

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

    /// The byte length dtype and shape imply (what a put of this spec
    /// stores; [`ShardMeta::implied_byte_len`]), `None` for an unknown
    /// dtype or overflow. Callers that gather the bytes themselves (the
    /// Python binding) check their buffer against it.
    pub fn byte_len(&self) -> Option<u64> {
        self.meta_of_len(0).implied_byte_len()
    }

    fn meta_of_len(&self, byte_len: u64) -> ShardMeta {
        ShardMeta {
            dtype: self.dtype,
            shape: RVec::from(self.shape.clone()),
            device: self.device,
            byte_len,
            checksum: ROption::RNone,
        }
    }

    fn meta(&self) -> Result<ShardMeta, HostError> {
        let mut meta = self.meta_of_len(0);
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
    /// Plugin instances that exported it; the storage transport (if any) is
    /// last. They stay alive (draining, after a reload removed them) until
    /// the shard is removed.
    exported_by: Vec<Arc<LoadedPlugin>>,
}

use crate::vocab::ShardBytes;

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
    /// Copy destinations kept for reuse, and how often copies reused one
    /// (`fetch.copy-buffers`).
    pub copy_buffers: ShelfStats,
    /// Loaded plugins.
    pub plugins: Vec<PluginStats>,
    /// Plugins that failed to load (one line each).
    pub load_failures: Vec<String>,
    /// Plugins a reload removed that still have calls, shards or leases
    /// out (one line each: name, path, why it waits).
    pub draining: Vec<String>,
    /// The config generation (0 at start, +1 per applied reload).
    pub generation: u64,
    /// Per-transport fetch metrics.
    pub transports: BTreeMap<String, crate::metrics::TransportSnapshot>,
    /// Downgrades.
    pub downgrades: u64,
    /// Fetches no loaded transport could serve.
    pub no_candidate: u64,
    /// Owned bytes leaked because a transport failed to unexport them.
    pub leaked_bytes: u64,
}

/// What a reload replaces at once: the config and everything derived
/// from it. Immutable; fetches hold the one they started with.
struct Generation {
    /// 0 at start, +1 per applied reload.
    number: u64,
    config: Arc<Config>,
    plugins: Vec<Arc<LoadedPlugin>>,
    facts: Vec<PluginFacts>,
    load_failures: Vec<String>,
    /// Plugin index whose allocator holds owned bytes (`storage = "pool"`).
    storage_plugin: Option<usize>,
    /// Live state per `config.experiments` entry.
    experiments: Vec<Arc<ExperimentState>>,
    /// Counters per experiment, per arm.
    arm_counters: Vec<Vec<Arc<ArmCounters>>>,
}

impl Generation {
    /// Builds a generation over loaded plugins (experiment states from
    /// `keep` when they fit, fresh ones otherwise).
    fn new(
        number: u64,
        config: Config,
        plugins: Vec<Arc<LoadedPlugin>>,
        load_failures: Vec<String>,
        metrics: &Metrics,
        mut keep: impl FnMut(&crate::config::Experiment) -> Option<Arc<ExperimentState>>,
        now_ns: u64,
    ) -> Generation {
        for p in &plugins {
            metrics.add_transport(p.name.as_str());
        }
        let facts = plugins
            .iter()
            .map(|p| PluginFacts {
                name: p.name.clone(),
                capabilities: p.capabilities(),
                needs_identity: p.needs_identity(),
            })
            .collect();
        let experiments = config
            .experiments
            .iter()
            .map(|e| keep(e).unwrap_or_else(|| Arc::new(ExperimentState::new(e, now_ns))))
            .collect();
        let arm_counters = config
            .experiments
            .iter()
            .map(|e| {
                e.arms
                    .iter()
                    .map(|a| metrics.arm_counters(&e.name, &a.name))
                    .collect()
            })
            .collect();
        Generation {
            number,
            storage_plugin: storage_plugin(&config.put.storage, &plugins),
            config: Arc::new(config),
            plugins,
            facts,
            load_failures,
            experiments,
            arm_counters,
        }
    }
}

struct Inner {
    tag: String,
    identity: NodeIdentity,
    locality: Locality,
    epoch: u64,
    /// The config generation in force.
    live: RwLock<Arc<Generation>>,
    /// Held for the whole of a reload (one at a time); removed plugins wait
    /// here until nothing uses them.
    reload: Mutex<reload::Book>,
    /// What the loader needs to make more instances (reloads).
    load_ctx: NodeContext,
    id_prefix: u64,
    next_id: AtomicU64,
    /// Keyed by ids this node made (a fast hash; see `kit::hash`).
    shards: Mutex<IdHashMap<ShardId, OwnedShard>>,
    cache: Mutex<Cache>,
    /// Copy destinations that came back, for later copies of the same length.
    copy_buffers: CopyBuffers,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
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
        let g = self.inner.live();
        f.debug_struct("Node")
            .field("name", &g.config.node.name)
            .field("tag", &self.inner.tag)
            .field("generation", &g.number)
            .field("plugins", &g.facts)
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
    pub fn start_with_clock(mut config: Config, clock: Arc<dyn Clock>) -> Result<Node, HostError> {
        for w in &config.warnings {
            tracing::warn!(target: "config", "{w}");
        }
        let epoch = unique_epoch(clock.now_unix_nanos());
        let tag = new_node_tag(epoch);
        if !config.node.name_given {
            config.node.name = unique_node_name();
        }
        let ctx = NodeContext {
            node_name: config.node.name.clone(),
            node_tag: tag.clone(),
            clock: Arc::clone(&clock),
            tags_used: Arc::default(),
        };
        let report = load_all(&config.plugins, &ctx);
        let refused: Vec<String> = report
            .failures
            .iter()
            .filter_map(|(e, _)| {
                let spec = config.plugins.iter().find(|s| e.plugin() == &s.name)?;
                config_refusal(e, spec).map(|c| c.to_string())
            })
            .collect();
        if !refused.is_empty() {
            return Err(HostError::PluginConfig(refused));
        }
        let (required, optional): (Vec<_>, Vec<_>) =
            report.failures.into_iter().partition(|(_, req)| *req);
        if !required.is_empty() {
            let mut errs: Vec<LoadError> = required.into_iter().map(|(e, _)| e).collect();
            errs.extend(optional.into_iter().map(|(e, _)| e));
            return Err(HostError::RequiredPlugins(errs));
        }
        let load_failures = optional.iter().map(|(e, _)| e.to_string()).collect();
        let mut rnd = [0u8; 8];
        let _ = getrandom::fill(&mut rnd);
        let metrics = Metrics::new(report.loaded.iter().map(|p| p.name.to_string()));
        let plugins: Vec<Arc<LoadedPlugin>> = report.loaded.into_iter().map(Arc::new).collect();
        tracing::info!(target: "node", node = %config.node.name, tag = %tag, plugins = plugins.len(), "node started");
        let started_ns = clock.monotonic_nanos();
        let cache = Cache::new(config.cache);
        let copy_buffers = CopyBuffers::new(config.fetch.copy_buffers);
        let book = reload::Book::started_from(&config.origin);
        let generation = Generation::new(
            0,
            config,
            plugins,
            load_failures,
            &metrics,
            |_| None,
            started_ns,
        );
        // Read once now what the first fetch would read (interfaces, host
        // names): a consumer that fetches once should not pay for it.
        let locality = Locality::new();
        locality.warm();
        Ok(Node {
            inner: Arc::new(Inner {
                tag,
                identity: NodeIdentity::current(),
                locality,
                epoch,
                live: RwLock::new(Arc::new(generation)),
                reload: Mutex::new(book),
                load_ctx: ctx,
                id_prefix: u64::from_le_bytes(rnd) ^ epoch,
                next_id: AtomicU64::new(1),
                shards: Mutex::default(),
                cache: Mutex::new(cache),
                copy_buffers,
                started_ns,
                clock: Arc::clone(&clock),
                metrics,
                fetch_seq: AtomicU64::new(0),
            }),
        })
    }

    /// This node as the owner written into its handles.
    fn owner(&self) -> Owner {
        Owner {
            addr: self.inner.live().config.node.advertise.clone(),
            identity: self.inner.identity.clone(),
            epoch: self.inner.epoch,
        }
    }

    /// The node's config in force now (a reload may replace it at any time).
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.inner.live().config)
    }

    /// The config generation in force: 0 at start, +1 per applied reload.
    pub fn generation(&self) -> u64 {
        self.inner.live().number
    }

    /// The node's unique tag.
    pub fn tag(&self) -> &str {
        &self.inner.tag
    }

    /// The node's locality identity.
    pub fn identity(&self) -> &NodeIdentity {
        &self.inner.identity
    }

    /// The plugins the config in force lists and that loaded.
    pub fn plugins(&self) -> Vec<Arc<LoadedPlugin>> {
        self.inner.live().plugins.clone()
    }

    /// The loaded plugin named `name`, if the config in force has it.
    pub fn plugin(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        let g = self.inner.live();
        g.plugins.iter().find(|p| p.name.as_str() == name).cloned()
    }

    /// One line per plugin that failed to load (optional plugins only; a
    /// required one stops the node).
    pub fn load_failures(&self) -> Vec<String> {
        self.inner.live().load_failures.clone()
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
        self.inner.copy_buffers.clear();
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
}

impl Inner {
    /// Appends to the metrics' event log, stamped with the node's clock.
    fn event(&self, kind: &str, experiment: Option<&str>, text: String) {
        let now_ms = self.clock.now_unix_nanos() / 1_000_000;
        self.metrics.event(now_ms, kind, experiment, text);
    }

    /// The generation in force (a fetch keeps it from start to end).
    fn live(&self) -> Arc<Generation> {
        Arc::clone(&self.live.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Unexports a shard from every transport that exported it, the storage
    /// transport last, then frees its bytes. When a transport fails to
    /// unexport (other than "not found"), it may still serve from the bytes,
    /// so they are leaked, loudly, rather than freed under it.
    fn unexport_all(&self, id: ShardId, shard: OwnedShard) {
        let mut still_lent = false;
        for p in &shard.exported_by {
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

/// The plugin whose allocator holds owned bytes under `storage = "pool"`;
/// `None` (the heap, with a warning) when it is not loaded or has no allocator.
fn storage_plugin(storage: &Storage, loaded: &[Arc<LoadedPlugin>]) -> Option<usize> {
    let Storage::Pool(t) = storage else {
        return None;
    };
    let found = loaded
        .iter()
        .position(|p| &p.name == t && p.capabilities().contains(Capabilities::ALLOCATOR));
    if found.is_none() {
        tracing::warn!(target: "store", transport = %t, "put.pool-transport is not loaded or has no allocator; shards will be stored on the heap");
    }
    found
}

/// The epoch of a node starting at `now` (Unix ns): `now`, or one more than
/// the last epoch this process handed out, so two nodes of one process
/// never share one (handles and segment names carry it), even under a
/// test clock.
fn unique_epoch(now: u64) -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let prev = LAST
        .fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |last| Some(now.max(last + 1)),
        )
        .unwrap_or_else(|last| last);
    now.max(prev + 1)
}

impl Inner {
    /// A destination for a copy of `len` bytes: one a finished copy of the
    /// same length left on the node's shelf (its old bytes still in it: the
    /// copy overwrites every one), else a fresh zeroed one. Either goes back
    /// to the shelf when its holder drops it.
    fn copy_destination(&self, len: u64) -> Result<CopyBuf, HostError> {
        let n = usize::try_from(len).map_err(|_| too_large(len))?;
        if let Some(buf) = self.copy_buffers.reuse(n) {
            return Ok(buf);
        }
        Ok(self.copy_buffers.adopt(zeroed(len)?))
    }
}

fn too_large(len: u64) -> HostError {
    HostError::InvalidShard(format!("{len} bytes do not fit in memory here"))
}

/// A zero-filled buffer of `len` bytes, or an error instead of an abort when
/// the allocation cannot be made.
fn zeroed(len: u64) -> Result<Vec<u8>, HostError> {
    let n = usize::try_from(len).map_err(|_| too_large(len))?;
    // Probe that large memory can be had (an error, not an abort, for a
    // size the allocator refuses; below `PROBE_FROM` a refusal is the
    // allocator's abort, as for any small allocation, and the probe would
    // double the cost of a small fetch), then take it zeroed from the
    // allocator: `vec![0; n]` is a calloc. It is not free: a block the
    // allocator maps fresh is zeroed by the kernel page by page, and one it
    // reuses from its heap (glibc's mmap threshold rises to the size of the
    // last large block freed) is cleared with memset; either way the bytes
    // are written twice, once zero and once by the copy. Copy fetches
    // therefore take their destinations from the node's shelf first
    // (`Inner::copy_destination`).
    const PROBE_FROM: usize = 1 << 20;
    if n >= PROBE_FROM {
        let mut probe = Vec::<u8>::new();
        probe
            .try_reserve_exact(n)
            .map_err(|e| HostError::InvalidShard(format!("cannot allocate {len} bytes: {e}")))?;
        drop(probe);
    }
    let mut buf = vec![0u8; n];
    if n >= HUGE_PAGES_FROM {
        // Before the copy touches a page: 2 MiB faults instead of 4 KiB ones
        // (a 256 MiB batch copy ran 3x slower than a single fetch without).
        shardport_kit::advise_huge_pages(&mut buf);
    }
    Ok(buf)
}

/// Fresh copy buffers at least this large get transparent huge pages (the
/// threshold NumPy uses for its arrays).
pub const HUGE_PAGES_FROM: usize = 4 << 20;
