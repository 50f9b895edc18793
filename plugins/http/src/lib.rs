//! # shardport-http: the HTTP transport
//!
//! An *implementation crate* of shardport's plugin system: a transport that
//! moves CPU shards between processes on any machines over HTTP/1.1. It is
//! the fallback that always reaches an owner when no same-node transport
//! can. Built as a `cdylib` the host loads by config (and as an `rlib` so its
//! tests run in-process).
//!
//! ```toml
//! [[plugin]]
//! name = "http"
//! path = "libshardport_http.so"
//! [plugin.config]
//! bind = "0.0.0.0:7071"
//! advertise = "node7.cluster.internal"   # the bound port is appended
//! auth-token-env = "SHARDPORT_TOKEN"
//! listen = "lazy"          # bind on the first export (default), or "eager"
//! ```
//!
//! The owner's server (and the runtime it runs on) starts on the first
//! `export`, or at construction with `listen = "eager"`: a process that only
//! fetches binds no port. The owner serves exported shards straight from
//! the memory the host lent to `export` (no copy); `unexport` waits until no response still reads
//! them. A consumer is a blocking client that runs on the calling host
//! thread (no runtime hop): it reads each response body from the socket
//! straight into the host's destination buffer over pooled kept-alive
//! connections, and batches `import_many` into one request per owner (owners
//! in parallel on scoped threads). The owner's server runs on the plugin's
//! own tokio runtime (`threads` workers); the ABI stays synchronous.
//!
//! ## Where to start reading
//! `server` (owner side: registry, HTTP handlers, timeouts), `client`
//! (consumer side: pool, reads into destinations, batches), `head` (the
//! consumer's request heads and response-head parser), `wire` (the
//! protocol's framings), `descriptor`, `config`, and `sys`, the only module
//! with `unsafe`. The README has the operator's view: config keys, the wire
//! protocol, failure modes.

#![deny(unsafe_code)]

mod client;
mod config;
mod descriptor;
/// Entry points for the fuzz targets in `fuzz/` (not a stable API).
#[doc(hidden)]
pub mod fuzzing;
#[allow(unsafe_code)]
mod gpu;
mod head;
mod relay;
mod server;
mod stats;
#[allow(unsafe_code)]
mod sys;
mod tls;
mod wire;

#[cfg(test)]
mod tests;

use std::{
    cell::RefCell,
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, OnceLock, PoisonError,
    },
    time::Duration,
};

use shardport_abi::{
    AbiError, Capabilities, ExportRequest, Health, IdentityParts, ImportInfo, ImportItem,
    PluginContext, PluginResult, ShardId, ShardMeta, Stat, TransportBox, TransportInfo,
};
use shardport_kit::{self as kit, PlainTransport};

use crate::{
    client::{Client, DeviceRing, Job, Owner, RelaySetup},
    config::{Config, Listen},
    descriptor::Descriptor,
    relay::{wire::Serves, Holdings},
    server::{Server, SHUTDOWN_GRACE},
    stats::{RelayGauges, Stats},
};

/// The transport's name, the key its descriptors are filed under.
pub const TRANSPORT_NAME: &str = "http";

/// How long dropping the transport waits for runtime tasks after the
/// server's own drain (connections are closed by then; this covers tasks
/// that are mid-poll).
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);
/// Blocking threads of the server's runtime (GPU staging and the hashing
/// of relayed shards; this bounds what they can start).
const MAX_BLOCKING_THREADS: usize = 4;
/// Relayed shards of one `import_many` fetched at once (at most
/// `max-connections-per-owner`: each may hold a connection to the owner
/// for its whole stream, and the others' joins need one).
const RELAY_THREADS: usize = 8;
/// Removal notices to relay holders sent at once.
const REMOVAL_FANOUT: usize = 16;
/// Removals waiting for their notices to be sent; beyond it a removal's
/// holders are not told (their copies expire with `relay-keep`, and no
/// consumer is sent to them: joins answer 404).
const REMOVAL_QUEUE: usize = 4096;

