//! `shardport plugins`: the configured plugins, whether each loaded, its
//! version, ABI version, capabilities and health.

use shardport_host::{HostError, Node};

use super::{load_config, Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE, EXIT_PLUGINS};

/// Arguments of `shardport plugins`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
}

/// Loads the config's plugins and lists them; load failures one line each.
pub fn run(args: Args) -> Outcome {
    let cfg = load_config(args.config.path())?;
    let specs = cfg.plugins.clone();
    let node = match Node::start(cfg) {
        Ok(n) => n,
        Err(HostError::RequiredPlugins(errs)) => {
            for spec in &specs {
                println!("{:<12} NOT LOADED", spec.name);
            }
            for e in errs {
                println!("  {e}");
            }
            return Err((EXIT_PLUGINS, "required plugins did not load").into());
        }
        Err(e @ HostError::PluginConfig(_)) => return Err(Failure::from((EXIT_CONFIG, e))),
        Err(e) => return Err(Failure::from((EXIT_FAILURE, e))),
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
