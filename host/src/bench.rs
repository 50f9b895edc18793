//! `shardport bench`: the foundation's measurements, each next to the
//! machine's own limit measured in the same run.
//!
//! - plugin dispatch: `Transport::echo` through the loaded `.so`'s vtable vs
//!   a direct (non-inlined) call;
//! - zero-copy fetch (handle -> readable view) p50/p99 at 4 KiB and 256 MiB,
//!   owner in another process;
//! - copy fetch of 256 MiB into a warm buffer vs a single-thread memcpy of
//!   the same size;
//! - put of 256 MiB into a warm pool vs the same memcpy.
//!
//! Numbers are reported, never asserted.

use std::{
    ffi::OsString,
    fmt,
    hint::black_box,
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::{
    config::{Config, FetchMode},
    handle::Handle,
    node::{Node, TensorSpec},
    worker::{fill_pattern, Request, WorkerProcess},
};

/// Bench settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `shardport` executable (starts the owner worker).
    pub exe: PathBuf,
    /// Config args for the worker.
    pub config_args: Vec<OsString>,
    /// The same config, for the in-process nodes.
    pub config: Config,
    /// Large-shard size (256 MiB by default).
    pub large: u64,
    /// Repetitions of each large-shard measurement.
    pub reps: usize,
}

/// One measured line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchLine {
    /// What was measured.
    pub name: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
    /// The baseline it is compared with, if any.
    pub baseline: Option<(String, f64)>,
    /// value / baseline (or baseline / value for times; always "higher is better" when `higher_better`).
    pub ratio: Option<f64>,
    /// The target, as text.
    pub target: String,
}

/// All lines.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// Lines in order.
    pub lines: Vec<BenchLine>,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<44} {:>12} {:<6} {:>30} {:>8}  target",
            "measurement", "value", "unit", "baseline (same run)", "ratio"
        )?;
        for l in &self.lines {
            let base = l
                .baseline
                .as_ref()
                .map_or(String::new(), |(n, v)| format!("{n} {v:.2}"));
            let ratio = l.ratio.map_or(String::new(), |r| format!("{r:.2}x"));
            writeln!(
                f,
                "{:<44} {:>12.3} {:<6} {:>30} {:>8}  {}",
                l.name, l.value, l.unit, base, ratio, l.target
            )?;
        }
        Ok(())
    }
}

