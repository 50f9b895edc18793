//! The matrix: sizes x paths x operations, each cell warm-up iterations
//! then timed repetitions, with real owner and consumer processes.
//!
//! - `put`: this process puts the shard from a warm buffer into a node that
//!   exports it through the path's transport only (plus the storage
//!   transport, which always exports what it holds). The pool is cycled
//!   once before the first put so its pages are backed and touched.
//! - `fetch`: an owner process (`shardport worker`) holds the shard; this
//!   process fetches it through the path (the handle keeps only that
//!   transport's export): a view, or a copy into a warm buffer.
//! - `put-fetch`: the owner process puts from its warm buffer, a separate
//!   consumer process fetches (a view, or into its warm buffer). The time is
//!   the owner's put plus the consumer's fetch, each timed inside its own
//!   process; passing the handle between them (the application's RPC, here
//!   a pipe through this process) is not counted.
//!
//! After each of a cell's repetitions this process takes one sample of the
//! cell's limit (a memcpy of the same size, a TCP round trip carrying it, or
//! their sum, see [`limit_parts`]), so the cell and its limit see the same
//! load on the machine; the ratio is the limit's median over the cell's.
//! A limit that is one copy has several ways to do it (one memcpy, 256 KiB
//! pieces, split across cores; between anonymous buffers or to/from shared
//! memory): below 4 MiB its samples take the ways in turn, one copy each,
//! so every way's copy starts from the cache state a cell sample leaves,
//! and the limit is the way with the lowest median (`Runner::rotation`);
//! from 4 MiB up each sample is the fastest of all ways back to back.
//!
//! The first repetition of each cell verifies every byte against the
//! pattern (after its timing).

use std::{
    collections::{BTreeMap, HashMap},
    hint::black_box,
    time::{Duration, Instant},
};

use shardport_abi::{DeviceKind, ShardId};

use super::{
    cell::{limit_parts, LimitPart},
    limits::{copy_by, copy_ways, memcpy_once, CopyWay, TcpPair},
    spec::{Op, PathSpec},
    stats::Summary,
    BenchError, BenchOptions,
};
use crate::{
    gpu::{self, DeviceMem, GpuLimits},
    worker::{check_pattern, fill_pattern, Request, WorkerProcess},
};
use shardport_host::{
    handle::Handle,
    node::{Fetched, Node, TensorSpec},
    vocab::{FetchMode, Storage, TransportName},
    DevicePtr,
};

/// Runs cells; owns the nodes and processes they share.
pub struct Runner<'a> {
    opts: &'a BenchOptions,
    /// This process as a consumer.
    consumer: &'a Node,
    /// This process as an owner, one node per transport exported.
    put_nodes: HashMap<&'static str, Node>,
    owner: Option<WorkerProcess>,
    consumer_proc: Option<WorkerProcess>,
    sampler: LimitSampler,
    seed: u64,
    /// Device memory of this process for the GPU paths: the put source
    /// `(size, memory)` holding the pattern for seed 1, and a fetch
    /// destination.
    device_source: Option<(u64, DeviceMem)>,
    device_dst: Option<DeviceMem>,
    /// [`owner_poll_ends`] of this config.
    owner_poll_ends: std::time::Duration,
}

/// How long after a response an http owner of this config may still poll
/// for the next request: the longest `owner-spin` of its http instances
/// (the plugin's default, 200 us, where unset), and 50 us of room.
fn owner_poll_ends(node: &Node) -> std::time::Duration {
    const PLUGIN_DEFAULT: std::time::Duration = std::time::Duration::from_micros(200);
    node.config()
        .plugins
        .iter()
        .filter(|p| p.transport.as_str() == "http")
        .map(|p| {
            shardport_kit::options::Options::parse(p.name.as_str(), &p.config_text)
                .ok()
                .and_then(|o| o.opt_duration("owner-spin").ok().flatten())
                .unwrap_or(PLUGIN_DEFAULT)
        })
        .max()
        .unwrap_or_default()
        + std::time::Duration::from_micros(50)
}