thread_local! {
    /// The host's log forwarding, installed on every runtime thread so
    /// events from server tasks reach the host.
    static THREAD_DISPATCH: RefCell<Option<tracing::dispatcher::DefaultGuard>> =
        const { RefCell::new(None) };
}

/// One http transport instance: an owner side (server, on the runtime,
/// started on first use) and a consumer side (blocking client pool, on the
/// calling threads).
struct HttpTransport {
    ctx: PluginContext,
    cfg: Config,
    /// The server and its runtime, once started.
    serving: OnceLock<Serving>,
    /// Serialises starting; holds why the last start failed (for `health`).
    start_error: Mutex<Option<AbiError>>,
    /// TLS configs built from the `tls-*` files at construction.
    tls: tls::Tls,
    client: Arc<Client>,
    stats: Arc<Stats>,
    /// Relay copies of shards this node fetched (`relay = "on"`).
    holdings: Arc<Holdings>,
    /// Warned once that this node cannot serve relay copies.
    relay_leaf_warned: AtomicBool,
    /// The queue of removals to tell relay holders of (its thread starts
    /// with the first; `None` if it could not start).
    notices: OnceLock<Option<std::sync::mpsc::SyncSender<Removal>>>,
}

/// A removed shard and the relay holders to tell.
type Removal = (ShardId, Vec<Serves>);

/// The owner side once started.
struct Serving {
    /// `Some` until dropped.
    rt: Option<tokio::runtime::Runtime>,
    server: Server,
}

impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport")
            .field("instance", &self.ctx.instance())
            .field("bound", &self.serving.get().map(|s| s.server.bound()))
            .finish_non_exhaustive()
    }
}

/// Builds a transport instance from the host context: validates the config
/// table (unknown keys are errors) and sets up the client. The server binds
/// on the first export (a bind failure names the address, in that export's
/// error), or here with `listen = "eager"`. This is the constructor the
/// plugin exports.
pub fn create(ctx: PluginContext) -> PluginResult<TransportBox> {
    Ok(kit::into_transport_box(HttpTransport::new(ctx)?))
}

/// Starts the runtime and binds the server (a bind failure names the address).
fn start(
    cfg: &Config,
    tls: &tls::Tls,
    stats: &Arc<Stats>,
    holdings: &Arc<Holdings>,
    client: &Arc<Client>,
) -> PluginResult<Serving> {
    // Called inside the context's guard, whose dispatcher forwards events to
    // the host: hand it to every runtime thread.
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.threads)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name("shardport-http")
        .enable_io()
        .enable_time()
        .on_thread_start(move || {
            let guard = tracing::dispatcher::set_default(&dispatch);
            THREAD_DISPATCH.with(|g| *g.borrow_mut() = Some(guard));
        })
        .on_thread_stop(|| {
            THREAD_DISPATCH.with(|g| drop(g.borrow_mut().take()));
        })
        .build()
        .map_err(|e| AbiError::io("cannot start the http transport's runtime", &e))?;
    let server = Server::start(
        cfg,
        tls.server.clone(),
        rt.handle(),
        Arc::clone(stats),
        Arc::clone(holdings),
        Arc::clone(client),
    )?;
    tracing::info!(
        target: "http",
        bound = %server.bound(),
        advertised = server.advertised(),
        auth = cfg.auth_token.is_some(),
        tls = server.tls(),
        mutual_tls = server.tls() && cfg.tls.client_auth == config::ClientAuth::Required,
        "http transport serving"
    );
    Ok(Serving {
        rt: Some(rt),
        server,
    })
}

