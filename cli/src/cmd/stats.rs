//! `shardport stats`: a running node's stats as JSON.

use shardport_host::config;

use super::{control_call, print_json, Outcome, CONTROL_CALL_TIMEOUT};

/// Arguments of `shardport stats`.
#[derive(clap::Args)]
pub struct Args {
    /// The node's control endpoint.
    #[arg(long, default_value = config::DEFAULT_CONTROL_BIND)]
    node: String,
    /// Bearer token of the control endpoint (or $SHARDPORT_TOKEN).
    #[arg(long, env = "SHARDPORT_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// `GET /v1/stats`.
pub fn run(args: Args) -> Outcome {
    let r = control_call(
        &args.node,
        "GET",
        "/v1/stats",
        args.token.as_deref(),
        &[],
        CONTROL_CALL_TIMEOUT,
    )?;
    print_json(&r);
    Ok(())
}