/// Takes limit samples between a cell's samples.
struct LimitSampler {
    /// Warm source bytes, as long as the largest size (also the put source).
    source: Vec<u8>,
    /// The same bytes in shared memory, and shared memory to copy into
    /// (`None` where posix-shm is not loaded).
    shm: Option<ShmLimits>,
    /// Warm memcpy destination, as long as the largest size.
    dst: Vec<u8>,
    /// The TCP pair for the current size.
    tcp: Option<(u64, TcpPair)>,
    /// Device and pinned buffers for the GPU paths' limits (made at first use).
    gpu: Option<GpuLimits>,
    /// A TCP pair carrying [`STAGED_PIECE`]-byte pieces (made at first use).
    tcp_pieces: Option<TcpPair>,
}

/// The piece a staged GPU fetch sends at a time: the http plugin's default
/// `device-piece`. Its TCP limit streams pieces of this size.
const STAGED_PIECE: u64 = 4 << 20;

/// Shared memory for the memcpy limit: on this project's VMs a copy out of
/// or into a tmpfs mapping runs up to ~15% faster than the same copy
/// between anonymous buffers (a C loop of 256 MiB copies: 22.9-23.6 ms out
/// of shm against 26.0-28.1 ms in one run), so a limit measured on
/// anonymous memory alone was beaten by the shm copy fetch (1.11-1.18x,
/// flagged suspect) and, once puts split large copies across cores, by
/// the put. A node of its own (posix-shm alone, a pool for two of the
/// largest shards) holds the source bytes, viewed zero-copy by the
/// consumer, and lends the space a put writes into.
struct ShmLimits {
    /// Declared first: the view's lease ends before its owner node stops.
    view: Fetched,
    node: Node,
}

impl ShmLimits {
    fn new(opts: &BenchOptions, consumer: &Node, bytes: &[u8]) -> Result<ShmLimits, BenchError> {
        let shm = TransportName::new("posix-shm").map_err(other)?;
        let mut cfg = opts.config.clone();
        cfg.plugins.retain(|p| p.transport == shm);
        let spec = cfg
            .plugins
            .first_mut()
            .ok_or_else(|| other("posix-shm is not in the config"))?;
        let pool = (2 * bytes.len() as u64 + (2 << 20)).next_multiple_of(1 << 20);
        spec.config_text = format!("allocation = \"pool\"\npool-size = {pool}");
        cfg.put.storage = Storage::Pool(shm.clone());
        cfg.put.export_to = Some(vec![shm]);
        let node = Node::start(cfg)?;
        let h = node.put(
            bytes,
            &TensorSpec::bytes(bytes.len() as u64),
            BTreeMap::new(),
        )?;
        let view = consumer.fetch_mode(&h, FetchMode::View)?;
        if !view.data.is_view() {
            return Err(other("the shared-memory limit source is not a view"));
        }
        let limits = ShmLimits { view, node };
        limits.copy_in(bytes, memcpy_once)?; // faults the destination's pages in
        Ok(limits)
    }

    /// A copy of `src` into pool space by `copy` (which times itself),
    /// timed inside the put, so the put's own work is not counted.
    fn copy_in(
        &self,
        src: &[u8],
        copy: impl FnOnce(&[u8], &mut [u8]) -> Duration,
    ) -> Result<Duration, BenchError> {
        let mut took = Duration::ZERO;
        let h = self.node.put_with(
            &TensorSpec::bytes(src.len() as u64),
            BTreeMap::new(),
            |dst| took = copy(src, dst),
        )?;
        self.node.remove(&[h.id]);
        Ok(took)
    }
}

/// Where a limit's copy reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Between warm anonymous buffers.
    Anon,
    /// Into pool space in shared memory (what a put writes).
    IntoShm,
    /// Out of a shared-memory mapping (what a copy fetch reads).
    OutOfShm,
}

