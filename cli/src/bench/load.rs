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
    /// Shards the owner put (and removed) meanwhile.
    pub churn_puts: u64,
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
    for (k, &size) in SIZES.iter().enumerate() {
        for j in 0..PER_SIZE {
            let r = call(
                &mut owner,
                &Request::Put {
                    len: size,
                    seed: (k * PER_SIZE + j) as u64,
                    dtype: None,
                    tags: BTreeMap::new(),
                },
            )?;
            handles.push(r.handle.ok_or("the owner's put gave no handle")?);
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
        let owner_cpu = owner.cpu_seconds();
        let (results, churn) = std::thread::scope(|s| {
            let churn = s.spawn(|| {
                call(
                    &mut owner,
                    &Request::Churn {
                        duration_ms,
                        per_s: opts.churn_per_s,
                    },
                )
            });
            let joins: Vec<_> = consumers
                .iter_mut()
                .enumerate()
                .map(|(i, w)| {
                    let spec = LoopSpec {
                        handles: handles.clone(),
                        duration_ms,
                        view_share: opts.view_share,
                        http_share: opts.http_share,
                        seed: 0x5eed + i as u64,
                    };
                    s.spawn(move || call(w, &Request::Load(spec)))
                })
                .collect();
            let results: Vec<Result<Reply, String>> = joins
                .into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err("a consumer thread panicked".into()))
                })
                .collect();
            let churn = churn
                .join()
                .unwrap_or_else(|_| Err("the churn thread panicked".into()));
            (results, churn)
        });
        let owner_cpu = owner.cpu_seconds() - owner_cpu;
        let churn_puts = churn?.count.unwrap_or(0);
        let mut loops = Vec::with_capacity(c);
        for r in results {
            loops.push(r?.load.ok_or("a consumer's reply had no load result")?);
        }
        for mut w in consumers {
            let _ = w.call(&Request::Exit);
        }
        rows.push(aggregate(c, &loops, owner_cpu, churn_puts));
    }
    let _ = owner.call(&Request::Exit);
    Ok(rows)
}

fn aggregate(c: usize, loops: &[LoopResult], owner_cpu: f64, churn_puts: u64) -> LoadRow {
    let secs = loops
        .iter()
        .map(|l| l.elapsed_ns as f64 / 1e9)
        .fold(0.0, f64::max)
        .max(1e-9);
    let fetches: u64 = loops.iter().map(|l| l.fetches).sum();
    let bytes: u64 = loops.iter().map(|l| l.bytes).sum();
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
        churn_puts,
    }
}

/// The rows as a table.
pub fn table(rows: &[LoadRow]) -> String {
    let mut out = String::from(
        "consumers   shards/s        GB/s     p50 us     p99 us   share min..max   owner CPU s/GB   errors   churn puts\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{:<11} {:<15.0} {:<8.2} {:>7.1} {:>10.1}   {:.2}..{:.2}       {:>8.3}        {:>6}   {:>10}\n",
            r.consumers,
            r.shards_per_s,
            r.gbps,
            r.p50_us,
            r.p99_us,
            r.share_min,
            r.share_max,
            r.owner_cpu_s_per_gb,
            r.errors,
            r.churn_puts
        ));
        for (kind, message) in &r.error_samples {
            out.push_str(&format!(
                "            {} x {kind}, e.g.: {message}\n",
                r.errors_by_kind.get(kind).copied().unwrap_or(0)
            ));
        }
    }
    out
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
        let row = aggregate(
            3,
            &[l(100, vec![1000; 10]), l(300, vec![5000; 10]), errors],
            0.5,
            9,
        );
        assert_eq!(row.shards_per_s, 400.0);
        assert_eq!(row.errors, 3);
        assert_eq!(row.errors_by_kind["NotFound"], 3);
        assert_eq!(row.error_samples["NotFound"], "shard 1 is not exported");
        assert_eq!((row.share_min, row.share_max), (0.0, 300.0 / (400.0 / 3.0)));
        assert_eq!(row.p50_us, 1.0);
        assert_eq!(row.p99_us, 5.0);
        assert_eq!(row.churn_puts, 9);
        let svg = svg(&[row]);
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    }
}
