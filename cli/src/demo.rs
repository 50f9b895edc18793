//! `shardport demo`: the main job on a config (the embedded default unless
//! told otherwise). It starts a real owner process and a real consumer
//! process (`shardport worker`), puts shards of several sizes in the owner
//! (bytes ready in a buffer, as an application has them), passes each
//! handle to the consumer, fetches it as a zero-copy view and as a copy,
//! verifies every byte, fetches one shard the way a consumer on another
//! machine would (over http, chosen by a route), removes the shards and
//! checks the owner's storage came back.
//!
//! Timings are steady state: every size is put, fetched and removed
//! [`DEMO_WARMUP`] times untimed before [`DEMO_REPS`] timed rounds, whose
//! median is shown (first-touch page faults and cold connections would
//! otherwise dominate the small sizes).

use std::{ffi::OsString, fmt, path::PathBuf};

use anstyle::{AnsiColor, Style};
use shardport_host::FetchMode;

use crate::worker::{Reply, Request, WorkerError, WorkerProcess};

/// Shard sizes the demo puts, smallest first.
pub const DEMO_SIZES: [u64; 6] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20];

/// Untimed rounds per size before the timed ones (pool pages touched,
/// connections open, caches warm).
pub const DEMO_WARMUP: usize = 2;

/// Timed rounds per size; the median is shown.
pub const DEMO_REPS: usize = 5;

/// From this size on, one warm-up and one timed round: a round moves
/// enough bytes to be steady by itself, and the demo stays quick.
pub const DEMO_LARGE: u64 = 64 << 20;

/// Size of the shard fetched over the network route.
pub const NETWORK_SHARD: u64 = 1 << 20;

/// The tag (and value) the default config's `network` route matches: the
/// shard goes over http, as it would to a consumer on another machine.
pub const NETWORK_TAG: (&str, &str) = ("path", "network");

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The `shardport` executable to start workers from.
    pub exe: PathBuf,
    /// Arguments selecting the config for the workers (`--config FILE`, or none).
    pub config_args: Vec<OsString>,
    /// Largest shard size to put.
    pub max_size: u64,
    /// Also fetch one shard over the network route (the http transport is
    /// loaded and healthy).
    pub network: bool,
    /// Environment for the worker processes (e.g. their log filter).
    pub worker_env: Vec<(String, String)>,
}

/// One line of the demo table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DemoRow {
    /// Shard size in bytes.
    pub size: u64,
    /// `put`, `view` or `copy`.
    pub op: String,
    /// Transport that served it (`owner` for `put`).
    pub transport: String,
    /// Why, as the router said (fetch rows).
    pub reason: String,
    /// Median duration in ns (put: owner side; fetch: consumer side, handle -> bytes).
    pub ns: u64,
    /// Timed rounds the median is of.
    pub reps: usize,
    /// Bytes verified against the owner's pattern in every round (fetch rows).
    pub verified: Option<bool>,
    /// Downgraded in any round.
    pub downgraded: bool,
}

/// A transport of the config and whether it can serve here.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TransportState {
    /// Plugin name.
    pub name: String,
    /// Loaded and healthy.
    pub available: bool,
    /// The plugin's health message (why not, when unavailable).
    pub detail: String,
}

/// What the demo did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    /// Owner pid.
    pub owner_pid: u32,
    /// Consumer pid.
    pub consumer_pid: u32,
    /// Untimed rounds per size.
    pub warmup: usize,
    /// Timed rounds per size (below [`DEMO_LARGE`]).
    pub reps: usize,
    /// Table rows.
    pub rows: Vec<DemoRow>,
    /// The config's transports (filled in by the caller).
    pub transports: Vec<TransportState>,
    /// Owner's plugin stats after every shard was removed (e.g. pool bytes in use).
    pub owner_after_remove: serde_json::Value,
}

impl DemoReport {
    /// True when every fetch verified and nothing was downgraded.
    pub fn all_verified(&self) -> bool {
        self.rows
            .iter()
            .filter(|r| r.op != "put")
            .all(|r| r.verified == Some(true) && !r.downgraded)
    }

    /// Bytes the owner's transports still report in use after every shard
    /// was removed (`pool_bytes_used` gauges); 0 when storage came back.
    pub fn bytes_still_used(&self) -> u64 {
        self.owner_plugins()
            .filter_map(|p| p["stats"]["pool_bytes_used"].as_u64())
            .sum()
    }

    fn owner_plugins(&self) -> impl Iterator<Item = &serde_json::Value> {
        self.owner_after_remove.as_array().into_iter().flatten()
    }
}

/// Demo failure.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A worker failed.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The owner no longer had shards the demo put.
    #[error("the owner lost shards it was never asked to remove: {0:?}")]
    Lost(Vec<String>),
    /// A reply lacked a field.
    #[error("the {0} process sent an incomplete reply")]
    Incomplete(&'static str),
}

