//! `shardport fetch`: fetches a handle into this process; prints the
//! transport and the reason; writes or verifies the bytes.

use std::path::PathBuf;

use shardport_host::{handle::HandleError, FetchMode, Handle};

use super::{load_config, start_node, Failure, Outcome, EXIT_CONFIG, EXIT_FAILURE};

/// Arguments of `shardport fetch`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: super::ConfigArg,
    /// The handle: hex of the binary form, JSON, or `@FILE`; `-` or absent reads stdin.
    #[arg(long)]
    handle: Option<String>,
    /// `view` or `copy` (default: the config's).
    #[arg(long)]
    mode: Option<String>,
    /// Write the bytes to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Verify the bytes against the pattern `shardport put --size` wrote with this seed.
    #[arg(long)]
    verify_seed: Option<u64>,
}

/// Reads the handle, starts a node and fetches.
pub fn run(args: Args) -> Outcome {
    let handle = read_handle(args.handle.as_deref())?;
    let cfg = load_config(args.config.path())?;
    let mode = match args.mode.as_deref() {
        None => cfg.fetch.mode,
        Some("view") => FetchMode::View,
        Some("copy") => FetchMode::Copy,
        Some(m) => {
            return Err((EXIT_CONFIG, format!("--mode `{m}`: expected view or copy")).into())
        }
    };
    let node = start_node(cfg)?;
    let f = node
        .fetch_mode(&handle, mode)
        .map_err(|e| Failure::from((EXIT_FAILURE, e)))?;
    println!(
        "fetched {} ({} bytes) via {} in {}{}\nreason: {}",
        f.id,
        f.data.len(),
        f.selection.transport,
        shardport_cli::demo::time_label(f.elapsed.as_nanos() as u64),
        if f.selection.downgraded {
            " (DOWNGRADED)"
        } else {
            ""
        },
        f.selection.reason
    );
    if let Some(seed) = args.verify_seed {
        if !shardport_cli::worker::check_pattern(&f.data, seed) {
            return Err((
                EXIT_FAILURE,
                format!("bytes do not match the pattern for seed {seed}"),
            )
                .into());
        }
        println!("verified: pattern seed {seed}");
    }
    if let Some(path) = args.out {
        super::write_file(&path, &f.data[..])?;
    }
    Ok(())
}

/// The handle from `--handle` (hex, JSON or `@FILE`) or stdin.
fn read_handle(arg: Option<&str>) -> Result<Handle, Failure> {
    let text = match arg {
        None | Some("-") => {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut t).map_err(|e| {
                Failure::from((EXIT_FAILURE, format!("reading the handle from stdin: {e}")))
            })?;
            t
        }
        Some(h) if h.starts_with('@') => std::fs::read_to_string(&h[1..])
            .map_err(|e| Failure::from((EXIT_FAILURE, format!("cannot read {}: {e}", &h[1..]))))?,
        Some(h) => h.to_owned(),
    };
    parse_handle(&text).map_err(|e| Failure::from((EXIT_CONFIG, e)))
}

/// A handle from its text: JSON, or hex of the binary form.
pub(super) fn parse_handle(text: &str) -> Result<Handle, HandleError> {
    let text = text.trim();
    if text.starts_with('{') {
        Handle::from_json(text)
    } else {
        hex::decode(text)
            .map_err(|e| HandleError {
                what: format!("not hex or JSON: {e}"),
                offset: 0,
            })
            .and_then(|b| Handle::from_bytes(&b))
    }
}
