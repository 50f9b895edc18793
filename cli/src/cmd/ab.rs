//! `shardport ab`: A/B experiments of transports: `report` compares the
//! arms of a metrics snapshot, `reset` re-enables arms a guardrail disabled.

use std::path::PathBuf;

use shardport_cli::ab_report::{self, ReportError};

use super::{post_each, print_report, write_file, Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE};

/// Subcommands of `shardport ab`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Compare the arms of experiments from a metrics snapshot: per arm n,
    /// p50/p90/p99 latency, throughput and error rate; each arm against the
    /// control with bootstrap 95% confidence intervals; optionally an SVG
    /// plot of the latency CDF per arm.
    Report(ReportArgs),
    /// Re-enable the arms a guardrail disabled on running nodes (after the
    /// cause is fixed), one call per node.
    Reset(ResetArgs),
}

/// Arguments of `shardport ab report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Snapshot file (JSON, format `shardport-metrics/1`).
    #[arg(long, conflicts_with = "node", required_unless_present = "node")]
    snapshot: Option<PathBuf>,
    /// Scrape the snapshot from this node's control endpoint
    /// (`GET /v1/metrics.json`) instead.
    #[arg(long)]
    node: Option<String>,
    /// Bearer token of the control endpoint (or $SHARDPORT_TOKEN).
    #[arg(long, env = "SHARDPORT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Only this experiment (default: all in the snapshot).
    #[arg(long)]
    experiment: Option<String>,
    /// Only this size bucket (4KiB, 64KiB, 1MiB, 16MiB, 256MiB, inf;
    /// default: all buckets merged).
    #[arg(long)]
    size: Option<String>,
    /// Write the latency CDF per arm to this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Bootstrap seed (the same seed gives the same intervals).
    #[arg(long, default_value_t = ab_report::DEFAULT_SEED)]
    seed: u64,
    /// Bootstrap resamples.
    #[arg(long, default_value_t = ab_report::DEFAULT_RESAMPLES)]
    resamples: usize,
}

/// Arguments of `shardport ab reset`.
#[derive(clap::Args)]
pub struct ResetArgs {
    /// Control endpoints (repeatable).
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// Bearer token of the control endpoints (or $SHARDPORT_TOKEN).
    #[arg(long, env = "SHARDPORT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Only this experiment (default: every experiment).
    #[arg(long)]
    experiment: Option<String>,
}

/// Runs a `shardport ab` subcommand.
pub fn run(command: Command) -> Outcome {
    match command {
        Command::Report(args) => report(args),
        Command::Reset(args) => reset(args),
    }
}

fn report(args: ReportArgs) -> Outcome {
    if let Some(p) = &args.plot {
        if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
            return Err((
                EXIT_CONFIG,
                format!(
                    "--plot {}: only SVG plots are written; name the file *.svg",
                    p.display()
                ),
            )
                .into());
        }
    }
    let snap = match (&args.snapshot, &args.node) {
        (Some(file), _) => ab_report::load(file),
        (None, Some(addr)) => {
            ab_report::scrape(addr, args.token.as_deref(), ab_report::SCRAPE_TIMEOUT)
        }
        (None, None) => {
            return Err((EXIT_CONFIG, "give --snapshot FILE or --node HOST:PORT").into())
        }
    }
    .map_err(report_failure)?;
    let opts = ab_report::Options {
        experiment: args.experiment,
        size: args.size,
        seed: args.seed,
        resamples: args.resamples,
    };
    let report = ab_report::build(&snap, &opts).map_err(report_failure)?;
    print_report(args.json, &report);
    if let Some(p) = args.plot {
        write_file(&p, report.plot_svg().as_bytes())?;
        if !args.json {
            println!("\nplot: {}", p.display());
        }
    }
    Ok(())
}

/// A report failure: bad input (file, format, names, options) is exit 2,
/// a node that cannot be scraped exit 1.
fn report_failure(e: ReportError) -> Failure {
    match e {
        ReportError::Scrape(_) => (EXIT_FAILURE, e).into(),
        _ => (EXIT_CONFIG, e).into(),
    }
}

fn reset(args: ResetArgs) -> Outcome {
    let body = serde_json::json!({ "experiment": args.experiment }).to_string();
    post_each(
        &args.nodes,
        "/v1/experiments/reset",
        args.token.as_deref(),
        None,
        &body,
        "reset",
        |r| {
            let arms: Vec<String> = r["reenabled"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}",
                        p[0].as_str().unwrap_or("?"),
                        p[1].as_str().unwrap_or("?")
                    )
                })
                .collect();
            if arms.is_empty() {
                "no arm was disabled".to_owned()
            } else {
                format!("re-enabled {}", arms.join(", "))
            }
        },
    )
}
