//! `shardport bench load`: one owner, C consumer processes fetching at once
//! for a fixed time, the owner putting and removing shards meanwhile; per
//! consumer count, aggregate rate, latency percentiles, each consumer's
//! share (fairness), the owner's CPU per GB moved and errors by kind.
//!
//! Every process is a real `shardport worker` on this machine; load goes
//! over loopback and shared memory only. A consumer runs its loop inside its
//! own worker (`worker::load::run_loop`, request `load`): no request round trip per
//! fetch, so the rate is the node's, not the harness's. Each loop is bounded
//! by its duration and by [`MAX_FETCHES_PER_LOOP`].
//!
//! The workload: shards of 4 KiB, 64 KiB, 1 MiB and 4 MiB (the same number
//! of each), each fetch picks one at random, as a view or a copy
//! (`view_share`), through posix-shm or http (`http_share`: the handle
//! keeps only that transport's export). The owner meanwhile puts and
//! removes 64 KiB shards of its own at a paced rate (churn on the pool, the
//! board and both transports' export tables).
//!
//! # The copy limit of each point
//! Copies are most of the work, and what they cost depends on how many
//! consumers copy: each consumer writes into its own destinations (its
//! node's shelf keeps one buffer per shard length), so C consumers write
//! into C sets of them. Up to a few sets they stay in the caches; at 64
//! sets of 5.1 MiB they do not, and every copy then pays the memory's
//! bandwidth (on this project's 2-vCPU VM a 4 MiB memcpy fell from 13.6
//! GB/s with 8 destinations taken in turn to 8.3-8.6 with 64, a NumPy
//! loop, 2026-11-27), and each switch between consumer processes finds the
//! next one's destinations colder. So after each point the same C
//! consumers measure the copy limit together ([`copy_limit`]): each copies
//! the shards' bytes from views into destinations of its own, as fast as
//! it can (no fetch, no lease, no http), for [`LIMIT_TIME`] with one
//! `memcpy` per copy and as long again with large copies split across
//! threads, the faster kept: what this machine copies with C processes
//! copying, under the same scheduler. The
//! row reports the consumers' copy rate during the point beside it. A curve
//! whose copies hold their ratio to that limit scales as the machine does.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Serialize;

pub use crate::worker::load::{LoopResult, LoopSpec, MAX_FETCHES_PER_LOOP, SIZES};
use crate::worker::{load::PER_SIZE, Reply, Request, WorkerProcess};
/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Consumer counts.
    pub consumers: Vec<usize>,
    /// Each point's duration.
    pub duration: Duration,
    /// Share of views.
    pub view_share: f64,
    /// Share of http fetches.
    pub http_share: f64,
    /// The owner's puts (and removes) per second meanwhile (0: unpaced).
    pub churn_per_s: u64,
    /// The `shardport` executable the workers run.
    pub exe: PathBuf,
    /// The workers' config arguments (`--config F`, or none for the embedded one).
    pub config_args: Vec<std::ffi::OsString>,
    /// Every consumer checks every fetched shard's bytes against the
    /// owner's pattern (`wrong_fetches`); costs the consumers a read of
    /// every byte, so rates are lower than without.
    pub verify: bool,
    /// Measure each point's copy and TCP limits (off for a config whose
    /// own limits a limit's loop would exceed: it holds a view of every
    /// shard at once).
    pub limits: bool,
}

