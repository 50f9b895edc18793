//! `shardport drain`: tells running nodes to drop their cached copies of
//! shards (and the leases those hold), one call per node.

use super::{post_each, Outcome};

/// Arguments of `shardport drain`.
#[derive(clap::Args)]
pub struct Args {
    /// Control endpoints of the consumer nodes (repeatable).
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    /// Bearer token of the control endpoints (or $SHARDPORT_TOKEN).
    #[arg(long, env = "SHARDPORT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Speak HTTPS, trusting the CA certificates (PEM) in this file (or
    /// $SHARDPORT_CA).
    #[arg(long, env = "SHARDPORT_CA", value_name = "FILE")]
    ca: Option<std::path::PathBuf>,
    /// Shard ids (32 hex digits), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "all",
        required_unless_present = "all"
    )]
    ids: Vec<String>,
    /// Drop every cached shard.
    #[arg(long)]
    all: bool,
}

/// POSTs `/v1/drain` to every node.
pub fn run(args: Args) -> Outcome {
    let body = if args.all {
        serde_json::json!({ "all": true })
    } else {
        serde_json::json!({ "ids": args.ids })
    };
    post_each(
        &args.nodes,
        "/v1/drain",
        args.token.as_deref(),
        args.ca.as_deref(),
        &body.to_string(),
        "drain",
        |r| format!("drained {}", r["drained"]),
    )
}