impl HttpTransport {
    fn new(ctx: PluginContext) -> PluginResult<HttpTransport> {
        let cfg = Config::parse(ctx.instance(), ctx.config())?;
        let stats = Arc::new(Stats::default());
        let tls = tls::setup(&cfg)?;
        let client = Arc::new(Client::new(&cfg, tls.client.clone(), Arc::clone(&stats))?);
        let holdings = Arc::new(Holdings::new(
            cfg.relay.cache,
            cfg.relay.window,
            cfg.relay.keep,
        ));
        let t = HttpTransport {
            ctx,
            cfg,
            serving: OnceLock::new(),
            start_error: Mutex::new(None),
            tls,
            client,
            stats,
            holdings,
            relay_leaf_warned: AtomicBool::new(false),
            notices: OnceLock::new(),
        };
        if t.cfg.listen == Listen::Eager {
            t.serving()?;
        }
        Ok(t)
    }

    /// The owner side, started now if this is its first use. A failure goes
    /// to the caller; the next call tries again.
    fn serving(&self) -> PluginResult<&Serving> {
        if let Some(s) = self.serving.get() {
            return Ok(s);
        }
        let mut last = kit::lock(&self.start_error);
        if let Some(s) = self.serving.get() {
            return Ok(s);
        }
        match start(
            &self.cfg,
            &self.tls,
            &self.stats,
            &self.holdings,
            &self.client,
        ) {
            Ok(s) => {
                *last = None;
                Ok(self.serving.get_or_init(|| s))
            }
            Err(e) => {
                *last = Some(e.clone());
                Err(e)
            }
        }
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        let r = self.import_checked(desc, meta, dst);
        self.count(&r, meta.byte_len);
        r
    }