/// One point of the curve.
#[derive(Debug, Clone, Serialize)]
pub struct LoadRow {
    /// Consumer processes.
    pub consumers: usize,
    /// Successful fetches per second, all consumers together.
    pub shards_per_s: f64,
    /// Their bytes per second, GB/s.
    pub gbps: f64,
    /// Latency percentiles over a uniform sample of every fetch, us.
    pub p50_us: f64,
    /// 99th percentile, us.
    pub p99_us: f64,
    /// The least served consumer's fetches over the mean.
    pub share_min: f64,
    /// The most served consumer's fetches over the mean.
    pub share_max: f64,
    /// Failed fetches.
    pub errors: u64,
    /// Failed fetches by kind.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// One message per error kind, as a consumer saw it.
    pub error_samples: BTreeMap<String, String>,
    /// The owner's CPU seconds per GB moved.
    pub owner_cpu_s_per_gb: f64,
    /// The bytes fetched as copies through posix-shm per second, GB/s.
    pub copy_gbps: f64,
    /// How late the latest consumer began after the point's common start,
    /// ms (its loop still ended with the others').
    pub late_start_ms: f64,
    /// This machine's copy rate into this many consumers' destinations,
    /// measured right after the point ([`copy_limit`]), GB/s; 0 when not
    /// measured (no copies through posix-shm in the workload).
    pub copy_limit_gbps: f64,
    /// Shards the owner put (and removed) meanwhile.
    pub churn_puts: u64,
    /// The owner's puts that failed meanwhile, by kind (a full pool, the
    /// shard table at its limit), and one message of each kind.
    pub churn_errors_by_kind: BTreeMap<String, u64>,
    /// One message per kind of failed put.
    pub churn_error_samples: BTreeMap<String, String>,
    /// Whether every fetched shard's bytes were checked (`--verify`).
    pub verified: bool,
    /// Fetches whose bytes were not the owner's (0 unless `verified`).
    pub wrong_fetches: u64,
    /// The bytes fetched through http per second, GB/s.
    pub http_gbps: f64,
    /// This machine's raw loopback TCP rate from one process to this many
    /// consumer processes, the workload's sizes, measured right after the
    /// point ([`tcp_limit`]), GB/s; 0 when not measured (no http in the
    /// workload).
    pub tcp_limit_gbps: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e3
}

fn call(w: &mut WorkerProcess, req: &Request) -> Result<Reply, String> {
    w.call(req).map_err(|e| e.to_string())
}

/// Sends each consumer its request (`request(i)` for the `i`-th) at once,
/// one thread per consumer, and returns their replies in order.
fn call_each(
    consumers: &mut [WorkerProcess],
    request: impl Fn(usize) -> Request,
) -> Vec<Result<Reply, String>> {
    std::thread::scope(|s| {
        let joins: Vec<_> = consumers
            .iter_mut()
            .enumerate()
            .map(|(i, w)| {
                let req = request(i);
                s.spawn(move || call(w, &req))
            })
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err("a consumer thread panicked".into()))
            })
            .collect()
    })
}