/// The owner and consumer processes of a demo run.
struct Pair {
    owner: WorkerProcess,
    consumer: WorkerProcess,
}

/// One shard to put and fetch: its size, tags and the fetch modes.
struct Case {
    size: u64,
    network: bool,
    modes: &'static [FetchMode],
}

/// Runs the demo.
pub fn run_demo(opts: &DemoOptions) -> Result<DemoReport, DemoError> {
    let env = &opts.worker_env;
    let mut pair = Pair {
        owner: WorkerProcess::spawn_with_env("owner", &opts.exe, &opts.config_args, env)?,
        consumer: WorkerProcess::spawn_with_env("consumer", &opts.exe, &opts.config_args, env)?,
    };
    let mut cases: Vec<Case> = DEMO_SIZES
        .iter()
        .filter(|&&s| s <= opts.max_size)
        .map(|&size| Case {
            size,
            network: false,
            modes: &[FetchMode::View, FetchMode::Copy],
        })
        .collect();
    if opts.network {
        cases.push(Case {
            size: NETWORK_SHARD.min(opts.max_size),
            network: true,
            modes: &[FetchMode::Copy],
        });
    }
    let mut rows = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        rows.extend(pair.measure(case, 0x5eed_0000 + (i as u64) * 100)?);
    }
    let stats = pair.owner.call(&Request::Stats)?.stats.unwrap_or_default();
    let report = DemoReport {
        owner_pid: pair.owner.pid(),
        consumer_pid: pair.consumer.pid(),
        warmup: DEMO_WARMUP,
        reps: DEMO_REPS,
        rows,
        transports: Vec::new(),
        owner_after_remove: stats
            .get("plugins")
            .cloned()
            .unwrap_or(serde_json::Value::Null),
    };
    pair.consumer.exit()?;
    pair.owner.exit()?;
    Ok(report)
}

impl Pair {
    /// Warm-up rounds, then timed rounds of put -> fetch in each mode ->
    /// remove; one row per operation with the median time.
    fn measure(&mut self, case: &Case, seed: u64) -> Result<Vec<DemoRow>, DemoError> {
        let (warmup, reps) = if case.size >= DEMO_LARGE {
            (1, 1)
        } else {
            (DEMO_WARMUP, DEMO_REPS)
        };
        for round in 0..warmup {
            self.round(case, seed + round as u64)?;
        }
        let mut rounds = Vec::with_capacity(reps);
        for round in 0..reps {
            rounds.push(self.round(case, seed + (warmup + round) as u64)?);
        }
        Ok(summarize(case, &rounds))
    }

    /// One put, a fetch per mode, one remove: the put's time and the
    /// consumer's replies.
    fn round(&mut self, case: &Case, seed: u64) -> Result<(u64, Vec<Reply>), DemoError> {
        let mut tags = std::collections::BTreeMap::new();
        if case.network {
            tags.insert(NETWORK_TAG.0.to_owned(), NETWORK_TAG.1.to_owned());
        }
        let put = self.owner.call(&Request::PutBuffer {
            len: case.size,
            seed,
            tags,
        })?;
        let handle = put.handle.ok_or(DemoError::Incomplete("owner"))?;
        let id = put.id.ok_or(DemoError::Incomplete("owner"))?;
        let mut fetched = Vec::with_capacity(case.modes.len());
        for &mode in case.modes {
            fetched.push(self.consumer.call(&Request::Fetch {
                handle: handle.clone(),
                mode: Some(mode),
                seed: Some(seed),
                hold: false,
                only: None,
            })?);
        }
        let missing = self
            .owner
            .call(&Request::Remove { ids: vec![id] })?
            .missing
            .unwrap_or_default();
        if !missing.is_empty() {
            return Err(DemoError::Lost(missing));
        }
        Ok((put.ns.unwrap_or(0), fetched))
    }
}

/// The rows of one case from its timed rounds: medians, and a fetch row
/// verified only when every round verified.
fn summarize(case: &Case, rounds: &[(u64, Vec<Reply>)]) -> Vec<DemoRow> {
    let mut rows = Vec::with_capacity(1 + case.modes.len());
    // The network case's put is the same as the other puts: no row.
    if !case.network {
        rows.push(DemoRow {
            size: case.size,
            op: "put".to_owned(),
            transport: "owner".to_owned(),
            reason: "bytes ready in the owner's buffer, copied once into storage, then exported"
                .to_owned(),
            ns: median(rounds.iter().map(|(ns, _)| *ns).collect()),
            reps: rounds.len(),
            verified: None,
            downgraded: false,
        });
    }
    for (m, mode) in case.modes.iter().enumerate() {
        let replies: Vec<&Reply> = rounds.iter().map(|(_, f)| &f[m]).collect();
        let last = replies[replies.len() - 1];
        rows.push(DemoRow {
            size: case.size,
            op: mode.to_string(),
            transport: last.transport.clone().unwrap_or_else(|| "?".to_owned()),
            reason: last.reason.clone().unwrap_or_default(),
            ns: median(replies.iter().map(|r| r.ns.unwrap_or(0)).collect()),
            reps: rounds.len(),
            verified: Some(replies.iter().all(|r| r.verified == Some(true))),
            downgraded: replies.iter().any(|r| r.downgraded.unwrap_or(false)),
        });
    }
    rows
}

