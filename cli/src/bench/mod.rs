//! `shardport bench`: how fast shardport is on this machine, next to what
//! the machine can physically do, measured in the same run.
//!
//! # What runs
//! 1. Limits ([`limits`]): single-thread memcpy between warm buffers and a
//!    raw TCP loopback round trip (our own socket pair) at every size, and a
//!    TCP loopback stream at the largest size.
//! 2. The matrix ([`matrix`]): sizes x paths ([`spec::PATHS`]: shm-view,
//!    shm-copy, http, cuda-ipc) x operations (put; fetch; put then fetch
//!    from another process), warm-up then repetitions, median and p90, each
//!    compared with the limit of the same work. A path whose plugin is not
//!    loaded, unhealthy, or missing what it needs is listed as skipped, with
//!    the reason.
//! 3. Outside the matrix ([`extras`]): plugin dispatch vs a direct call, a
//!    1000 x 4 KiB batch, a consumer's peak RSS during a large http fetch.
//! 4. The targets of issue 7, met or missed ([`report`]).
//!
//! The table goes to the caller (stdout in the CLI), progress to a callback
//! (stderr), and [`BenchReport`] serializes to the JSON file; [`plot`]
//! draws the ratios as SVG. Numbers are reported, never asserted.

pub mod cell;
pub mod cluster;
pub mod extras;
pub mod limits;
pub mod load;
pub mod matrix;
pub mod plot;
pub mod report;
pub mod spec;
pub mod stats;
pub mod weights;

use std::{ffi::OsString, path::PathBuf};

pub use report::BenchReport;
pub use spec::{Op, PathId};

use cell::{Cell, CellStatus};
use matrix::Runner;
use shardport_host::{config::Config, node::Node};
use spec::PathSpec;

/// Bench settings.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// `shardport` executable (starts the owner and consumer workers).
    pub exe: PathBuf,
    /// Config args for the workers.
    pub config_args: Vec<OsString>,
    /// The same config, for the in-process nodes.
    pub config: Config,
    /// Shard sizes, in order.
    pub sizes: Vec<u64>,
    /// Paths, in order.
    pub paths: Vec<PathId>,
    /// Operations, in order.
    pub ops: Vec<Op>,
    /// Timed repetitions per cell.
    pub reps: usize,
    /// Untimed iterations before them.
    pub warmup: usize,
    /// Small and fast: no pool pre-cycling, fewer dispatch calls.
    pub quick: bool,
    /// The command line, for the report.
    pub command: Vec<String>,
}

/// Default timed repetitions per cell.
pub const DEFAULT_REPS: usize = 30;
/// Default warm-up iterations per cell: the first maps the owner's pool
/// and opens the connection; the next ones settle caches.
pub const DEFAULT_WARMUP: usize = 3;
/// Repetitions and warm-up of `--quick`.
pub const QUICK_REPS: usize = 3;
/// Warm-up of `--quick`.
pub const QUICK_WARMUP: usize = 1;
/// Dispatch loop length: 20M calls take ~80 ms, so the clock's resolution
/// and the loop's setup vanish in the per-call figure; `--quick` needs only
/// a figure, not a precise one.
const DISPATCH_CALLS: u64 = 20_000_000;
const QUICK_DISPATCH_CALLS: u64 = 200_000;

