//! The `shardport` command line.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::{Parser, Subcommand};
use shardport_host::{
    bench::{run_bench, BenchOptions},
    config::{self, Config},
    demo::{run_demo, DemoOptions},
    Node,
};

/// Exit status for a runtime failure.
const EXIT_FAILURE: u8 = 1;
/// Exit status for an invalid config or arguments.
const EXIT_CONFIG: u8 = 2;
/// Exit status when required plugins did not load.
const EXIT_PLUGINS: u8 = 3;

#[derive(Parser)]
#[command(
    name = "shardport",
    version,
    about = "Move tensor shards between the processes of a distributed ML job"
)]
struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the main job: an owner and a consumer process move shards of
    /// several sizes (up to 256 MiB) through shared memory and verify them.
    Demo {
        /// Config file (default: the embedded default config).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Largest shard to put.
        #[arg(long, default_value = "256MiB", value_parser = config::byte_size_arg)]
        max_size: u64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the configured plugins, whether each loaded, and its capabilities.
    Plugins {
        /// Config file (default: the embedded default config).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Measure dispatch, fetch and put against this machine's memcpy.
    Bench {
        /// Config file (default: the embedded default config).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Large-shard size.
        #[arg(long, default_value = "256MiB", value_parser = config::byte_size_arg)]
        size: u64,
        /// Repetitions of each large-shard measurement.
        #[arg(long, default_value_t = 7)]
        reps: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// A node driven by JSON lines on stdin (used by demo, bench and tests).
    #[command(hide = true)]
    Worker {
        /// Config file (default: the embedded default config).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config file and print what it sets up.
    Check {
        /// The file.
        file: PathBuf,
    },
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// An error with the exit status it maps to.
struct Failure {
    code: u8,
    message: String,
}

impl<E: std::fmt::Display> From<(u8, E)> for Failure {
    fn from((code, e): (u8, E)) -> Self {
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<Config, Failure> {
    match path {
        Some(p) => config::load(p).map_err(|e| (EXIT_CONFIG, e).into()),
        None => config::parse_str(config::DEFAULT_CONFIG, config::Origin::embedded())
            .map_err(|e| (EXIT_CONFIG, e).into()),
    }
}

fn config_args(path: Option<&Path>) -> Result<Vec<OsString>, Failure> {
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

fn start_node(config: Config) -> Result<Node, Failure> {
    Node::start(config).map_err(|e| match e {
        shardport_host::HostError::RequiredPlugins(_) => (EXIT_PLUGINS, e).into(),
        other => (EXIT_FAILURE, other).into(),
    })
}

fn current_exe() -> Result<PathBuf, Failure> {
    std::env::current_exe().map_err(|e| {
        (
            EXIT_FAILURE,
            format!("cannot find the shardport executable: {e}"),
        )
            .into()
    })
}

/// Prints a report as pretty JSON or as its table.
#[allow(clippy::print_stdout)] // the binary's own output
fn print_report(json: bool, report: &(impl serde::Serialize + std::fmt::Display)) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        print!("{report}");
    }
}

#[allow(clippy::print_stdout)] // main is the one place that prints results
fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Demo {
            config,
            max_size,
            json,
        } => {
            let cfg = load_config(config.as_deref())?;
            // Fail here, with the loader's message, rather than in both children.
            drop(start_node(cfg)?);
            let opts = DemoOptions {
                exe: current_exe()?,
                config_args: config_args(config.as_deref())?,
                max_size,
            };
            let report = run_demo(&opts).map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
            print_report(json, &report);
            if !json {
                println!(
                    "\nowner storage after remove: {}",
                    serde_json::to_string(&report.owner_after_remove).unwrap_or_default()
                );
            }
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
        Command::Plugins { config } => {
            let cfg = load_config(config.as_deref())?;
            let specs = cfg.plugins.clone();
            let node = match Node::start(cfg) {
                Ok(n) => n,
                Err(shardport_host::HostError::RequiredPlugins(errs)) => {
                    for spec in &specs {
                        println!("{:<12} NOT LOADED", spec.name);
                    }
                    for e in errs {
                        println!("  {e}");
                    }
                    return Err((EXIT_PLUGINS, "required plugins did not load").into());
                }
                Err(e) => return Err((EXIT_FAILURE, e).into()),
            };
            for spec in &specs {
                match node.plugins().iter().find(|p| p.name == spec.name) {
                    Some(p) => {
                        let health = p.transport.health();
                        println!(
                            "{:<12} loaded   v{} (abi {})  {}\n{:<12} caps: {}  health: {}",
                            p.name,
                            p.plugin_version,
                            p.abi_version,
                            p.path.display(),
                            "",
                            p.capabilities().names().join(", "),
                            if health.ok {
                                "ok".to_owned()
                            } else {
                                format!("FAILING: {}", health.message)
                            }
                        );
                    }
                    None => println!("{:<12} NOT LOADED", spec.name),
                }
            }
            for f in node.load_failures() {
                println!("  {f}");
            }
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => {
            let cfg = config::load(&file).map_err(|e| Failure::from((EXIT_CONFIG, e)))?;
            for w in &cfg.warnings {
                println!("warning: {w}");
            }
            println!("{}: ok", file.display());
            println!(
                "  node        {} advertising {}",
                cfg.node.name, cfg.node.advertise
            );
            println!(
                "  storage     {:?}, checksum {:?}",
                cfg.put.storage, cfg.put.checksum
            );
            println!(
                "  fetch       mode {}, on-downgrade {:?}, verify-checksum {}, max-batch {}",
                cfg.fetch.mode,
                cfg.fetch.on_downgrade,
                cfg.fetch.verify_checksum,
                cfg.fetch.max_batch
            );
            println!("  cache       {:?}", cfg.cache);
            for p in &cfg.plugins {
                let found = p.paths.iter().find(|c| c.is_file());
                println!(
                    "  plugin      {} <- {}{}{}",
                    p.name,
                    found.unwrap_or(&p.paths[0]).display(),
                    if found.is_some() {
                        ""
                    } else {
                        " (file not found)"
                    },
                    if p.required { ", required" } else { "" }
                );
            }
            println!(
                "  selection   same-node transports first (identity must agree), zero-copy first for views, then the owner's export order"
            );
            Ok(())
        }
        Command::Bench {
            config,
            size,
            reps,
            json,
        } => {
            if size == 0 {
                return Err((EXIT_CONFIG, "--size must be at least 1 byte").into());
            }
            let cfg = load_config(config.as_deref())?;
            let opts = BenchOptions {
                exe: current_exe()?,
                config_args: config_args(config.as_deref())?,
                config: cfg,
                large: size,
                reps: reps.max(1),
            };
            let report = run_bench(&opts).map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
            print_report(json, &report);
            Ok(())
        }
        Command::Worker { config } => {
            let cfg = load_config(config.as_deref())?;
            let node = start_node(cfg)?;
            let stdin = std::io::stdin().lock();
            let stdout = std::io::stdout().lock();
            shardport_host::worker::serve(&node, stdin, stdout)
                .map_err(|e| Failure::from((EXIT_FAILURE, format!("worker pipe: {e}"))))?;
            node.clear();
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
