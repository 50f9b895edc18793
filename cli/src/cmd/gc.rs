//! `shardport gc`: sweeps what dead processes left behind (segments of dead
//! owners, leases of dead consumers); never a live process's.

use super::{load_config, start_node, Outcome, EXIT_FAILURE};

/// Arguments of `shardport gc`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
}

/// Starts a node and sweeps through every loaded transport. The counts
/// include what the transports swept while the node started (posix-shm
/// sweeps dead owners' segments at construction): a transport that keeps a
/// `<name>_total` counter for a swept quantity reports that total.
/// Transports that are unavailable here (cuda-ipc without a GPU) are listed
/// as skipped, not failed.
pub fn run(args: Args) -> Outcome {
    let cfg = load_config(args.config.path())?;
    let node = start_node(cfg)?;
    let report = node.sweep();
    let stats = node.stats();
    if report.is_empty() {
        println!("no loaded transport has anything to sweep");
    }
    let mut errors = 0;
    for (t, r) in report {
        let plugin = stats.plugins.iter().find(|p| p.name == t);
        match r {
            Ok(swept) => {
                let totals: Vec<String> = swept
                    .iter()
                    .map(|(k, v)| {
                        let total = plugin
                            .and_then(|p| p.stats.get(&format!("{k}_total")))
                            .copied()
                            .unwrap_or(*v);
                        format!("{k}={total}")
                    })
                    .collect();
                println!("{t}: {}", totals.join(" "));
            }
            Err(e) if plugin.is_some_and(|p| !p.healthy) => {
                println!("{t}: skipped: {e}");
            }
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