/// Runs every point; `progress` gets a line per step.
pub fn run_load(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<LoadRow>, String> {
    let spawn = |role: &str| {
        WorkerProcess::spawn(role, &opts.exe, &opts.config_args).map_err(|e| e.to_string())
    };
    let mut owner = spawn("owner")?;
    let mut handles = Vec::new();
    let mut seeds = Vec::new();
    for (k, &size) in SIZES.iter().enumerate() {
        for j in 0..PER_SIZE {
            let seed = (k * PER_SIZE + j) as u64;
            let r = call(
                &mut owner,
                &Request::Put {
                    len: size,
                    seed,
                    dtype: None,
                    tags: BTreeMap::new(),
                },
            )?;
            handles.push(r.handle.ok_or("the owner's put gave no handle")?);
            seeds.push(seed);
        }
    }
    let mut rows = Vec::new();
    for &c in &opts.consumers {
        if c == 0 {
            return Err("--consumers: each count at least 1".into());
        }
        progress(&format!("{c} consumers, {:?}", opts.duration));
        let mut consumers = (0..c)
            .map(|i| spawn(&format!("consumer {i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let duration_ms = opts.duration.as_millis() as u64;
        let start_unix_ns = start_after(start_margin(c));
        let owner_cpu = owner.cpu_seconds();
        let (results, churn) = std::thread::scope(|s| {
            let churn = s.spawn(|| {
                call(
                    &mut owner,
                    &Request::Churn {
                        duration_ms,
                        per_s: opts.churn_per_s,
                        start_unix_ns,
                    },
                )
            });
            let results = call_each(&mut consumers, |i| {
                Request::Load(LoopSpec {
                    handles: handles.clone(),
                    duration_ms,
                    view_share: opts.view_share,
                    http_share: opts.http_share,
                    seed: 0x5eed + i as u64,
                    start_unix_ns,
                    seeds: if opts.verify {
                        seeds.clone()
                    } else {
                        Vec::new()
                    },
                })
            });
            let churn = churn
                .join()
                .unwrap_or_else(|_| Err("the churn thread panicked".into()));
            (results, churn)
        });
        let owner_cpu = owner.cpu_seconds() - owner_cpu;
        let churn = churn?.load.ok_or("the owner's churn reply had no result")?;
        let mut loops = Vec::with_capacity(c);
        for r in results {
            loops.push(r?.load.ok_or("a consumer's reply had no load result")?);
        }
        let mut row = aggregate(c, &loops, owner_cpu, &churn);
        row.verified = opts.verify;
        if opts.limits && opts.view_share < 1.0 && opts.http_share < 1.0 {
            progress(&format!("{c} consumers, the copy limit"));
            row.copy_limit_gbps =
                copy_limit(&mut consumers, &handles, opts.duration.min(LIMIT_TIME))?;
        }
        if opts.limits && opts.http_share > 0.0 {
            progress(&format!("{c} consumers, the TCP limit"));
            row.tcp_limit_gbps = tcp_limit(
                &mut owner,
                &mut consumers,
                &handles,
                opts.duration.min(LIMIT_TIME),
            )?;
        }
        for mut w in consumers {
            let _ = w.call(&Request::Exit);
        }
        rows.push(row);
    }
    let _ = owner.call(&Request::Exit);
    Ok(rows)
}

fn aggregate(c: usize, loops: &[LoopResult], owner_cpu: f64, churn: &LoopResult) -> LoadRow {
    let secs = loops
        .iter()
        .map(|l| l.elapsed_ns as f64 / 1e9)
        .fold(0.0, f64::max)
        .max(1e-9);
    let fetches: u64 = loops.iter().map(|l| l.fetches).sum();
    let bytes: u64 = loops.iter().map(|l| l.bytes).sum();
    let copied: u64 = loops.iter().map(|l| l.copied_bytes).sum();
    let mut errors_by_kind = BTreeMap::new();
    let mut error_samples = BTreeMap::new();
    for l in loops {
        for (k, v) in &l.errors {
            *errors_by_kind.entry(k.clone()).or_default() += v;
        }
        for (k, m) in &l.error_samples {
            error_samples.entry(k.clone()).or_insert_with(|| m.clone());
        }
    }
    let mut lat: Vec<u64> = loops
        .iter()
        .flat_map(|l| l.latencies_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let mean = fetches as f64 / c as f64;
    let share = |f: fn(f64, f64) -> f64, init: f64| {
        loops
            .iter()
            .map(|l| l.fetches as f64 / mean.max(1e-9))
            .fold(init, f)
    };
    LoadRow {
        consumers: c,
        shards_per_s: fetches as f64 / secs,
        gbps: bytes as f64 / secs / 1e9,
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        share_min: share(f64::min, f64::INFINITY),
        share_max: share(f64::max, 0.0),
        errors: errors_by_kind.values().sum(),
        errors_by_kind,
        error_samples,
        owner_cpu_s_per_gb: owner_cpu / (bytes as f64 / 1e9).max(1e-9),
        churn_puts: churn.fetches,
        churn_errors_by_kind: churn.errors.clone(),
        churn_error_samples: churn.error_samples.clone(),
        verified: false,
        wrong_fetches: loops.iter().map(|l| l.wrong_fetches).sum(),
        copy_gbps: copied as f64 / secs / 1e9,
        late_start_ms: loops.iter().map(|l| l.late_ns).max().unwrap_or(0) as f64 / 1e6,
        copy_limit_gbps: 0.0,
        http_gbps: loops.iter().map(|l| l.http_bytes).sum::<u64>() as f64 / secs / 1e9,
        tcp_limit_gbps: 0.0,
    }
}

/// The copy limit of a point, GB/s: every consumer at once copies the
/// shards' bytes from views into destinations of its own
/// (`worker::load::run_copy_limit`), for `time` with one `memcpy` per copy
/// and for `time` again with large copies split across threads as the
/// product's copies are; the faster of the two (with all cores busy, a
/// second thread per copy only costs; with cores idle, it is how a large
/// copy goes fastest).
fn copy_limit(
    consumers: &mut [WorkerProcess],
    handles: &[String],
    time: Duration,
) -> Result<f64, String> {
    let single = copy_rate(consumers, handles, time, false)?;
    let split = copy_rate(consumers, handles, time, true)?;
    Ok(single.max(split))
}

/// Every consumer's copies (one way) at once; their bytes over the longest
/// loop, GB/s.
fn copy_rate(
    consumers: &mut [WorkerProcess],
    handles: &[String],
    time: Duration,
    split: bool,
) -> Result<f64, String> {
    let spec = limit_spec(consumers.len(), handles, time, 0xc0b1);
    limit_rate(
        consumers,
        &spec,
        |spec| Request::CopyLimit { spec, split },
        |l| l.copied_bytes,
        "copy-limit",
    )
}

/// The loop of a limit measured right after a point: `time` long from a
/// common start, each consumer's seed `seed` plus its number.
fn limit_spec(consumers: usize, handles: &[String], time: Duration, seed: u64) -> LoopSpec {
    LoopSpec {
        handles: handles.to_vec(),
        duration_ms: time.as_millis() as u64,
        view_share: 0.0,
        http_share: 0.0,
        seed,
        start_unix_ns: start_after(start_margin(consumers)),
        seeds: Vec::new(),
    }
}

/// Every consumer's loop of a limit at once (`request` of `spec`, each
/// with its own seed); the bytes `counted` over the longest loop, GB/s.
fn limit_rate(
    consumers: &mut [WorkerProcess],
    spec: &LoopSpec,
    request: impl Fn(LoopSpec) -> Request,
    counted: fn(&LoopResult) -> u64,
    what: &str,
) -> Result<f64, String> {
    let results = call_each(consumers, |i| {
        request(LoopSpec {
            seed: spec.seed + i as u64,
            ..spec.clone()
        })
    });
    let mut bytes = 0u64;
    let mut secs = 1e-9f64;
    for r in results {
        let l = r?
            .load
            .ok_or_else(|| format!("a consumer's reply had no {what} result"))?;
        bytes += counted(&l);
        secs = secs.max(l.elapsed_ns as f64 / 1e9);
    }
    Ok(bytes as f64 / secs / 1e9)
}

/// The TCP limit of a point, GB/s: the owner serves raw loopback TCP
/// (`worker::tcp_limit`) and every consumer at once asks it for the
/// shards' sizes for `time`; their bytes over the longest loop. What the
/// machine's TCP carries to this many processes at once, for the http
/// rows to be read against.
fn tcp_limit(
    owner: &mut WorkerProcess,
    consumers: &mut [WorkerProcess],
    handles: &[String],
    time: Duration,
) -> Result<f64, String> {
    let spec = limit_spec(consumers.len(), handles, time, 0x7c9);
    let port = call(
        owner,
        &Request::TcpServe {
            connections: consumers.len(),
            duration_ms: spec.duration_ms,
            start_unix_ns: spec.start_unix_ns,
        },
    )?
    .port
    .ok_or("the owner's tcp_serve gave no port")?;
    limit_rate(
        consumers,
        &spec,
        |spec| Request::TcpLimit { port, spec },
        |l| l.bytes,
        "TCP-limit",
    )
}

/// How long before a point's common start its requests go out: time for
/// every consumer to receive its request, warm up (`worker::load`'s
/// `warm_up`: each shard fetched once) and be waiting when the window
/// opens (a consumer that is not starts late, and is reported so,
/// `late_start_ms`).
fn start_margin(consumers: usize) -> Duration {
    Duration::from_millis(300) + Duration::from_millis(20) * consumers as u32
}

/// Nanoseconds since the Unix epoch, `after` from now.
fn start_after(after: Duration) -> u64 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        + after)
        .as_nanos() as u64
}

/// How long each way of a point's copy limit runs at most (the point's
/// duration when shorter).
pub const LIMIT_TIME: Duration = Duration::from_millis(1500);

/// The rows as a table.
pub fn table(rows: &[LoadRow]) -> String {
    let mut out = String::from(
        "consumers   shards/s        GB/s     p50 us     p99 us   share min..max   owner CPU s/GB   errors   churn puts   copies GB/s (limit, ratio)   http GB/s (TCP limit, ratio)\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:<11} {:<15.0} {:<8.2} {:>7.1} {:>10.1}   {:.2}..{:.2}       {:>8.3}        {:>6}   {:>10}   {:<28} {}\n",
            r.consumers,
            r.shards_per_s,
            r.gbps,
            r.p50_us,
            r.p99_us,
            r.share_min,
            r.share_max,
            r.owner_cpu_s_per_gb,
            r.errors,
            r.churn_puts,
            against_limit(r.copy_gbps, r.copy_limit_gbps),
            against_limit(r.http_gbps, r.tcp_limit_gbps)
        ));
        if r.late_start_ms > 0.0 {
            out.push_str(&format!(
                "            the latest consumer began {:.1} ms after the common start\n",
                r.late_start_ms
            ));
        }
        for (kind, message) in &r.error_samples {
            out.push_str(&format!(
                "            {} x {kind}, e.g.: {message}\n",
                r.errors_by_kind.get(kind).copied().unwrap_or(0)
            ));
        }
        for (kind, message) in &r.churn_error_samples {
            out.push_str(&format!(
                "            {} owner put(s) failed, {kind}, e.g.: {message}\n",
                r.churn_errors_by_kind.get(kind).copied().unwrap_or(0)
            ));
        }
        if r.verified {
            out.push_str(&format!(
                "            every fetched byte checked: {} fetch(es) with wrong bytes\n",
                r.wrong_fetches
            ));
        }
    }
    if let Some(line) = against_peak(rows) {
        out.push_str(&line);
    }
    out
}

/// A rate, its limit and their ratio (`-` without a limit).
fn against_limit(gbps: f64, limit_gbps: f64) -> String {
    if limit_gbps > 0.0 {
        format!("{gbps:.2} ({limit_gbps:.2}, {:.2}x)", gbps / limit_gbps)
    } else {
        format!("{gbps:.2} (-)")
    }
}

/// The last point against the peak of the curve: the raw rate, the copy
/// limit, and the copies' ratio to their limit. `None` for fewer than two
/// points.
pub fn against_peak(rows: &[LoadRow]) -> Option<String> {
    let last = rows.last()?;
    let peak = rows
        .iter()
        .max_by(|a, b| a.shards_per_s.total_cmp(&b.shards_per_s))?;
    if rows.len() < 2 || peak.shards_per_s <= 0.0 {
        return None;
    }
    let mut line = format!(
        "{} consumers against the peak ({} consumers): shards/s {:.2}x",
        last.consumers,
        peak.consumers,
        last.shards_per_s / peak.shards_per_s
    );
    if last.copy_limit_gbps > 0.0 && peak.copy_limit_gbps > 0.0 && peak.copy_gbps > 0.0 {
        let ratio = |r: &LoadRow| r.copy_gbps / r.copy_limit_gbps;
        line.push_str(&format!(
            "; the copy limit {:.2}x; copies against their limit {:.2}x",
            last.copy_limit_gbps / peak.copy_limit_gbps,
            ratio(last) / ratio(peak)
        ));
    }
    let tcp_peak = rows
        .iter()
        .max_by(|a, b| a.tcp_limit_gbps.total_cmp(&b.tcp_limit_gbps))
        .filter(|r| r.tcp_limit_gbps > 0.0);
    if let (Some(tcp_peak), true) = (
        tcp_peak,
        last.tcp_limit_gbps > 0.0 && peak.tcp_limit_gbps > 0.0 && peak.http_gbps > 0.0,
    ) {
        let ratio = |r: &LoadRow| r.http_gbps / r.tcp_limit_gbps;
        line.push_str(&format!(
            "; the TCP limit {:.2}x of its value at {} consumers and {:.2}x of its own peak \
             ({} consumers); http against its limit {:.2}x",
            last.tcp_limit_gbps / peak.tcp_limit_gbps,
            peak.consumers,
            last.tcp_limit_gbps / tcp_peak.tcp_limit_gbps,
            tcp_peak.consumers,
            ratio(last) / ratio(peak)
        ));
    }
    line.push('\n');
    Some(line)
}

/// An SVG of the curves: shards/s and p99 latency against consumers (each
/// scaled to its own maximum).
pub fn svg(rows: &[LoadRow]) -> String {
    let (w, h, pad) = (640.0, 360.0, 50.0);
    let max_c = rows.iter().map(|r| r.consumers).max().unwrap_or(1).max(1) as f64;
    let max_rate = rows.iter().map(|r| r.shards_per_s).fold(1.0, f64::max);
    let max_p99 = rows.iter().map(|r| r.p99_us).fold(1.0, f64::max);
    let x = |c: usize| pad + (c as f64).ln_1p() / max_c.ln_1p() * (w - 2.0 * pad);
    let y = |v: f64, max: f64| h - pad - v / max * (h - 2.0 * pad);
    let line = |color, f: fn(&LoadRow) -> f64, max| {
        super::plot::polyline(color, rows.iter().map(|r| (x(r.consumers), y(f(r), max))))
    };
    let title = format!(
        "shardport bench load: shards/s (blue, max {max_rate:.0}) and p99 (red, max \
         {max_p99:.0} us) against consumers (log scale, up to {max_c})"
    );
    let body =
        line("#1f77b4", |r| r.shards_per_s, max_rate) + &line("#d62728", |r| r.p99_us, max_p99);
    super::plot::page(w, h, pad, &title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregation_counts_shares_and_percentiles() {
        let l = |fetches, lat: Vec<u64>| LoopResult {
            fetches,
            bytes: fetches * 1000,
            latencies_ns: lat,
            elapsed_ns: 1_000_000_000,
            ..LoopResult::default()
        };
        let mut errors = l(0, vec![]);
        errors.errors.insert("NotFound".into(), 3);
        errors
            .error_samples
            .insert("NotFound".into(), "shard 1 is not exported".into());
        let mut churn = l(9, vec![]);
        churn.errors.insert("Transport".into(), 2);
        churn
            .error_samples
            .insert("Transport".into(), "posix-shm holds 16 shards".into());
        let mut wrong = l(300, vec![5000; 10]);
        wrong.wrong_fetches = 2;
        let row = aggregate(3, &[l(100, vec![1000; 10]), wrong, errors], 0.5, &churn);
        assert_eq!(row.shards_per_s, 400.0);
        assert_eq!(row.errors, 3);
        assert_eq!(row.errors_by_kind["NotFound"], 3);
        assert_eq!(row.error_samples["NotFound"], "shard 1 is not exported");
        assert_eq!((row.share_min, row.share_max), (0.0, 300.0 / (400.0 / 3.0)));
        assert_eq!(row.p50_us, 1.0);
        assert_eq!(row.p99_us, 5.0);
        assert_eq!(row.churn_puts, 9);
        assert_eq!(row.churn_errors_by_kind["Transport"], 2);
        assert_eq!(row.wrong_fetches, 2);
        let mut shown = row.clone();
        shown.verified = true;
        let t = table(&[shown]);
        assert!(
            t.contains("2 owner put(s) failed, Transport, e.g.: posix-shm holds 16 shards"),
            "{t}"
        );
        assert!(t.contains("2 fetch(es) with wrong bytes"), "{t}");
        assert_eq!(row.late_start_ms, 0.0);
        let mut late = l(10, vec![1000]);
        late.late_ns = 2_500_000;
        late.copied_bytes = 4_000_000_000;
        let r2 = aggregate(2, &[l(10, vec![1000]), late], 0.5, &l(1, vec![]));
        assert_eq!(r2.late_start_ms, 2.5);
        assert_eq!(r2.copy_gbps, 4.0);
        // The last point against the peak: raw rate, copy limit, and the
        // copies' ratio to it.
        let mut peak = r2.clone();
        peak.shards_per_s = 100.0;
        peak.copy_gbps = 4.0;
        peak.copy_limit_gbps = 8.0;
        let mut last = peak.clone();
        last.consumers = 64;
        last.shards_per_s = 80.0;
        last.copy_gbps = 3.0;
        last.copy_limit_gbps = 4.0;
        let line = against_peak(&[peak.clone(), last]).unwrap();
        assert_eq!(
            line,
            "64 consumers against the peak (2 consumers): shards/s 0.80x; the copy limit 0.50x; \
             copies against their limit 1.50x\n"
        );
        assert_eq!(
            against_peak(&[peak]),
            None,
            "one point has no peak to compare"
        );
        let svg = svg(&[row]);
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    }
}