impl LimitSampler {
    /// Every way a single-copy limit (`part` a memcpy part) can be done at
    /// `n` bytes: each [`CopyWay`] between warm anonymous buffers, and into
    /// (put) or out of (copy fetch) shared memory where posix-shm is loaded.
    fn copy_ways(&self, part: LimitPart, n: usize) -> Vec<(Place, CopyWay)> {
        let shm = match part {
            LimitPart::Memcpy => Place::IntoShm,
            LimitPart::MemcpyFromShm => Place::OutOfShm,
            LimitPart::Tcp | LimitPart::DeviceCopy | LimitPart::Staged => return Vec::new(),
        };
        let places = [Place::Anon]
            .into_iter()
            .chain(self.shm.as_ref().map(|_| shm));
        places
            .flat_map(|p| copy_ways(n).iter().map(move |&w| (p, w)))
            .collect()
    }

    /// One copy of `n` bytes done one way, timed.
    fn copy_one(
        &mut self,
        (place, way): (Place, CopyWay),
        n: usize,
    ) -> Result<Duration, BenchError> {
        let shm = || {
            self.shm
                .as_ref()
                .ok_or_else(|| other("no shared memory for the limit"))
        };
        Ok(match place {
            Place::Anon => copy_by(way, &self.source[..n], &mut self.dst[..n]),
            // A failed put into the pool leaves the anonymous copy (as in
            // `sample`).
            Place::IntoShm => match shm()?.copy_in(&self.source[..n], |s, d| copy_by(way, s, d)) {
                Ok(d) => d,
                Err(_) => copy_by(way, &self.source[..n], &mut self.dst[..n]),
            },
            Place::OutOfShm => {
                let data = &shm()?.view.data[..n];
                copy_by(way, data, &mut self.dst[..n])
            }
        })
    }

    /// One sample of the limit made of `parts` at `size`.
    fn sample(&mut self, parts: &[LimitPart], size: u64) -> Result<Duration, BenchError> {
        let n = size as usize;
        let mut total = Duration::ZERO;
        for part in parts {
            total += match part {
                LimitPart::Memcpy => {
                    let anon = memcpy_once(&self.source[..n], &mut self.dst[..n]);
                    match &self.shm {
                        // A failed put into the pool leaves the anonymous copy.
                        Some(shm) => shm
                            .copy_in(&self.source[..n], memcpy_once)
                            .map_or(anon, |d| anon.min(d)),
                        None => anon,
                    }
                }
                LimitPart::MemcpyFromShm => {
                    let anon = memcpy_once(&self.source[..n], &mut self.dst[..n]);
                    match &self.shm {
                        Some(shm) => anon.min(memcpy_once(&shm.view.data[..n], &mut self.dst[..n])),
                        None => anon,
                    }
                }
                LimitPart::Tcp => self.tcp(size)?,
                LimitPart::DeviceCopy => self.gpu()?.device_copy(size).map_err(other)?,
                LimitPart::Staged => {
                    let d2h = self.gpu()?.to_host(size).map_err(other)?;
                    let tcp = self.tcp_in_pieces(size)?;
                    let h2d = self.gpu()?.to_device(size).map_err(other)?;
                    d2h.max(tcp).max(h2d)
                }
            };
        }
        Ok(total)
    }

    /// One sample of the raw TCP limit at `size`.
    fn tcp(&mut self, size: u64) -> Result<Duration, BenchError> {
        if self.tcp.as_ref().is_none_or(|(s, _)| *s != size) {
            self.tcp = None; // one pair at a time
            let pair =
                TcpPair::new(size as usize).map_err(|e| other(format!("raw TCP loopback: {e}")))?;
            self.tcp = Some((size, pair));
        }
        let (_, pair) = self.tcp.as_mut().expect("just set");
        pair.best()
            .map_err(|e| other(format!("raw TCP loopback: {e}")))
    }