/// Bench failure.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Node start failed.
    #[error(transparent)]
    Host(#[from] crate::HostError),
    /// Worker failed.
    #[error(transparent)]
    Worker(#[from] crate::worker::WorkerError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

#[inline(never)]
fn direct_echo(x: u64) -> u64 {
    black_box(x)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Warm single-thread memcpy of `len` bytes, GB/s (median of `reps`).
pub fn memcpy_gbps(len: usize, reps: usize) -> f64 {
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // touch both
    let mut v: Vec<f64> = (0..reps.max(3))
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
            gbps(len as u64, t.elapsed())
        })
        .collect();
    median(&mut v)
}

/// Puts `len` pattern bytes in the owner process; returns the id and the decoded handle.
fn put_remote(
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
    let bytes = hex::decode(put.handle.unwrap_or_default())
        .map_err(|e| BenchError::Other(e.to_string()))?;
    let handle = Handle::from_bytes(&bytes).map_err(|e| BenchError::Other(e.to_string()))?;
    Ok((put.id.unwrap_or_default(), handle))
}

/// Runs every measurement.
pub fn run_bench(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let mut lines = Vec::new();
    let node = Node::start(opts.config.clone())?;
    let plugin = node
        .plugins()
        .first()
        .ok_or_else(|| BenchError::Other("no plugin loaded; the bench needs posix-shm".into()))?;

    // 1. Dispatch overhead.
    const CALLS: u64 = 20_000_000;
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..CALLS {
        acc = acc.wrapping_add(plugin.transport.echo(black_box(i)));
    }
    let via = t.elapsed().as_nanos() as f64 / CALLS as f64;
    let t = Instant::now();
    for i in 0..CALLS {
        acc = acc.wrapping_add(direct_echo(black_box(i)));
    }
    let direct = t.elapsed().as_nanos() as f64 / CALLS as f64;
    black_box(acc);
    lines.push(BenchLine {
        name: format!("dispatch through `{}` vtable", plugin.name),
        value: via,
        unit: "ns".into(),
        baseline: Some(("direct call ns".into(), direct)),
        ratio: Some(via / direct),
        target: format!("overhead {:.2} ns (<= 10 ns)", via - direct),
    });

    // 2. Zero-copy fetch latency, owner in another process.
    let mut owner = WorkerProcess::spawn("owner", &opts.exe, &opts.config_args)?;
    for (size, iters) in [(4u64 << 10, 2000usize), (opts.large, 200)] {
        let (id, handle) = put_remote(&mut owner, size, 7)?;
        let mut lat = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            let f = node.fetch_mode(&handle, FetchMode::View)?;
            black_box(f.data[0]);
            lat.push(t.elapsed().as_nanos() as f64 / 1e3);
            if f.selection.mode != FetchMode::View {
                return Err(BenchError::Other(format!(
                    "view fetch served as {}: {}",
                    f.selection.mode, f.selection.reason
                )));
            }
        }
        let p99 = percentile(&mut lat, 0.99);
        let p50 = percentile(&mut lat, 0.5);
        lines.push(BenchLine {
            name: format!("zero-copy fetch p50, {}", crate::demo::size_label(size)),
            value: p50,
            unit: "us".into(),
            baseline: Some(("p99 us".into(), p99)),
            ratio: None,
            target: "<= 20 us".into(),
        });
        owner.call(&Request::Remove {
            ids: vec![id.clone()],
        })?;
    }

    // 3. Copy fetch of a large shard into a warm buffer vs memcpy.
    let large = opts.large;
    let (id, handle) = put_remote(&mut owner, large, 9)?;
    let mut dst = vec![0u8; large as usize];
    node.fetch_into(&handle, &mut dst)?; // warm the buffer and the mapping
    let mut copy: Vec<f64> = (0..opts.reps)
        .map(|_| {
            let t = Instant::now();
            node.fetch_into(&handle, &mut dst)
                .map(|_| gbps(large, t.elapsed()))
        })
        .collect::<Result<_, _>>()?;
    let memcpy = memcpy_gbps(large as usize, opts.reps);
    let copy = median(&mut copy);
    lines.push(BenchLine {
        name: format!(
            "shm copy fetch {} (warm dst)",
            crate::demo::size_label(large)
        ),
        value: copy,
        unit: "GB/s".into(),
        baseline: Some(("memcpy GB/s".into(), memcpy)),
        ratio: Some(copy / memcpy),
        target: ">= 0.8x memcpy".into(),
    });
    owner.call(&Request::Remove {
        ids: vec![id.clone()],
    })?;
    owner.exit()?;

    // 4. Put of a large shard into a warm pool vs memcpy.
    let mut src = vec![0u8; large as usize];
    fill_pattern(&mut src, 3);
    let spec = TensorSpec::bytes(large);
    // The pool allocator moves on through the pool before wrapping, so every
    // page of the pool is touched once before a put counts as "warm".
    let pool_total = node
        .stats()
        .plugins
        .iter()
        .find_map(|p| p.stats.get("pool_bytes_total").copied())
        .unwrap_or(large);
    let warmup = (pool_total / large.max(1)) as usize + 1;
    let mut put_rates = Vec::new();
    for i in 0..warmup + opts.reps {
        let t = Instant::now();
        let h = node.put_with(&spec, Default::default(), |d| d.copy_from_slice(&src))?;
        let rate = gbps(large, t.elapsed());
        node.remove(&[h.id]);
        if i >= warmup {
            put_rates.push(rate);
        }
    }
    let memcpy = memcpy_gbps(large as usize, opts.reps);
    let put = median(&mut put_rates);
    lines.push(BenchLine {
        name: format!("put {} into warm pool", crate::demo::size_label(large)),
        value: put,
        unit: "GB/s".into(),
        baseline: Some(("memcpy GB/s".into(), memcpy)),
        ratio: Some(put / memcpy),
        target: ">= 0.8x memcpy".into(),
    });
    if node.plugins().iter().any(|p| p.name.as_str() == "http") {
        bench_http(opts, &node, &mut lines)?;
    }
    Ok(BenchReport { lines })
}

/// Raw TCP loopback throughput with our own socket pair: one thread writes
/// `len` bytes from a warm buffer in 1 MiB writes, the other reads them into
/// a warm buffer. GB/s, median of `reps`.
pub fn tcp_loopback_gbps(len: usize, reps: usize) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let rounds = reps.max(3) + 1;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        let src = vec![7u8; 1 << 20];
        for _ in 0..rounds {
            let mut left = len;
            while left > 0 {
                let n = left.min(src.len());
                s.write_all(&src[..n])?;
                left -= n;
            }
        }
        Ok(())
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    let mut dst = vec![0u8; len];
    let mut rates = Vec::new();
    for round in 0..rounds {
        let t = Instant::now();
        s.read_exact(&mut dst)?;
        if round > 0 {
            rates.push(gbps(len as u64, t.elapsed())); // round 0 warms up
        }
    }
    writer
        .join()
        .map_err(|_| std::io::Error::other("writer thread panicked"))??;
    Ok(median(&mut rates))
}

