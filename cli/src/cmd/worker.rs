//! `shardport worker` (hidden): a node driven by JSON lines on stdin, for
//! the demo, the benchmark, the soak and the end-to-end tests.

use super::{load_config, start_node, Failure, Outcome, EXIT_FAILURE};

/// Arguments of `shardport worker`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Keep fetched shards until drained (cache policy "explicit").
    #[arg(long)]
    cache_explicit: bool,
}

/// Serves requests from stdin until `exit` or end of input.
pub fn run(args: Args) -> Outcome {
    let mut cfg = load_config(args.config.path())?;
    if args.cache_explicit {
        cfg.cache.enabled = true;
    }
    let node = start_node(cfg)?;
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    shardport_cli::worker::serve(&node, stdin, stdout)
        .map_err(|e| Failure::from((EXIT_FAILURE, format!("worker pipe: {e}"))))?;
    node.clear();
    Ok(())
}