/// The median (the upper one of an even count).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Human size (`256 MiB`).
pub fn size_label(n: u64) -> String {
    shardport_kit::format_byte_size(n)
}

/// Human duration from ns.
pub fn time_label(ns: u64) -> String {
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

const HEADER: Style = Style::new().bold();
const GOOD: Style = AnsiColor::Green.on_default();
const BAD: Style = AnsiColor::Red.on_default().bold();
const NOTE: Style = AnsiColor::Yellow.on_default();

/// The table and the summary. Styled with ANSI escapes: print it through
/// `anstream`, which drops them where the stream is not a terminal or
/// `NO_COLOR` is set.
impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "owner pid {}, consumer pid {}: separate processes, handles passed between them as bytes.",
            self.owner_pid, self.consumer_pid
        )?;
        writeln!(
            f,
            "Steady-state timings: {} untimed rounds per size, then the median of {} timed ones\n(one of each from {} up).\n",
            self.warmup,
            self.reps,
            size_label(DEMO_LARGE)
        )?;
        writeln!(
            f,
            "{HEADER}{:>9}  {:<5} {:<10} {:>10} {:>10}  {:<6}why{HEADER:#}",
            "size", "op", "transport", "time", "GB/s", "bytes"
        )?;
        for r in &self.rows {
            write_row(f, r)?;
        }
        writeln!(f)?;
        self.write_summary(f)
    }
}

fn write_row(f: &mut fmt::Formatter<'_>, r: &DemoRow) -> fmt::Result {
    let gbps = if r.op == "view" {
        "zero-copy".to_owned()
    } else if r.ns > 0 {
        format!("{:.2}", r.size as f64 / r.ns as f64)
    } else {
        "-".to_owned()
    };
    let check = match r.verified {
        Some(true) => format!("{GOOD}ok{GOOD:#}   "),
        Some(false) => format!("{BAD}BAD{BAD:#}  "),
        None => "     ".to_owned(),
    };
    let reason = if r.downgraded {
        format!("{BAD}DOWNGRADED{BAD:#}: {}", r.reason)
    } else {
        r.reason.clone()
    };
    writeln!(
        f,
        "{:>9}  {:<5} {:<10} {:>10} {:>10}  {check} {reason}",
        size_label(r.size),
        r.op,
        r.transport,
        time_label(r.ns),
        gbps,
    )
}

impl DemoReport {
    /// Storage after remove, the verdict and which transports were available.
    fn write_summary(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.owner_plugins() {
            let (Some(used), Some(total)) = (
                p["stats"]["pool_bytes_used"].as_u64(),
                p["stats"]["pool_bytes_total"].as_u64(),
            ) else {
                continue;
            };
            writeln!(
                f,
                "Owner storage after remove: {} pool, {} of {} in use, {} shards live.",
                p["name"].as_str().unwrap_or("?"),
                size_label(used),
                size_label(total),
                p["stats"]["shards_live"].as_u64().unwrap_or(0)
            )?;
        }
        let fetches = self.rows.iter().filter(|r| r.op != "put").count();
        if self.all_verified() {
            writeln!(
                f,
                "{GOOD}All {fetches} fetch rows verified byte for byte, none downgraded.{GOOD:#}"
            )?;
        } else {
            writeln!(
                f,
                "{BAD}Some fetches did not verify or were downgraded (see the table).{BAD:#}"
            )?;
        }
        self.write_transports(f)
    }

    fn write_transports(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let up: Vec<&str> = self
            .transports
            .iter()
            .filter(|t| t.available)
            .map(|t| t.name.as_str())
            .collect();
        let down: Vec<String> = self
            .transports
            .iter()
            .filter(|t| !t.available)
            .map(|t| {
                let why = t.detail.strip_prefix("unavailable: ").unwrap_or(&t.detail);
                format!("{} ({why})", t.name)
            })
            .collect();
        if !up.is_empty() {
            write!(f, "Transports available here: {}", up.join(", "))?;
        }
        if down.is_empty() {
            writeln!(f, ".")
        } else {
            writeln!(f, "; {NOTE}unavailable: {}{NOTE:#}.", down.join("; "))
        }
    }
}