fn http_only(mut h: Handle) -> Result<Handle, BenchError> {
    if !h.keep_only("http") {
        return Err(BenchError::Other(
            "the owner did not export through http".into(),
        ));
    }
    Ok(h)
}

/// The http transport: large-shard throughput vs raw TCP loopback, 4 KiB
/// latency on a kept-alive connection, a 1000 x 4 KiB batch, and the
/// consumer's peak RSS while fetching a large shard.
fn bench_http(
    opts: &BenchOptions,
    node: &Node,
    lines: &mut Vec<BenchLine>,
) -> Result<(), BenchError> {
    let large = opts.large;
    let mut owner = WorkerProcess::spawn("owner", &opts.exe, &opts.config_args)?;

    let (id, h) = put_remote(&mut owner, large, 21)?;
    let h = http_only(h)?;
    let mut dst = vec![0u8; large as usize];
    node.fetch_into(&h, &mut dst)?; // warm buffer and connection
    let mut rates: Vec<f64> = (0..opts.reps)
        .map(|_| {
            let t = Instant::now();
            node.fetch_into(&h, &mut dst)
                .map(|_| gbps(large, t.elapsed()))
        })
        .collect::<Result<_, _>>()?;
    let tcp = tcp_loopback_gbps(large as usize, opts.reps)
        .map_err(|e| BenchError::Other(format!("raw TCP loopback: {e}")))?;
    let rate = median(&mut rates);
    lines.push(BenchLine {
        name: format!("http fetch {} (warm dst)", crate::demo::size_label(large)),
        value: rate,
        unit: "GB/s".into(),
        baseline: Some(("raw TCP loopback GB/s".into(), tcp)),
        ratio: Some(rate / tcp),
        target: ">= 0.8x TCP loopback".into(),
    });
    drop(dst);

    // Consumer peak RSS: a fresh consumer process fetching the large shard.
    let mut consumer = WorkerProcess::spawn("consumer", &opts.exe, &opts.config_args)?;
    let before = consumer.call(&Request::Stats)?.peak_rss.unwrap_or(0);
    let handle_hex = hex::encode(h.to_bytes());
    consumer.call(&Request::Fetch {
        handle: handle_hex,
        mode: Some(FetchMode::Copy),
        seed: Some(21),
        hold: false,
        only: Some("http".into()),
    })?;
    let peak = consumer.call(&Request::Stats)?.peak_rss.unwrap_or(0);
    consumer.exit()?;
    lines.push(BenchLine {
        name: format!(
            "http consumer peak RSS, {} fetch",
            crate::demo::size_label(large)
        ),
        value: peak as f64 / large as f64,
        unit: "x size".into(),
        baseline: Some((
            "RSS before fetch MiB".into(),
            before as f64 / (1 << 20) as f64,
        )),
        ratio: None,
        target: "<= 1.2x shard size".into(),
    });
    owner.call(&Request::Remove { ids: vec![id] })?;

    // 4 KiB latency on a kept-alive connection.
    let (id, h) = put_remote(&mut owner, 4 << 10, 22)?;
    let h = http_only(h)?;
    let mut small = vec![0u8; 4 << 10];
    let mut lat = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let t = Instant::now();
        node.fetch_into(&h, &mut small)?;
        lat.push(t.elapsed().as_nanos() as f64 / 1e3);
    }
    let p99 = percentile(&mut lat, 0.99);
    lines.push(BenchLine {
        name: "http fetch p50, 4 KiB (kept-alive)".into(),
        value: percentile(&mut lat, 0.5),
        unit: "us".into(),
        baseline: Some(("p99 us".into(), p99)),
        ratio: None,
        target: "<= 60 us".into(),
    });
    owner.call(&Request::Remove { ids: vec![id] })?;

    // 1000 x 4 KiB in one batch.
    let mut ids = Vec::new();
    let mut handles = Vec::new();
    for i in 0..1000 {
        let (id, h) = put_remote(&mut owner, 4 << 10, 100 + i)?;
        ids.push(id);
        handles.push(http_only(h)?);
    }
    let mut rates = Vec::new();
    for _ in 0..opts.reps.max(3) {
        let t = Instant::now();
        let results = node.fetch_many(&handles, FetchMode::Copy)?;
        let elapsed = t.elapsed();
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            return Err(e.into());
        }
        rates.push(1000.0 / elapsed.as_secs_f64());
    }
    lines.push(BenchLine {
        name: "http batch, 1000 x 4 KiB".into(),
        value: median(&mut rates) / 1e3,
        unit: "k/s".into(),
        baseline: None,
        ratio: None,
        target: ">= 50k shards/s".into(),
    });
    owner.call(&Request::Remove { ids })?;
    owner.exit()?;
    Ok(())
}
