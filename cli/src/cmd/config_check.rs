//! `shardport config check FILE`: validates a config, loads its plugins as
//! a node started on it would, and prints what it sets up (each plugin
//! instance with its transport, the routing table, each experiment's
//! starting shares). Exit 2 for a bad config, 3 when a required plugin
//! does not load (as `shardport serve` would), 0 otherwise.

use std::path::PathBuf;

use shardport_host::{config, HostError, Node};

use super::{Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE, EXIT_PLUGINS};

/// Subcommands of `shardport config`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Validate a config file and print what it sets up.
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// Runs a `shardport config` subcommand.
pub fn run(command: Command) -> Outcome {
    let Command::Check { file } = command;
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
        cfg.fetch.mode, cfg.fetch.on_downgrade, cfg.fetch.verify_checksum, cfg.fetch.max_batch
    );
    println!(
        "  cache       {}",
        if !cfg.cache.enabled {
            "none".to_owned()
        } else {
            format!(
                "kept until drained; lru max-bytes {:?}; ttl {:?}",
                cfg.cache.max_bytes, cfg.cache.ttl
            )
        }
    );
    // Loaded as a node loads them (without serve's eager ports and pools,
    // which a running node may hold): a required plugin that does not
    // load fails the check, an optional one is reported.
    let node = match Node::start(cfg.clone()) {
        Ok(n) => Some(n),
        Err(HostError::RequiredPlugins(errs)) => {
            print_plugins(&cfg, None);
            for e in &errs {
                println!("  error: {e}");
            }
            return Err((
                EXIT_PLUGINS,
                format!(
                    "{}: required plugins did not load ({} failure(s)); `shardport serve` would exit 3",
                    file.display(),
                    errs.len()
                ),
            )
                .into());
        }
        Err(e @ HostError::PluginConfig(_)) => return Err(Failure::from((EXIT_CONFIG, e))),
        Err(e) => return Err(Failure::from((EXIT_FAILURE, e))),
    };
    print_plugins(&cfg, node.as_ref());
    if let Some(n) = &node {
        for f in n.load_failures() {
            println!("  warning: optional plugin not loaded: {f}");
        }
    }
    println!("  same-node   {:?} (locality.same-node)", cfg.same_node);
    println!("  control     {}", cfg.control.bind);
    print!("{}", config::routing_table(&cfg));
    Ok(())
}

/// One line per plugin instance: its name, the transport it implements,
/// the file, and whether it loaded (`node`: the node that loaded them).
fn print_plugins(cfg: &config::Config, node: Option<&Node>) {
    for p in &cfg.plugins {
        let found = p.paths.iter().find(|c| c.is_file());
        let transport = if p.transport == p.name {
            String::new()
        } else {
            format!(" (transport {})", p.transport)
        };
        let loaded = node.and_then(|n| n.plugins().into_iter().find(|l| l.name == p.name));
        let state = match (&loaded, found) {
            (Some(l), _) => format!(", loaded v{}", l.plugin_version),
            (None, None) => " (file not found)".to_owned(),
            (None, Some(_)) => ", NOT LOADED".to_owned(),
        };
        println!(
            "  plugin      {}{transport} <- {}{state}{}",
            p.name,
            found.unwrap_or(&p.paths[0]).display(),
            if p.required { ", required" } else { "" }
        );
    }
}