/// Bench failure.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Node start failed.
    #[error(transparent)]
    Host(#[from] shardport_host::HostError),
    /// Worker failed.
    #[error(transparent)]
    Worker(#[from] crate::worker::WorkerError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Whether `spec` can run on `node`: its plugin loaded, healthy, with the
/// capabilities it needs, and nothing the host cannot do yet.
pub fn availability(spec: &PathSpec, node: &Node) -> Result<(), String> {
    let t = spec.transport;
    let Some(plugin) = node.plugin(t) else {
        if !node.config().plugins.iter().any(|p| p.name.as_str() == t) {
            return Err(format!(
                "plugin `{t}` is not loaded: the config has no [[plugin]] named `{t}`"
            ));
        }
        let why = node
            .load_failures()
            .iter()
            .find(|f| f.contains(t))
            .cloned()
            .unwrap_or_else(|| "see `shardport plugins`".into());
        return Err(format!("plugin `{t}` did not load: {why}"));
    };
    let health = plugin.transport.health();
    if !health.ok {
        return Err(format!("plugin `{t}` is unhealthy: {}", health.message));
    }
    if !plugin.capabilities().contains(spec.needs) {
        return Err(format!(
            "plugin `{t}` lacks the capability this path needs ({})",
            spec.needs.names().join(", ")
        ));
    }
    if let Some(why) = spec.blocker() {
        return Err(why);
    }
    Ok(())
}

/// Runs the limits, the matrix and the extras; `progress` gets one line per
/// step (`[3/40] http fetch 64 MiB`).
pub fn run_bench(
    opts: &BenchOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, BenchError> {
    if opts.sizes.is_empty() || opts.paths.is_empty() || opts.ops.is_empty() {
        return Err(BenchError::Other(
            "nothing to measure: give at least one size, path and operation".into(),
        ));
    }
    let load_before = report::load_average();
    let node = Node::start(opts.config.clone())?;
    let cells_total = opts.sizes.len() * opts.paths.len() * opts.ops.len();
    let total = opts.sizes.len() + cells_total + 3;
    let mut step = 0;
    let mut say = |what: &str| {
        step += 1;
        progress(&format!("[{step}/{total}] {what}"));
    };

    // 1 + 2. Size by size: this machine's limits at that size, then every
    // cell of that size, so each limit is measured close in time to the
    // cells it is compared with (other work on the machine drifts).
    let tcp_err = |e: std::io::Error| BenchError::Other(format!("raw TCP loopback: {e}"));
    let mut limits = limits::Limits::default();
    let largest = opts.sizes.iter().copied().max().expect("sizes not empty");
    let available: Vec<(PathId, Result<(), String>)> = opts
        .paths
        .iter()
        .map(|&p| (p, availability(p.spec(), &node)))
        .collect();
    let mut runner = Runner::new(opts, &node);
    let mut cells = Vec::with_capacity(cells_total);
    for &size in &opts.sizes {
        let size_label = shardport_kit::format_byte_size(size);
        say(&format!(
            "limits {size_label}: memcpy, tcp loopback round trip"
        ));
        let reps = opts.reps.max(5);
        limits
            .memcpy
            .push(limits::memcpy(size as usize, opts.warmup, reps));
        limits
            .tcp_round_trip
            .push(limits::tcp_round_trip(size as usize, opts.warmup, reps).map_err(tcp_err)?);
        if size == largest {
            limits.tcp_stream =
                Some(limits::tcp_stream(largest as usize, opts.reps.max(3)).map_err(tcp_err)?);
        }
        for (path, available) in &available {
            let spec = path.spec();
            for &op in &opts.ops {
                let label = format!("{path} {op} {size_label}");
                let cell = match available {
                    Err(why) => {
                        say(&format!("{label}: skipped ({why})"));
                        Cell::skipped(spec, op, size, why.clone())
                    }
                    Ok(()) => {
                        say(&format!("{label} ..."));
                        measure_cell(&mut runner, opts, &limits, (spec, op, size))
                    }
                };
                cells.push(cell);
            }
        }
    }
    // Reported path by path, operation by operation, size by size.
    let order = |c: &Cell| {
        (
            opts.paths.iter().position(|&p| p == c.path),
            opts.ops.iter().position(|&o| o == c.op),
            opts.sizes.iter().position(|&s| s == c.size),
        )
    };
    cells.sort_by_key(order);

    // 3. Outside the matrix.
    let extras = run_extras(&mut runner, opts, &node, largest, &mut say);
    runner.finish()?;
    drop(node);

    let targets = report::targets(&cells, &extras, limits.tcp_stream.as_ref());
    Ok(BenchReport {
        schema: report::SCHEMA,
        date: report::utc_now(),
        command: opts.command.clone(),
        machine: report::Machine::probe(),
        load_average: report::LoadAverage {
            before: load_before,
            after: report::load_average(),
        },
        settings: report::Settings {
            sizes: opts.sizes.clone(),
            paths: opts.paths.clone(),
            ops: opts.ops.clone(),
            reps: opts.reps,
            warmup: opts.warmup,
            quick: opts.quick,
        },
        limits,
        cells,
        extras,
        targets,
    })
}

/// One measured cell: its timings summarised and set beside its limit, or
/// why it has none.
fn measure_cell(
    runner: &mut Runner<'_>,
    opts: &BenchOptions,
    limits: &limits::Limits,
    (spec, op, size): (&'static PathSpec, Op, u64),
) -> Cell {
    match runner.run(spec, op, size) {
        Ok(t) => match stats::Summary::of(&t.cell) {
            Some(s) => {
                let paired = stats::Summary::of(&t.limit);
                Cell::measured(spec, op, size, opts.warmup, s, paired.as_ref(), limits)
            }
            None => Cell::skipped(spec, op, size, "no samples".into()),
        },
        Err(e) => {
            let mut c = Cell::skipped(spec, op, size, e.to_string());
            c.status = CellStatus::Failed;
            c
        }
    }
}

/// The measurements outside the matrix: dispatch, the http batch, many small
/// shards and the consumer's peak RSS; a failed one is reported in its row.
fn run_extras(
    runner: &mut Runner<'_>,
    opts: &BenchOptions,
    node: &Node,
    largest: u64,
    say: &mut dyn FnMut(&str),
) -> Vec<extras::Extra> {
    say("dispatch: vtable vs direct call");
    let calls = if opts.quick {
        QUICK_DISPATCH_CALLS
    } else {
        DISPATCH_CALLS
    };
    let mut extras = extras::dispatch(node, calls);
    let http_ok = availability(PathId::Http.spec(), node);
    say("batch: 1000 x 4 KiB over http");
    // A failure here is reported in its row; the matrix is still worth printing.
    let batch = extras::batch(runner, node, opts.reps.min(10), http_ok.clone());
    extras.push(batch.unwrap_or_else(|e| {
        extras::Extra::failed("batch_shards_per_s", "http batch", "shards/s", &e)
    }));
    say("http fetches back to back");
    let reps = if opts.quick { 100 } else { 1000 };
    for size in extras::BACK_TO_BACK_SIZES {
        extras.push(extras::back_to_back(runner, node, size, reps, &http_ok));
    }
    say("many small shards: 4 KiB each, put, and fetched from another process");
    let shm_ok = availability(PathId::ShmCopy.spec(), node);
    let many = if opts.quick {
        extras::QUICK_MANY_SHARDS
    } else {
        extras::MANY_SHARDS
    };
    extras.extend(extras::many_small(
        runner,
        node,
        (many, opts.reps.min(5)),
        shm_ok,
        http_ok.clone(),
    ));
    say("consumer peak RSS during an http fetch");
    let rss = extras::consumer_rss(runner, opts, largest, http_ok);
    extras.push(rss.unwrap_or_else(|e| {
        extras::Extra::failed(
            "http_consumer_peak_rss_x",
            "http consumer peak RSS",
            "x size",
            &e,
        )
    }));
    extras
}
