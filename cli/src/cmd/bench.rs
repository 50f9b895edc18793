//! `shardport bench`: put and fetch through every path at several sizes,
//! each next to this machine's own limit measured in the same run.

use std::path::{Path, PathBuf};

use shardport_cli::bench::{self, run_bench, BenchOptions, Op, PathId};

use super::{config_args, current_exe, load_config, write_file, Failure, Outcome, EXIT_FAILURE};

/// Arguments of `shardport bench`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// `cluster`: broadcast and fan-in across a simulated cluster.
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    config: super::ConfigArg,
    /// Shard sizes, comma separated [default: 4KiB,64KiB,1MiB,4MiB,64MiB,256MiB].
    #[arg(long, value_delimiter = ',', value_parser = bench::spec::parse_size)]
    sizes: Vec<u64>,
    /// Paths, comma separated: shm-view, shm-copy, http, cuda-ipc,
    /// cuda-copy, cuda-http
    /// [default: all; a path whose plugin is absent is listed as skipped].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(PathId))]
    paths: Vec<PathId>,
    /// Operations, comma separated: put, fetch, put-fetch [default: all].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(Op))]
    ops: Vec<Op>,
    /// Timed repetitions per cell [default: 30; 3 with --quick].
    #[arg(long)]
    reps: Option<usize>,
    /// Untimed warm-up iterations per cell [default: 3; 1 with --quick].
    #[arg(long)]
    warmup: Option<usize>,
    /// Write the full report as JSON to this file (`-`: stdout, instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG chart of each cell's ratio to its limit to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Small sizes (4KiB,256KiB) and few repetitions, pools not
    /// pre-cycled: checks that everything runs, in seconds.
    #[arg(long)]
    quick: bool,
}

/// Benchmarks other than the one-machine matrix.
#[derive(clap::Subcommand)]
enum Sub {
    /// Broadcast and fan-in across a simulated cluster: network namespaces
    /// behind a bridge, every link rate-limited (needs root, `ip`, `tc`),
    /// each result beside its floor from the link rates.
    Cluster(ClusterArgs),
    /// Many consumer processes fetching from one owner at once, for a fixed
    /// time per point, the owner putting and removing meanwhile: rate,
    /// latency, fairness, owner CPU per GB and errors per consumer count.
    Load(LoadArgs),
    /// Weight updates of a synthetic state dict: across the simulated
    /// cluster (one publisher, N receivers, relays as the docs configure
    /// them) beside S / B, and on one node beside a copy of the same bytes.
    Weights(WeightsArgs),
}

