//! `shardport soak`: put -> fetch from another process -> drain -> remove,
//! many times; both processes' RSS and the `/dev/shm` entry count at the
//! start and at the end (they must stay flat).
//!
//! `shardport soak --chaos --duration D`: owners and consumers in separate
//! processes, killed and restarted at random, with reloads, drains and
//! sweeps (see `shardport_cli::soak::chaos`); fails on any wrong byte or
//! leaked segment.

use std::{path::PathBuf, time::Duration};

use shardport_cli::soak::{
    chaos::{run_chaos, ChaosOptions},
    run_soak, SoakOptions,
};

use super::{config_args, current_exe, print_report, write_file, Failure, Outcome, EXIT_FAILURE};

/// Arguments of `shardport soak`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Steps after the warm-up (the step soak).
    #[arg(long, default_value_t = 2000)]
    steps: usize,
    /// Print the report as JSON; with a file name (`--json F`), write it
    /// there and print the table.
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    json: Option<Option<PathBuf>>,
    /// The chaos soak: owners and consumers killed at random, reloads,
    /// drains and sweeps, for `--duration`.
    #[arg(long)]
    chaos: bool,
    /// How long the chaos soak runs (`90s`, `10m`, `1h`).
    #[arg(long, default_value = "10m", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    duration: Duration,
    /// Owner processes (the first is never killed).
    #[arg(long, default_value_t = 2, requires = "chaos")]
    owners: usize,
    /// Consumer processes (the first is never killed).
    #[arg(long, default_value_t = 4, requires = "chaos")]
    consumers: usize,
    /// Seed of the random choices (victims, moments, sizes, modes).
    #[arg(long, default_value_t = 1, requires = "chaos")]
    seed: u64,
    /// Mean time between SIGKILLs (each wait is 0.5x-1.5x of it).
    #[arg(long, default_value = "20s", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    kill_every: Duration,
    /// Time between config reloads of every worker.
    #[arg(long, default_value = "60s", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    reload_every: Duration,
    /// Time between drains of the consumers' caches and sweeps of every worker.
    #[arg(long, default_value = "30s", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    sweep_every: Duration,
    /// Time between resource snapshots.
    #[arg(long, default_value = "60s", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    snapshot_every: Duration,
    /// Flatness is judged on the snapshots after this time, first half
    /// against second (half the duration in shorter runs).
    #[arg(long, default_value = "5m", value_parser = shardport_host::config::duration_arg, requires = "chaos")]
    mark: Duration,
    /// Live shards each owner keeps.
    #[arg(long, default_value_t = 32, requires = "chaos")]
    shards_per_owner: usize,
    /// Each owner's shared-memory pool, MiB.
    #[arg(long, default_value_t = 256, requires = "chaos")]
    pool_mib: u64,
    /// Directory of the plugin libraries (default: $SHARDPORT_PLUGIN_DIR,
    /// else next to this executable, else its `deps/`).
    #[arg(long, value_name = "DIR", requires = "chaos")]
    plugin_dir: Option<PathBuf>,
    /// Write an SVG plot of RSS and fds over time (chaos soak).
    #[arg(long, value_name = "FILE", requires = "chaos")]
    plot: Option<PathBuf>,
    /// At every snapshot, write each live worker's metrics (Prometheus
    /// text, labelled `soak_worker`) to DIR/shardport-soak-<worker>.prom,
    /// for a node_exporter textfile collector and the Grafana dashboard.
    #[arg(long, value_name = "DIR", requires = "chaos")]
    metrics_dir: Option<PathBuf>,
}

/// Runs the soak; fails when anything grew (or, chaos, on any wrong byte,
/// leaked segment or crash).
pub fn run(args: Args) -> Outcome {
    if args.chaos {
        return run_chaos_soak(args);
    }
    let opts = SoakOptions {
        exe: current_exe()?,
        config_args: config_args(args.config.path())?,
        steps: args.steps,
    };
    let report = run_soak(&opts, |s| eprintln!("soak: step {s}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    let json = emit(&args.json, &report)?;
    if !json {
        println!();
    }
    if !report.flat() {
        return Err((EXIT_FAILURE, "the soak leaked (see the table)").into());
    }
    Ok(())
}

/// Prints the report (JSON to stdout with a bare `--json`, else the table)
/// and writes it to the `--json` file when one is named; returns whether
/// stdout got JSON.
fn emit(
    json: &Option<Option<PathBuf>>,
    report: &(impl serde::Serialize + std::fmt::Display),
) -> Result<bool, Failure> {
    if let Some(Some(path)) = json {
        let text = serde_json::to_vec_pretty(report).unwrap_or_default();
        write_file(path, &text)?;
    }
    let to_stdout = matches!(json, Some(None));
    print_report(to_stdout, report);
    Ok(to_stdout)
}

fn plugin_dir(exe: &std::path::Path, given: Option<PathBuf>) -> PathBuf {
    if let Some(d) = given
        .or_else(|| std::env::var_os(shardport_host::config::PLUGIN_DIR_ENV).map(PathBuf::from))
    {
        return d;
    }
    let next_to = exe.parent().map(PathBuf::from).unwrap_or_default();
    if next_to.join("libshardport_posix_shm.so").is_file() {
        next_to
    } else {
        next_to.join("deps")
    }
}

fn run_chaos_soak(args: Args) -> Outcome {
    if args.config.path().is_some() {
        return Err((
            EXIT_FAILURE,
            "--config does not apply to --chaos: the soak writes every worker's config itself \
             (and rewrites it at each reload)",
        )
            .into());
    }
    let exe = current_exe()?;
    let plugin_dir = plugin_dir(&exe, args.plugin_dir);
    let opts = ChaosOptions {
        owners: args.owners,
        consumers: args.consumers,
        duration: args.duration,
        seed: args.seed,
        kill_every: args.kill_every,
        reload_every: args.reload_every,
        sweep_every: args.sweep_every,
        snapshot_every: args.snapshot_every,
        mark: args.mark,
        shards_per_owner: args.shards_per_owner,
        pool_mib: args.pool_mib,
        metrics_dir: args.metrics_dir,
        ..ChaosOptions::new(exe, plugin_dir)
    };
    let report = run_chaos(&opts).map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    if let Some(path) = &args.plot {
        write_file(path, report.svg().as_bytes())?;
    }
    emit(&args.json, &report)?;
    let failures = report.failures();
    if !failures.is_empty() {
        return Err((
            EXIT_FAILURE,
            format!("the chaos soak failed: {}", failures.join("; ")),
        )
            .into());
    }
    Ok(())
}
