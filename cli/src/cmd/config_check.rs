//! `shardport config check FILE`: validates a config and prints what it
//! sets up, routing table included.

use std::path::PathBuf;

use shardport_host::config;

use super::{Failure, Outcome, EXIT_CONFIG};

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
    println!("  same-node   {:?} (locality.same-node)", cfg.same_node);
    println!("  control     {}", cfg.control.bind);
    print!("{}", config::routing_table(&cfg));
    Ok(())
}