    /// A GPU shard into device memory at `dst` (of `dst_len` bytes).
    fn import_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        kit::check::device_destination(dst_len, meta)?;
        let d = Descriptor::decode(desc)?;
        kit::check::declared_len("http descriptor", "len", d.len, meta)?;
        let ring = DeviceRing {
            staging: self.cfg.staging,
            buffers: self.cfg.device_buffers,
            piece: self.cfg.device_piece,
        };
        // The caller's thread keeps its CUDA context whatever this binds.
        let _restore = gpu::ContextGuard::save();
        let ordinal = self.cfg.staging.device_of(dst).map_err(|why| {
            AbiError::unavailable(format!("http cannot copy into device memory here: {why}"))
        })?;
        let _span =
            tracing::debug_span!(target: "http", "fetch_device", shard = %d.id, owner = %d.addr)
                .entered();
        let relayed = if self.relays(&d) {
            self.client
                .fetch_relayed_device(&d, ordinal, dst, &ring, &self.relay_setup(&d))
        } else {
            Ok(None)
        };
        let r = match relayed {
            Ok(Some(info)) => Ok(info),
            Ok(None) => self.client.fetch_one_device(&d, ordinal, dst, &ring),
            Err(e) => Err(e),
        };
        self.count(&r, meta.byte_len);
        r.map(|i| ImportInfo {
            note: format!("{} staged into cuda:{ordinal}", i.note).into(),
        })
    }

    fn import_checked(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        let d = check_item(desc, meta, dst.len())?;
        let _span =
            tracing::debug_span!(target: "http", "fetch", shard = %d.id, owner = %d.addr).entered();
        self.fetch_one(&d, dst)
    }

    /// One shard: through its relay tree when relaying applies, else (or
    /// when its owner does not relay it) straight from the owner.
    fn fetch_one(&self, d: &Descriptor, dst: &mut [u8]) -> PluginResult<ImportInfo> {
        if self.relays(d) {
            if let Some(info) = self.client.fetch_relayed(d, dst, &self.relay_setup(d))? {
                return Ok(info);
            }
        }
        self.client.fetch_one(d, dst)
    }

    /// Whether a fetch of `d` goes through the owner's relay tree.
    fn relays(&self, d: &Descriptor) -> bool {
        self.cfg.relay.on && d.len > 0 && d.len >= self.cfg.relay.min_size
    }

    /// This node's part in relaying `d`: where it serves copies (starting
    /// its server), or a leaf when it cannot serve the owner's peers.
    fn relay_setup(&self, d: &Descriptor) -> RelaySetup<'_> {
        let serves = match self.serving() {
            Ok(s) if reaches_peers_of(s.server.advertised(), &d.addr) => Some(Serves {
                addr: s.server.advertised().to_owned(),
                tls: s.server.tls(),
            }),
            Ok(s) => {
                self.warn_leaf(&format!(
                    "it advertises the loopback address {} and the owner {} is on another \
                     machine (set `bind`/`advertise`)",
                    s.server.advertised(),
                    d.addr
                ));
                None
            }
            Err(e) => {
                self.warn_leaf(&format!("its server cannot start: {}", e.message));
                None
            }
        };
        RelaySetup {
            serves,
            serves_client_auth: self.cfg.tls.client_auth == config::ClientAuth::Required,
            holdings: &self.holdings,
            stall: self.cfg.relay.stall_timeout,
            min_piece: config::MIN_RELAY_PIECE,
            sources: self.cfg.relay.sources,
            lag: self.cfg.relay.lag,
        }
    }

    fn warn_leaf(&self, why: &str) {
        if !self.relay_leaf_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "http", "relay = \"on\" but this node fetches as a leaf and serves no relay copies: {why}");
        }
    }

    /// Relay-eligible items, each through its tree, `RELAY_THREADS` at once.
    fn fetch_relayed_items(
        &self,
        jobs: Vec<(usize, Descriptor, &mut [u8])>,
    ) -> Vec<(usize, PluginResult<ImportInfo>)> {
        let queue = Mutex::new(jobs);
        let work = || {
            let mut out = Vec::new();
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some((index, d, dst)) = next else {
                    break out;
                };
                out.push((index, self.fetch_one(&d, dst)));
            }
        };
        let n = queue.lock().unwrap_or_else(PoisonError::into_inner).len();
        let threads = n.min(RELAY_THREADS).min(self.cfg.max_connections_per_owner);
        client::on_threads(threads, "shardport-http-relay", work)
    }

    /// Queues a removal for the relay holders of `id`: one long-lived
    /// thread per transport sends the notices (`unexport` does not wait for
    /// the holders), `REMOVAL_FANOUT` at a time.
    fn tell_holders(&self, id: ShardId, holders: Vec<Serves>) {
        if holders.is_empty() {
            return;
        }
        let notices = self.notices.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Removal>(REMOVAL_QUEUE);
            let client = Arc::clone(&self.client);
            let stats = Arc::clone(&self.stats);
            let dispatch = tracing::dispatcher::get_default(Clone::clone);
            let sender = move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    for (id, holders) in rx {
                        send_removals(&client, &stats, id, &holders);
                    }
                });
            };
            match std::thread::Builder::new()
                .name("shardport-http-relay-rm".into())
                .spawn(sender)
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(target: "http", error = %e, "cannot start the thread that tells relay holders of removals; their copies expire with relay-keep");
                    None
                }
            }
        });
        let queued = notices
            .as_ref()
            .is_some_and(|tx| tx.try_send((id, holders)).is_ok());
        if !queued {
            self.stats.relay_removal_failures.inc();
        }
    }

    fn import_many(&self, items: &mut [ImportItem<'_>]) -> Vec<PluginResult<ImportInfo>> {
        let mut results: Vec<Option<PluginResult<ImportInfo>>> =
            items.iter().map(|_| None).collect();
        let lens: Vec<u64> = items.iter().map(|i| i.meta.byte_len).collect();
        // Group the valid items by owner, keeping request order within each.
        let mut owners: Vec<(Owner, Vec<Job<'_>>)> = Vec::new();
        let mut by_addr: HashMap<Owner, usize> = HashMap::new();
        let mut relayed = Vec::new();
        for (index, item) in items.iter_mut().enumerate() {
            let dst = item.dst.as_mut_slice();
            match check_item(item.desc.as_slice(), item.meta, dst.len()) {
                Err(e) => results[index] = Some(Err(e)),
                Ok(d) if self.relays(&d) => relayed.push((index, d, dst)),
                Ok(d) => {
                    let owner = Owner::of(&d);
                    let slot = *by_addr.entry(owner.clone()).or_insert_with(|| {
                        owners.push((owner, Vec::new()));
                        owners.len() - 1
                    });
                    owners[slot].1.push(Job {
                        index,
                        id: d.id,
                        dst,
                    });
                }
            }
        }
        // Relayed shards on their own threads, the batches meanwhile.
        let done = std::thread::scope(|s| {
            let relaying = (!relayed.is_empty()).then(|| {
                let dispatch = tracing::dispatcher::get_default(Clone::clone);
                s.spawn(move || {
                    tracing::dispatcher::with_default(&dispatch, || {
                        self.fetch_relayed_items(relayed)
                    })
                })
            });
            let mut done = self.client.fetch_many(owners);
            if let Some(j) = relaying {
                match j.join() {
                    Ok(v) => done.extend(v),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            done
        });
        for (index, r) in done {
            results[index] = Some(r);
        }
        results
            .into_iter()
            .zip(lens)
            .map(|(r, len)| {
                let r = r.unwrap_or_else(|| Err(AbiError::internal("item was never fetched")));
                self.count(&r, len);
                r
            })
            .collect()
    }

    fn count(&self, r: &PluginResult<ImportInfo>, len: u64) {
        match r {
            Ok(_) => {
                self.stats.fetches.inc();
                self.stats.bytes_fetched.add(len);
            }
            Err(_) => self.stats.fetch_errors.inc(),
        }
    }

    fn health(&self) -> Health {
        let Some(serving) = self.serving.get() else {
            let last = kit::lock(&self.start_error).clone();
            return match last {
                Some(e) => kit::guard::failing(format!("cannot serve: {}", e.message)),
                None => kit::guard::ok(format!(
                    "not serving yet: binds {} on the first export",
                    self.cfg.bind_text
                )),
            };
        };
        let server = &serving.server;
        match server.unhealthy() {
            Some(why) => kit::guard::failing(format!("not serving on {}: {why}", server.bound())),
            None => kit::guard::ok(format!(
                "serving on {} (advertised as {}){}",
                server.bound(),
                server.advertised(),
                if server.tls() { " over TLS" } else { "" }
            )),
        }
    }
}

/// What `describe` reports: CPU and GPU shards to any node, copies only
/// (GPU shards staged through host memory, see `gpu`).
fn info() -> TransportInfo {
    TransportInfo {
        name: TRANSPORT_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        capabilities: Capabilities::CPU.with(Capabilities::CUDA),
        needs_identity: IdentityParts::default(),
    }
}

/// Tells each of `holders` that `id` is removed, `REMOVAL_FANOUT` at once.
fn send_removals(client: &Client, stats: &Stats, id: ShardId, holders: &[Serves]) {
    for group in holders.chunks(REMOVAL_FANOUT) {
        std::thread::scope(|s| {
            let sent: Vec<_> = group
                .iter()
                .map(|h| (h, s.spawn(|| client.drop_copy(h, id))))
                .collect();
            for (h, j) in sent {
                match j.join() {
                    Ok(Ok(())) => stats.relay_removals_sent.inc(),
                    Ok(Err(e)) => {
                        stats.relay_removal_failures.inc();
                        tracing::warn!(target: "http", shard = %id, holder = %h.addr, error = %e.message, "a relay holder was not told of a removal; its copy expires with relay-keep, and no consumer is sent to it any more");
                    }
                    Err(_) => stats.relay_removal_failures.inc(),
                }
            }
        });
    }
}

/// Whether a node advertising `advertised` can serve the peers of the owner
/// at `owner`: always, unless it advertises a loopback address and the
/// owner is not on loopback (its other consumers are on other machines).
fn reaches_peers_of(advertised: &str, owner: &str) -> bool {
    let loopback = |a: &str| {
        descriptor::parse_host_port(a)
            .ok()
            .and_then(|(h, _)| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
            .is_some_and(|ip| ip.is_loopback())
    };
    !loopback(advertised) || loopback(owner)
}

/// Validates one import: destination length against the metadata, the
/// descriptor, and the descriptor's length against the metadata.
fn check_item(desc: &[u8], meta: &ShardMeta, dst_len: usize) -> PluginResult<Descriptor> {
    kit::check::destination(dst_len, meta)?;
    let d = Descriptor::decode(desc)?;
    kit::check::declared_len("http descriptor", "len", d.len, meta)?;
    Ok(d)
}

impl Drop for HttpTransport {
    fn drop(&mut self) {
        let grace = SHUTDOWN_GRACE.min(self.cfg.request_timeout);
        let ctx = self.ctx.clone();
        let Some(serving) = self.serving.get_mut() else {
            return;
        };
        // Never unwind out of a drop that runs behind the ABI; the guard
        // logs a panic (to the host) and swallows it.
        ctx.guard_infallible("drop", (), || {
            serving.server.shutdown(grace);
            if let Some(rt) = serving.rt.take() {
                if tokio::runtime::Handle::try_current().is_ok() {
                    // Dropped from inside an async context of the same tokio
                    // (an rlib user), where blocking would panic.
                    rt.shutdown_background();
                } else {
                    rt.shutdown_timeout(RUNTIME_SHUTDOWN);
                }
            }
        });
    }
}

/// Plain types; `kit::Guarded` runs each method under the context's guard
/// and answers `UNSUPPORTED` for views and the allocator.
impl PlainTransport for HttpTransport {
    const NAME: &'static str = TRANSPORT_NAME;

    fn context(&self) -> &PluginContext {
        &self.ctx
    }

    fn describe(&self) -> TransportInfo {
        info()
    }

    fn export(&self, req: &ExportRequest) -> PluginResult<Vec<u8>> {
        self.serving()?.server.export(req)
    }

    fn unexport(&self, id: ShardId) -> PluginResult<()> {
        match self.serving.get() {
            Some(s) => {
                let (r, holders) = s.server.unexport(id);
                self.tell_holders(id, holders);
                r
            }
            None => Err(AbiError::not_found(format!(
                "shard {id} is not exported by this http transport"
            ))),
        }
    }

    fn import_into(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst: &mut [u8],
    ) -> PluginResult<ImportInfo> {
        HttpTransport::import_into(self, desc, meta, dst)
    }

    fn stats(&self) -> Vec<Stat> {
        let serving = self.serving.get();
        let (shards, bytes) = serving.map_or((0, 0), |s| s.server.registry().totals());
        let (copies, copy_bytes) = self.holdings.totals();
        let relay = RelayGauges {
            trees: serving.map_or(0, |s| s.server.relay_trees() as u64),
            copies,
            copy_bytes,
        };
        let mut out = self.stats.snapshot(shards, bytes, relay);
        let staging = serving.map_or(0, |s| s.server.staging_buffers());
        out.push(Stat::gauge(
            "device_staging_bytes",
            (staging * self.cfg.device_piece) as u64,
        ));
        out
    }

    fn health(&self) -> Health {
        HttpTransport::health(self)
    }

    /// One request per owner (a panic, logged by the guard, fails every item).
    fn import_many(&self, items: &mut [ImportItem<'_>]) -> Vec<PluginResult<ImportInfo>> {
        HttpTransport::import_many(self, items)
    }

    fn import_into_device(
        &self,
        desc: &[u8],
        meta: &ShardMeta,
        dst_addr: u64,
        dst_len: u64,
    ) -> PluginResult<ImportInfo> {
        self.import_device(desc, meta, dst_addr, dst_len)
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
