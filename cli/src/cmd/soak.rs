//! `shardport soak`: put -> fetch from another process -> drain -> remove,
//! many times; both processes' RSS and the `/dev/shm` entry count at the
//! start and at the end (they must stay flat).

use shardport_cli::soak::{run_soak, SoakOptions};

use super::{config_args, current_exe, print_report, Failure, Outcome, EXIT_FAILURE};

/// Arguments of `shardport soak`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Steps after the warm-up.
    #[arg(long, default_value_t = 2000)]
    steps: usize,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs the soak; fails when anything grew.
pub fn run(args: Args) -> Outcome {
    let opts = SoakOptions {
        exe: current_exe()?,
        config_args: config_args(args.config.path())?,
        steps: args.steps,
    };
    let report = run_soak(&opts, |s| eprintln!("soak: step {s}"))
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    print_report(args.json, &report);
    if !args.json {
        println!();
    }
    if !report.flat() {
        return Err((EXIT_FAILURE, "the soak leaked (see the table)").into());
    }
    Ok(())
}
