//! `shardport stats`: a running node's stats as JSON.

use super::{control_call, print_json, Outcome, CONTROL_CALL_TIMEOUT};

/// Arguments of `shardport stats`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: super::NodeArgs,
}

/// `GET /v1/stats`.
pub fn run(args: Args) -> Outcome {
    let r = control_call(
        &args.target.node,
        "GET",
        "/v1/stats",
        args.target.auth.token.as_deref(),
        args.target.auth.ca.as_deref(),
        &[],
        CONTROL_CALL_TIMEOUT,
    )?;
    print_json(&r);
    Ok(())
}