    /// One sample of the raw TCP limit of `size` bytes sent as staged
    /// pieces ([`STAGED_PIECE`] each, from and into cache-resident buffers):
    /// a shard of one piece or less is one round trip of its own size.
    fn tcp_in_pieces(&mut self, size: u64) -> Result<Duration, BenchError> {
        if size <= STAGED_PIECE {
            return self.tcp(size);
        }
        let err = |e: std::io::Error| other(format!("raw TCP loopback: {e}"));
        if self.tcp_pieces.is_none() {
            self.tcp_pieces = Some(TcpPair::new(STAGED_PIECE as usize).map_err(err)?);
        }
        let pair = self.tcp_pieces.as_mut().expect("just made");
        pair.best_carrying(size).map_err(err)
    }

    /// The GPU limits' buffers, made at first use (as long as the largest
    /// size).
    fn gpu(&mut self) -> Result<&mut GpuLimits, BenchError> {
        if self.gpu.is_none() {
            let largest = self.source.len() as u64;
            self.gpu = Some(GpuLimits::new(largest).map_err(other)?);
        }
        Ok(self.gpu.as_mut().expect("just made"))
    }
}

/// A cell's own timings and the limit timings taken between them.
pub struct Timings {
    /// The cell's samples.
    pub cell: Vec<Duration>,
    /// Limit samples, one after each cell sample (empty: no limit).
    pub limit: Vec<Duration>,
}

/// From this size up a single-copy limit tries all its ways back to back
/// in every sample (the bytes no longer fit in L2, and taken one way per
/// sample the limit was slower than the product's own copy: the 64 MiB put,
/// which copies with `kit::copy`, ran 1.10-1.17x of every way measured
/// that way, `kit::copy` included; not understood, so not used).
const ROTATE_BELOW: u64 = 4 << 20;

/// The samples of the way with the lowest median (as the report computes
/// it), when the `i`-th sample after the `warmup` first was taken the
/// `i % ways`-th way; warm-up samples are dropped. With fewer timed
/// samples than ways, the ways never sampled do not compete.
fn fastest_way(samples: Vec<Duration>, ways: usize, warmup: usize) -> Vec<Duration> {
    let ways = ways.max(1);
    let mut by_way = vec![Vec::new(); ways];
    for (i, d) in samples.into_iter().skip(warmup).enumerate() {
        by_way[i % ways].push(d);
    }
    let median = |v: &Vec<Duration>| Summary::of(v).map_or(f64::INFINITY, |s| s.median_us);
    by_way
        .into_iter()
        .filter(|v| !v.is_empty())
        .min_by(|a, b| median(a).total_cmp(&median(b)))
        .unwrap_or_default()
}

fn other(msg: impl Into<String>) -> BenchError {
    BenchError::Other(msg.into())
}

/// Puts `len` pattern bytes in the owner process; returns the id and the decoded handle.
pub fn put_remote(
    owner: &mut WorkerProcess,
    len: u64,
    seed: u64,
) -> Result<(String, Handle), BenchError> {
    let put = owner.call(&Request::Put {
        len,
        seed,
        dtype: None,
        tags: Default::default(),
    })?;
    let handle = decode(put.handle.as_deref().unwrap_or_default())?;
    Ok((put.id.unwrap_or_default(), handle))
}

fn decode(hex_text: &str) -> Result<Handle, BenchError> {
    let bytes = hex::decode(hex_text).map_err(|e| other(format!("owner sent bad hex: {e}")))?;
    Handle::from_bytes(&bytes).map_err(|e| other(format!("owner sent a bad handle: {e}")))
}

/// Keeps only `transport`'s export of `h`.
pub fn only(mut h: Handle, transport: &str) -> Result<Handle, BenchError> {
    if !h.keep_only(transport) {
        return Err(other(format!(
            "the owner did not export through {transport}"
        )));
    }
    Ok(h)
}

/// Bytes of the pool of `node`'s storage transport (0 without a pool).
pub fn pool_bytes(node: &Node) -> u64 {
    node.stats()
        .plugins
        .iter()
        .find_map(|p| p.stats.get("pool_bytes_total").copied())
        .unwrap_or(0)
}

