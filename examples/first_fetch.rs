//! The first fetch of a fresh process, through the Rust API (no Python):
//! starts a node on the embedded library config and times its first view
//! fetch of a handle another process put, then the same fetch again. For
//! profiling the first-call costs (`perf record` over many runs, samples
//! filtered to the fetch's stacks) and as the baseline of
//! `scripts/bench_first_fetch.py`.
//!
//! ```text
//! cargo build --release -p shardport-cli -p shardport-posix-shm -p shardport-http --example first_fetch
//! SHARDPORT_PLUGIN_DIR=target/release ./target/release/examples/first_fetch HANDLE_HEX
//! ```

#![allow(clippy::print_stdout)] // the figures on stdout are this program's output

use std::time::Instant;

use shardport_host::{config, FetchMode, Handle, Node};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hex = std::env::args()
        .nth(1)
        .ok_or("usage: first_fetch HANDLE_HEX")?;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<_, _>>()?;
    let h = Handle::from_bytes(&bytes)?;
    let cfg = config::parse_str(config::LIBRARY_CONFIG, config::Origin::embedded())?;
    let node = Node::start(cfg)?;
    let t = Instant::now();
    let f = node.fetch_mode(&h, FetchMode::View)?;
    let first = t.elapsed();
    drop(f);
    let t = Instant::now();
    let f = node.fetch_mode(&h, FetchMode::View)?;
    let again = t.elapsed();
    drop(f);
    println!(
        "{:.1} {:.1}",
        first.as_secs_f64() * 1e6,
        again.as_secs_f64() * 1e6
    );
    Ok(())
}
