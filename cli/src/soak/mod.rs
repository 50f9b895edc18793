//! `shardport soak`: many steps of put -> fetch from another process ->
//! drain -> remove, with the owner's and the consumer's RSS and the number of
//! `/dev/shm` entries at the start and at the end. Nothing may grow: a leak
//! of a cache entry, a lease, a segment or a mapping per step shows up here.
//!
//! [`chaos`] is `shardport soak --chaos`: many owners and consumers, killed
//! and restarted at random, with reloads, drains and sweeps, for a duration.

pub mod chaos;
mod plot;

use std::{ffi::OsString, fmt, path::PathBuf};

use serde::Serialize;

use crate::worker::{Request, WorkerError, WorkerProcess};
use shardport_host::vocab::FetchMode;

/// Sizes the steps cycle through.
pub const SOAK_SIZES: [u64; 3] = [4 << 10, 64 << 10, 1 << 20];

/// Steps run before the first snapshot: allocator arenas, mappings and
/// connection pools reach their steady state.
pub const WARMUP_STEPS: usize = 50;

/// Private-memory growth tolerated between the snapshots: allocator
/// fragmentation, not a per-step leak (2000 steps leaking even one small
/// cache entry each would exceed it).
pub const ANON_SLACK: u64 = 8 << 20;

/// Soak settings.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// `shardport` executable.
    pub exe: PathBuf,
    /// Config args for both workers.
    pub config_args: Vec<OsString>,
    /// Steps after the warm-up.
    pub steps: usize,
}

/// A point-in-time measurement.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Snapshot {
    /// Step number.
    pub step: usize,
    /// Owner RSS in bytes.
    pub owner_rss: u64,
    /// Owner private (anonymous) RSS in bytes.
    pub owner_anon: u64,
    /// Consumer RSS in bytes.
    pub consumer_rss: u64,
    /// Consumer private (anonymous) RSS in bytes.
    pub consumer_anon: u64,
    /// Entries in /dev/shm.
    pub shm_entries: usize,
    /// Shards the owner holds.
    pub owner_shards: u64,
    /// Consumer cache entries.
    pub consumer_cache: u64,
}

/// The soak's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// After the warm-up.
    pub start: Snapshot,
    /// After the last step.
    pub end: Snapshot,
    /// Fetches whose bytes did not verify.
    pub bad_fetches: usize,
    /// Transports that served the fetches, with counts.
    pub served_by: std::collections::BTreeMap<String, usize>,
}

impl SoakReport {
    /// True when nothing grew that should not: the owner holds no shard, the
    /// consumer caches nothing, /dev/shm has no more entries, every fetch
    /// verified, and neither process's private memory grew by more than
    /// [`ANON_SLACK`] (allocator noise). Shared-memory RSS is not judged: it
    /// is the owner's pool pages being touched once as the allocator moves
    /// through the pool, bounded by the pool size, and shared, not leaked.
    pub fn flat(&self) -> bool {
        let grew = |a: u64, b: u64| b.saturating_sub(a) > ANON_SLACK;
        self.bad_fetches == 0
            && self.end.owner_shards == 0
            && self.end.consumer_cache == 0
            && self.end.shm_entries <= self.start.shm_entries
            && !grew(self.start.owner_anon, self.end.owner_anon)
            && !grew(self.start.consumer_anon, self.end.consumer_anon)
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        writeln!(
            f,
            "{:>6} {:>22} {:>24} {:>9} {:>12} {:>14}",
            "step",
            "owner RSS (anon) MiB",
            "consumer RSS (anon) MiB",
            "/dev/shm",
            "owner shards",
            "consumer cache"
        )?;
        for s in [self.start, self.end] {
            writeln!(
                f,
                "{:>6} {:>22} {:>24} {:>9} {:>12} {:>14}",
                s.step,
                format!("{:.1} ({:.1})", mib(s.owner_rss), mib(s.owner_anon)),
                format!("{:.1} ({:.1})", mib(s.consumer_rss), mib(s.consumer_anon)),
                s.shm_entries,
                s.owner_shards,
                s.consumer_cache
            )?;
        }
        writeln!(
            f,
            "served by: {:?}; bad fetches: {}",
            self.served_by, self.bad_fetches
        )?;
        write!(
            f,
            "{}",
            if self.flat() {
                "flat: nothing leaked (shared-memory RSS is pool pages touched once, bounded by the pool size)"
            } else {
                "NOT FLAT"
            }
        )
    }
}

/// Counts entries in /dev/shm.
pub fn shm_entries() -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn snapshot(
    step: usize,
    owner: &mut WorkerProcess,
    consumer: &mut WorkerProcess,
) -> Result<Snapshot, WorkerError> {
    let o = owner.call(&Request::Stats)?;
    let c = consumer.call(&Request::Stats)?;
    let get = |r: &crate::worker::Reply, k: &str| {
        r.stats.as_ref().and_then(|s| s[k].as_u64()).unwrap_or(0)
    };
    Ok(Snapshot {
        step,
        owner_rss: o.rss.unwrap_or(0),
        owner_anon: o.rss_anon.unwrap_or(0),
        consumer_rss: c.rss.unwrap_or(0),
        consumer_anon: c.rss_anon.unwrap_or(0),
        shm_entries: shm_entries(),
        owner_shards: get(&o, "shards_owned"),
        consumer_cache: get(&c, "cache_entries"),
    })
}

/// Runs the soak; `progress` is called every 500 steps.
pub fn run_soak(
    opts: &SoakOptions,
    mut progress: impl FnMut(usize),
) -> Result<SoakReport, WorkerError> {
    let mut owner = WorkerProcess::spawn("owner", &opts.exe, &opts.config_args)?;
    let mut consumer_args = opts.config_args.clone();
    consumer_args.push("--cache-explicit".into());
    let mut consumer = WorkerProcess::spawn("consumer", &opts.exe, &consumer_args)?;
    let mut bad = 0;
    let mut served_by = std::collections::BTreeMap::new();
    let mut start = Snapshot::default();
    let total = WARMUP_STEPS + opts.steps;
    for step in 0..total {
        if step == WARMUP_STEPS {
            start = snapshot(step, &mut owner, &mut consumer)?;
        }
        let seed = step as u64;
        let put = owner.call(&Request::Put {
            len: SOAK_SIZES[step % SOAK_SIZES.len()],
            seed,
            dtype: None,
            tags: Default::default(),
        })?;
        let id = put.id.clone().unwrap_or_default();
        let got = consumer.call(&Request::Fetch {
            handle: put.handle.unwrap_or_default(),
            mode: Some(if step % 2 == 0 {
                FetchMode::View
            } else {
                FetchMode::Copy
            }),
            seed: Some(seed),
            hold: false,
            only: None,
        })?;
        if got.verified != Some(true) {
            bad += 1;
        }
        *served_by
            .entry(got.transport.unwrap_or_default())
            .or_insert(0) += 1;
        consumer.call(&Request::Drain {
            ids: vec![id.clone()],
        })?;
        owner.call(&Request::Remove { ids: vec![id] })?;
        if step > 0 && step % 500 == 0 {
            progress(step);
        }
    }
    let end = snapshot(total, &mut owner, &mut consumer)?;
    consumer.exit()?;
    owner.exit()?;
    Ok(SoakReport {
        start,
        end,
        bad_fetches: bad,
        served_by,
    })
}