/// Arguments of `shardport bench weights`.
#[derive(clap::Args)]
struct WeightsArgs {
    /// State dicts, comma separated: gpt-64MiB, gpt-1GiB, small-1000x4KiB
    /// [default: gpt-64MiB].
    #[arg(long = "dict", value_delimiter = ',', value_parser = bench::weights::Dict::parse)]
    dicts: Vec<bench::weights::Dict>,
    /// Receiver counts across the simulated cluster, comma separated
    /// (needs root, `ip`, `tc`) [default: none with --local, else 8].
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Every node's link rate, each direction (`200mbit`, `1gbit`).
    #[arg(long, default_value = "200mbit", value_parser = shardport_cli::cluster::parse_rate)]
    rate: u64,
    /// The one-node update (owner and receiver processes on this machine).
    #[arg(long)]
    local: bool,
    /// Measured versions per configuration, after the warm-up ones.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// The publisher's bucket size [default: 16MiB].
    #[arg(long, value_parser = bench::spec::parse_size)]
    bucket_size: Option<u64>,
    /// Write the rows as JSON to this file (`-`: stdout, instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// This executable (what the testbed's workers run) and the directory
/// beside it, where cargo puts the plugin libraries.
fn exe_and_plugin_dir() -> Result<(PathBuf, PathBuf), Failure> {
    let exe = current_exe()?;
    let dir = exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    Ok((exe, dir))
}

fn run_weights(args: WeightsArgs) -> Outcome {
    let (exe, plugin_dir) = exe_and_plugin_dir()?;
    let nodes = if args.nodes.is_empty() && !args.local {
        vec![8]
    } else {
        dedup(args.nodes.clone())
    };
    let opts = bench::weights::WeightsOptions {
        dicts: if args.dicts.is_empty() {
            vec![bench::weights::Dict::Gpt64]
        } else {
            args.dicts.clone()
        },
        nodes,
        rate_bps: args.rate,
        local: args.local,
        steps: args.steps,
        bucket_size: args.bucket_size,
        exe,
        plugin_dir,
    };
    let rows = bench::weights::run_weights(&opts, &mut |line| eprintln!("{line}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    write_report(args.json.as_deref(), &rows, || bench::weights::table(&rows))?;
    if rows.iter().any(|r| !r.correct) {
        return Err((
            EXIT_FAILURE,
            "a receiver's tensors did not match the publisher's".to_owned(),
        )
            .into());
    }
    Ok(())
}

/// Arguments of `shardport bench load`.
#[derive(clap::Args)]
struct LoadArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Consumer process counts, comma separated [default: 1,2,8,32].
    #[arg(long, value_delimiter = ',')]
    consumers: Vec<usize>,
    /// How long each point runs (`10s`, `500ms`).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: std::time::Duration,
    /// Share of fetches made as zero-copy views (the rest copies), 0..=1.
    #[arg(long, default_value_t = 0.5)]
    view_share: f64,
    /// Share of fetches made through http (the rest posix-shm), 0..=1.
    #[arg(long, default_value_t = 0.5)]
    http_share: f64,
    /// The owner's puts and removes per second meanwhile (0: unpaced).
    #[arg(long, default_value_t = 1000)]
    churn_rate: u64,
    /// Check every fetched shard's bytes against the owner's (the row's
    /// `wrong_fetches`); the consumers then read every byte, so the rates
    /// are lower than without.
    #[arg(long)]
    verify: bool,
    /// Leave out each point's copy and TCP limits (a copy limit holds a
    /// view of every shard at once, which a tight `max-leases` refuses).
    #[arg(long)]
    no_limits: bool,
    /// Write the rows as JSON to this file (`-`: stdout, instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG of the curves to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    shardport_host::config::parse_duration(text)
        .filter(|d| !d.is_zero() && d.as_secs() <= 24 * 3600)
        .ok_or_else(|| format!("`{text}` is not a duration of up to a day (e.g. 10s, 500ms)"))
}

fn run_load(args: LoadArgs) -> Outcome {
    for (name, v) in [
        ("--view-share", args.view_share),
        ("--http-share", args.http_share),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err((EXIT_FAILURE, format!("{name} {v}: expected 0..=1")).into());
        }
    }
    let opts = bench::load::LoadOptions {
        consumers: dedup(or(&args.consumers, &[1, 2, 8, 32])),
        duration: args.duration,
        view_share: args.view_share,
        http_share: args.http_share,
        churn_per_s: args.churn_rate,
        exe: current_exe()?,
        config_args: config_args(args.config.path())?,
        verify: args.verify,
        limits: !args.no_limits,
    };
    let rows = bench::load::run_load(&opts, &mut |line| eprintln!("{line}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    write_report(args.json.as_deref(), &rows, || bench::load::table(&rows))?;
    if let Some(path) = &args.plot {
        write_file(path, bench::load::svg(&rows).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Arguments of `shardport bench cluster`.
#[derive(clap::Args)]
struct ClusterArgs {
    /// Node counts N, comma separated [default: 2,4,8].
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<usize>,
    /// Shard sizes, comma separated [default: 64MiB].
    #[arg(long = "size", value_delimiter = ',', value_parser = bench::spec::parse_size)]
    sizes: Vec<u64>,
    /// Every node's link rate, each direction (`200mbit`, `1gbit`).
    #[arg(long, default_value = "200mbit", value_parser = shardport_cli::cluster::parse_rate)]
    rate: u64,
    /// The fan-in consumer's link is this many times faster.
    #[arg(long, default_value_t = 4)]
    fanin_factor: u64,
    /// After the other runs of each N, one more relayed broadcast in which
    /// the first relay of the chain is killed (SIGKILL) a third of the way
    /// through the floor time: the survivors' time and bytes.
    #[arg(long)]
    kill_relay: bool,
    /// After the other runs of each N (before `--kill-relay`), one more
    /// relayed broadcast in which the first relay of the chain is stopped
    /// (SIGSTOP) a third of the way through the floor time for this long
    /// (`3s`), then continued: the other consumers' time and its own
    #[arg(long, value_parser = parse_duration)]
    stall_relay: Option<std::time::Duration>,
    /// Every node's `relay-lag` (`250ms`): the least time without a piece
    /// after which a source is late [default: the http plugin's]
    #[arg(long, value_parser = parse_duration)]
    lag: Option<std::time::Duration>,
    /// Phases to leave out, comma separated: `owner-only` (the broadcast
    /// with the owner serving everyone), `fan-in`. The broadcast with
    /// relays always runs.
    #[arg(long, value_delimiter = ',', value_parser = ["owner-only", "fan-in"])]
    skip: Vec<String>,
    /// The owner's `relay-piece` (bytes per verified piece) [default: the
    /// http plugin's, 256KiB].
    #[arg(long, value_parser = bench::spec::parse_size)]
    piece: Option<u64>,
    /// The consumers' `relay-window` (bytes of its latest pieces each relay
    /// keeps) [default: the whole shard]: what lets N nodes on one machine
    /// relay a shard of several GiB.
    #[arg(long, value_parser = bench::spec::parse_size)]
    window: Option<u64>,
    /// Every node's `relay-sources` (sources a relayed fetch takes pieces
    /// from at once: its parent and alternates) [default: the http
    /// plugin's, 2]; 1 is the plain chain.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    sources: Option<u32>,
    /// Write the rows as JSON to this file (`-`: stdout, instead of the table).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG of each time over its floor against N to this file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

fn run_cluster(args: ClusterArgs) -> Outcome {
    let (exe, plugin_dir) = exe_and_plugin_dir()?;
    let opts = bench::cluster::ClusterOptions {
        nodes: dedup(or(&args.nodes, &[2, 4, 8])),
        sizes: dedup(or(&args.sizes, &[64 << 20])),
        rate_bps: args.rate,
        fanin_factor: args.fanin_factor,
        kill_relay: args.kill_relay,
        stall_relay: args.stall_relay,
        relay_lag: args.lag,
        owner_only: !args.skip.iter().any(|p| p == "owner-only"),
        fanin: !args.skip.iter().any(|p| p == "fan-in"),
        relay_piece: args.piece,
        relay_window: args.window,
        relay_sources: args.sources,
        exe,
        plugin_dir,
    };
    let rows = bench::cluster::run_cluster(&opts, &mut |line| eprintln!("{line}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    write_report(args.json.as_deref(), &rows, || {
        format!(
            "{}\n{}",
            bench::cluster::table(&rows),
            bench::cluster::targets(&rows)
        )
    })?;
    if let Some(path) = &args.plot {
        write_file(path, bench::cluster::svg(&rows).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    if rows.iter().any(|r| !r.verified) {
        return Err((
            EXIT_FAILURE,
            "a copy did not match the owner's bytes".to_owned(),
        )
            .into());
    }
    Ok(())
}

/// Prints `table()` unless the JSON goes to stdout (`json` is `-`), and
/// writes `rows` as JSON to `json` when given.
fn write_report<T: serde::Serialize>(
    json: Option<&Path>,
    rows: &T,
    table: impl FnOnce() -> String,
) -> Outcome {
    let to_stdout = json == Some(Path::new("-"));
    if !to_stdout {
        print!("{}", table());
    }
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(rows).unwrap_or_default();
        if to_stdout {
            println!("{text}");
        } else {
            write_file(path, text.as_bytes())?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Runs the matrix, prints the table, writes the JSON and plot files;
/// fails naming the measurements that failed.
pub fn run(args: Args) -> Outcome {
    match args.sub {
        Some(Sub::Cluster(c)) => return run_cluster(c),
        Some(Sub::Load(l)) => return run_load(l),
        Some(Sub::Weights(w)) => return run_weights(w),
        None => {}
    }
    let opts = options(&args)?;
    let report = run_bench(&opts, &mut |line| eprintln!("{line}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    write_report(args.json.as_deref(), &report, || report.to_string())?;
    if let Some(path) = &args.plot {
        write_file(path, bench::plot::svg(&report).as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    let mut failed: Vec<String> = report
        .cells
        .iter()
        .filter(|c| c.status == bench::cell::CellStatus::Failed)
        .map(|c| {
            format!(
                "{} {} {}",
                c.path,
                c.op,
                shardport_kit::format_byte_size(c.size)
            )
        })
        .collect();
    failed.extend(
        report
            .extras
            .iter()
            .filter(|e| e.failed)
            .map(|e| e.name.clone()),
    );
    if !failed.is_empty() {
        return Err((
            EXIT_FAILURE,
            format!(
                "{} measurements failed (see the table): {}",
                failed.len(),
                failed.join(", ")
            ),
        )
            .into());
    }
    Ok(())
}

/// The arguments with their defaults filled in (`--quick` picks smaller ones).
fn options(args: &Args) -> Result<BenchOptions, Failure> {
    let quick = args.quick;
    let (sizes, reps, warmup) = if quick {
        (
            bench::spec::QUICK_SIZES,
            bench::QUICK_REPS,
            bench::QUICK_WARMUP,
        )
    } else {
        (
            bench::spec::DEFAULT_SIZES,
            bench::DEFAULT_REPS,
            bench::DEFAULT_WARMUP,
        )
    };
    let config = load_config(args.config.path())?;
    Ok(BenchOptions {
        exe: current_exe()?,
        config_args: config_args(args.config.path())?,
        config,
        sizes: dedup(or(&args.sizes, sizes)),
        paths: dedup(or(&args.paths, bench::spec::DEFAULT_PATHS)),
        ops: dedup(or(&args.ops, bench::spec::ALL_OPS)),
        reps: args.reps.unwrap_or(reps).max(1),
        warmup: args.warmup.unwrap_or(warmup),
        quick,
        command: std::env::args().collect(),
    })
}

/// `given`, or `default` when nothing was given.
fn or<T: Clone>(given: &[T], default: &[T]) -> Vec<T> {
    if given.is_empty() {
        default.to_vec()
    } else {
        given.to_vec()
    }
}

/// The items of `v` in order, each once.
fn dedup<T: PartialEq>(v: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}
