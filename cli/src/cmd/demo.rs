//! `shardport demo`: the main job (see [`shardport_cli::demo`]).

use shardport_cli::demo::{run_demo, DemoOptions, TransportState};
use shardport_host::{config, Node};

use super::{
    config_args, current_exe, load_config, print_report, start_node, Failure, Outcome, EXIT_FAILURE,
};

/// Arguments of `shardport demo`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Largest shard to put.
    #[arg(long, default_value = "256MiB", value_parser = config::byte_size_arg)]
    max_size: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The transport that carries the network row.
const NETWORK_TRANSPORT: &str = "http";

/// Checks the config's plugins here (each unavailable one is logged once,
/// by this process), then runs the owner and consumer processes.
pub fn run(args: Args) -> Outcome {
    let cfg = load_config(args.config.path())?;
    // Fail here, with the loader's message, rather than in both children.
    let transports = transport_states(&start_node(cfg)?);
    let opts = DemoOptions {
        exe: current_exe()?,
        config_args: config_args(args.config.path())?,
        max_size: args.max_size,
        network: transports
            .iter()
            .any(|t| t.name == NETWORK_TRANSPORT && t.available),
        worker_env: worker_env(),
    };
    let mut report = run_demo(&opts).map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    report.transports = transports;
    print_report(args.json, &report);
    if report.bytes_still_used() != 0 {
        return Err((
            EXIT_FAILURE,
            format!(
                "owner storage did not come back after remove: {} bytes still in use",
                report.bytes_still_used()
            ),
        )
            .into());
    }
    if !report.all_verified() {
        return Err((
            EXIT_FAILURE,
            "some fetched bytes did not match what the owner put",
        )
            .into());
    }
    Ok(())
}

/// Each configured plugin and whether it can serve on this machine.
fn transport_states(node: &Node) -> Vec<TransportState> {
    node.config()
        .plugins
        .iter()
        .map(
            |spec| match node.plugins().iter().find(|p| p.name == spec.name) {
                Some(p) => {
                    let health = p.transport.health();
                    TransportState {
                        name: p.name.to_string(),
                        available: health.ok,
                        detail: health.message.into(),
                    }
                }
                None => TransportState {
                    name: spec.name.to_string(),
                    available: false,
                    detail: "not loaded".to_owned(),
                },
            },
        )
        .collect()
}

/// The workers log errors only, unless `RUST_LOG` says otherwise: this
/// process has already said once which transports are unavailable, and
/// every downgrade or failed check shows in the table.
fn worker_env() -> Vec<(String, String)> {
    if std::env::var_os("RUST_LOG").is_some() {
        Vec::new()
    } else {
        vec![("RUST_LOG".to_owned(), "error".to_owned())]
    }
}