impl<'a> Runner<'a> {
    /// A runner for `opts`, fetching into `consumer`.
    pub fn new(opts: &'a BenchOptions, consumer: &'a Node) -> Runner<'a> {
        let largest = opts.sizes.iter().copied().max().unwrap_or(0) as usize;
        let mut source = vec![0u8; largest];
        fill_pattern(&mut source, 1);
        let mut dst = vec![0u8; largest];
        dst.copy_from_slice(&source); // touched: warm
        Runner {
            opts,
            consumer,
            put_nodes: HashMap::new(),
            owner: None,
            consumer_proc: None,
            sampler: LimitSampler {
                shm: match ShmLimits::new(opts, consumer, &source) {
                    Ok(shm) => Some(shm),
                    Err(e) => {
                        tracing::warn!(error = %e, "memcpy limit from anonymous memory only: no shared-memory source");
                        None
                    }
                },
                source,
                dst,
                tcp: None,
                gpu: None,
                tcp_pieces: None,
            },
            seed: 1000,
            device_source: None,
            device_dst: None,
            owner_poll_ends: owner_poll_ends(consumer),
        }
    }

    /// How long after a response this config's http owner may still poll
    /// ([`owner_poll_ends`], read once).
    pub fn owner_poll_ends(&self) -> std::time::Duration {
        self.owner_poll_ends
    }

    /// The owner process, started (and its pool cycled) on first use.
    pub fn owner(&mut self) -> Result<&mut WorkerProcess, BenchError> {
        if self.owner.is_none() {
            let mut w = WorkerProcess::spawn("owner", &self.opts.exe, &self.opts.config_args)?;
            if !self.opts.quick {
                let pool = pool_bytes(self.consumer);
                let chunk = (self.sampler.source.len() as u64).min(pool);
                let mut done = 0;
                while chunk > 0 && done <= pool {
                    let r = w.call(&Request::PutBuffer {
                        len: chunk,
                        seed: 1,
                        tags: Default::default(),
                    })?;
                    w.call(&Request::Remove {
                        ids: vec![r.id.unwrap_or_default()],
                    })?;
                    done += chunk;
                }
            }
            self.owner = Some(w);
        }
        Ok(self.owner.as_mut().expect("just started"))
    }

    fn consumer_proc(&mut self) -> Result<&mut WorkerProcess, BenchError> {
        if self.consumer_proc.is_none() {
            self.consumer_proc = Some(WorkerProcess::spawn(
                "consumer",
                &self.opts.exe,
                &self.opts.config_args,
            )?);
        }
        Ok(self.consumer_proc.as_mut().expect("just started"))
    }

    /// The in-process owner node exporting through `transport`, started
    /// (and its pool cycled) on first use.
    pub fn put_node(&mut self, transport: &'static str) -> Result<&Node, BenchError> {
        if !self.put_nodes.contains_key(transport) {
            let mut cfg = self.opts.config.clone();
            cfg.put.export_to = Some(vec![TransportName::new(transport).map_err(other)?]);
            let node = Node::start(cfg)?;
            if !self.opts.quick {
                let pool = pool_bytes(&node);
                let chunk = (self.sampler.source.len() as u64).min(pool) as usize;
                let mut done = 0;
                while chunk > 0 && done <= pool {
                    let h = node.put(
                        &self.sampler.source[..chunk],
                        &TensorSpec::bytes(chunk as u64),
                        BTreeMap::new(),
                    )?;
                    node.remove(&[h.id]);
                    done += chunk as u64;
                }
            }
            self.put_nodes.insert(transport, node);
        }
        Ok(&self.put_nodes[transport])
    }

    /// Runs one cell: `warmup` + `reps` timings, each followed by a sample
    /// of the cell's limit; the warm-up ones are dropped.
    pub fn run(&mut self, spec: &PathSpec, op: Op, size: u64) -> Result<Timings, BenchError> {
        self.seed += 1;
        let rounds = self.opts.warmup + self.opts.reps;
        let parts = limit_parts(spec, op);
        let mut t = Timings {
            cell: Vec::with_capacity(rounds),
            limit: Vec::with_capacity(rounds),
        };
        match op {
            Op::Put => self.put(spec, size, rounds, &parts, &mut t)?,
            Op::Fetch => self.fetch(spec, size, rounds, &parts, &mut t)?,
            Op::PutFetch => self.put_fetch(spec, size, rounds, &parts, &mut t)?,
        }
        let w = self.opts.warmup;
        let limit = match self.rotation(&parts, size) {
            Some(ways) => fastest_way(t.limit, ways.len(), w),
            None => t.limit.split_off(w.min(t.limit.len())),
        };
        Ok(Timings {
            cell: t.cell.split_off(w.min(t.cell.len())),
            limit,
        })
    }

    /// Records a limit sample after a cell sample, when the cell has a
    /// limit. A single-copy limit takes its ways in turn, one per sample
    /// (see [`rotation`](Self::rotation)).
    fn pair(&mut self, parts: &[LimitPart], size: u64, t: &mut Timings) -> Result<(), BenchError> {
        if parts.is_empty() {
            return Ok(());
        }
        if parts.contains(&LimitPart::Tcp) {
            // The http owner polls for the next request after a response
            // (`owner-spin`): left polling, it would spin on one of the
            // cores through the limit's sample. Both ends of the limit are
            // then alone, as its server parks after each sample for the
            // cell's.
            std::thread::sleep(self.owner_poll_ends);
        }
        let sample = match self.rotation(parts, size) {
            Some(ways) => {
                // Warm-up samples take the ways in turn too; the timed ones
                // start again at the first (see `fastest_way`).
                let i = t.limit.len();
                let turn = i.checked_sub(self.opts.warmup).unwrap_or(i);
                self.sampler
                    .copy_one(ways[turn % ways.len()], size as usize)?
            }
            None => self.sampler.sample(parts, size)?,
        };
        t.limit.push(sample);
        Ok(())
    }

    /// The ways of a limit that is one copy (a put's, a shm copy fetch's)
    /// below [`ROTATE_BELOW`], which its samples take in turn: each way's
    /// copy then runs right after a cell sample, with the cache as the
    /// product finds it. Tried back to back within one sample, the second
    /// and later ways found the bytes the first had just pulled into the
    /// 2 MiB L2: at 1 MiB the limit was 29-31 us while each way, taken
    /// alone after a put, needs 41-50 us (and the put 44-47 us). The
    /// cell's limit is the way with the lowest median ([`fastest_way`]).
    /// `None` for other limits (a TCP round trip, a sum of parts), from
    /// [`ROTATE_BELOW`] up, and when there are fewer repetitions than ways:
    /// those are sampled whole (all ways back to back) each time.
    fn rotation(&self, parts: &[LimitPart], size: u64) -> Option<Vec<(Place, CopyWay)>> {
        match parts {
            [p @ (LimitPart::Memcpy | LimitPart::MemcpyFromShm)] if size < ROTATE_BELOW => {
                Some(self.sampler.copy_ways(*p, size as usize))
            }
            _ => None,
        }
        // Every way needs a timed sample; with fewer, sample whole.
        .filter(|ways| !ways.is_empty() && ways.len() <= self.opts.reps)
    }

    fn put(
        &mut self,
        spec: &PathSpec,
        size: u64,
        rounds: usize,
        parts: &[LimitPart],
        times: &mut Timings,
    ) -> Result<(), BenchError> {
        self.put_node(spec.transport)?;
        let device = spec.device != DeviceKind::CPU;
        if device && self.device_source.as_ref().is_none_or(|(n, _)| *n != size) {
            self.device_source = None;
            let mem = DeviceMem::new(size).map_err(other)?;
            mem.fill(1).map_err(other)?;
            self.device_source = Some((size, mem));
        }
        let tensor = if device {
            gpu::spec(size)
        } else {
            TensorSpec::bytes(size)
        };
        let transport = TransportName::new(spec.transport).map_err(other)?;
        for _ in 0..rounds {
            let node = &self.put_nodes[spec.transport];
            let t = Instant::now();
            let h = match &self.device_source {
                Some((_, mem)) if device => {
                    node.put_device(DevicePtr(mem.addr()), size, &tensor, BTreeMap::new())?
                }
                _ => node.put(
                    &self.sampler.source[..size as usize],
                    &tensor,
                    BTreeMap::new(),
                )?,
            };
            times.cell.push(t.elapsed());
            let exported = h.export(&transport).is_some();
            node.remove(&[h.id]);
            if !exported {
                return Err(other(format!(
                    "the put did not export through {}",
                    spec.transport
                )));
            }
            self.pair(parts, size, times)?;
        }
        Ok(())
    }

    fn fetch(
        &mut self,
        spec: &PathSpec,
        size: u64,
        rounds: usize,
        parts: &[LimitPart],
        times: &mut Timings,
    ) -> Result<(), BenchError> {
        let seed = self.seed;
        let (id, h) = if spec.device == DeviceKind::CPU {
            put_remote(self.owner()?, size, seed)?
        } else {
            let put = self
                .owner()?
                .call(&Request::PutDevice { len: size, seed })?;
            let h = decode(put.handle.as_deref().unwrap_or_default())?;
            (put.id.unwrap_or_default(), h)
        };
        let h = only(h, spec.transport)?;
        let result = self.fetch_rounds(spec, &h, seed, rounds, parts, times);
        self.owner()?.call(&Request::Remove { ids: vec![id] })?;
        result
    }

    fn fetch_rounds(
        &mut self,
        spec: &PathSpec,
        h: &Handle,
        seed: u64,
        rounds: usize,
        parts: &[LimitPart],
        times: &mut Timings,
    ) -> Result<(), BenchError> {
        let node = self.consumer;
        let size = h.meta.byte_len;
        let device = spec.device != DeviceKind::CPU;
        let mut dst = match spec.mode {
            FetchMode::Copy if !device => vec![0u8; size as usize],
            _ => Vec::new(),
        };
        if device
            && spec.mode == FetchMode::Copy
            && self.device_dst.as_ref().is_none_or(|m| m.len() != size)
        {
            self.device_dst = None;
            self.device_dst = Some(DeviceMem::new(size).map_err(other)?);
        }
        for i in 0..rounds {
            // Each arm times the fetch alone, then checks the first round's
            // bytes (a GPU shard's read back to the host).
            let t = Instant::now();
            let (served_by, mode, verified) = match (&self.device_dst, spec.mode) {
                (Some(dev), FetchMode::Copy) if device => {
                    let sel = node.fetch_device_into(h, DevicePtr(dev.addr()), size)?;
                    times.cell.push(t.elapsed());
                    let ok = i > 0 || gpu::holds_pattern(dev.addr(), size, seed).map_err(other)?;
                    (sel.transport, sel.mode, ok)
                }
                _ if device => {
                    let v = node.fetch_device(h)?;
                    times.cell.push(t.elapsed());
                    let ok = i > 0 || gpu::holds_pattern(v.addr().0, size, seed).map_err(other)?;
                    (v.selection().transport.clone(), v.selection().mode, ok)
                }
                (_, FetchMode::View) => {
                    let f = node.fetch_mode(h, FetchMode::View)?;
                    black_box(f.data.first());
                    times.cell.push(t.elapsed());
                    let ok = i > 0 || check_pattern(&f.data, seed);
                    (f.selection.transport, f.selection.mode, ok)
                }
                (_, FetchMode::Copy) => {
                    let sel = node.fetch_into(h, &mut dst)?;
                    times.cell.push(t.elapsed());
                    let ok = i > 0 || check_pattern(&dst, seed);
                    (sel.transport, sel.mode, ok)
                }
            };
            check_served(spec, &served_by, mode, Some(verified))?;
            self.pair(parts, size, times)?;
        }
        Ok(())
    }

    fn put_fetch(
        &mut self,
        spec: &PathSpec,
        size: u64,
        rounds: usize,
        parts: &[LimitPart],
        times: &mut Timings,
    ) -> Result<(), BenchError> {
        let seed = self.seed;
        self.owner()?;
        self.consumer_proc()?;
        for i in 0..rounds {
            let owner = self.owner.as_mut().expect("started");
            let put = owner.call(&if spec.device == DeviceKind::CPU {
                Request::PutBuffer {
                    len: size,
                    seed,
                    tags: Default::default(),
                }
            } else {
                Request::PutDevice { len: size, seed }
            })?;
            let id: ShardId = shardport_control::parse_id(put.id.as_deref().unwrap_or_default())
                .map_err(other)?;
            let handle = put.handle.unwrap_or_default();
            let verify = (i == 0).then_some(seed);
            let only = Some(spec.transport.to_owned());
            let request = match spec.mode {
                _ if spec.device != DeviceKind::CPU => Request::FetchDevice {
                    handle,
                    into: spec.mode == FetchMode::Copy,
                    only,
                    seed: verify,
                },
                FetchMode::View => Request::Fetch {
                    handle,
                    mode: Some(FetchMode::View),
                    seed: verify,
                    hold: false,
                    only,
                },
                FetchMode::Copy => Request::FetchBuffer {
                    handle,
                    only,
                    seed: verify,
                },
            };
            let fetched = self.consumer_proc.as_mut().expect("started").call(&request);
            let owner = self.owner.as_mut().expect("started");
            owner.call(&Request::Remove {
                ids: vec![id.to_string()],
            })?;
            let fetched = fetched?;
            check_served(
                spec,
                fetched.transport.as_deref().unwrap_or_default(),
                fetched.mode.unwrap_or(FetchMode::Copy),
                fetched.verified,
            )?;
            times.cell.push(Duration::from_nanos(
                put.ns.unwrap_or_default() + fetched.ns.unwrap_or_default(),
            ));
            self.pair(parts, size, times)?;
        }
        Ok(())
    }

    /// Stops the worker processes.
    pub fn finish(self) -> Result<(), BenchError> {
        for w in [self.owner, self.consumer_proc].into_iter().flatten() {
            w.exit()?;
        }
        Ok(())
    }
}

