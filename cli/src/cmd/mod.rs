//! One module per `shardport` subcommand: its arguments (clap derive) and a
//! `run` that does the work through the library modules and prints the
//! result. `main.rs` only parses and dispatches.
//!
//! What the subcommands share is here: the exit statuses, [`Failure`] (an
//! error with the status it maps to), config loading and node start-up with
//! the errors mapped, and the one way output is printed (colour only where
//! the stream is a terminal and `NO_COLOR` is unset, through `anstream`).
// The subcommands are the binary's output.
#![allow(clippy::print_stdout)]

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use shardport_control::client::Trust;
use shardport_host::{
    config::{self, Config},
    HostError, Node,
};

pub mod ab;
pub mod bench;
pub mod config_check;
pub mod demo;
pub mod drain;
pub mod fetch;
pub mod gc;
pub mod metrics;
pub mod new_transport;
pub mod plugins;
pub mod put;
pub mod reload;
pub mod serve;
pub mod soak;
pub mod stats;
pub mod worker;

/// Exit status for a runtime failure.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for an invalid config or arguments.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status when required plugins did not load.
pub const EXIT_PLUGINS: u8 = 3;

/// How long a one-shot call to a node's control endpoint may take.
pub const CONTROL_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `--config FILE`: the config a subcommand runs on.
#[derive(clap::Args)]
pub struct ConfigArg {
    /// Config file (default: the embedded default config).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

impl ConfigArg {
    /// The file given, if any.
    pub fn path(&self) -> Option<&Path> {
        self.config.as_deref()
    }
}

/// `--node ADDR --token T`: a running node's control endpoint.
#[derive(clap::Args)]
pub struct NodeArgs {
    /// The node's control endpoint.
    #[arg(long, default_value = config::DEFAULT_CONTROL_BIND)]
    pub node: String,
    #[command(flatten)]
    pub auth: ControlAuth,
}

/// `--token T --ca FILE`: how to speak to control endpoints.
#[derive(clap::Args)]
pub struct ControlAuth {
    /// Bearer token of the control endpoints (or $SHARDPORT_TOKEN).
    #[arg(long, env = "SHARDPORT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speak HTTPS to the control endpoints, trusting the CA certificates
    /// (PEM) in this file (or $SHARDPORT_CA); for nodes with
    /// `control.tls-cert` set.
    #[arg(long, env = "SHARDPORT_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

/// An error with the exit status it maps to.
pub struct Failure {
    /// Exit status.
    pub code: u8,
    /// What went wrong, printed once after `error: `.
    pub message: String,
}

impl<E: std::fmt::Display> From<(u8, E)> for Failure {
    fn from((code, e): (u8, E)) -> Self {
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

/// The result of a subcommand.
pub type Outcome = Result<(), Failure>;

/// The config at `path`, or the embedded default config.
pub fn load_config(path: Option<&Path>) -> Result<Config, Failure> {
    match path {
        Some(p) => config::load(p).map_err(|e| (EXIT_CONFIG, e).into()),
        None => config::parse_str(config::DEFAULT_CONFIG, config::Origin::embedded())
            .map_err(|e| (EXIT_CONFIG, e).into()),
    }
}

/// Arguments that make a child `shardport` process use the same config
/// (`--config ABSOLUTE`, or none for the embedded default).
pub fn config_args(path: Option<&Path>) -> Result<Vec<OsString>, Failure> {
    Ok(match path {
        Some(p) => {
            let abs = std::fs::canonicalize(p).map_err(|e| {
                Failure::from((EXIT_CONFIG, format!("config file {}: {e}", p.display())))
            })?;
            vec!["--config".into(), abs.into_os_string()]
        }
        None => Vec::new(),
    })
}

/// Starts a node; required plugins that did not load are exit 3, a plugin
/// that refused its config table exit 2.
pub fn start_node(config: Config) -> Result<Node, Failure> {
    Node::start(config).map_err(|e| match e {
        HostError::RequiredPlugins(_) => (EXIT_PLUGINS, e).into(),
        HostError::PluginConfig(_) => (EXIT_CONFIG, e).into(),
        other => (EXIT_FAILURE, other).into(),
    })
}

/// This executable, to start worker processes from.
pub fn current_exe() -> Result<PathBuf, Failure> {
    std::env::current_exe().map_err(|e| {
        (
            EXIT_FAILURE,
            format!("cannot find the shardport executable: {e}"),
        )
            .into()
    })
}

/// Writes a report file, naming it in the error.
pub fn write_file(path: &Path, bytes: &[u8]) -> Outcome {
    std::fs::write(path, bytes).map_err(|e| {
        Failure::from((
            EXIT_FAILURE,
            format!("cannot write {}: {e}", path.display()),
        ))
    })
}

/// Prints a report as pretty JSON or as its table.
pub fn print_report(json: bool, report: &(impl serde::Serialize + std::fmt::Display)) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        anstream::print!("{report}");
    }
}

/// Prints a JSON value from a node, pretty.
pub fn print_json(value: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// POSTs `body` to `path` on every node, printing one line per node
/// (`describe` turns an answer into words); fails naming the nodes that did
/// not answer 200.
pub fn post_each(
    nodes: &[String],
    path: &str,
    token: Option<&str>,
    ca: Option<&Path>,
    body: &str,
    what: &str,
    describe: impl Fn(&serde_json::Value) -> String,
) -> Outcome {
    let mut failed = Vec::new();
    for n in nodes {
        match control_call(
            n,
            "POST",
            path,
            token,
            ca,
            body.as_bytes(),
            CONTROL_CALL_TIMEOUT,
        ) {
            Ok(r) => println!("{n}: {}", describe(&r)),
            Err(e) => {
                println!("{n}: FAILED: {}", e.message);
                failed.push(n.clone());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err((
            EXIT_FAILURE,
            format!("{what} failed on {}", failed.join(", ")),
        )
            .into())
    }
}

/// What `--ca FILE` trusts, read now: a bad file is a usage error (exit 2)
/// naming the flag and the file.
pub fn trust(ca: Option<&Path>) -> Result<Option<Trust>, Failure> {
    ca.map(Trust::from_ca_file)
        .transpose()
        .map_err(|e| Failure::from((EXIT_CONFIG, e)))
}

/// One call to a node's control endpoint (over TLS with `ca`); a failure
/// is exit 1.
pub fn control_call(
    node: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    ca: Option<&Path>,
    body: &[u8],
    timeout: Duration,
) -> Result<serde_json::Value, Failure> {
    let trust = trust(ca)?;
    shardport_control::client::call_with(node, trust.as_ref(), method, path, token, body, timeout)
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))
}
