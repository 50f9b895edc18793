//! `shardport metrics`: a running node's metrics, as Prometheus text (what
//! `/metrics` serves) or as the JSON snapshot `shardport ab report` reads.

use super::{control_call, print_json, Failure, Outcome, CONTROL_CALL_TIMEOUT, EXIT_FAILURE};

/// Arguments of `shardport metrics`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: super::NodeArgs,
    /// Print the JSON snapshot instead of Prometheus text.
    #[arg(long)]
    json: bool,
}

/// `GET /v1/metrics.json` or `GET /metrics`.
pub fn run(args: Args) -> Outcome {
    let token = args.target.auth.token.as_deref();
    let ca = args.target.auth.ca.as_deref();
    if args.json {
        let r = control_call(
            &args.target.node,
            "GET",
            "/v1/metrics.json",
            token,
            ca,
            &[],
            CONTROL_CALL_TIMEOUT,
        )?;
        print_json(&r);
    } else {
        let trust = super::trust(ca)?;
        let text = shardport_control::client::get_text_with(
            &args.target.node,
            trust.as_ref(),
            "/metrics",
            token,
            CONTROL_CALL_TIMEOUT,
        )
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
        print!("{text}");
    }
    Ok(())
}
