//! `shardport reload`: apply a config to running nodes without restarting
//! them (the same as SIGHUP to `shardport serve`, or `POST /v1/reload`).
//!
//! Nodes are reloaded one at a time, in the order given, and the rollout
//! stops at the first node that refuses: name a canary node first and the
//! rest only change once it has taken the new config. A config is checked
//! by the node, not here: a bad one reaches the first node, which refuses,
//! counts and logs it (its `shardport_reloads_total{result="refused"}` and
//! alert see it), and the rollout stops there. The file a node reads on a
//! later SIGHUP stays its own unless `--adopt` is given.

use std::path::PathBuf;

use super::{Failure, Outcome, CONTROL_CALL_TIMEOUT, EXIT_CONFIG, EXIT_FAILURE};

/// Arguments of `shardport reload`.
#[derive(clap::Args)]
pub struct Args {
    /// Control endpoints, reloaded one at a time in this order (repeatable).
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
    #[command(flatten)]
    auth: super::ControlAuth,
    /// The config to apply, read here and sent to each node (relative
    /// plugin paths resolve against its directory on the node's machine).
    /// Without it each node reads its own config file again.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Make `--config`'s file each node's own: what a later SIGHUP or a
    /// reload without `--config` reads (by default that stays the file the
    /// node was started with).
    #[arg(long, requires = "config")]
    adopt: bool,
}

/// `POST /v1/reload` to each node until one refuses.
pub fn run(args: Args) -> Outcome {
    // The file is read once; the node checks it. Parsed here only to tell
    // a refusal of the file itself (exit 2, as for every bad config) from a
    // refusal of what it would change (exit 1).
    let (body, invalid) = match &args.config {
        None => (String::new(), false),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::from((
                    EXIT_CONFIG,
                    format!("cannot read config file {}: {e}", path.display()),
                ))
            })?;
            let invalid = shardport_host::config::parse_str(
                &text,
                shardport_host::config::Origin::File(path.clone()),
            )
            .is_err();
            let abs = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            let body =
                serde_json::json!({ "config": text, "path": abs, "adopt": args.adopt }).to_string();
            (body, invalid)
        }
    };
    let trust = super::trust(args.auth.ca.as_deref())?;
    for (i, n) in args.nodes.iter().enumerate() {
        let r = shardport_control::client::call_with(
            n,
            trust.as_ref(),
            "POST",
            "/v1/reload",
            args.auth.token.as_deref(),
            body.as_bytes(),
            CONTROL_CALL_TIMEOUT,
        );
        match r {
            Ok(report) => print_report(n, &report),
            Err(e) => {
                let rest = &args.nodes[i + 1..];
                let untouched = if rest.is_empty() {
                    String::new()
                } else {
                    format!("; not reloaded: {}", rest.join(", "))
                };
                let refused_file = invalid
                    && matches!(
                        e,
                        shardport_control::client::ClientError::Status { status: 409, .. }
                    );
                return Err(Failure::from((
                    if refused_file {
                        EXIT_CONFIG
                    } else {
                        EXIT_FAILURE
                    },
                    format!("{n}: {e}{untouched}"),
                )));
            }
        }
    }
    Ok(())
}

fn print_report(node: &str, r: &serde_json::Value) {
    let changes: Vec<&str> = r["changes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
        .collect();
    println!(
        "{node}: generation {}, {} change(s), {} cache entries evicted",
        r["generation"],
        changes.len(),
        r["evicted"]
    );
    for c in changes {
        println!("  {c}");
    }
    for key in ["draining", "warnings"] {
        for line in r[key].as_array().into_iter().flatten() {
            println!("  {key}: {}", line.as_str().unwrap_or("?"));
        }
    }
}
