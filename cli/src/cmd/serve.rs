//! `shardport serve`: a long-lived node that owns shards and serves them
//! through its transports, with a control endpoint for `put`, `stats` and
//! `remove`; with `--fetch FILE` it is also a long-lived consumer of the
//! handles the file lists ([`fetch_loop`]). SIGINT/SIGTERM shut it down
//! cleanly (segments removed); SIGHUP reloads the config file the node was
//! started with (as `shardport reload` and `POST /v1/reload` do). Every
//! reload, applied or refused, is logged once by the node, whoever asked.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use shardport_control::{tls, ControlServer, Limits, IO_TIMEOUT};
use shardport_host::Node;

use super::{load_config, start_node, Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE};

mod fetch_loop;

/// How often the sweeper thread looks at its stop flag.
const SWEEPER_TICK: Duration = Duration::from_millis(200);

/// Arguments of `shardport serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Control endpoint address (overrides `control.bind`).
    #[arg(long)]
    control: Option<String>,
    /// Also fetch, pass after pass, every handle this file lists (one per
    /// line, hex or JSON; read again when it changes): a long-lived
    /// consumer whose control endpoint reports its fetches and experiments.
    #[arg(long, value_name = "FILE")]
    fetch: Option<std::path::PathBuf>,
    /// The pause between two passes over the `--fetch` file.
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = shardport_host::config::duration_arg)]
    fetch_every: Duration,
}

/// Plugin options a long-lived node sets unless its config says otherwise:
/// its data port and pool exist from the start, so a bind or `/dev/shm`
/// failure stops `serve` at once instead of failing its first put.
const EAGER_OPTIONS: [(&str, &str, &str); 2] = [
    ("http", "listen", "eager"),
    ("posix-shm", "create-pool", "eager"),
];

/// Serves until SIGINT or SIGTERM; reloads on SIGHUP.
pub fn run(args: Args) -> Outcome {
    let mut cfg = load_config(args.config.path())?;
    make_eager(&mut cfg).map_err(|e| Failure::from((EXIT_CONFIG, e)))?;
    let bind = args.control.unwrap_or_else(|| cfg.control.bind.clone());
    let token = cfg
        .control
        .token
        .resolve()
        .map_err(|e| Failure::from((EXIT_CONFIG, e)))?;
    // Read and checked before the node starts: a bad file is a config error
    // naming the key and the file.
    let control_tls = match &cfg.control.tls {
        None => None,
        Some(t) => {
            Some(tls::server_config(&t.cert, &t.key).map_err(|e| Failure::from((EXIT_CONFIG, e)))?)
        }
    };
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| Failure::from((EXIT_FAILURE, format!("cannot install signal handlers: {e}"))))?;
    let node = start_node(cfg)?;
    // A reloaded file gets the same adjustment, so reloading an unchanged
    // file keeps every plugin instance.
    node.set_reload_hook(std::sync::Arc::new(make_eager));
    let server = ControlServer::start_tls(&node, &bind, token, Limits::default(), control_tls)
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    let sweeper = spawn_sweeper(&node);
    let fetcher = match args.fetch {
        None => None,
        Some(file) => Some(
            fetch_loop::spawn(&node, file, args.fetch_every).map_err(|e| {
                Failure::from((EXIT_FAILURE, format!("cannot start the fetch loop: {e}")))
            })?,
        ),
    };
    println!("control: {}", server.addr());
    println!(
        "node: {} advertising {} (tag {})",
        node.config().node.name,
        node.config().node.advertise,
        node.tag()
    );
    for p in node.plugins() {
        println!("plugin: {} {}", p.name, p.transport.health().message);
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let mut sig = None;
    for s in signals.forever() {
        if s != signal_hook::consts::SIGHUP {
            sig = Some(s);
            break;
        }
        // The node logs what changed, or why it refused, once.
        let _ = node.reload_file(None);
    }
    tracing::info!(target: "node", signal = ?sig, "shutting down");
    drop(server);
    sweeper.store(true, Ordering::Relaxed);
    if let Some(f) = fetcher {
        f.stop();
    }
    if !node.shutdown(IO_TIMEOUT * 2) {
        tracing::warn!(target: "node", "control requests still running at shutdown; their shards stay until they end");
    }
    println!("stopped");
    Ok(())
}

/// Adds [`EAGER_OPTIONS`] to the plugin tables that do not set them.
fn make_eager(cfg: &mut shardport_host::Config) -> Result<(), String> {
    for p in &mut cfg.plugins {
        for (plugin, key, value) in EAGER_OPTIONS {
            if p.transport.as_str() != plugin {
                continue;
            }
            let mut table: toml::Table = p
                .config_text
                .parse()
                .map_err(|e| format!("plugin `{}` config: {e}", p.name))?;
            if !table.contains_key(key) {
                table.insert(key.to_owned(), toml::Value::String(value.to_owned()));
                p.config_text = table.to_string();
            }
        }
    }
    Ok(())
}

/// Sweeps `node` every `node.sweep-interval` until the returned flag is set
/// or the node is gone.
fn spawn_sweeper(node: &Node) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let (weak, flag, every) = (
        node.downgrade(),
        Arc::clone(&stop),
        node.config().node.sweep_interval,
    );
    let step = SWEEPER_TICK.min(every);
    let spawned = std::thread::Builder::new()
        .name("shardport-sweep".into())
        .spawn(move || {
            let mut waited = Duration::ZERO;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(step);
                waited += step;
                if waited < every {
                    continue;
                }
                waited = Duration::ZERO;
                match weak.upgrade() {
                    Some(n) => drop(n.sweep()),
                    None => break,
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(target: "cleanup", error = %e, "cannot start the periodic sweep");
    }
    stop
}