/// The fetch went through the path's transport, in its mode, and the bytes
/// were right.
fn check_served(
    spec: &PathSpec,
    transport: &str,
    mode: FetchMode,
    verified: Option<bool>,
) -> Result<(), BenchError> {
    if transport != spec.transport || mode != spec.mode {
        return Err(other(format!(
            "{} fetch was served by {transport} as a {mode}",
            spec.id
        )));
    }
    if verified == Some(false) {
        return Err(other(format!(
            "{} fetch returned bytes that differ from what the owner put",
            spec.id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotated_limit_keeps_the_way_with_the_lowest_median() {
        let us = Duration::from_micros;
        // Two warm-up samples (dropped: they would make way 1 look
        // fastest), then ways 0, 1, 2 in turn.
        let samples = [50, 1, 30, 20, 40, 31, 21, 41, 29, 900, 39, 32]
            .map(us)
            .to_vec();
        // Way 0: 30, 31, 29, 32 (median 30.5); way 1: 20, 21, 900 (21);
        // way 2: 40, 41, 39 (40).
        assert_eq!(fastest_way(samples.clone(), 3, 2), [20, 21, 900].map(us));
        // One way: every sample after the warm-up.
        assert_eq!(fastest_way(samples.clone(), 1, 10), [39, 32].map(us));
        // More ways than samples: the unsampled ones do not compete.
        assert_eq!(fastest_way(samples[..3].to_vec(), 6, 1), [1].map(us));
        assert!(fastest_way(Vec::new(), 3, 0).is_empty());
        // Ranked by the report's median, the mean of the middle two of an
        // even count: way 0 has 10, 10, 40, 40 (25), way 1 30 x 4 (30); by
        // the upper middle sample (40 against 30) way 1 would win.
        let even = [10, 30, 10, 30, 40, 30, 40, 30].map(us).to_vec();
        assert_eq!(fastest_way(even, 2, 0), [10, 10, 40, 40].map(us));
    }
}
