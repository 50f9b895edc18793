//! `shardport drain`: tells running nodes to drop their cached copies of
//! shards (and the leases those hold), one call per node.

use super::{post_each, Outcome};

/// Arguments of `shardport drain`.
#[derive(clap::Args)]
pub struct Args {
    /// Control endpoints of the consumer nodes (repeatable).
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    #[command(flatten)]
    auth: super::ControlAuth,
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
        args.auth.token.as_deref(),
        args.auth.ca.as_deref(),
        &body.to_string(),
        "drain",
        |r| format!("drained {}", r["drained"]),
    )
}
