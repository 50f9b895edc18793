//! `shardport gc`: sweeps what dead processes left behind (segments of dead
//! owners, leases of dead consumers); never a live process's.

use std::path::PathBuf;

use super::{load_config, start_node, Outcome, EXIT_FAILURE};

/// Arguments of `shardport gc`.
#[derive(clap::Args)]
pub struct Args {
    /// Config file (default: the embedded default config).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Starts a node and sweeps through every loaded transport.
pub fn run(args: Args) -> Outcome {
    let cfg = load_config(args.config.as_deref())?;
    // Starting the node already sweeps (plugins sweep on start); the
    // explicit sweep reports what is reclaimed and catches the rest.
    let node = start_node(cfg)?;
    let report = node.sweep();
    if report.is_empty() {
        println!("no loaded transport has anything to sweep");
    }
    let mut errors = 0;
    for (t, r) in report {
        match r {
            Ok(stats) => println!(
                "{t}: {}",
                stats
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Err(e) => {
                errors += 1;
                println!("{t}: FAILED: {e}");
            }
        }
    }
    if errors > 0 {
        return Err((EXIT_FAILURE, "some transports failed to sweep").into());
    }
    Ok(())
}
